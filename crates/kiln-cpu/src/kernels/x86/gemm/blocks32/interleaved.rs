//! Q5_0's interleaved layout (`kernels::interleaved`, its AVX2 form) for the AVX2 products of
//! `gemm::interleaved`, bit-identical to [`Blocks32`]`<Q5_0>`'s tiles.
//!
//! A block's 4 quant lines hold 16 rows' packed bytes: a line's 32-byte half, its nibbles split,
//! is two panel lines (the low nibbles chunk `v`, the high ones chunk `v + 4`), each completed by
//! its fifth bits at bit 4 of every byte. In the AVX2 form of the layout a half's 32 mask bytes
//! hold those bits transposed (byte `j` of a panel line finds its bit for chunk `c` in bit `c` of
//! mask byte `j`), so one 16-bit shift and one `and` give a chunk's fifth bits where spreading a
//! 32-bit mask takes four instructions: the one-row kernel runs about 1.8x the file layout's in
//! cache (Zen 3, docs/BENCHMARKS.md). Its i16 sums cover 4 chunks each (`|sum| <= 4 * 2 * 31 *
//! 128 = 31744`: no wrap), widened to i32 before the offset `16 * sum(a)` comes off: the tile's
//! exact block sums, then its f32 step (`finish_block`).

use std::arch::x86_64::*;

use super::super::interleaved::Layout;
use super::super::{broadcast4, PANEL_ROWS, PIECE};
use super::{Blocks32, Legacy, Q5_0};
use crate::kernels::interleaved::{ActivationTerms, Blocking, Q5_0 as GEOMETRY};
use crate::kernels::x86::{load16, load32};

type Tile = Blocks32<Q5_0>;

/// How far ahead of the block it multiplies [`Layout::direct`] requests the weights (as Q4_K's
/// one-row kernel, `superblocks::interleaved`).
const PREFETCH: usize = 4096;

/// The two panel lines of line `v` of half `h` of a block: chunk `v` (low nibbles) and chunk
/// `v + 4` (high), each with its fifth bits from the half's transposed masks `f`.
///
/// # Safety
/// AVX2; the block's quants are readable at `quants`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunks(quants: *const u8, f: __m256i, v: usize, h: usize) -> [__m256i; 2] {
    let low4 = _mm256_set1_epi8(0x0f);
    let bit4 = _mm256_set1_epi8(0x10);
    let line = load32(quants.add(64 * v + 32 * h));
    // Bit `v` of each mask byte to bit 4, then bit `v + 4` to bit 4 (16-bit shifts: the `and`
    // drops what crossed from the neighbouring byte).
    let (lo_bits, hi_bits) = match v {
        0 => (_mm256_slli_epi16::<4>(f), f),
        1 => (_mm256_slli_epi16::<3>(f), _mm256_srli_epi16::<1>(f)),
        2 => (_mm256_slli_epi16::<2>(f), _mm256_srli_epi16::<2>(f)),
        _ => (_mm256_slli_epi16::<1>(f), _mm256_srli_epi16::<3>(f)),
    };
    let lo = _mm256_and_si256(line, low4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(line), low4);
    [
        _mm256_or_si256(lo, _mm256_and_si256(lo_bits, bit4)),
        _mm256_or_si256(hi, _mm256_and_si256(hi_bits, bit4)),
    ]
}

/// Q5_0's interleaved layout in its AVX2 form.
pub(in crate::kernels::x86::gemm) struct Q5Layout;

impl Layout for Q5Layout {
    type F = Tile;
    const BLOCKING: Blocking = GEOMETRY.blocking();
    // Below 3 activation rows the one-row kernel per row beats packing the panels.
    const MIN_COLS: usize = 3;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(group: *const u8, blocks: usize, b: usize, h: usize, dst: *mut u8) {
        let (scales, masks, quants) = GEOMETRY.block_at(blocks, b);
        let f = load32(group.add(masks + 32 * h));
        for v in 0..4 {
            let [lo, hi] = chunks(group.add(quants), f, v, h);
            _mm256_storeu_si256(dst.add(32 * v).cast(), lo);
            _mm256_storeu_si256(dst.add(32 * (v + 4)).cast(), hi);
        }
        let d = _mm256_cvtph_ps(load16(group.add(scales + 16 * h)));
        _mm256_storeu_ps(dst.add(PIECE).cast(), d);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn direct(
        group: *const u8,
        blocks: usize,
        a: *const u8,
        terms: &ActivationTerms,
        t0: usize,
        out: *mut f32,
    ) {
        const { assert!(Q5_0::OFFSET == 16) };
        let ones = _mm256_set1_epi16(1);
        let block_bytes = GEOMETRY.group_block();
        let mut acc = [_mm256_setzero_ps(); 2];
        for b in 0..blocks {
            for l in 0..block_bytes.div_ceil(64) {
                let ahead = group.wrapping_add(b * block_bytes + PREFETCH + 64 * l);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            }
            let (scales, masks, quants) = GEOMETRY.block_at(blocks, b);
            let yq = a.add(b * Q5_0::A_BLOCK + Q5_0::A_QS);
            let f = [load32(group.add(masks)), load32(group.add(masks + 32))];
            let mut s_lo = [_mm256_setzero_si256(); 2];
            let mut s_hi = [_mm256_setzero_si256(); 2];
            for v in 0..4 {
                let a_lo = broadcast4(yq.add(4 * v));
                let a_hi = broadcast4(yq.add(16 + 4 * v));
                for h in 0..2 {
                    let [lo, hi] = chunks(group.add(quants), f[h], v, h);
                    s_lo[h] = _mm256_add_epi16(s_lo[h], _mm256_maddubs_epi16(lo, a_lo));
                    s_hi[h] = _mm256_add_epi16(s_hi[h], _mm256_maddubs_epi16(hi, a_hi));
                }
            }
            let t = t0 + b;
            let offset = _mm256_set1_epi32(16 * *terms.sums.get_unchecked(t));
            let da = _mm256_set1_ps(*terms.scales.get_unchecked(t));
            for h in 0..2 {
                let wide = _mm256_add_epi32(
                    _mm256_madd_epi16(s_lo[h], ones),
                    _mm256_madd_epi16(s_hi[h], ones),
                );
                let isum = _mm256_sub_epi32(wide, offset);
                // The tile's f32 step (`finish_block`).
                let d = _mm256_cvtph_ps(load16(group.add(scales + 16 * h)));
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, da), acc[h]);
            }
        }
        for (h, v) in acc.into_iter().enumerate() {
            _mm256_storeu_ps(out.add(h * PANEL_ROWS), v);
        }
    }
}
