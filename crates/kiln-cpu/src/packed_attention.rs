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
        let mut rows: [&[f32]; MR] = [zeros; MR];
        for (r, src) in rows.iter_mut().enumerate() {
            if p * MR + r < n {
                *src = &b.k[row(p * MR + r)];
            }
        }
        pack_rows(isa, &rows, panel);
    }
    let values = sized(&mut s.values, dim_panels * n_pad * MR, 0.0);
    // Key by key (its row read once), each dim panel's step of it: panel `c`, step `j` at
    // `c·n_pad·MR + j·MR`. Steps past the sequence and dims past `hd` are zero.
    for j in 0..n_pad {
        let src = if j < n { &b.v[row(j)] } else { zeros };
        for c in 0..dim_panels {
            let at = c * n_pad * MR + j * MR;
            let step = &mut values[at..at + MR];
            let d0 = c * MR;
            match src.get(d0..d0 + MR) {
                // `d0..d0 + MR`: a fixed-size copy, not a `memcpy` call.
                Some(full) => step.copy_from_slice(full),
                None => {
                    for (r, x) in step.iter_mut().enumerate() {
                        *x = src.get(d0 + r).copied().unwrap_or(0.0);
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
        // Plain loops, not `array::from_fn`: its closures stayed calls here (as in the key
        // panels above).
        let mut srcs: [&[f32]; NR] = [zeros; NR];
        for (lane, src) in srcs.iter_mut().enumerate().take(nq) {
            *src = &b.q[row(i0 + lane)];
        }
        fill_queries(isa, &srcs, b.scale, queries);
        // Whole key panels [j0, j1) that some query of the group can see, and the keys
        // [all_lo, all_hi) that every query of it sees.
        let (lo, all_hi) = visible(i0);
        let (all_lo, hi) = visible(query(NR - 1));
        let (j0, j1) = (lo / MR * MR, hi.div_ceil(MR) * MR);
        // Key panels [j0 / MR, j1 / MR), two per call (twelve sums in flight).
        let panel = |i: usize| &keys[(j0 / MR + i) * hd * MR..(j0 / MR + i + 1) * hd * MR];
        fma_tiles(isa, hd, (j1 - j0) / MR, panel, queries, &mut scores[j0..j1]);
        let rows = &mut scores[j0..j1];
        let mut windows = [(0, n); NR];
        if b.radius.is_some() {
            for (lane, w) in windows.iter_mut().enumerate() {
                *w = visible(query(lane));
            }
        }
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
        let mut dsts: [Option<&mut [f32]>; NR] = [const { None }; NR];
        for (lane, dst) in dsts.iter_mut().enumerate().take(nq) {
            // SAFETY: this task is the only one that writes the head's columns of the
            // sequence's rows, and the lanes name distinct rows.
            *dst = Some(unsafe { out.slice(row(i0 + lane)) });
        }
        store_outputs(isa, &sums[..hd], &inv, &mut dsts);
    }
}

/// The query group as a weight panel: `queries[d].0[lane] = scale · srcs[lane][d]` for every
/// `d < queries.len()` (each source at least that long). One multiply per element in every
/// build, so the bits do not depend on the level; the SIMD builds transpose 16 × 16 (AVX-512) or
/// 8 × 8 (AVX2) blocks in registers where the head dim is a multiple of the block, instead of
/// gathering one value per row for each lane.
#[inline(always)]
fn fill_queries(isa: Isa, srcs: &[&[f32]; NR], scale: f32, queries: &mut [PanelRow]) {
    let hd = queries.len();
    assert!(srcs.iter().all(|r| r.len() >= hd), "short query row");
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the levels exist only where the CPU has them; the assert proves every source
        // holds `hd` values, and `queries` has `hd` rows.
        if isa == Isa::Avx512 && hd.is_multiple_of(16) {
            return unsafe { x86::queries16(srcs, scale, queries) };
        }
        if matches!(isa, Isa::Avx2 | Isa::Avx512) && hd.is_multiple_of(8) {
            return unsafe { x86::queries8(srcs, scale, queries) };
        }
    }
    let _ = isa;
    // Dim by dim, so that each step is written whole (lane by lane, each store went to
    // another cache line: 16 % of this function's time on MiniLM).
    for (d, step) in queries.iter_mut().enumerate() {
        for (x, src) in step.0.iter_mut().zip(srcs) {
            *x = src[d] * scale;
        }
    }
}

/// The group's outputs: `dsts[lane][d] = sums[d].0[lane] · inv[lane]` for every
/// `d < sums.len()` and every lane with a destination (each at least that long). One multiply
/// per element in every build, as in [`fill_queries`], whose blocks it transposes back.
#[inline(always)]
fn store_outputs(
    isa: Isa,
    sums: &[PanelRow],
    inv: &[f32; NR],
    dsts: &mut [Option<&mut [f32]>; NR],
) {
    let hd = sums.len();
    assert!(
        dsts.iter().flatten().all(|d| d.len() >= hd),
        "short output row"
    );
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `fill_queries`; the assert proves every destination holds `hd` values.
        if isa == Isa::Avx512 && hd.is_multiple_of(16) {
            return unsafe { x86::outputs16(sums, inv, dsts) };
        }
        if matches!(isa, Isa::Avx2 | Isa::Avx512) && hd.is_multiple_of(8) {
            return unsafe { x86::outputs8(sums, inv, dsts) };
        }
    }
    let _ = isa;
    for (lane, dst) in dsts.iter_mut().enumerate() {
        if let Some(dst) = dst {
            for (x, d) in dst.iter_mut().zip(sums) {
                *x = d.0[lane] * inv[lane];
            }
        }
    }
}

/// Register transposes for [`fill_queries`] and [`store_outputs`].
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::sgemm::{PanelRow, NR};

    /// Rows `r[i]` of an 8 × 8 block as columns: `out[c][i] = r[i][c]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // Pairs of rows interleaved, then quads (within each 128-bit half), then the halves.
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4h + j]: rows 4h..4h + 4 of columns j (low half) and j + 4 (high half).
        let mut u = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            let (lo, hi) = (t[4 * h], t[4 * h + 1]);
            let (lo2, hi2) = (t[4 * h + 2], t[4 * h + 3]);
            u[4 * h] = _mm256_shuffle_ps::<0x44>(lo, lo2);
            u[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(lo, lo2);
            u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(hi, hi2);
            u[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(hi, hi2);
        }
        let mut out = [_mm256_setzero_ps(); 8];
        for j in 0..4 {
            out[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
            out[j + 4] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
        }
        out
    }

    /// Rows `r[i]` of a 16 × 16 block as columns: `out[c][i] = r[i][c]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4q + j]: in 128-bit lane `l`, rows 4q..4q + 4 of column 4l + j.
        let mut u = [_mm512_setzero_ps(); 16];
        for q in 0..4 {
            let (lo, hi) = (t[4 * q], t[4 * q + 1]);
            let (lo2, hi2) = (t[4 * q + 2], t[4 * q + 3]);
            u[4 * q] = _mm512_shuffle_ps::<0x44>(lo, lo2);
            u[4 * q + 1] = _mm512_shuffle_ps::<0xEE>(lo, lo2);
            u[4 * q + 2] = _mm512_shuffle_ps::<0x44>(hi, hi2);
            u[4 * q + 3] = _mm512_shuffle_ps::<0xEE>(hi, hi2);
        }
        let mut out = [_mm512_setzero_ps(); 16];
        for j in 0..4 {
            // Lanes 0 and 2 / 1 and 3 of rows 0..8, then of rows 8..16.
            let v = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
            let w = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
            let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
            let w2 = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_f32x4::<0x88>(v, v2);
            out[8 + j] = _mm512_shuffle_f32x4::<0xDD>(v, v2);
            out[4 + j] = _mm512_shuffle_f32x4::<0x88>(w, w2);
            out[12 + j] = _mm512_shuffle_f32x4::<0xDD>(w, w2);
        }
        out
    }

    /// `super::fill_queries` in 8 × 8 blocks.
    ///
    /// # Safety
    /// AVX2 and FMA; every source holds `queries.len()` values, a multiple of 8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn queries8(srcs: &[&[f32]; NR], scale: f32, queries: &mut [PanelRow]) {
        let s = _mm256_set1_ps(scale);
        for d0 in (0..queries.len()).step_by(8) {
            for l0 in [0, 8] {
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, r) in r.iter_mut().enumerate() {
                    *r = _mm256_mul_ps(_mm256_loadu_ps(srcs[l0 + i].as_ptr().add(d0)), s);
                }
                for (i, c) in transpose8(r).into_iter().enumerate() {
                    _mm256_store_ps(queries[d0 + i].0.as_mut_ptr().add(l0), c);
                }
            }
        }
    }

    /// `super::fill_queries` in 16 × 16 blocks.
    ///
    /// # Safety
    /// AVX-512 F; every source holds `queries.len()` values, a multiple of 16.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn queries16(srcs: &[&[f32]; NR], scale: f32, queries: &mut [PanelRow]) {
        let s = _mm512_set1_ps(scale);
        for d0 in (0..queries.len()).step_by(16) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (r, src) in r.iter_mut().zip(srcs) {
                *r = _mm512_mul_ps(_mm512_loadu_ps(src.as_ptr().add(d0)), s);
            }
            for (i, c) in transpose16(r).into_iter().enumerate() {
                _mm512_store_ps(queries[d0 + i].0.as_mut_ptr(), c);
            }
        }
    }

    /// `super::store_outputs` in 8 × 8 blocks.
    ///
    /// # Safety
    /// AVX2 and FMA; `sums.len()` is a multiple of 8 and every destination holds that many.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn outputs8(
        sums: &[PanelRow],
        inv: &[f32; NR],
        dsts: &mut [Option<&mut [f32]>; NR],
    ) {
        for l0 in [0, 8] {
            let iv = _mm256_loadu_ps(inv.as_ptr().add(l0));
            for d0 in (0..sums.len()).step_by(8) {
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, r) in r.iter_mut().enumerate() {
                    *r = _mm256_mul_ps(_mm256_load_ps(sums[d0 + i].0.as_ptr().add(l0)), iv);
                }
                for (c, dst) in transpose8(r).into_iter().zip(&mut dsts[l0..l0 + 8]) {
                    if let Some(dst) = dst {
                        _mm256_storeu_ps(dst.as_mut_ptr().add(d0), c);
                    }
                }
            }
        }
    }

    /// `super::store_outputs` in 16 × 16 blocks.
    ///
    /// # Safety
    /// AVX-512 F; `sums.len()` is a multiple of 16 and every destination holds that many.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn outputs16(
        sums: &[PanelRow],
        inv: &[f32; NR],
        dsts: &mut [Option<&mut [f32]>; NR],
    ) {
        let iv = _mm512_loadu_ps(inv.as_ptr());
        for d0 in (0..sums.len()).step_by(16) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, r) in r.iter_mut().enumerate() {
                *r = _mm512_mul_ps(_mm512_load_ps(sums[d0 + i].0.as_ptr()), iv);
            }
            for (c, dst) in transpose16(r).into_iter().zip(dsts.iter_mut()) {
                if let Some(dst) = dst {
                    _mm512_storeu_ps(dst.as_mut_ptr().add(d0), c);
                }
            }
        }
    }
}
