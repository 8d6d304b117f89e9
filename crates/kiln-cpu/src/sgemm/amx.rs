//! F32 products on Intel AMX BF16 tiles (`tdpbf16ps`), each operand split into two BF16 parts:
//! the float GEMM where the operating system grants the tiles ([`available`]) and
//! [`CpuOptions::amx_float`](crate::CpuOptions::amx_float) asks for it.
//!
//! **The split.** A value `v` becomes `hi = bf16(v)` and `lo = bf16(v − hi)` (round to nearest
//! even; `v − hi` is exact in f32), so `|v − hi| ≤ 2⁻⁸·|v|` and `v = hi + lo + e` with
//! `|e| ≤ 2⁻¹⁷·|v|`. A product `x·w` is computed as `x_hi·w_lo + x_hi·w_hi + x_lo·w_hi`: each
//! BF16 product is exact in f32 and added into an f32 sum. The dropped `x_lo·w_lo` (at most
//! `2⁻¹⁶·(1 + 2⁻⁹)²·|x·w|`) and the parts' errors (`2⁻¹⁷` each) leave each term within
//! `2⁻¹⁵·(1 + 2⁻⁸)·|x·w|`, so a sum over `k` steps is within `2⁻¹⁵·(1 + 2⁻⁸) + γ₃ₖ₊₂` of
//! `Σ|x·w|` (about 3·10⁻⁵ at worst, where the f32 kernels' products are exact and only their
//! `k` additions round; random operands land far inside it). The tile instructions flush BF16
//! subnormals (parts below 2⁻¹²⁶) to zero, and an infinite operand gives NaN (`∞ − ∞` in its lo
//! part). These are not the other kernels' bits (tested against f64 with that bound); every sum
//! is the same chain of instructions for any thread count and whatever the other rows of the
//! call are (tested), so the products stay thread- and batch-invariant.
//!
//! **Why.** One `tdpbf16ps` does 16 × 16 × 32 multiply-adds: three of them per 32 k-steps of
//! 32 × 32 sums would take ~1/5 of the cycles of the AVX-512 FMA kernel. The tile loads bound
//! it instead (eight per twelve products, each ~3 products' time on an Emerald Rapids VM):
//! measured 1.4-1.9× the f32 kernel's GFLOP/s (docs/BENCHMARKS.md).
//!
//! **Layouts.** Weights, packed once ([`SplitPanels`]): per panel of [`NR`] output columns, per
//! chunk of 32 k-steps, a hi tile then a lo tile, each 16 rows of 16 column pairs (row `i`,
//! column `c`: steps `2i` and `2i + 1` of weight row `c`), zero past `n` and `k`. Activations,
//! split by each task for its rows into a buffer of its thread: a row holds its hi parts then
//! its lo parts, each padded with zeros to the chunks (`2·k32` values a row); the rows are padded
//! to whole blocks of 32 (padding rows give sums that are never stored). A task computes blocks
//! of 32 rows by two panels over all of `k` in the tiles (no k-blocks), row group by row group.
//! A block's sums start from the bias (one 64-byte row loaded into all 16 rows of a tile:
//! stride 0), so the bias is the first term of each sum rather than added after it; a whole
//! block of a product without GELU is stored from the tiles straight into `y`, others through a
//! scratch block (GELU, edges).

use half::bf16;

use super::{each_task, Exec, Isa, Out, Plan, NR};
use crate::kernels::{SplitTiles, SPLIT_TILE_BYTES};
use crate::team::Team;

/// k-steps per chunk: one operand tile row holds 32 BF16 values.
const CHUNK: usize = 32;
/// Rows per block: two tiles of 16.
const ROWS: usize = 32;

/// Whether F32 products can run on the split BF16 tiles with `isa`: the AVX-512 kernel level,
/// CPUID's AMX-BF16 and AVX512_BF16, and the tile state granted to this process
/// (`kernels::amx_granted`, which `KILN_AMX=0` refuses).
pub(crate) fn available(isa: Isa) -> bool {
    isa == Isa::Avx512
        && crate::kernels::amx_granted()
        && crate::kernels::cpu_has_amx_bf16()
        && is_x86_feature_detected!("avx512bf16")
}

