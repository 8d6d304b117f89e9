//! Causal attention over a contiguous KV cache, one query row at a time.
//!
//! Scores of one query row against its visible keys live in a per-row buffer (at most the window
//! or the context length); the full `[n, n_kv]` score matrix is never built. The inner loops are
//! plain Rust written with eight explicit lanes; on x86-64 with AVX2 the same code is compiled
//! with AVX2+FMA enabled (no fused multiply-adds are formed, so both builds give identical bits).

use kiln_backend::{shape_err, AttentionParams, Result};

use crate::kernels::{simd_level, SimdLevel};
use crate::math;
use crate::{CpuBackend, CpuTensor};

pub(crate) fn attention(
    cpu: &CpuBackend,
    q: &CpuTensor,
    k_cache: &CpuTensor,
    v_cache: &CpuTensor,
    q_pos: usize,
    n_kv: usize,
    p: &AttentionParams,
) -> Result<CpuTensor> {
    let hd = p.head_dim;
    if p.n_kv_heads == 0
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
        || q.cols != p.n_heads * hd
        || k_cache.cols != p.n_kv_heads * hd
        || v_cache.cols != p.n_kv_heads * hd
        || n_kv > k_cache.rows
        || n_kv > v_cache.rows
        || q_pos + q.rows > n_kv
    {
        return Err(shape_err(
            "attention",
            format!(
                "q [{}, {}] at {q_pos}, caches [{}, {}]/[{}, {}] with {n_kv} filled, {} heads / {} kv heads of {hd}",
                q.rows, q.cols, k_cache.rows, k_cache.cols, v_cache.rows, v_cache.cols, p.n_heads, p.n_kv_heads
            ),
        ));
    }
    let avx2 = cpu.simd == SimdLevel::Avx2 && simd_level() == SimdLevel::Avx2;
    let mut out = vec![0.0f32; q.rows * q.cols];
    crate::for_each_chunk(cpu, &mut out, q.cols, q.rows > 1, |i, out_row| {
        let row = Row {
            q: q.row(i),
            k: &k_cache.data,
            v: &v_cache.data,
            pos: q_pos + i,
            p,
        };
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: `avx2` is only true when the CPU reports AVX2 and FMA (simd_level()).
            unsafe { attend_row_avx2(&row, out_row) };
            return;
        }
        let _ = avx2;
        attend_row(&row, out_row);
    });
    Ok(CpuTensor {
        data: out,
        rows: q.rows,
        cols: q.cols,
    })
}

/// One query row: its values, the caches, its position.
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
            let mut v = math::dot(qh, kj) * p.scale;
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
