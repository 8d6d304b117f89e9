//! AVX2 GEMM tile kernels: `out[c * ldo + r] = dot(weight row r, activation row c)` for many weight
//! rows and activation rows at once (prompt processing).
//!
//! A row dot unpacks every weight block again for every activation row. Here weight rows are
//! taken 8 at a time (a *panel*, one row per 32-bit lane) and each block of the panel is unpacked
//! once into a scratch buffer, transposed so that lane `r` of chunk `i` holds quants `4i..4i + 4` of
//! row `r`; the blocks' factors become 8-lane vectors beside them. A micro-kernel then runs one or
//! two panels against 4 or 2 activation rows at a time: per chunk one load of each panel's weights
//! and, per activation row, one broadcast of 4 activation quants and one `maddubs` per panel,
//! whose i16 pair sums stay in their row's lane. Every lane holds one output, so there are no
//! horizontal sums, and the 8 results of a panel and an activation row are 8 adjacent floats of
//! `out`. The formats live in `blocks32` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and `superblocks` (Q4_K,
//! Q5_K, Q6_K). With fewer activation rows than unpacking pays for (`Format::MIN_COLS`: 3 or 4
//! for the k-quants, whose scales are slow to unpack) a call loops over the AVX2 row dot instead.
//!
//! **Passes over the row length.** Two panels of a long row outgrow L1 (Q4_K at k = 2048: 40 KB,
//! at 8192: 160 KB), and each pair of activation rows read them whole again from L2. So `tiles`
//! takes the panels' blocks a slice at a time (`SLICE_BYTES`: of two panels, 4 super-blocks or
//! 38 to 42 blocks of 32), every activation row against one slice before the next; the slice
//! stays in L1 while the activation rows stream past it. Between passes the micro-tiles' f32
//! sums wait in the scratch; each still adds its blocks in order from zero, so the results are
//! the bits of one pass (+6 % for Q4_K at k = 2048, +8 % at 8192 on Zen 3: docs/BENCHMARKS.md).
//!
//! **VNNI variants** (`Blocks32Vnni`, `SuperBlocksVnni`, on CPUs with AVX-512 F/BW/VL/VNNI): the
//! same panels (Q8_0's quants stored biased, `q + 128`, so that they are unsigned; the k-quants'
//! scales as plain i32 lanes), but one `vpdpbusd` per chunk, panel and activation row adds the
//! four u8 x i8 products straight into an i32 lane: no i16 stage, no groups, no sign trick. An
//! offset (the format's, or Q8_0's bias) is taken off the block's or sub-block's i32 sum as
//! `offset * sum(a)`, precomputed per activation block. With AVX-512's 32 vector registers the
//! micro-tile is 2 panels x 4 activation rows. The i32 sums are the same exact integers as the
//! AVX2 kernel's and the f32 steps after them are shared code, so the results are bit-identical.
//!
//! **Narrow kernels** (VNNI, 32-element formats, 2 to 8 activation rows: batched decode): the
//! roles swapped, activations packed into the lanes once per product and thread, and the weights
//! streamed where they lie (`blocks32::narrow_pack`). With so few rows there is too little
//! arithmetic per weight byte to hide the tile kernel's packing, which stalled on memory: the
//! 262k-row Q8_0 output projection of Gemma at 8 rows went from 14.2 to 8.2 ms (2 threads,
//! `examples/gemv_bench.rs`).
//! Same exact integers; blocks are taken in pairs, chunk-interleaved so that each 512-bit lane
//! sums a whole block of one activation row (the pair's first block in the even lanes, its
//! second in the odd ones), one f32 step per two blocks, the lane pairs added at the end of the
//! row; so the results equal the tiles' up to the order of the f32 additions, not bit for
//! bit. The k-quants have theirs in `superblocks` (bit-identical to their tiles).
//!
//! **One-row products** (VNNI, Q4_0/Q5_0/Q8_0, decode: `blocks32::rows_vnni`, handed out by
//! `kernels::gemv_fn`): each weight row streamed two blocks at a time, one 512-bit `vpdpbusd`
//! per pair from a starting accumulator that holds the activation row's offset correction,
//! prepared once per call with its factors.
//!
//! Invariants:
//!
//! - **Exact integers.** Weight quants are unpacked unsigned, except Q8_0's, which keep their sign
//!   and go through the sign trick (`maddubs(|w|, sign(a, w))`). The i16 results of `maddubs` are
//!   added over a *group* of chunks before one `madd` (by 1 or by the sub-block scale) widens
//!   them to i32. Without an offset the group is small enough that no i16 sum can leave the i16
//!   range. A format whose weight is `q - offset` (Q4_0, Q5_0, Q6_K) subtracts from the group's
//!   i16 sums the activations' share `offset * sum(a)`, precomputed per group and i16 half of a
//!   lane: the adds and the subtraction wrap, so they are exact modulo 2^16, and the group is
//!   small enough that the true `sum((q - offset) * a)` lies in the i16 range, hence is what the
//!   lane holds. The bounds are written at each format, for any weight bytes and activation quants
//!   in -127..=127 (what the quantizers write; the sign trick needs it too). What remains is one
//!   f32 multiply-add per block and lane, so the result is the row dot's up to the order of the
//!   f32 additions.
//! - **Lengths are checked once** by `gemm_shape`; the kernels then read weights, activations and
//!   the scratch through raw pointers, only at offsets below `rows * w_row`, `cols * a_row` and
//!   the scratch length, and write `out` only at `c * ldo + r` for `r < rows`, `c < cols`. A panel
//!   with fewer than 8 rows repeats the last row (a valid row: computed, never stored).
//! - **Scratch** (the panels, per-block activation factors, the sums between passes) is per
//!   thread and grows to the largest call; it is never shrunk and never shared, and its lines
//!   are 32-byte aligned.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use kiln_core::GgmlType;

use super::{load32, read_f16_bits, read_u32};
use crate::kernels::gemm::{dot_loop, gemm_shape};
use crate::kernels::{GemmFn, VecDotFn};