/// `v` as its BF16 parts `(hi, lo)` (bits), each rounded to nearest even.
pub(crate) fn split(v: f32) -> (u16, u16) {
    let hi = bf16::from_f32(v);
    let lo = bf16::from_f32(v - hi.to_f32());
    (hi.to_bits(), lo.to_bits())
}

/// One operand tile of packed weights: 16 rows of 16 BF16 pairs.
#[derive(Clone, Copy, PartialEq)]
#[repr(C, align(64))]
pub(crate) struct Block([u16; SPLIT_TILE_BYTES / 2]);

/// An F32 weight `[n, k]` packed for the tiles (see the module docs).
#[derive(Clone, PartialEq)]
pub(crate) struct SplitPanels {
    /// Chunks of 32 k-steps (`k` rounded up).
    chunks: usize,
    /// `n.div_ceil(NR)` panels of `chunks` (hi, lo) pairs of tiles.
    blocks: Vec<Block>,
}

impl SplitPanels {
    /// Packs `n` rows of `k` F32 values (`row_bytes = 4k` each, checked by the caller), panels
    /// in parallel on `team`; `None` where [`available`] says no for `isa`.
    pub(crate) fn pack(
        isa: Isa,
        team: &Team,
        bytes: &[u8],
        n: usize,
        k: usize,
        row_bytes: usize,
    ) -> Option<SplitPanels> {
        if !available(isa) {
            return None;
        }
        let chunks = k.div_ceil(CHUNK);
        let mut blocks = vec![Block([0; SPLIT_TILE_BYTES / 2]); n.div_ceil(NR) * chunks * 2];
        team.for_each_chunk(&mut blocks, 2 * chunks, |panel, dst| {
            for c in 0..NR.min(n - panel * NR) {
                let r = panel * NR + c;
                let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
                for (p, v) in src.chunks_exact(4).enumerate() {
                    let (hi, lo) = split(f32::from_le_bytes([v[0], v[1], v[2], v[3]]));
                    let (chunk, s) = (p / CHUNK, p % CHUNK);
                    let at = (s / 2) * 2 * NR + 2 * c + s % 2;
                    dst[2 * chunk].0[at] = hi;
                    dst[2 * chunk + 1].0[at] = lo;
                }
            }
        });
        Some(SplitPanels { chunks, blocks })
    }

    /// The memory the tiles take, in bytes.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&self.blocks[..])
    }
}

thread_local! {
    /// Each thread's split activations of its current task (grown, never shrunk).
    static XSPLIT: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `y = x · Wᵀ (+ bias)`, GELU'd with `gelu`, for `x` of `m` rows of `k` and the packed `w` of
/// `n` rows, as [`super::sgemm`] runs it. Each task splits its own rows into a buffer of its
/// thread (about `MC_MAX` rows: 144 KiB at k = 384, which stays in L2 for the tile loads), and
/// tasks take whole widths (the plan of a kernel that packs activations: no n-blocks), so each
/// row is split once. Splitting all of `x` up front wrote it out and read it back through
/// memory (7 % of an embedding run); per task with 1 MiB n-blocks it was split up to three
/// times (13 %); whole-width tasks measured 4-10 % faster than either on MiniLM.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    exec: Exec<'_>,
    x: &[f32],
    (m, n, k): (usize, usize, usize),
    w: &SplitPanels,
    bias: Option<&[f32]>,
    gelu: bool,
    out: &Out,
) {
    let k32 = w.chunks * CHUNK;
    assert!(
        x.len() == m * k
            && k <= k32
            && w.blocks.len() == n.div_ceil(NR) * 2 * w.chunks
            && bias.is_none_or(|b| b.len() == n),
        "split product out of bounds"
    );
    let row_len = 2 * k32;
    let plan = Plan::with_rows(m, n, k, true, ROWS);
    each_task(exec, &plan, |t| {
        XSPLIT.with_borrow_mut(|buf| {
            let (r0, r1, _, _) = plan.task(t);
            let len = (r1 - r0).next_multiple_of(ROWS) * row_len;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            // Rows past `r1` keep stale values: their sums are never stored.
            for (j, row) in buf[..(r1 - r0) * row_len]
                .chunks_exact_mut(row_len)
                .enumerate()
            {
                let r = r0 + j;
                split_row(&x[r * k..(r + 1) * k], row);
            }
            task(&plan, t, &buf[..len], k32, w, bias, gelu, out)
        })
    });
}

