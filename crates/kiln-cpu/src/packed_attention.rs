//! Bidirectional attention over a packed batch of variable-length sequences (encoders).
//!
//! Work is split into tasks of (sequence, head, block of up to [`QUERY_BLOCK`] queries). A task
//! computes its scores `Q·Kᵀ` for the keys its queries can see with one small GEMM, applies the
//! softmax row by row (vectorized `exp`), and multiplies by `V` with a second GEMM. Nothing is
//! computed across sequences, so packing wastes no work on padding, and the score buffer is at
//! most `QUERY_BLOCK × visible keys`, so long sequences never materialise an `L × L` matrix.
//!
//! Each output element is produced by one task with a fixed instruction sequence, so results do
//! not depend on the thread count or on what else is in the batch.

use kiln_backend::{shape_err, PackedAttentionParams, Result};
use rayon::prelude::*;

use crate::dense::{self, MatMut, MatRef};
use crate::{CpuBackend, CpuTensor};

/// Queries per task: bounds the score buffer and gives the pool enough tasks for one long text.
const QUERY_BLOCK: usize = 64;

struct Task {
    /// First row of the sequence in the packed batch.
    start: usize,
    len: usize,
    head: usize,
    /// Query rows `q0..q1` of the sequence.
    q0: usize,
    q1: usize,
}

pub(crate) fn packed_attention(
    cpu: &CpuBackend,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    seq_lens: &[usize],
    p: &PackedAttentionParams,
) -> Result<CpuTensor> {
    let cols = p.n_heads * p.head_dim;
    let total: usize = seq_lens.iter().sum();
    if p.head_dim == 0 || [q, k, v].iter().any(|t| t.cols != cols || t.rows != total) {
        return Err(shape_err(
            "packed_attention",
            format!(
                "q [{}, {}], k [{}, {}], v [{}, {}] for {} heads of {} and {total} packed rows",
                q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, p.n_heads, p.head_dim
            ),
        ));
    }
    let mut tasks = Vec::new();
    let mut start = 0;
    for &len in seq_lens {
        for head in 0..p.n_heads {
            for q0 in (0..len).step_by(QUERY_BLOCK) {
                tasks.push(Task {
                    start,
                    len,
                    head,
                    q0,
                    q1: (q0 + QUERY_BLOCK).min(len),
                });
            }
        }
        start += len;
    }
    let avx2 = cpu.avx2();
    let blocks: Vec<Vec<f32>> = cpu.pool.install(|| {
        tasks
            .par_iter()
            .map(|t| attend_block(q, k, v, t, p, avx2))
            .collect::<Result<_>>()
    })?;
    let hd = p.head_dim;
    let mut out = vec![0.0f32; total * cols];
    for (t, block) in tasks.iter().zip(&blocks) {
        for (i, row) in block.chunks_exact(hd).enumerate() {
            let at = (t.start + t.q0 + i) * cols + t.head * hd;
            out[at..at + hd].copy_from_slice(row);
        }
    }
    CpuTensor::new(out, total, cols)
}

/// Output rows `[q1 - q0, head_dim]` of one task.
fn attend_block(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    t: &Task,
    p: &PackedAttentionParams,
    avx2: bool,
) -> Result<Vec<f32>> {
    let hd = p.head_dim;
    // Keys any query of the block can see.
    let (k0, k1) = match p.radius {
        Some(r) => (t.q0.saturating_sub(r), (t.q1 + r).min(t.len)),
        None => (0, t.len),
    };
    let (nq, nk) = (t.q1 - t.q0, k1 - k0);
    fn head_view<'a>(
        x: &'a CpuTensor,
        t: &Task,
        hd: usize,
        first: usize,
        rows: usize,
    ) -> MatRef<'a> {
        MatRef {
            data: x.data(),
            offset: (t.start + first) * x.cols + t.head * hd,
            rows,
            cols: hd,
            rs: x.cols,
            cs: 1,
        }
    }
    let mut scores = vec![0.0f32; nq * nk];
    dense::gemm(
        MatMut {
            data: &mut scores,
            offset: 0,
            rs: nk,
            cs: 1,
        },
        head_view(q, t, hd, t.q0, nq),
        head_view(k, t, hd, k0, nk).t(),
        p.scale,
        1,
    )?;
    for (i, row) in scores.chunks_exact_mut(nk).enumerate() {
        let qi = t.q0 + i;
        let (lo, hi) = match p.radius {
            Some(r) => (qi.saturating_sub(r).max(k0) - k0, (qi + r + 1).min(k1) - k0),
            None => (0, nk),
        };
        crate::math::softmax(avx2, &mut row[lo..hi]);
        row[..lo].fill(0.0);
        row[hi..].fill(0.0);
    }
    let mut out = vec![0.0f32; nq * hd];
    dense::gemm(
        MatMut {
            data: &mut out,
            offset: 0,
            rs: hd,
            cs: 1,
        },
        MatRef::row_major(&scores, nq, nk),
        head_view(v, t, hd, k0, nk),
        1.0,
        1,
    )?;
    Ok(out)
}
