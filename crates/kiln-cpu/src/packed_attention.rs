//! Bidirectional attention over a packed batch of variable-length sequences (encoders).
//!
//! Work is split into tasks of (sequence, head). A task packs its head's keys and values once
//! into the weight-panel layout of the GEMM micro-kernel ([`crate::sgemm`]): `Kᵀ` as panels of
//! [`NR`] keys × `head_dim` steps, `V` as panels of [`NR`] head dims × `keys` steps. It then takes
//! its queries [`MR`] at a time: the six query rows are packed as one activation panel, their
//! scores against every key panel they can see come from the `MR × NR` FMA micro-kernel, the
//! unnormalized softmax runs row by row (vectorized `exp`), the six probability rows are packed
//! the same way, and one more micro-kernel call per value panel gives the output, scaled by each
//! row's `1 / Σ`. Nothing is computed across sequences, so packing wastes no work on padding,
//! and the score buffer is `MR × keys`: long sequences never materialise an `L × L` matrix.
//!
//! Each output element is produced by one task with a fixed instruction sequence (the scalar
//! fallback uses `f32::mul_add` in the micro-kernel's order), so results do not depend on the
//! thread count, the SIMD level or on what else is in the batch.

use kiln_backend::{shape_err, PackedAttentionParams, Result};
use rayon::prelude::*;

use crate::sgemm::{fma_tile, pack_rows, Isa, PanelRow, MR, NR};
use crate::{CpuBackend, CpuTensor};

pub(crate) fn packed_attention(
    cpu: &CpuBackend,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    seq_lens: &[usize],
    p: &PackedAttentionParams,
) -> Result<CpuTensor> {
    let (hd, cols) = (p.head_dim, p.n_heads * p.head_dim);
    let total: usize = seq_lens.iter().sum();
    if hd == 0 || [q, k, v].iter().any(|t| t.cols != cols || t.rows != total) {
        return Err(shape_err(
            "packed_attention",
            format!(
                "q [{}, {}], k [{}, {}], v [{}, {}] for {} heads of {} and {total} packed rows",
                q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, p.n_heads, p.head_dim
            ),
        ));
    }
    let avx2 = cpu.avx2();
    let isa = Isa::avx2(avx2);
    let mut tasks = Vec::new();
    let mut row0 = 0;
    for &len in seq_lens {
        for head in 0..p.n_heads {
            tasks.push(Block {
                q: q.data(),
                k: k.data(),
                v: v.data(),
                cols,
                hd,
                col0: head * hd,
                row0,
                len,
                scale: p.scale,
                radius: p.radius,
                isa,
            });
        }
        row0 += len;
    }
    let results: Vec<Vec<f32>> = cpu.pool.install(|| {
        tasks
            .par_iter()
            .map(|b| {
                let mut out = vec![0.0f32; b.len * hd];
                attend(avx2, b, &mut out);
                out
            })
            .collect()
    });
    // The tasks' rows and head columns cover it.
    let mut out = crate::buffers::take(total * cols);
    for (b, result) in tasks.iter().zip(&results) {
        for (i, row) in result.chunks_exact(hd).enumerate() {
            let at = (b.row0 + i) * cols + b.col0;
            out[at..at + hd].copy_from_slice(row);
        }
    }
    CpuTensor::new(out, total, cols)
}

/// One task: one head of one sequence of the packed tensors.
struct Block<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// Row length of q, k and v (all heads).
    cols: usize,
    hd: usize,
    /// First column of the head.
    col0: usize,
    /// First row of the sequence.
    row0: usize,
    len: usize,
    scale: f32,
    radius: Option<usize>,
    isa: Isa,
}