mod blocks32;
mod interleaved;
mod superblocks;

pub(in crate::kernels::x86) use interleaved::product as interleaved_product;

/// Weight rows per panel: one per 32-bit lane.
const PANEL_ROWS: usize = 8;
/// The most panels of a micro-tile (see `Format::SHAPE`).
const MAX_PANELS: usize = 2;
/// Bytes of the quants of 32 elements of a panel: 8 chunks of 8 rows x 4 quants.
const PIECE: usize = 256;
/// Most activation rows for which a call prefetches the next tile's weights (see `drive`).
const PREFETCH_MAX_COLS: usize = 16;
/// Bytes of the panels' blocks that one pass of `tiles` runs every activation row against (see
/// `Format::k_slice`): three quarters of a 32 KB L1, the rest for the activation rows passing
/// through. Measured with `examples/gemm_bench.rs` (Q4_K, Zen 3; 8 to 48 KB tried): see
/// docs/BENCHMARKS.md.
const SLICE_BYTES: usize = 24 << 10;

/// One aligned 32-byte line of the panel scratch.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Line([u8; 32]);

#[derive(Default)]
struct Scratch {
    panels: Vec<Line>,
    factors: Vec<u32>,
    /// The f32 sums of the micro-tiles between passes of `tiles`.
    accs: Vec<Line>,
    /// Block sums of the one-row products (`blocks32::rows_exact`).
    sums: Vec<Line>,
    /// The narrow kernels' activation panel, and the key it was packed for (0: none; see
    /// `run_narrow`).
    narrow: Vec<Line>,
    narrow_key: u64,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A weight format with a tile kernel.
trait Format {
    const TYPE: GgmlType;
    /// Elements per block.
    const QK: usize;
    /// Bytes per weight block and per activation block.
    const W_BLOCK: usize;
    const A_BLOCK: usize;
    /// 32-byte lines of one block of a panel.
    const PANEL_LINES: usize;
    /// 32-bit words of precomputed factors per activation block (0: `tile` reads none).
    const FACTOR_WORDS: usize;
    /// The micro-tile: 1 panel x 4 activation rows, or 2 panels x 2 activation rows (each
    /// broadcast of activation quants then serves two weight chunks); either way its i16 sums,
    /// i32 sums and f32 accumulators (12 registers), weight chunks and a broadcast fit the 16 AVX2
    /// registers, and which is faster depends on the format's work per block (measured with
    /// `examples/gemm_bench.rs`). The VNNI kernels, with 32 registers, take 2 panels x 4 rows.
    const SHAPE: Shape;
    /// Whether `tile` needs AVX-512 F/BW/VL/VNNI (the call then runs `drive_vnni`).
    const VNNI: bool;
    /// Fewest activation rows for which the tile kernel beats the row dots: below it, unpacking
    /// the panels costs more than it saves and the call loops over `ROW_DOT` instead (crossovers
    /// measured with `examples/gemm_bench.rs`).
    const MIN_COLS: usize;
    /// The AVX2 row dot of the format.
    const ROW_DOT: VecDotFn;

    /// Blocks of NP panels per pass of `tiles`: as many as [`SLICE_BYTES`] holds, at least one.
    fn k_slice(np: usize) -> usize {
        (SLICE_BYTES / (np * Self::PANEL_LINES * 32)).max(1)
    }

    /// Writes the `FACTOR_WORDS` factors of the activation block at `a` to `out`.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `a` points at a readable activation block, `out` at `FACTOR_WORDS`
    /// writable words.
    unsafe fn factors(a: *const u8, out: *mut u32);

    /// Unpacks one block of each of the 8 rows at `src` into the panel block at `dst`.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; each `src[r]` points at a readable weight block, `dst` at `PANEL_LINES`
    /// writable lines.
    unsafe fn pack(src: &[*const u8; PANEL_ROWS], dst: *mut u8);

    /// The (8 NP) x NR dots of `blocks` blocks of the NP panels at `panels` (block `b` of panel
    /// `i` at `panels[i] + b * stride`) with the activation rows at `acts` (their factors at
    /// `factors`), added block by block to `acc`: lane `r` of result `[i][j]` is `acc[i][j]` plus
    /// `dot(row r of panel i, activation row j)`.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; each panel holds `blocks` packed blocks, each `acts[j]` `blocks`
    /// activation blocks and each `factors[j]` `blocks * FACTOR_WORDS` words.
    unsafe fn tile<const NP: usize, const NR: usize>(
        acc: [[__m256; NR]; NP],
        blocks: usize,
        panels: &[*const u8; NP],
        stride: usize,
        acts: &[*const u8; NR],
        factors: &[*const u32; NR],
    ) -> [[__m256; NR]; NP];
}

/// Panels x activation rows of a micro-tile (see `Format::SHAPE`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Narrow,
    Wide,
    Big,
}

impl Shape {
    const fn panels(self) -> usize {
        match self {
            Shape::Narrow => 1,
            Shape::Wide | Shape::Big => 2,
        }
    }
}

/// Pointers and sizes of one GEMM call, lengths already checked by `gemm_shape`.
#[derive(Clone, Copy)]
struct Call {
    blocks: usize,
    w: *const u8,
    w_row: usize,
    rows: usize,
    a: *const u8,
    a_row: usize,
    cols: usize,
    out: *mut f32,
    ldo: usize,
}

/// Whether a call whose lengths `gemm_shape` checked has no products to form: no rows or columns
/// (nothing written), or rows of no blocks (every output the empty sum, 0).
fn nothing_to_multiply(
    blocks: usize,
    rows: usize,
    cols: usize,
    out: &mut [f32],
    ldo: usize,
) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    if blocks == 0 {
        for c in 0..cols {
            out[c * ldo..c * ldo + rows].fill(0.0);
        }
        return true;
    }
    false
}

