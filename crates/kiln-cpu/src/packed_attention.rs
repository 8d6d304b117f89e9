//! Bidirectional attention over a packed batch of variable-length sequences (encoders).
//!
//! Work is split into tasks of (sequence, head). A task gathers its head's keys (transposed)
//! and values into contiguous buffers once, then takes its queries in blocks of
//! [`QUERY_BLOCK`]: scores `Q·Kᵀ` against the key tiles the block can see (FMA register tiles),
//! the softmax row by row (vectorized `exp`), and the product with `V` the same way. Nothing is
//! computed across sequences, so packing wastes no work on padding, and the score buffer is at
//! most `QUERY_BLOCK × keys`, so long sequences never materialise an `L × L` matrix.
//!
//! Each output element is produced by one task with a fixed instruction sequence, so results do
//! not depend on the thread count or on what else is in the batch.

use kiln_backend::{shape_err, PackedAttentionParams, Result};
use rayon::prelude::*;

use crate::{CpuBackend, CpuTensor};

/// Queries per task: bounds the score buffer and gives the pool enough tasks for one long text.
const QUERY_BLOCK: usize = 64;

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
                avx2,
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
    let mut out = vec![0.0f32; total * cols];
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
    avx2: bool,
}

/// Register tile of the two products: `ROWS` queries × `LANES` keys (scores) or `LANES` head
/// dims (output). 4 × 16 f32 accumulators are 8 AVX2 registers.
const ROWS: usize = 4;
const LANES: usize = 16;

/// The first `LANES` values of `s` as an array (the callers' buffers are padded to whole
/// tiles, so `s` is always long enough; zeros otherwise).
#[inline(always)]
fn lanes(s: &[f32]) -> &[f32; LANES] {
    const ZERO: [f32; LANES] = [0.0; LANES];
    s.get(..LANES)
        .and_then(|s| s.first_chunk::<LANES>())
        .unwrap_or(&ZERO)
}

