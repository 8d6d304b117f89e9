//! Causal attention on Gemma 3 270M's shape (4 query heads sharing 1 KV head of 256) or another:
//! kiln's tiled kernel (over an f32 and an f16 cache) against the row-at-a-time kernel it
//! replaced (f32), in the same run.
//!
//! `cargo run --release -p kiln-cpu --example attn_bench [threads] [rounds] [heads kv_heads
//! head_dim]` (2 threads, 7 rounds and Gemma's shape by default; `32 8 64` is llama-3.2-1b's). Prefill of 512 rows at position 0 (no window, and Gemma's window of
//! 512) and decode of one row over 512, 2048 and 8192 cached keys. Each round times the old
//! kernel, then the new one over each cache (alternating, so that load from other processes hits
//! all alike); the best round of each is reported. Repeated calls find their cache in L2/L3: this
//! is the kernels' compute rate (`attn_batch_bench` streams caches from memory).

mod common;

use std::time::Instant;

use kiln_backend::{AttentionParams, Backend, KvDtype};
use kiln_cpu::kernels::simd_level;
use kiln_cpu::{CpuKv, CpuTensor};
use rayon::prelude::*;

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads = args.next().and_then(|s| s.parse().ok()).unwrap_or(2);
    let rounds = args.next().and_then(|s| s.parse().ok()).unwrap_or(7);
    let mut shape = args.filter_map(|s| s.parse::<usize>().ok());
    let heads = shape.next().unwrap_or(4);
    let kv_heads = shape.next().unwrap_or(1);
    let head_dim = shape.next().unwrap_or(256);
    let b = common::backend(threads);
    // The old kernel ran on the backend's rayon pool of `threads` threads; this one has as many.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let avx2 = simd_level().has_avx2();
    println!(
        "attention, {heads} heads / {kv_heads} kv heads of {head_dim}, {threads} threads, {:?}; best of {rounds}",
        simd_level()
    );
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6}",
        "case", "old ms", "f32 ms", "f16 ms", "old GF/s", "f32 GF/s", "f16 GF/s", "ratio"
    );
    let cases: [(&str, usize, usize, Option<usize>); 6] = [
        ("prefill 512, no window", 512, 0, None),
        ("prefill 512, window 512", 512, 0, Some(512)),
        ("decode at 512, no window", 1, 511, None),
        ("decode at 2048, no window", 1, 2047, None),
        ("decode at 8192, no window", 1, 8191, None),
        ("decode at 8192, window 512", 1, 8191, Some(512)),
    ];
    for (name, rows, q_pos, window) in cases {
        let n_kv = q_pos + rows;
        let p = AttentionParams {
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: window,
            softcap: None,
        };
        let q = b
            .tensor_from_f32(&values(rows * heads * head_dim, 1), rows, heads * head_dim)
            .unwrap();
        let k = b
            .tensor_from_f32(
                &values(n_kv * kv_heads * head_dim, 2),
                n_kv,
                kv_heads * head_dim,
            )
            .unwrap();
        let v = b
            .tensor_from_f32(
                &values(n_kv * kv_heads * head_dim, 3),
                n_kv,
                kv_heads * head_dim,
            )
            .unwrap();
        // Score/value pairs: each costs 4 flops per head dim (two multiply-adds).
        let pairs: usize = (0..rows)
            .map(|i| {
                let pos = q_pos + i;
                pos + 1 - window.map_or(0, |w| (pos + 1).saturating_sub(w))
            })
            .sum();
        let flops = (4 * heads * head_dim * pairs) as f64;
        let cache = |t: &CpuTensor, dtype| {
            CpuKv::from_f32(&b.to_f32(t).unwrap(), n_kv, kv_heads * head_dim, dtype).unwrap()
        };
        let caches = [KvDtype::F32, KvDtype::F16].map(|d| (cache(&k, d), cache(&v, d)));
        // Agreement first (the unit tests hold the new kernel to 1e-5 of the output over the
        // values the cache holds; f16 rounds them).
        let old = old_attention(&pool, avx2, &q, &k, &v, q_pos, &p);
        let err = caches.each_ref().map(|(kc, vc)| {
            let new = b
                .to_f32(&b.attention(&q, kc, vc, q_pos, n_kv, &p).unwrap())
                .unwrap();
            old.iter()
                .zip(&new)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        });
        let reps = (2e8 / flops).ceil().clamp(1.0, 200.0) as usize;
        let (mut best_old, mut best_new) = (f64::INFINITY, [f64::INFINITY; 2]);
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..reps {
                std::hint::black_box(old_attention(&pool, avx2, &q, &k, &v, q_pos, &p));
            }
            best_old = best_old.min(t.elapsed().as_secs_f64() / reps as f64);
            for ((kc, vc), best) in caches.iter().zip(&mut best_new) {
                let t = Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(b.attention(&q, kc, vc, q_pos, n_kv, &p).unwrap());
                }
                *best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        println!(
            "{name:<34} {:>8.3} {:>8.3} {:>8.3} {:>9.1} {:>9.1} {:>9.1} {:>5.2}x   (max |old - new| {:.1e} f32, {:.1e} f16)",
            best_old * 1e3,
            best_new[0] * 1e3,
            best_new[1] * 1e3,
            flops / best_old / 1e9,
            flops / best_new[0] / 1e9,
            flops / best_new[1] / 1e9,
            best_old / best_new[0],
            err[0],
            err[1]
        );
    }
}

