//! Bidirectional attention over a packed batch of variable-length sequences (encoders).
//!
//! Work is split into tasks of (sequence, head), and each task computes its head of its sequence
//! with the `MR × NR` FMA micro-kernel of the GEMM ([`crate::sgemm`]), in transposed form so that
//! neither the scores nor the probabilities are ever transposed:
//!
//! 1. **Once per task**, keys are packed as activation panels of [`MR`] keys × `head_dim` steps
//!    and values as activation panels of [`MR`] head dims × `keys` steps (a copy, not a
//!    transpose: six neighbouring dims of one key are one step).
//! 2. **Per group of [`NR`] queries**, the scaled queries become one weight panel (`head_dim`
//!    rows of 16 queries). Each micro-kernel call over a key panel gives six rows of `Sᵀ`: one
//!    key, its scores against the 16 queries (two key panels per call where the group sees two:
//!    twelve independent sums keep the FMA units busy where six leave their latency exposed).
//!    The softmax then runs down the columns of `Sᵀ`, one query per SIMD lane (vertical max, `exp`, vertical sum: no horizontal reductions),
//!    in place, which leaves `Pᵀ` in exactly the weight-panel layout the second product wants.
//! 3. One micro-kernel call per value panel (two, paired as above) gives `(P V)ᵀ` for six dims ×
//!    16 queries, stored transposed into the output scaled by each query's `1 / Σ`.
//!
//! Nothing is computed across sequences, so packing wastes no work on padding, and the score
//! buffer is `keys × NR`: long sequences never materialise an `L × L` matrix. Scratch buffers
//! live as long as a worker's run of tasks, and each task writes its rows of its head's columns
//! straight into the output (those rectangles are disjoint and cover it).
//!
//! Each output element is produced by one task with a fixed instruction sequence that depends
//! only on its sequence (the scalar fallback uses `f32::mul_add` in the micro-kernel's order,
//! the AVX-512 build the same chains in 16-lane registers, and the softmax is the same
//! element-wise code in every build), so results do not depend on the thread count, the SIMD
//! level or on what else is in the batch.

use kiln_backend::{shape_err, PackedAttentionParams, Result};

use crate::context::Context;
use crate::kernels::prefetch_rows;
use crate::sgemm::{fma_tiles, pack_rows, Isa, PanelRow, MR, NR};
use crate::team::Disjoint;
use crate::tensor::CpuTensor;

pub(crate) fn packed_attention(
    cpu: &Context,
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
    let isa = Isa::for_level(cpu.simd);
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
    let mut data = crate::buffers::take(total * cols);
    // Debug builds (and so the tests) poison the recycled buffer, so that an element no task
    // wrote shows as NaN.
    #[cfg(debug_assertions)]
    data.fill(f32::NAN);
    let out = Disjoint::new(&mut data);
    cpu.team
        .for_each_with(tasks.len(), Scratch::default, |s, i| {
            attend(&tasks[i], s, &out)
        });
    // Every element is written: the tasks' rows and head columns cover the output.
    CpuTensor::new(data, total, cols)
}

/// Key panels whose rows of q, k and v are requested ahead of the copies (see `attend_impl`).
const PREFETCH_PANELS: usize = 4;

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

/// A worker's buffers, reused from task to task (each task overwrites what it reads).
#[derive(Default)]
struct Scratch {
    /// Key panels: panel `p`, step `d` holds dim `d` of keys `p·MR .. p·MR + MR`.
    keys: Vec<f32>,
    /// Value panels: panel `c`, step `j` holds dims `c·MR .. c·MR + MR` of key `j`.
    values: Vec<f32>,
    /// The query group as a weight panel: row `d` holds `scale · q[d]` of its 16 queries.
    queries: Vec<PanelRow>,
    /// `Sᵀ`, then `Pᵀ`: row `j` holds key `j`'s scores (probabilities) for the 16 queries.
    scores: Vec<PanelRow>,
    /// `(P V)ᵀ` of the group: row `d` holds dim `d` of the 16 queries' outputs.
    sums: Vec<PanelRow>,
    /// A zero key, for the rows of the last key panel past the sequence.
    zeros: Vec<f32>,
}

/// `v` with length `len`; its values are unspecified (callers overwrite what they read).
fn sized<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) -> &mut [T] {
    v.resize(len, fill);
    &mut v[..len]
}

/// [`attend_impl`], built for the block's instruction set (`Isa` values exist only where the CPU
/// has them). The softmax and the copies are element-wise, so 8 or 16 lanes give the same bits.
fn attend(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
            attend_impl(b, s, out)
        }
        #[target_feature(enable = "avx2,fma,avx512f")]
        unsafe fn avx512(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
            attend_impl(b, s, out)
        }
        match b.isa {
            // SAFETY: `Isa::Avx2` exists only where the CPU has AVX2 and FMA.
            Isa::Avx2 => return unsafe { avx2(b, s, out) },
            // SAFETY: `Isa::Avx512` exists only where the CPU has AVX-512 F, AVX2 and FMA.
            Isa::Avx512 => return unsafe { avx512(b, s, out) },
            Isa::Scalar => {}
        }
    }
    attend_impl(b, s, out)
}

