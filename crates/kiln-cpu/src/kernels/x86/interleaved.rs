//! The AVX-512 VNNI products over interleaved Q8_0 and Q5_0 weights (layouts:
//! `kernels::interleaved`).
//!
//! Per group of 16 weight rows and block: the block's 8 quant lines are made once into 8
//! registers (Q8_0: loaded; Q5_0: 4 loads split into low and high nibbles, each line's fifth bits
//! added by one masked add from its 64-bit mask); for each activation row, 8 `vpdpbusd` of a line
//! against that row's matching 4 quants broadcast from memory, started from the row's offset
//! correction, leave the 16 rows' exact block sums in the 16 lanes, and one conversion and one
//! multiply-add by `d * da` (the 16 scales converted once per block) add them into the row's f32
//! accumulator. Activation rows go 8 at a time (8 accumulators and the 8 lines stay in
//! registers), the group's weights (11 KB for 640-element Q8_0 rows) in L1 across the chunks of 8.

use std::arch::x86_64::*;

use kiln_core::GgmlType;

use super::super::interleaved::{
    check_call, ActivationTerms, Geometry, InterleavedGemmFn, INTERLEAVE_ROWS, Q5_0, Q8_0,
};

/// Bytes of a Q8_0 activation block.
const A_BLOCK: usize = 34;

/// A format's interleaved quant lines.
trait Lines {
    const GEOMETRY: Geometry;

    /// The 8 lines of one block of a group, quants as unsigned bytes (`q + offset`): line `c`
    /// holds quants `4c..4c + 4` of each row in the row's lane.
    ///
    /// # Safety
    /// The block's masks and quants are readable at `masks` and `quants`; AVX-512 F/BW.
    unsafe fn lines(masks: *const u8, quants: *const u8) -> [__m512i; 8];
}

struct Q8;
struct Q5;

impl Lines for Q8 {
    const GEOMETRY: Geometry = Q8_0;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn lines(_masks: *const u8, quants: *const u8) -> [__m512i; 8] {
        std::array::from_fn(|l| _mm512_loadu_si512(quants.add(64 * l).cast()))
    }
}

impl Lines for Q5 {
    const GEOMETRY: Geometry = Q5_0;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn lines(masks: *const u8, quants: *const u8) -> [__m512i; 8] {
        let low4 = _mm512_set1_epi8(0x0f);
        let fifth = _mm512_set1_epi8(16);
        let mask = |c: usize| masks.add(8 * c).cast::<u64>().read_unaligned();
        let mut lines = [_mm512_setzero_si512(); 8];
        for v in 0..4 {
            let packed = _mm512_loadu_si512(quants.add(64 * v).cast());
            let low = _mm512_and_si512(packed, low4);
            let high = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), low4);
            lines[v] = _mm512_mask_add_epi8(low, mask(v), low, fifth);
            lines[4 + v] = _mm512_mask_add_epi8(high, mask(4 + v), high, fifth);
        }
        lines
    }
}

/// The kernel of `ty`'s interleaved layout (see `kernels::interleaved_gemm_fn`).
pub(in crate::kernels) fn interleaved_gemm_fn(ty: GgmlType) -> Option<InterleavedGemmFn> {
    match ty {
        GgmlType::Q8_0 => Some(gemm::<Q8>),
        GgmlType::Q5_0 => Some(gemm::<Q5>),
        _ => None,
    }
}

/// `kernels::InterleavedGemmFn` on AVX-512 VNNI for the format `L`.
///
/// # Safety
/// As `InterleavedGemmFn`; handed out only when the CPU has AVX-512 F/BW/VL/VNNI (and AVX2,
/// FMA, F16C).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<L: Lines>(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    terms: &ActivationTerms,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let blocks = check_call(L::GEOMETRY, k, w, rows, a, terms, cols);
    if rows == 0 || cols == 0 {
        return;
    }
    // SAFETY: the lengths are checked above (whole groups of `blocks` blocks, `cols` activation
    // rows of `blocks` blocks, the terms of each); the caller vouches for `out` and the CPU.
    unsafe {
        groups::<L>(
            blocks,
            w.as_ptr(),
            rows / INTERLEAVE_ROWS,
            a.as_ptr(),
            cols,
            terms,
            out,
            ldo,
        )
    }
}

/// Every group of `w` against every activation row, 8 activation rows at a time per group.
///
/// # Safety
/// As [`gemm`] after its checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn groups<L: Lines>(
    blocks: usize,
    w: *const u8,
    n_groups: usize,
    a: *const u8,
    cols: usize,
    terms: &ActivationTerms,
    out: *mut f32,
    ldo: usize,
) {
    let group_bytes = blocks * L::GEOMETRY.group_block();
    let a_row = blocks * A_BLOCK;
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
                sums: terms.sums.as_ptr().add(c0 * blocks),
                da: terms.scales.as_ptr().add(c0 * blocks),
                out: out.add(c0 * ldo + g * INTERLEAVE_ROWS),
                ldo,
            };
            match m {
                1 => chunk::<L, 1>(&at),
                2 => chunk::<L, 2>(&at),
                3 => chunk::<L, 3>(&at),
                4 => chunk::<L, 4>(&at),
                5 => chunk::<L, 5>(&at),
                6 => chunk::<L, 6>(&at),
                7 => chunk::<L, 7>(&at),
                _ => chunk::<L, 8>(&at),
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
    /// The first activation row's quant sums and scales (rows `blocks` apart).
    sums: *const i32,
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
unsafe fn chunk<L: Lines, const M: usize>(c: &Chunk) {
    let offset = L::GEOMETRY.offset;
    let mut acc = [_mm512_setzero_ps(); M];
    for b in 0..c.blocks {
        let (scales, masks, quants) = L::GEOMETRY.block_at(c.blocks, b);
        let lines = L::lines(c.w.add(masks), c.w.add(quants));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.w.add(scales).cast()));
        // The activation rows' 4-quant chunks, broadcast from memory: row `j`, line `l`.
        let chunk = |j: usize, l: usize| {
            _mm512_set1_epi32(
                c.a.add(j * c.a_row + b * A_BLOCK + 2 + 4 * l)
                    .cast::<i32>()
                    .read_unaligned(),
            )
        };
        // One chain of 8 `vpdpbusd` per activation row, the rows' chains interleaved so that
        // consecutive instructions are independent; below 4 rows each row's chain is split in
        // two (even and odd lines), for enough chains in flight.
        let mut sums: [__m512i; M] =
            std::array::from_fn(|j| _mm512_set1_epi32(-offset * *c.sums.add(j * c.blocks + b)));
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