crate::math::avx2_dispatch!(
    /// [`attend_impl`], with its softmax vectorized when `avx2`.
    fn attend(b: &Block<'_>, out: &mut [f32]) => attend_impl
);

/// `out = softmax(scale · Q Kᵀ) V` for one (sequence, head), `out` row-major `[len, hd]`.
/// See the module docs for the steps; keys past the visible window of a query (or past the
/// sequence, in the last panel) get weight 0.
#[inline(always)]
fn attend_impl(b: &Block<'_>, out: &mut [f32]) {
    let (hd, n, isa) = (b.hd, b.len, b.isa);
    let n_pad = n.div_ceil(NR) * NR;
    let dim_panels = hd.div_ceil(NR);
    let row = |r: usize| {
        let at = (b.row0 + r) * b.cols + b.col0;
        at..at + hd
    };
    // Kᵀ: panel p, step d holds dim d of keys p·NR .. p·NR + NR. V: panel c, step j holds dims
    // c·NR .. c·NR + NR of key j. Padding (keys past n, dims past hd) stays zero.
    let mut kp = vec![PanelRow([0.0; NR]); n_pad / NR * hd];
    let mut vp = vec![PanelRow([0.0; NR]); dim_panels * n_pad];
    for (p, panel) in kp.chunks_exact_mut(hd).enumerate() {
        let keys: Vec<&[f32]> = (p * NR..n.min(p * NR + NR)).map(|j| &b.k[row(j)]).collect();
        for (d, step) in panel.iter_mut().enumerate() {
            for (x, key) in step.0.iter_mut().zip(&keys) {
                *x = key[d];
            }
        }
    }
    for j in 0..n {
        for (c, dims) in b.v[row(j)].chunks(NR).enumerate() {
            vp[c * n_pad + j].0[..dims.len()].copy_from_slice(dims);
        }
    }
    let visible = |i: usize| match b.radius {
        Some(r) => (i.saturating_sub(r), (i + r + 1).min(n)),
        None => (0, n),
    };
    let mut qa = vec![0.0f32; MR * hd];
    let mut scores = vec![0.0f32; MR * n_pad];
    let mut pa = vec![0.0f32; MR * n_pad];
    for i0 in (0..n).step_by(MR) {
        // Rows past the sequence repeat its last query; they are computed but never stored.
        let ni = MR.min(n - i0);
        let last = |i: usize| i0 + i.min(ni - 1);
        // Whole key panels [j0, j1) that some query of the group can see.
        let (j0, j1) = (
            visible(i0).0 / NR * NR,
            visible(i0 + ni - 1).1.div_ceil(NR) * NR,
        );
        let w = j1 - j0;
        let qrows: [&[f32]; MR] = std::array::from_fn(|i| &b.q[row(last(i))]);
        pack_rows(isa, &qrows, &mut qa);
        for p in j0 / NR..j1 / NR {
            let sums = fma_tile(isa, hd, &qa, &kp[p * hd..(p + 1) * hd]);
            for (i, s) in sums.iter().enumerate() {
                let at = i * w + p * NR - j0;
                for (d, &v) in scores[at..at + NR].iter_mut().zip(s) {
                    *d = v * b.scale;
                }
            }
        }
        let mut inv = [0.0f32; MR];
        for (i, inv) in inv.iter_mut().enumerate().take(ni) {
            let (lo, hi) = visible(i0 + i);
            let srow = &mut scores[i * w..(i + 1) * w];
            *inv = 1.0 / crate::math::exp_shifted_in_place(&mut srow[lo - j0..hi - j0]);
            srow[..lo - j0].fill(0.0);
            srow[hi - j0..].fill(0.0);
        }
        let prows: [&[f32]; MR] =
            std::array::from_fn(|i| &scores[i.min(ni - 1) * w..(i.min(ni - 1) + 1) * w]);
        let pa = &mut pa[..MR * w];
        pack_rows(isa, &prows, pa);
        for c in 0..dim_panels {
            let sums = fma_tile(isa, w, pa, &vp[c * n_pad + j0..c * n_pad + j1]);
            let width = NR.min(hd - c * NR);
            for (i, (s, &inv)) in sums.iter().zip(&inv).enumerate().take(ni) {
                let at = (i0 + i) * hd + c * NR;
                for (d, &v) in out[at..at + width].iter_mut().zip(s) {
                    *d = v * inv;
                }
            }
        }
    }
}
