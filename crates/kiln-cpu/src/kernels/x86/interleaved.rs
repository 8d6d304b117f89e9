//! The AVX-512 VNNI product over interleaved Q8_0 weights (layout: `kernels::interleaved`).
//!
//! Per group of 16 weight rows and block: the block's 8 quant lines are loaded once into 8
//! registers; for each activation row, 8 `vpdpbusd` of a line against that row's matching 4
//! quants broadcast from memory (two chains of four, started from the row's bias correction)
//! leave the 16 rows' exact block sums in the 16 lanes, and one conversion and one multiply-add
//! by `d * da` (the 16 scales converted once per block) add them into the row's f32 accumulator.
//! Activation rows go 8 at a time (8 accumulators and the 8 lines stay in registers), the group's
//! ~11 KB of weights in L1 across the chunks of 8.

use std::arch::x86_64::*;

use super::super::interleaved::{activation_terms, block_at, check_call, INTERLEAVE_ROWS};

/// Bytes of a Q8_0 block (an activation block too).
const BLOCK: usize = 34;

thread_local! {
    /// Per-thread activation terms (`-128 * sum(q)` and `da` of every activation block), reused.
    static TERMS: std::cell::RefCell<(Vec<i32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `kernels::InterleavedGemmFn` on AVX-512 VNNI.
///
/// # Safety
/// As `InterleavedGemmFn`; handed out only when the CPU has AVX-512 F/BW/VL/VNNI (and AVX2,
/// FMA, F16C).
pub(in crate::kernels) unsafe fn q8_0x16_gemm(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let blocks = check_call(k, w, rows, a, cols);
    if rows == 0 || cols == 0 {
        return;
    }
    TERMS.with_borrow_mut(|(start, da)| {
        activation_terms(a, blocks, start, da);
        // SAFETY: the lengths are checked above (whole groups of `blocks` blocks, `cols`
        // activation rows of `blocks` blocks, the terms of each); the caller vouches for `out`
        // and the CPU.
        unsafe {
            groups(
                blocks,
                w.as_ptr(),
                rows / INTERLEAVE_ROWS,
                a.as_ptr(),
                cols,
                start,
                da,
                out,
                ldo,
            )
        }
    });
}

/// Every group of `w` against every activation row, 8 activation rows at a time per group.
///
/// # Safety
/// As [`q8_0x16_gemm`] after its checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn groups(
    blocks: usize,
    w: *const u8,
    n_groups: usize,
    a: *const u8,
    cols: usize,
    start: &[i32],
    da: &[f32],
    out: *mut f32,
    ldo: usize,
) {
    let group_bytes = blocks * BLOCK * INTERLEAVE_ROWS;
    let a_row = blocks * BLOCK;
    for g in 0..n_groups {
        let wg = w.add(g * group_bytes);
        let mut c0 = 0;
        while c0 < cols {
            let m = (cols - c0).min(8);
            let at = Chunk {
                blocks,
                w: wg,
                a: a.add(c0 * a_row),
                a_row,
                start: start.as_ptr().add(c0 * blocks),
                da: da.as_ptr().add(c0 * blocks),
                out: out.add(c0 * ldo + g * INTERLEAVE_ROWS),
                ldo,
            };
            match m {
                1 => chunk::<1>(&at),
                2 => chunk::<2>(&at),
                3 => chunk::<3>(&at),
                4 => chunk::<4>(&at),
                5 => chunk::<5>(&at),
                6 => chunk::<6>(&at),
                7 => chunk::<7>(&at),
                _ => chunk::<8>(&at),
            }
            c0 += m;
        }
    }
}

/// One group against `M` activation rows: where everything is.
struct Chunk {
    blocks: usize,
    /// The group's first byte.
    w: *const u8,
    /// The first activation row's first block.
    a: *const u8,
    a_row: usize,
    /// The first activation row's terms (rows `blocks` apart).
    start: *const i32,
    da: *const f32,
    /// Where the first activation row's 16 outputs go (rows `ldo` apart).
    out: *mut f32,
    ldo: usize,
}

/// The 16 rows of a group against `M` activation rows (see the module docs).
///
/// # Safety
/// `c` names a whole group, `M` activation rows and their terms, and writable outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn chunk<const M: usize>(c: &Chunk) {
    let mut acc = [_mm512_setzero_ps(); M];
    for b in 0..c.blocks {
        let (scales, quants) = block_at(c.blocks, b);
        let q = c.w.add(quants);
        let lines: [__m512i; 8] = std::array::from_fn(|l| _mm512_loadu_si512(q.add(64 * l).cast()));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.w.add(scales).cast()));
        // The activation rows' 4-quant chunks, broadcast from memory: row `j`, line `l`.
        let chunk = |j: usize, l: usize| {
            _mm512_set1_epi32(
                c.a.add(j * c.a_row + b * BLOCK + 2 + 4 * l)
                    .cast::<i32>()
                    .read_unaligned(),
            )
        };
        // One chain of 8 `vpdpbusd` per activation row, the rows' chains interleaved so that
        // consecutive instructions are independent; below 4 rows each row's chain is split in
        // two (even and odd lines), for enough chains in flight.
        let mut sums: [__m512i; M] =
            std::array::from_fn(|j| _mm512_set1_epi32(*c.start.add(j * c.blocks + b)));
        if M >= 4 {
            for (l, line) in lines.iter().enumerate() {
                for (j, sum) in sums.iter_mut().enumerate() {
                    *sum = _mm512_dpbusd_epi32(*sum, *line, chunk(j, l));
                }
            }
        } else {
            let mut odd = [_mm512_setzero_si512(); M];
            for l in (0..8).step_by(2) {
                for j in 0..M {
                    sums[j] = _mm512_dpbusd_epi32(sums[j], lines[l], chunk(j, l));
                    odd[j] = _mm512_dpbusd_epi32(odd[j], lines[l + 1], chunk(j, l + 1));
                }
            }
            for j in 0..M {
                sums[j] = _mm512_add_epi32(sums[j], odd[j]);
            }
        }
        for (j, acc) in acc.iter_mut().enumerate() {
            let factor = _mm512_mul_ps(d, _mm512_set1_ps(*c.da.add(j * c.blocks + b)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[j]), factor, *acc);
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(c.out.add(j * c.ldo), *acc);
    }
}