/// `src` split into `dst`: its hi parts, zeros to `k32 = dst.len() / 2`, its lo parts, zeros.
fn split_row(src: &[f32], dst: &mut [u16]) {
    let k32 = dst.len() / 2;
    assert!(src.len() <= k32 && dst.len() == 2 * k32);
    let (hi, lo) = dst.split_at_mut(k32);
    // SAFETY: `SplitPanels` exist only where `available` said yes, which checks AVX-512 F (the
    // kernel level) and AVX512_BF16; the lengths are checked above.
    unsafe { split_avx512(src, hi, Some(lo)) };
    hi[src.len()..].fill(0);
    lo[src.len()..].fill(0);
}

/// The BF16 parts of `src` into the first `src.len()` values of `hi` and (where given) `lo`, as
/// [`split`] makes them for normal values (`vcvtneps2bf16` rounds to nearest even and also
/// flushes subnormals to zero); without `lo`, each value rounded to BF16 once (`bf16_dot`).
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and BF16; `hi` and `lo` hold at least `src.len()` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn split_avx512(src: &[f32], hi: &mut [u16], mut lo: Option<&mut [u16]>) {
    use std::arch::x86_64::*;
    let n = src.len();
    let mut i = 0;
    while i < n {
        // The tail through a masked load, so every value takes the same instruction.
        let lanes = (n - i).min(16);
        let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
        let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
        let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
        _mm256_mask_storeu_epi16(hi.as_mut_ptr().add(i).cast(), mask, h);
        if let Some(lo) = lo.as_deref_mut() {
            let wide = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            let l: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_sub_ps(v, wide)));
            _mm256_mask_storeu_epi16(lo.as_mut_ptr().add(i).cast(), mask, l);
        }
        i += 16;
    }
}

