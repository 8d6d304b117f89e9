//! Causal attention over a contiguous KV cache, one (query row, head) at a time.
//!
//! Scores of one query row against its visible keys live in a per-row buffer (at most the window
//! or the context length); the full `[n, n_kv]` score matrix is never built.

use kiln_backend::{shape_err, AttentionParams, Result};
use rayon::prelude::*;

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
        || p.n_heads % p.n_kv_heads != 0
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
    let group = p.n_heads / p.n_kv_heads;
    let kv_cols = k_cache.cols;
    let mut out = vec![0.0f32; q.rows * q.cols];
    cpu.pool.install(|| {
        out.par_chunks_mut(q.cols.max(1)).enumerate().for_each(|(i, out_row)| {
            let pos = q_pos + i;
            let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let hi = pos + 1;
            let mut scores = vec![0.0f32; hi - lo];
            for h in 0..p.n_heads {
                let kvh = h / group;
                let qh = &q.row(i)[h * hd..(h + 1) * hd];
                let mut max = f32::NEG_INFINITY;
                for (s, j) in scores.iter_mut().zip(lo..hi) {
                    let kj = &k_cache.data[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
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
                let oh = &mut out_row[h * hd..(h + 1) * hd];
                for (s, j) in scores.iter().zip(lo..hi) {
                    let vj = &v_cache.data[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
                    let weight = s / sum;
                    for (o, &v) in oh.iter_mut().zip(vj) {
                        *o += weight * v;
                    }
                }
            }
        })
    });
    Ok(CpuTensor { data: out, rows: q.rows, cols: q.cols })
}

/// f32 dot product with eight independent accumulators (vectorizes; fixed summation order).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut tail = 0.0;
    for i in chunks * 8..a.len().min(b.len()) {
        tail += a[i] * b[i];
    }
    acc.iter().sum::<f32>() + tail
}