/// The safe entry of every tile kernel: checks the lengths, sizes the scratch, runs `drive`.
fn tiled<F: Format, const ALWAYS: bool>(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    out: &mut [f32],
    ldo: usize,
) {
    if !ALWAYS && cols < F::MIN_COLS {
        return dot_loop(F::TYPE, F::ROW_DOT, k, w, rows, a, cols, out, ldo);
    }
    let (w_row, a_row) = gemm_shape(F::TYPE, k, w.len(), rows, a.len(), cols, out.len(), ldo);
    let blocks = k / F::QK;
    debug_assert_eq!(w_row, blocks * F::W_BLOCK);
    debug_assert_eq!(a_row, blocks * F::A_BLOCK);
    if nothing_to_multiply(blocks, rows, cols, out, ldo) {
        return;
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let lines = MAX_PANELS * blocks * F::PANEL_LINES;
        if scratch.panels.len() < lines {
            scratch.panels.resize(lines, Line([0; 32]));
        }
        // cols * blocks <= a.len(), and FACTOR_WORDS is at most 16: no overflow.
        let words = cols * blocks * F::FACTOR_WORDS;
        if scratch.factors.len() < words {
            scratch.factors.resize(words, 0);
        }
        // One vector per panel and activation row.
        let accs = cols * MAX_PANELS;
        if scratch.accs.len() < accs {
            scratch.accs.resize(accs, Line([0; 32]));
        }
        let call = Call {
            blocks,
            w: w.as_ptr(),
            w_row,
            rows,
            a: a.as_ptr(),
            a_row,
            cols,
            out: out.as_mut_ptr(),
            ldo,
        };
        let (panels, factors, accs) = (
            scratch.panels.as_mut_ptr().cast(),
            scratch.factors.as_mut_ptr(),
            scratch.accs.as_mut_ptr().cast(),
        );
        // SAFETY: the CPU has AVX2+FMA+F16C, and AVX-512 F/BW/VL/VNNI for a VNNI format (module
        // invariant of `x86`: these fns are handed out only after detection); `gemm_shape`
        // checked that `w`, `a` and `out` hold exactly what `call` describes, and the scratch was
        // just sized for `MAX_PANELS` panels of `blocks` blocks, `cols * blocks` blocks of
        // factors and `cols * MAX_PANELS` sums (32-byte lines: aligned vectors).
        unsafe {
            if F::VNNI {
                drive_vnni::<F>(&call, panels, factors, accs)
            } else {
                drive_avx2::<F>(&call, panels, factors, accs)
            }
        }
    })
}

/// `drive` compiled for AVX2 formats.
///
/// # Safety
/// As `drive`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn drive_avx2<F: Format>(
    call: &Call,
    panels: *mut u8,
    factors: *mut u32,
    accs: *mut __m256,
) {
    drive::<F>(call, panels, factors, accs)
}

/// `drive` compiled for VNNI formats, so that their `tile` inlines.
///
/// # Safety
/// As `drive`, on a CPU with AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn drive_vnni<F: Format>(
    call: &Call,
    panels: *mut u8,
    factors: *mut u32,
    accs: *mut __m256,
) {
    drive::<F>(call, panels, factors, accs)
}

/// # Safety
/// AVX2+FMA+F16C (and AVX-512 F/BW/VL/VNNI for a VNNI format); `call` describes readable
/// weights and activations and writable outputs (as `gemm_shape` checks), `panels` has
/// `MAX_PANELS * blocks * PANEL_LINES` lines and `factors` room for
/// `cols * blocks * FACTOR_WORDS` words, `accs` room for `cols * MAX_PANELS` aligned vectors.
#[inline(always)]
unsafe fn drive<F: Format>(call: &Call, panels: *mut u8, factors: *mut u32, accs: *mut __m256) {
    if F::FACTOR_WORDS > 0 {
        for c in 0..call.cols {
            let row = call.a.add(c * call.a_row);
            for b in 0..call.blocks {
                let out = factors.add((c * call.blocks + b) * F::FACTOR_WORDS);
                F::factors(row.add(b * F::A_BLOCK), out);
            }
        }
    }
    let tile_rows = F::SHAPE.panels() * PANEL_ROWS;
    // With few activation rows (batched decode) the weights come from memory and packing
    // stalls on them. So while a tile is packed, the next tile's weight rows (contiguous bytes)
    // are requested a few lines per block, spread over the packing rather than in one burst that
    // overflows the core's outstanding misses (measured with `examples/gemv_bench.rs 2 8`; see
    // docs/BENCHMARKS.md). With many rows the weights are reused from cache and the requests
    // would only cost.
    let ahead = if call.cols <= PREFETCH_MAX_COLS {
        tile_rows
    } else {
        0
    };
    for r0 in (0..call.rows).step_by(tile_rows) {
        if F::SHAPE.panels() == 2 && call.rows - r0 > PANEL_ROWS {
            pack::<F, 2>(call, panels, r0, r0 + tile_rows, ahead);
            if F::SHAPE == Shape::Big {
                tiles::<F, 2, 4>(call, panels, factors, r0, accs);
            } else {
                tiles::<F, 2, 2>(call, panels, factors, r0, accs);
            }
        } else {
            pack::<F, 1>(call, panels, r0, r0 + tile_rows, ahead);
            tiles::<F, 1, 4>(call, panels, factors, r0, accs);
        }
    }
}