/// `softmax(scale · Q Kᵀ) V` for one (sequence, head), into its rows and columns of `out`
/// (row-major, `b.cols` wide). See the module docs for the steps; keys outside the visible
/// window of a query (and the padding of the last key panel) get weight 0.
#[inline(always)]
fn attend_impl(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
    let (hd, n, isa) = (b.hd, b.len, b.isa);
    if n == 0 {
        return;
    }
    let key_panels = n.div_ceil(MR);
    let n_pad = key_panels * MR;
    let dim_panels = hd.div_ceil(MR);
    let row = |r: usize| {
        let at = (b.row0 + r) * b.cols + b.col0;
        at..at + hd
    };
    // Only ever grown with zeros, never written.
    let zeros = &*sized(&mut s.zeros, hd, 0.0);
    let keys = sized(&mut s.keys, key_panels * hd * MR, 0.0);
    // The head's rows of q, k and v are pieces of rows a few KiB apart, rarely in cache (MiniLM's
    // batch of 32 x 256 tokens makes 12 MB of each): requested a few key panels ahead, so that
    // the copies below do not wait for one miss after another.
    let prefetch = |p: usize| {
        for j in (p * MR).min(n)..((p + 1) * MR).min(n) {
            prefetch_rows::<f32>(&[&b.k[row(j)], &b.v[row(j)], &b.q[row(j)]]);
        }
    };
    (0..PREFETCH_PANELS).for_each(prefetch);
    for (p, panel) in keys.chunks_exact_mut(hd * MR).enumerate() {
        prefetch(p + PREFETCH_PANELS);
        let rows: [&[f32]; MR] = std::array::from_fn(|r| {
            let j = p * MR + r;
            if j < n {
                &b.k[row(j)]
            } else {
                zeros
            }
        });
        pack_rows(isa, &rows, panel);
    }
    let values = sized(&mut s.values, dim_panels * n_pad * MR, 0.0);
    for (c, panel) in values.chunks_exact_mut(n_pad * MR).enumerate() {
        let (d0, width) = (c * MR, MR.min(hd - c * MR));
        for (j, step) in panel.chunks_exact_mut(MR).enumerate() {
            let src = if j < n {
                &b.v[row(j)][d0..d0 + width]
            } else {
                &[]
            };
            match <&[f32; MR]>::try_from(src) {
                // A fixed-size copy: `copy_from_slice` of a run-time length is a `memcpy` call.
                Ok(full) => step.copy_from_slice(full),
                Err(_) => {
                    for (r, x) in step.iter_mut().enumerate() {
                        *x = src.get(r).copied().unwrap_or(0.0);
                    }
                }
            }
        }
    }
    let visible = |i: usize| match b.radius {
        Some(r) => (i.saturating_sub(r), (i + r + 1).min(n)),
        None => (0, n),
    };
    let queries = sized(&mut s.queries, hd, PanelRow([0.0; NR]));
    let scores = sized(&mut s.scores, n_pad, PanelRow([0.0; NR]));
    let sums = sized(&mut s.sums, dim_panels * MR, PanelRow([0.0; NR]));
    for i0 in (0..n).step_by(NR) {
        let nq = NR.min(n - i0);
        // Lanes past the sequence stand for its last query (zero query, its window): they are
        // computed but never stored.
        let query = |lane: usize| i0 + lane.min(nq - 1);
        // Dim by dim, so that each step is written whole (lane by lane, each store went to
        // another cache line: 16 % of this function's time on MiniLM).
        let srcs: [&[f32]; NR] = std::array::from_fn(|lane| {
            if lane < nq {
                &b.q[row(i0 + lane)]
            } else {
                zeros
            }
        });
        for (d, step) in queries.iter_mut().enumerate() {
            for (x, src) in step.0.iter_mut().zip(&srcs) {
                *x = src[d] * b.scale;
            }
        }
        // Whole key panels [j0, j1) that some query of the group can see, and the keys
        // [all_lo, all_hi) that every query of it sees.
        let (lo, all_hi) = visible(i0);
        let (all_lo, hi) = visible(query(NR - 1));
        let (j0, j1) = (lo / MR * MR, hi.div_ceil(MR) * MR);
        // Key panels [j0 / MR, j1 / MR), two per call (twelve sums in flight).
        let panel = |i: usize| &keys[(j0 / MR + i) * hd * MR..(j0 / MR + i + 1) * hd * MR];
        fma_tiles(isa, hd, (j1 - j0) / MR, panel, queries, &mut scores[j0..j1]);
        let rows = &mut scores[j0..j1];
        let windows: [(usize, usize); NR] = std::array::from_fn(|lane| visible(query(lane)));
        for (j, r) in (j0..j1).zip(rows.iter_mut()) {
            if j < all_lo || j >= all_hi {
                for (x, &(l, h)) in r.0.iter_mut().zip(&windows) {
                    if j < l || j >= h {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let mut max = [f32::NEG_INFINITY; NR];
        for r in rows.iter() {
            for (m, &x) in max.iter_mut().zip(&r.0) {
                *m = if x > *m { x } else { *m };
            }
        }
        let mut total = [0.0f32; NR];
        for r in rows.iter_mut() {
            for ((x, &m), t) in r.0.iter_mut().zip(&max).zip(total.iter_mut()) {
                *x = crate::math::exp_nonpositive(*x - m);
                *t += *x;
            }
        }
        let inv = total.map(|t| 1.0 / t);
        // The visible keys of each dim panel, two panels per call as above.
        let steps = |c: usize| &values[c * n_pad * MR + j0 * MR..c * n_pad * MR + j1 * MR];
        fma_tiles(isa, j1 - j0, dim_panels, steps, rows, sums);
        for (lane, &inv) in inv.iter().enumerate().take(nq) {
            // SAFETY: this task is the only one that writes the head's columns of the
            // sequence's rows, and it holds one such row at a time.
            let dst = unsafe { out.slice(row(i0 + lane)) };
            for (x, d) in dst.iter_mut().zip(sums.iter()) {
                *x = d.0[lane] * inv;
            }
        }
    }
}