/// The kernel `attention.rs` held before the tiled one (commit 3af488c), as it ran: one task per
/// query row on the pool (decode on one thread), per head the row's scores into a buffer,
/// softmax with libm's `exp`, weighted sum of values; compiled with AVX2+FMA when available.
fn old_attention(
    pool: &rayon::ThreadPool,
    avx2: bool,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    q_pos: usize,
    p: &AttentionParams,
) -> Vec<f32> {
    let cols = p.n_heads * p.head_dim;
    let rows = q.data().len() / cols;
    let mut out = vec![0.0f32; rows * cols];
    let row = |(i, out_row): (usize, &mut [f32])| {
        let r = Row {
            q: &q.data()[i * cols..(i + 1) * cols],
            k: k.data(),
            v: v.data(),
            pos: q_pos + i,
            p,
        };
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: `avx2` is only true when the CPU reports AVX2 and FMA (simd_level()).
            unsafe { attend_row_avx2(&r, out_row) };
            return;
        }
        attend_row(&r, out_row);
    };
    if rows > 1 {
        pool.install(|| out.par_chunks_mut(cols).enumerate().for_each(row));
    } else {
        out.chunks_mut(cols).enumerate().for_each(row);
    }
    let _ = avx2;
    out
}

struct Row<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    pos: usize,
    p: &'a AttentionParams,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_row_avx2(row: &Row<'_>, out: &mut [f32]) {
    attend_row(row, out)
}

/// The crate's `math::dot`: eight independent accumulators, fixed order.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ta.iter().zip(tb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[inline(always)]
fn attend_row(row: &Row<'_>, out: &mut [f32]) {
    let p = row.p;
    let hd = p.head_dim;
    let kv_cols = p.n_kv_heads * hd;
    let group = p.n_heads / p.n_kv_heads;
    let lo = p
        .sliding_window
        .map_or(0, |w| (row.pos + 1).saturating_sub(w));
    let hi = row.pos + 1;
    let mut scores = vec![0.0f32; hi - lo];
    for h in 0..p.n_heads {
        let kvh = h / group;
        let qh = &row.q[h * hd..(h + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for (s, j) in scores.iter_mut().zip(lo..hi) {
            let kj = &row.k[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
            let mut v = dot(qh, kj) * p.scale;
            if let Some(cap) = p.softcap {
                v = cap * (v / cap).tanh();
            }
            *s = v;
            max = max.max(v);
        }
        let mut sum = 0.0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        let oh = &mut out[h * hd..(h + 1) * hd];
        for (s, j) in scores.iter().zip(lo..hi) {
            let vj = &row.v[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
            let weight = s * inv;
            for (o, &v) in oh.iter_mut().zip(vj) {
                *o += weight * v;
            }
        }
    }
}