/// `acc[i][l] = Σ_t x[i][t] · b[t·ldb + c0 + l]` for `t < len`, summed in order of `t` with a
/// fused multiply-add at each step. The AVX2 build and the portable one (`f32::mul_add`, exactly
/// rounded too) give identical bits.
#[inline(always)]
fn tile(
    avx2: bool,
    x: [&[f32]; ROWS],
    b: &[f32],
    ldb: usize,
    c0: usize,
    len: usize,
) -> [[f32; LANES]; ROWS] {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only true when the CPU reports AVX2 and FMA.
        return unsafe { tile_avx2(x, b, ldb, c0, len) };
    }
    let _ = avx2;
    let mut acc = [[0.0f32; LANES]; ROWS];
    for t in 0..len {
        let br = lanes(b.get(t * ldb + c0..).unwrap_or_default());
        for (a, xr) in acc.iter_mut().zip(&x) {
            let xv = xr.get(t).copied().unwrap_or(0.0);
            for (a, &bv) in a.iter_mut().zip(br) {
                *a = xv.mul_add(bv, *a);
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(
    x: [&[f32]; ROWS],
    b: &[f32],
    ldb: usize,
    c0: usize,
    len: usize,
) -> [[f32; LANES]; ROWS] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
    for t in 0..len {
        let br = lanes(b.get(t * ldb + c0..).unwrap_or_default());
        // SAFETY: `br` is 16 floats: two unaligned 8-float loads stay inside it.
        let (b0, b1) = unsafe {
            (
                _mm256_loadu_ps(br.as_ptr()),
                _mm256_loadu_ps(br.as_ptr().add(8)),
            )
        };
        for (a, xr) in acc.iter_mut().zip(&x) {
            let xv = _mm256_set1_ps(xr.get(t).copied().unwrap_or(0.0));
            a[0] = _mm256_fmadd_ps(xv, b0, a[0]);
            a[1] = _mm256_fmadd_ps(xv, b1, a[1]);
        }
    }
    let mut out = [[0.0f32; LANES]; ROWS];
    for (o, a) in out.iter_mut().zip(&acc) {
        // SAFETY: each `o` is 16 floats: two unaligned 8-float stores stay inside it.
        unsafe {
            _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
        }
    }
    out
}

crate::math::avx2_dispatch!(
    /// [`attend_impl`], with its softmax vectorized when `avx2`.
    fn attend(b: &Block<'_>, out: &mut [f32]) => attend_impl
);

/// `out = softmax(scale · Q Kᵀ) V` for one (sequence, head). Keys (transposed) and values are
/// gathered once into zero-padded contiguous copies; queries then go by blocks of
/// [`QUERY_BLOCK`], each against the key tiles it can see, so that both products run as
/// `ROWS × LANES` FMA register tiles over contiguous rows and the score buffer stays
/// `QUERY_BLOCK × keys`. Every output element sums in a fixed order.
#[inline(always)]
fn attend_impl(b: &Block<'_>, out: &mut [f32]) {
    let (hd, nq, nk) = (b.hd, b.len, b.len);
    let nk_pad = nk.div_ceil(LANES) * LANES;
    let hd_pad = hd.div_ceil(LANES) * LANES;
    let row = |r: usize| r * b.cols + b.col0..r * b.cols + b.col0 + hd;
    // Kᵀ as [hd][nk_pad] and V as [nk_pad][hd_pad]; padding stays zero. Queries are read in place.
    let mut kt = vec![0.0f32; hd * nk_pad];
    let mut vv = vec![0.0f32; nk_pad * hd_pad];
    for j in 0..nk {
        let kr = &b.k[row(b.row0 + j)];
        for (d, &x) in kr.iter().enumerate() {
            kt[d * nk_pad + j] = x;
        }
        vv[j * hd_pad..j * hd_pad + hd].copy_from_slice(&b.v[row(b.row0 + j)]);
    }
    let mut scores = vec![0.0f32; QUERY_BLOCK.min(nq) * nk_pad];
    for qb0 in (0..nq).step_by(QUERY_BLOCK) {
        let qb1 = (qb0 + QUERY_BLOCK).min(nq);
        // Key tiles this block can see: [jt0, jt1), whole tiles.
        let (k0, k1) = match b.radius {
            Some(r) => (qb0.saturating_sub(r), (qb1 + r).min(nk)),
            None => (0, nk),
        };
        let jt0 = k0 / LANES * LANES;
        let jt1 = (k1.div_ceil(LANES) * LANES).min(nk_pad);
        let nkb = jt1 - jt0;
        // Scores, ROWS queries at a time (a short last group repeats its last row, unstored).
        for i0 in (qb0..qb1).step_by(ROWS) {
            let ni = (qb1 - i0).min(ROWS);
            let qrow = |i: usize| &b.q[row(b.row0 + i0 + i.min(ni - 1))];
            let qrows = [qrow(0), qrow(1), qrow(2), qrow(3)];
            for j0 in (jt0..jt1).step_by(LANES) {
                let acc = tile(b.avx2, qrows, &kt, nk_pad, j0, hd);
                for (i, a) in acc.iter().enumerate().take(ni) {
                    let at = (i0 - qb0 + i) * nkb + (j0 - jt0);
                    for (s, &v) in scores[at..at + LANES].iter_mut().zip(a) {
                        *s = v * b.scale;
                    }
                }
            }
        }
        // Softmax over each query's visible keys; everything else (window, padding) weighs 0.
        for (i, srow) in scores[..(qb1 - qb0) * nkb]
            .chunks_exact_mut(nkb)
            .enumerate()
        {
            let qi = qb0 + i;
            let (lo, hi) = match b.radius {
                Some(r) => (qi.saturating_sub(r), (qi + r + 1).min(nk)),
                None => (0, nk),
            };
            let (lo, hi) = (lo - jt0, hi - jt0);
            crate::math::softmax_in_place(&mut srow[lo..hi]);
            srow[..lo].fill(0.0);
            srow[hi..].fill(0.0);
        }
        // Output = P · V, ROWS queries × LANES head dims at a time.
        let vblock = &vv[jt0 * hd_pad..];
        for i0 in (qb0..qb1).step_by(ROWS) {
            let ni = (qb1 - i0).min(ROWS);
            let prow = |i: usize| &scores[(i0 - qb0 + i.min(ni - 1)) * nkb..][..nkb];
            let prows = [prow(0), prow(1), prow(2), prow(3)];
            for c0 in (0..hd_pad).step_by(LANES) {
                let acc = tile(b.avx2, prows, vblock, hd_pad, c0, nkb);
                let width = LANES.min(hd - c0);
                for (i, a) in acc.iter().enumerate().take(ni) {
                    let at = (i0 + i) * hd + c0;
                    out[at..at + width].copy_from_slice(&a[..width]);
                }
            }
        }
    }
}
