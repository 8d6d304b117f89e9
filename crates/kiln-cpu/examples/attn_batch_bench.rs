//! Batched decode attention as Gemma 3 270M's `-b 8` steps run it: 8 sequences x 18 layers of
//! one query row (4 heads sharing 1 KV head of 256) over `ctx` cached keys, each job's K/V cache
//! its own (144 caches: the step streams them from memory), through `attention_many` per layer;
//! caches stored as f32, then as f16 (half the bytes to stream).
//!
//! `cargo run --release -p kiln-cpu --example attn_batch_bench [-- THREADS CTX]`

mod common;

use std::time::Instant;

use kiln_backend::{AttentionJob, AttentionParams, Backend, KvDtype};
use kiln_cpu::CpuKv;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = args.first().copied().unwrap_or(2);
    let ctx = args.get(1).copied().unwrap_or(64);
    let (seqs, layers, hd) = (8, 18, 256);
    let b = common::backend(threads);
    let params = AttentionParams {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: hd,
        scale: 1.0 / 16.0,
        sliding_window: None,
        softcap: None,
    };
    let fill = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0)
            .collect()
    };
    let q = b.tensor_from_f32(&fill(4 * hd, 7), 1, 4 * hd).unwrap();
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let caches: Vec<_> = (0..seqs * layers)
            .map(|s| {
                let k = CpuKv::from_f32(&fill(ctx * hd, 2 * s), ctx, hd, dtype).unwrap();
                let v = CpuKv::from_f32(&fill(ctx * hd, 2 * s + 1), ctx, hd, dtype).unwrap();
                (k, v)
            })
            .collect();
        let step = || {
            for l in 0..layers {
                let jobs: Vec<_> = (0..seqs)
                    .map(|s| {
                        let (k, v) = &caches[l * seqs + s];
                        AttentionJob {
                            q: &q,
                            k,
                            v,
                            pages: None,
                            q_pos: ctx - 1,
                            n_kv: ctx,
                        }
                    })
                    .collect();
                std::hint::black_box(b.attention_many(&jobs, &params).unwrap());
            }
        };
        step();
        let mut best = f64::INFINITY;
        for _ in 0..20 {
            let t = Instant::now();
            step();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let bytes = (seqs * layers * ctx * 2 * dtype.row_bytes(hd)) as f64;
        println!(
            "{threads} threads, ctx {ctx}, {dtype} cache: {:.3} ms per step, {:.1} GB/s of K/V",
            best * 1e3,
            bytes / best / 1e9
        );
    }
}