/// Packs the NP panels of rows `r0..r0 + 8 NP` (rows past the end repeat the last row) into
/// `panels`, block `b` of panel `i` at line `(b * NP + i) * PANEL_LINES`, and requests the
/// weight rows `ahead..ahead + ahead_rows` (clipped to the call's rows), a few 64-byte lines
/// before each block.
///
/// # Safety
/// As `drive`, with `r0 < rows` (the requests stay inside the call's weight rows; a prefetch
/// never faults anyway).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<F: Format, const NP: usize>(
    call: &Call,
    panels: *mut u8,
    r0: usize,
    ahead: usize,
    ahead_rows: usize,
) {
    let panel_block = F::PANEL_LINES * 32;
    let last = call.rows - 1;
    let ahead_end = (ahead + ahead_rows).min(call.rows);
    let (mut cursor, end) = if ahead < ahead_end {
        (ahead * call.w_row, ahead_end * call.w_row)
    } else {
        (0, 0)
    };
    let per_block = (end - cursor).div_ceil(64 * NP * call.blocks);
    for i in 0..NP {
        let mut src: [*const u8; PANEL_ROWS] = std::array::from_fn(|r| {
            let row = (r0 + i * PANEL_ROWS + r).min(last);
            call.w.add(row * call.w_row)
        });
        for b in 0..call.blocks {
            for _ in 0..per_block {
                if cursor < end {
                    _mm_prefetch::<_MM_HINT_T0>(call.w.add(cursor).cast());
                    cursor += 64;
                }
            }
            F::pack(&src, panels.add((b * NP + i) * panel_block));
            // Past the last block the pointers are never read: hence `wrapping_add`.
            src = src.map(|p| p.wrapping_add(F::W_BLOCK));
        }
    }
}

/// Runs the packed NP panels of rows `r0..` against every activation row, NR at a time (fewer at
/// the end), a slice of [`Format::k_slice`] blocks at a time: every activation row's dots over one
/// slice, then over the next, so that the slice of the panels (a few KB) stays in L1 while the
/// activation rows stream past it from L2. Between slices each micro-tile's f32 sums wait in
/// `accs` (`NP * NR` vectors per group of NR rows); every sum still takes its blocks in order from
/// zero, so the results are the same bits as one pass over all blocks.
///
/// # Safety
/// As `drive`, with the panels packed by `pack::<F, NP>` and `accs` room for
/// `cols * NP` vectors (aligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<F: Format, const NP: usize, const NR: usize>(
    call: &Call,
    panels: *const u8,
    factors: *const u32,
    r0: usize,
    accs: *mut __m256,
) {
    let per_slice = F::k_slice(NP);
    for b0 in (0..call.blocks).step_by(per_slice) {
        let pass = b0..(b0 + per_slice).min(call.blocks);
        let mut c = 0;
        while c + NR <= call.cols {
            run::<F, NP, NR>(call, panels, factors, c, r0, pass.clone(), accs.add(c * NP));
            c += NR;
        }
        let at = accs.add(c * NP);
        match call.cols - c {
            3 => run::<F, NP, 3>(call, panels, factors, c, r0, pass, at),
            2 => run::<F, NP, 2>(call, panels, factors, c, r0, pass, at),
            1 => run::<F, NP, 1>(call, panels, factors, c, r0, pass, at),
            _ => {}
        }
    }
}

/// Runs the micro-kernel for activation rows `c..c + NR` against the packed NP panels of rows
/// `r0..`, over the blocks `pass`: the sums start from zero on the first slice, else from
/// `acc_at`; they are kept at `acc_at` (NP * NR vectors) for the next slice, or, after the last,
/// the results of the rows below `rows` stored.
///
/// # Safety
/// As `tiles`, with `c + NR <= cols` and `acc_at` room for NP * NR vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<F: Format, const NP: usize, const NR: usize>(
    call: &Call,
    panels: *const u8,
    factors: *const u32,
    c: usize,
    r0: usize,
    pass: Range<usize>,
    acc_at: *mut __m256,
) {
    let panel_block = F::PANEL_LINES * 32;
    let (b0, blocks, last) = (pass.start, pass.len(), pass.end == call.blocks);
    let first: [*const u8; NP] = std::array::from_fn(|i| panels.add((b0 * NP + i) * panel_block));
    let acts: [*const u8; NR] =
        std::array::from_fn(|j| call.a.add((c + j) * call.a_row + b0 * F::A_BLOCK));
    // Without factors the pointers are dangling and never read: hence `wrapping_add`.
    let facts: [*const u32; NR] = std::array::from_fn(|j| {
        factors.wrapping_add(((c + j) * call.blocks + b0) * F::FACTOR_WORDS)
    });
    let start = if b0 == 0 {
        [[_mm256_setzero_ps(); NR]; NP]
    } else {
        std::array::from_fn(|i| std::array::from_fn(|j| *acc_at.add(i * NR + j)))
    };
    let acc = F::tile::<NP, NR>(start, blocks, &first, NP * panel_block, &acts, &facts);
    if !last {
        for (i, acc) in acc.into_iter().enumerate() {
            for (j, v) in acc.into_iter().enumerate() {
                *acc_at.add(i * NR + j) = v;
            }
        }
        return;
    }
    for (i, acc) in acc.into_iter().enumerate() {
        let row = r0 + i * PANEL_ROWS;
        let valid = (call.rows - row).min(PANEL_ROWS);
        for (j, v) in acc.into_iter().enumerate() {
            store_lanes(call.out.add((c + j) * call.ldo + row), v, valid);
        }
    }
}

/// Stores the first `valid` lanes of `v` at `dst` (all 8 with one store).
///
/// # Safety
/// `dst..dst + valid` writable, `valid <= 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_lanes(dst: *mut f32, v: __m256, valid: usize) {
    if valid == PANEL_ROWS {
        _mm256_storeu_ps(dst, v);
    } else {
        let mut lanes = [0f32; PANEL_ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
    }
}

// ---- helpers of the formats (inlined into them: same target features) ----

/// Requests the lines of block `b`'s share of `lines` 64-byte lines from `next` (`per_block` a
/// block): how the narrow kernels fetch the next rows while they multiply these.
///
/// # Safety
/// None beyond the target features: a prefetch never faults, and `wrapping_add` forms the
/// addresses.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefetch_share(next: *const u8, lines: usize, per_block: usize, b: usize) {
    for l in b * per_block..((b + 1) * per_block).min(lines) {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * l).cast());
    }
}