/// Task `t` of `plan`: blocks of 32 rows by two panels (the last panel alone where the task has
/// an odd count), row group by row group, each over all of `k` in the tiles; `xs` holds the
/// task's rows split, from its first (`plan.task(t).0`).
#[allow(clippy::too_many_arguments)]
fn task(
    plan: &Plan,
    t: usize,
    xs: &[u16],
    k32: usize,
    w: &SplitPanels,
    bias: Option<&[f32]>,
    gelu: bool,
    out: &Out,
) {
    let (r0, r1, p0, p1) = plan.task(t);
    let row_len = 2 * k32;
    let per_panel = 2 * w.chunks;
    assert!(
        (r1 - r0).next_multiple_of(ROWS) * row_len <= xs.len() && p1 * per_panel <= w.blocks.len(),
        "split task out of bounds"
    );
    // SAFETY: `w` exists, so `available` said yes (the grant and AMX-BF16).
    let tiles = unsafe { SplitTiles::begin() };
    let mut sums = [[0.0f32; 2 * NR]; ROWS];
    let mut init = [0.0f32; 2 * NR];
    for row in (r0..r1).step_by(ROWS) {
        let a = [
            xs[(row - r0) * row_len..].as_ptr().cast::<u8>(),
            xs[(row - r0 + ROWS / 2) * row_len..].as_ptr().cast::<u8>(),
        ];
        let rows = (r1 - row).min(ROWS);
        for panel in (p0..p1).step_by(2) {
            let second = if panel + 1 < p1 { panel + 1 } else { panel };
            let b = [
                w.blocks[panel * per_panel..].as_ptr().cast::<u8>(),
                w.blocks[second * per_panel..].as_ptr().cast::<u8>(),
            ];
            let c0 = panel * NR;
            let cols = ((second - panel + 1) * NR).min(plan.n - c0);
            if let Some(bias) = bias {
                // Zeros past the last column: the block computes them, the store drops them.
                init[..cols].copy_from_slice(&bias[c0..c0 + cols]);
                init[cols..].fill(0.0);
            }
            // A whole block of a product without GELU goes from the tiles straight to `y`.
            let direct = !gelu && rows == ROWS && cols == 2 * NR;
            let dst = if direct {
                assert!(
                    out.block_fits(row, c0, ROWS, 2 * NR),
                    "split block out of bounds"
                );
                // SAFETY: `block_fits` proves the 32 × 32 block inside `y`.
                (
                    unsafe { out.ptr.add(row * out.ld + c0) }.cast::<u8>(),
                    4 * out.ld,
                )
            } else {
                (sums.as_mut_ptr().cast::<u8>(), 4 * 2 * NR)
            };
            // SAFETY: the assert above proves rows `row - r0 .. row - r0 + 32` of `xs` (each
            // `row_len` values: hi parts at 0, lo parts `2·k32` bytes on, `w.chunks` chunks of 64
            // bytes each) and both panels' `2·w.chunks` tiles readable; `dst` is `sums` or a block
            // of `y` that this task alone accesses (see `Out`).
            unsafe { tiles.block(w.chunks, a, 2 * k32, 2 * row_len, b, &init, dst) };
            if !direct {
                store(out, &sums, (row, rows), (c0, cols), gelu);
            }
        }
    }
    drop(tiles);
}

/// Rows `[r0, r0 + rows)`, columns `[c0, c0 + cols)` of `y` from `sums` (GELU'd with `gelu`).
fn store(
    out: &Out,
    sums: &[[f32; 2 * NR]; ROWS],
    (r0, rows): (usize, usize),
    (c0, cols): (usize, usize),
    gelu: bool,
) {
    assert!(
        (1..=ROWS).contains(&rows)
            && (1..=2 * NR).contains(&cols)
            && out.block_fits(r0, c0, rows, cols),
        "split store out of bounds"
    );
    // SAFETY: the assert proves every row's `cols` elements inside `y`; this task alone
    // accesses them (see `Out`).
    unsafe { store_avx512(out, sums, (r0, rows), (c0, cols), gelu) }
}

/// [`store`]'s stores: each row's two halves through masked AVX-512 loads and stores (the GELU
/// through a 16-value row, which `gelu_slice` compiles to vector code here).
///
/// # Safety
/// As checked by [`store`]; the CPU has AVX-512 F/BW (`available`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn store_avx512(
    out: &Out,
    sums: &[[f32; 2 * NR]; ROWS],
    (r0, rows): (usize, usize),
    (c0, cols): (usize, usize),
    gelu: bool,
) {
    use std::arch::x86_64::*;
    for h in 0..cols.div_ceil(NR) {
        let lanes = (cols - h * NR).min(NR);
        let mask: __mmask16 = if lanes == NR { !0 } else { (1u16 << lanes) - 1 };
        for (i, s) in sums.iter().take(rows).enumerate() {
            let mut v = _mm512_loadu_ps(s.as_ptr().add(h * NR));
            if gelu {
                let mut row = [0.0f32; NR];
                _mm512_storeu_ps(row.as_mut_ptr(), v);
                let mut g = [0.0f32; NR];
                crate::math::gelu_slice(&row, &mut g);
                v = _mm512_loadu_ps(g.as_ptr());
            }
            let dst = out.ptr.add((r0 + i) * out.ld + c0 + h * NR);
            _mm512_mask_storeu_ps(dst, mask, v);
        }
    }
}