/// Stores lane `c < cols` of `acc[i]` at `out + c * ldo + r0 + i`: a narrow kernel's results
/// (lanes are activation rows) into `out[activation row][weight row]`; 8 rows through one
/// transpose and a vector store per activation row.
///
/// # Safety
/// Those elements of `out` writable, `cols <= 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_columns<const R: usize>(
    acc: [__m256; R],
    out: *mut f32,
    ldo: usize,
    r0: usize,
    cols: usize,
) {
    if R == PANEL_ROWS {
        // Transposed, activation row `c`'s 8 results are one contiguous store.
        let rows = transpose(std::array::from_fn(|i| _mm256_castps_si256(acc[i])));
        for (c, v) in rows.into_iter().enumerate().take(cols) {
            _mm256_storeu_si256(out.add(c * ldo + r0).cast(), v);
        }
        return;
    }
    for (i, v) in acc.into_iter().enumerate() {
        let mut lanes = [0f32; PANEL_ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        for (c, &x) in lanes.iter().enumerate().take(cols) {
            *out.add(c * ldo + r0 + i) = x;
        }
    }
}

/// The 8 x 8 transpose of 32-bit elements: lane `r` of result `i` is lane `i` of `u[r]` (quants
/// `4i..4i + 4` of row `r`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn transpose(u: [__m256i; PANEL_ROWS]) -> [__m256i; PANEL_ROWS] {
    // Per 128-bit half: t[2p] = (u[2p].0, u[2p+1].0, u[2p].1, u[2p+1].1), t[2p+1] the same of
    // elements 2 and 3 (4..8 in the high half).
    let t: [__m256i; PANEL_ROWS] = std::array::from_fn(|i| {
        let (x, y) = (u[i & !1], u[i | 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(x, y)
        } else {
            _mm256_unpackhi_epi32(x, y)
        }
    });
    // s[4h + e]: element e (e + 4 in the high half) of rows 4h..4h + 4.
    let s: [__m256i; PANEL_ROWS] = std::array::from_fn(|i| {
        let (h, e) = (i / 4, i % 4);
        let (x, y) = (t[4 * h + e / 2], t[4 * h + 2 + e / 2]);
        if e % 2 == 0 {
            _mm256_unpacklo_epi64(x, y)
        } else {
            _mm256_unpackhi_epi64(x, y)
        }
    });
    std::array::from_fn(|i| {
        if i < 4 {
            _mm256_permute2x128_si256::<0x20>(s[i], s[i + 4])
        } else {
            _mm256_permute2x128_si256::<0x31>(s[i - 4], s[i])
        }
    })
}

/// Stores 32 quants of each row (`quants(r)`), transposed, at `dst` (8 lines).
///
/// # Safety
/// `dst..dst + PIECE` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_piece(dst: *mut u8, quants: impl Fn(usize) -> __m256i) {
    let chunks = transpose(std::array::from_fn(quants));
    for (i, chunk) in chunks.into_iter().enumerate() {
        _mm256_storeu_si256(dst.add(32 * i).cast(), chunk);
    }
}

/// Stores the halves at `src[r] + at`, widened to f32 (exact), as 8 lanes at `dst`.
///
/// # Safety
/// Each `src[r] + at` has 2 readable bytes, `dst` 32 writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_halves(dst: *mut u8, src: &[*const u8; PANEL_ROWS], at: usize) {
    let bits: [u16; PANEL_ROWS] = src.map(|p| read_f16_bits(p.add(at)));
    let v = _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast()));
    _mm256_storeu_ps(dst.cast(), v);
}

/// The IEEE half at `p`, widened to f32 (exact).
///
/// # Safety
/// `p..p + 2` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(read_f16_bits(p)))))
}

/// 4 bytes at `p` in every 32-bit lane.
///
/// # Safety
/// `p..p + 4` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32(read_u32(p) as i32)
}

/// The offset shares of 32 activation quants at `p` (8 chunks): 32-bit lane `c` is the i16 pair
/// `(offset * (a[4c] + a[4c + 1]), offset * (a[4c + 2] + a[4c + 3]))`, the amounts that `maddubs`
/// of a chunk with weights `q` puts in the two i16 halves of a lane beyond `(q - offset) * a`.
/// Exact modulo 2^16 (see the module invariants).
///
/// # Safety
/// `p..p + 32` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_shares(p: *const u8, offset: i16) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), load32(p));
    _mm256_mullo_epi16(pairs, _mm256_set1_epi16(offset))
}

/// The i16-wise (wrapping) sum of the four 32-bit lanes of each 128-bit half of `v`, in lane 0
/// of that half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sum_lanes_per_half(v: __m256i) -> __m256i {
    let v = _mm256_add_epi16(v, _mm256_shuffle_epi32::<0b01_00_11_10>(v));
    _mm256_add_epi16(v, _mm256_shuffle_epi32::<0b10_11_00_01>(v))
}

/// Defines the public GEMM entry `$name` for the tile format `$format`.
/// `$name` takes the row-dot loop below the format's crossover; `$always`, the batch-invariant
/// entry, runs the tile kernel for any number of activation rows: each output is then computed
/// by the same operations whatever else is in the call.
macro_rules! gemm_entries {
    ($($(#[$doc:meta])* $name:ident, $always:ident => $format:ty;)*) => {
        $(
            $(#[$doc])*
            pub(in crate::kernels) fn $name(
                k: usize,
                w: &[u8],
                rows: usize,
                a: &[u8],
                cols: usize,
                out: &mut [f32],
                ldo: usize,
            ) {
                tiled::<$format, false>(k, w, rows, a, cols, out, ldo)
            }

            $(#[$doc])*
            pub(in crate::kernels) fn $always(
                k: usize,
                w: &[u8],
                rows: usize,
                a: &[u8],
                cols: usize,
                out: &mut [f32],
                ldo: usize,
            ) {
                tiled::<$format, true>(k, w, rows, a, cols, out, ldo)
            }
        )*
    };
}

gemm_entries! {
    /// Q4_0 weights x Q8_0 activations.
    q4_0, q4_0_always => blocks32::Blocks32<blocks32::Q4_0>;
    /// Q4_1 weights x Q8_1 activations.
    q4_1, q4_1_always => blocks32::Blocks32<blocks32::Q4_1>;
    /// Q5_0 weights x Q8_0 activations.
    q5_0, q5_0_always => blocks32::Blocks32<blocks32::Q5_0>;
    /// Q5_1 weights x Q8_1 activations.
    q5_1, q5_1_always => blocks32::Blocks32<blocks32::Q5_1>;
    /// Q8_0 weights x Q8_0 activations.
    q8_0, q8_0_always => blocks32::Blocks32<blocks32::Q8_0>;
    /// Q4_K weights x Q8_K activations.
    q4_k, q4_k_always => superblocks::SuperBlocks<superblocks::Q4K>;
    /// Q5_K weights x Q8_K activations.
    q5_k, q5_k_always => superblocks::SuperBlocks<superblocks::Q5K>;
    /// Q6_K weights x Q8_K activations.
    q6_k, q6_k_always => superblocks::SuperBlocks<superblocks::Q6K>;
    /// Q4_0 weights x Q8_0 activations, VNNI.
    q4_0_vnni_tiled, q4_0_vnni_always => blocks32::Blocks32Vnni<blocks32::Q4_0>;
    /// Q4_1 weights x Q8_1 activations, VNNI.
    q4_1_vnni_tiled, q4_1_vnni_always => blocks32::Blocks32Vnni<blocks32::Q4_1>;
    /// Q5_0 weights x Q8_0 activations, VNNI.
    q5_0_vnni_tiled, q5_0_vnni_always => blocks32::Blocks32Vnni<blocks32::Q5_0>;
    /// Q5_1 weights x Q8_1 activations, VNNI.
    q5_1_vnni_tiled, q5_1_vnni_always => blocks32::Blocks32Vnni<blocks32::Q5_1>;
    /// Q8_0 weights x Q8_0 activations, VNNI.
    q8_0_vnni_tiled, q8_0_vnni_always => blocks32::Blocks32Vnni<blocks32::Q8_0>;
    /// Q4_K weights x Q8_K activations, VNNI.
    q4_k_vnni_tiled, q4_k_vnni_always => superblocks::SuperBlocksVnni<superblocks::Q4K>;
    /// Q5_K weights x Q8_K activations, VNNI.
    q5_k_vnni_tiled, q5_k_vnni_always => superblocks::SuperBlocksVnni<superblocks::Q5K>;
    /// Q6_K weights x Q8_K activations, VNNI.
    q6_k_vnni_tiled, q6_k_vnni_always => superblocks::SuperBlocksVnni<superblocks::Q6K>;
}

/// Signature of a narrow kernel's two steps (`narrow_pack`, `narrow_rows_all` of `blocks32` and
/// `superblocks`): the call and the panel scratch.
type NarrowFn = unsafe fn(&Call, *mut u8);

/// A weight format's narrow kernel: what [`narrow_or_tiled`] needs to run it.
struct Narrow {
    ty: GgmlType,
    /// Fewest activation rows it runs for (up to 8; below, the tiled entry decides).
    min_cols: usize,
    /// Scratch lines per block.
    lines: usize,
    /// Packs the activations into the panel.
    pack: NarrowFn,
    /// Runs the weight rows against the packed panel.
    run: NarrowFn,
}

impl Narrow {
    /// Whether it runs for `cols` activation rows.
    fn takes(&self, cols: usize) -> bool {
        (self.min_cols..=PANEL_ROWS).contains(&cols)
    }
}

/// A GEMM on a CPU with AVX-512 VNNI: the format's narrow kernel (weights read where they lie,
/// activations in the lanes) for `min_cols` to 8 activation rows (batched decode), the `tiled`
/// entry otherwise. Both form the same exact block sums (the f32 steps: see the module docs).
#[allow(clippy::too_many_arguments)]
fn narrow_or_tiled(
    narrow: &Narrow,
    tiled: GemmFn,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    out: &mut [f32],
    ldo: usize,
) {
    if !narrow.takes(cols) {
        return tiled(k, w, rows, a, cols, out, ldo);
    }
    let (w_row, a_row) = gemm_shape(narrow.ty, k, w.len(), rows, a.len(), cols, out.len(), ldo);
    let blocks = k / narrow.ty.block_size();
    if nothing_to_multiply(blocks, rows, cols, out, ldo) {
        return;
    }
    // SAFETY: `gemm_shape` checked that `out` holds `c * ldo + r` for every `r < rows`,
    // `c < cols`, and the exclusive borrow keeps everyone else off it; the rest as `run_narrow`.
    unsafe {
        run_narrow(
            narrow,
            0,
            blocks,
            w,
            w_row,
            rows,
            a,
            a_row,
            cols,
            out.as_mut_ptr(),
            ldo,
        )
    }
}

/// The narrow kernel writing straight into a strided output shared with other threads (see
/// `kernels::StridedGemmFn`); false, writing nothing, for `cols` outside its range or nothing to
/// multiply.
///
/// # Safety
/// `out + c * ldo + r` is writable for every `r < rows`, `c < cols`, and nothing else reads or
/// writes those elements during the call; a nonzero `panel` key as `kernels::StridedGemmFn`.
#[allow(clippy::too_many_arguments)]
unsafe fn narrow_strided(
    narrow: &Narrow,
    panel: u64,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    out: *mut f32,
    ldo: usize,
) -> bool {
    if !narrow.takes(cols) || rows == 0 {
        return false;
    }
    // The extent of the outputs, for the shape check (the caller vouches for the memory).
    let extent = (cols - 1).saturating_mul(ldo).saturating_add(rows);
    let (w_row, a_row) = gemm_shape(narrow.ty, k, w.len(), rows, a.len(), cols, extent, ldo);
    let blocks = k / narrow.ty.block_size();
    if blocks == 0 {
        return false;
    }
    // SAFETY: the caller's contract for `out`; the rest as `run_narrow`.
    unsafe {
        run_narrow(
            narrow, panel, blocks, w, w_row, rows, a, a_row, cols, out, ldo,
        )
    };
    true
}

/// Runs `narrow`'s kernel with this thread's scratch. With a nonzero `panel` key equal to the
/// one this thread's panel was last packed for, the packing is skipped: the tasks of one product
/// (the 1024 of Gemma's 262k-row output projection at 8 sequences) share its activations, and
/// packing them again per task cost 5% of the product on one thread (12.9 against 12.2 ms,
/// `examples/gemv_bench 1 8`).
///
/// # Safety
/// `w` is `rows` rows of `blocks` blocks (`w_row` bytes each), `a` `cols` rows (`a_row` bytes
/// each) of as many activation blocks, `cols` in `min_cols..=8`, `rows` and `blocks` nonzero;
/// `out + c * ldo + r` is writable for every `r < rows`, `c < cols` and nothing else accesses
/// those elements during the call; a nonzero `panel` was passed before on this thread only with
/// this `narrow`, the same `blocks`, `cols` and `a_row`, and the same bytes of `a`.
#[allow(clippy::too_many_arguments)]
unsafe fn run_narrow(
    narrow: &Narrow,
    panel: u64,
    blocks: usize,
    w: &[u8],
    w_row: usize,
    rows: usize,
    a: &[u8],
    a_row: usize,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    SCRATCH.with_borrow_mut(|scratch| {
        let lines = blocks * narrow.lines;
        if scratch.narrow.len() < lines {
            scratch.narrow.resize(lines, Line([0; 32]));
        }
        let call = Call {
            blocks,
            w: w.as_ptr(),
            w_row,
            rows,
            a: a.as_ptr(),
            a_row,
            cols,
            out,
            ldo,
        };
        let buf = scratch.narrow.as_mut_ptr().cast();
        // SAFETY: the VNNI entries are handed out only on a CPU with AVX2+FMA+F16C and AVX-512
        // F/BW/VL/VNNI; the shapes and `out` are this function's contract; the scratch was just
        // sized for `blocks * lines` lines, and it holds the panel of these activations when
        // the key matches (this function's contract; the key is reset before a packing that
        // could be cut short).
        unsafe {
            if panel == 0 || scratch.narrow_key != panel {
                scratch.narrow_key = 0;
                (narrow.pack)(&call, buf);
                scratch.narrow_key = panel;
            }
            (narrow.run)(&call, buf)
        }
    })
}

/// Defines the public VNNI GEMM entries with a narrow kernel (see `narrow_or_tiled`), and their
/// strided forms (see `narrow_strided`).
macro_rules! narrow_entries {
    ($($(#[$doc:meta])* $name:ident, $strided:ident => $narrow:expr, $tiled:ident;)*) => {
        $(
            $(#[$doc])*
            pub(in crate::kernels) fn $name(
                k: usize,
                w: &[u8],
                rows: usize,
                a: &[u8],
                cols: usize,
                out: &mut [f32],
                ldo: usize,
            ) {
                const NARROW: Narrow = $narrow;
                narrow_or_tiled(&NARROW, $tiled, k, w, rows, a, cols, out, ldo)
            }

            $(#[$doc])*
            /// Strided: see `kernels::StridedGemmFn`.
            ///
            /// # Safety
            /// As `kernels::StridedGemmFn`.
            #[allow(clippy::too_many_arguments)]
            pub(in crate::kernels) unsafe fn $strided(
                panel: u64,
                k: usize,
                w: &[u8],
                rows: usize,
                a: &[u8],
                cols: usize,
                out: *mut f32,
                ldo: usize,
            ) -> bool {
                const NARROW: Narrow = $narrow;
                // SAFETY: the caller's contract.
                unsafe { narrow_strided(&NARROW, panel, k, w, rows, a, cols, out, ldo) }
            }
        )*
    };
}

/// The narrow kernel of a 32-element format: from 2 activation rows.
const fn narrow32<L: blocks32::Legacy>() -> Narrow {
    Narrow {
        ty: L::TYPE,
        min_cols: 2,
        lines: blocks32::NARROW_LINES,
        pack: blocks32::narrow_pack::<L>,
        run: blocks32::narrow_rows_all::<L>,
    }
}

/// The narrow kernel of a k-quant: from the format's tile crossover, below which the row dots
/// are faster still.
const fn narrow_k<K: superblocks::KQuant>() -> Narrow {
    Narrow {
        ty: K::TYPE,
        min_cols: K::MIN_COLS,
        lines: superblocks::NARROW_LINES,
        pack: superblocks::narrow_pack::<K>,
        run: superblocks::narrow_rows_all::<K>,
    }
}

narrow_entries! {
    /// Q4_0 weights x Q8_0 activations, VNNI.
    q4_0_vnni, q4_0_vnni_strided => narrow32::<blocks32::Q4_0>(), q4_0_vnni_tiled;
    /// Q4_1 weights x Q8_1 activations, VNNI.
    q4_1_vnni, q4_1_vnni_strided => narrow32::<blocks32::Q4_1>(), q4_1_vnni_tiled;
    /// Q5_0 weights x Q8_0 activations, VNNI.
    q5_0_vnni, q5_0_vnni_strided => narrow32::<blocks32::Q5_0>(), q5_0_vnni_tiled;
    /// Q5_1 weights x Q8_1 activations, VNNI.
    q5_1_vnni, q5_1_vnni_strided => narrow32::<blocks32::Q5_1>(), q5_1_vnni_tiled;
    /// Q8_0 weights x Q8_0 activations, VNNI.
    q8_0_vnni, q8_0_vnni_strided => narrow32::<blocks32::Q8_0>(), q8_0_vnni_tiled;
    /// Q4_K weights x Q8_K activations, VNNI.
    q4_k_vnni, q4_k_vnni_strided => narrow_k::<superblocks::Q4K>(), q4_k_vnni_tiled;
    /// Q5_K weights x Q8_K activations, VNNI.
    q5_k_vnni, q5_k_vnni_strided => narrow_k::<superblocks::Q5K>(), q5_k_vnni_tiled;
    /// Q6_K weights x Q8_K activations, VNNI.
    q6_k_vnni, q6_k_vnni_strided => narrow_k::<superblocks::Q6K>(), q6_k_vnni_tiled;
}

/// The lengths of a one-row product checked as a GEMM of one activation row would check them
/// (panics on a broken contract); the blocks per row, or `None` when there are no rows.
fn one_row_shape(
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    out: &[f32],
) -> Option<usize> {
    gemm_shape(ty, k, w.len(), rows, a.len(), 1, out.len(), rows.max(1));
    (rows > 0).then(|| k / ty.block_size())
}

/// The safe entry of the tile-exact one-row products (see `blocks32::rows_exact`): checks the
/// lengths as a GEMM of one activation row would, then runs the kernel.
fn exact_rows<L: blocks32::Legacy>(k: usize, w: &[u8], rows: usize, a: &[u8], out: &mut [f32]) {
    let Some(blocks) = one_row_shape(L::TYPE, k, w, rows, a, out) else {
        return;
    };
    debug_assert_eq!(w.len(), rows * blocks * L::W_BLOCK);
    with_sums(blocks32::rows_exact_scratch(blocks), |sums| {
        // SAFETY: the CPU has AVX2+FMA+F16C (this fn is handed out only after detection);
        // `gemm_shape` checked that `w` is `rows` rows of `blocks` blocks, `a` one activation
        // row of `blocks` blocks, and that `out` holds `rows` values; `sums` has room for
        // `rows_exact_scratch(blocks)` vectors.
        unsafe {
            blocks32::rows_exact::<L>(blocks, w.as_ptr(), rows, a.as_ptr(), out.as_mut_ptr(), sums)
        }
    })
}

/// Runs `f` with this thread's scratch of the one-row products, room for `vectors` 32-byte
/// vectors.
fn with_sums(vectors: usize, f: impl FnOnce(*mut __m256i)) {
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.sums.len() < vectors {
            scratch.sums.resize(vectors, Line([0; 32]));
        }
        f(scratch.sums.as_mut_ptr().cast())
    })
}

/// Defines the public tile-exact one-row entries, each the safe entry `$entry` of its format.
macro_rules! exact_rows_entries {
    ($($(#[$doc:meta])* $name:ident => $entry:ident::<$format:ty>;)*) => {
        $(
            $(#[$doc])*
            pub(in crate::kernels) fn $name(k: usize, w: &[u8], rows: usize, a: &[u8], out: &mut [f32]) {
                $entry::<$format>(k, w, rows, a, out)
            }
        )*
    };
}

exact_rows_entries! {
    /// Q4_0 weights x one Q8_0 activation row.
    q4_0_rows => exact_rows::<blocks32::Q4_0>;
    /// Q4_1 weights x one Q8_1 activation row.
    q4_1_rows => exact_rows::<blocks32::Q4_1>;
    /// Q5_0 weights x one Q8_0 activation row.
    q5_0_rows => exact_rows::<blocks32::Q5_0>;
    /// Q5_1 weights x one Q8_1 activation row.
    q5_1_rows => exact_rows::<blocks32::Q5_1>;
    /// Q8_0 weights x one Q8_0 activation row.
    q8_0_rows => exact_rows::<blocks32::Q8_0>;
    /// Q4_K weights x one Q8_K activation row.
    q4_k_rows => exact_rows_k::<superblocks::Q4K>;
    /// Q5_K weights x one Q8_K activation row.
    q5_k_rows => exact_rows_k::<superblocks::Q5K>;
    /// Q6_K weights x one Q8_K activation row.
    q6_k_rows => exact_rows_k::<superblocks::Q6K>;
}

/// The safe entry of the VNNI one-row products (see `blocks32::rows_vnni`): checks the lengths
/// as a GEMM of one activation row would, then runs the kernel.
fn vnni_rows<L: blocks32::Legacy>(k: usize, w: &[u8], rows: usize, a: &[u8], out: &mut [f32]) {
    let Some(blocks) = one_row_shape(L::TYPE, k, w, rows, a, out) else {
        return;
    };
    // SAFETY: the VNNI entries are handed out only on a CPU with AVX2+FMA+F16C and AVX-512
    // F/BW/VL/VNNI; `gemm_shape` checked that `w` is `rows` rows of `blocks` blocks, `a` one
    // activation row of as many blocks, and that `out` holds `rows` values.
    unsafe { blocks32::rows_vnni::<L>(blocks, w.as_ptr(), rows, a.as_ptr(), out.as_mut_ptr()) }
}

exact_rows_entries! {
    /// Q4_0 weights x one Q8_0 activation row, VNNI.
    q4_0_rows_vnni => vnni_rows::<blocks32::Q4_0>;
    /// Q5_0 weights x one Q8_0 activation row, VNNI.
    q5_0_rows_vnni => vnni_rows::<blocks32::Q5_0>;
    /// Q8_0 weights x one Q8_0 activation row, VNNI.
    q8_0_rows_vnni => vnni_rows::<blocks32::Q8_0>;
}

/// As `exact_rows`, for the k-quants (see `superblocks::rows_exact`).
fn exact_rows_k<K: superblocks::KQuant>(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    out: &mut [f32],
) {
    let Some(blocks) = one_row_shape(K::TYPE, k, w, rows, a, out) else {
        return;
    };
    with_sums(blocks * (2 * PANEL_ROWS + K::PREPARED), |sums| {
        // SAFETY: AVX2+FMA+F16C (handed out only after detection); `gemm_shape` checked that `w`
        // is `rows` rows of `blocks` super-blocks, `a` one Q8_K row of as many blocks, and
        // `out` holds `rows` values; `sums` has room for `blocks * (16 + K::PREPARED)` vectors.
        unsafe {
            superblocks::rows_exact::<K>(
                blocks,
                w.as_ptr(),
                rows,
                a.as_ptr(),
                out.as_mut_ptr(),
                sums,
            )
        }
    })
}
