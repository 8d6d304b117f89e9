//! Q4_K's interleaved layout (`kernels::interleaved::q4_k`) for the AVX2 products of
//! `gemm::interleaved`, bit-identical to [`SuperBlocks`]`<Q4K>`'s tiles.
//!
//! A line's 32-byte half, its nibbles split, is a panel line of two sub-blocks (the low nibbles
//! sub-block `2c`, the high ones `2c + 1`). The one-row kernel spends per line and half an `and`
//! (and a shift) and a `maddubs` against 4 activation quants broadcast, the i16 sums of a
//! sub-block widened once by its scale; then the tile's exact i32 sums (`isum`: the sub-block
//! sums times their scales; `mins`: the minimums times the activation sums of their sub-blocks)
//! and its f32 steps in its order (`SuperBlocks::finish_block`).
//!
//! Q6_K has the same kind of kernel written and bit-exact, but not here: its codes take four
//! times the instructions to unpack (6 bits from two lines), so it ran only 1.1x the file
//! layout's one-row kernel in cache and no faster streaming from memory with two threads, while
//! making batched decode faster (Zen 3, docs/BENCHMARKS.md); its products stay with the file
//! layout's kernels.

use std::arch::x86_64::*;

use super::super::interleaved::Layout;
use super::super::{broadcast4, PANEL_ROWS, PIECE};
use super::{KQuant, SuperBlocks, Q4K, Q8K, Q8K_QS};
use crate::kernels::interleaved::{q4_k, ActivationTerms, Blocking};
use crate::kernels::x86::{load16, load32};

type Tile4 = SuperBlocks<Q4K>;

/// How far ahead of the super-block it multiplies [`Layout::direct`] requests the weights. The
/// hardware prefetcher alone left one thread streaming a 75 MB matrix at 18.7 GB/s (the file
/// layout's kernel too); requests 2, 4 and 8 KB ahead gave 25.6, 26.4 and 26.8 GB/s, and two
/// such streams at once 25.5 GB/s each (Zen 3, `examples/interleave_stream_bench`: docs/BENCHMARKS.md).
const PREFETCH: usize = 4096;

/// The byte shuffle that puts bytes `lo` and `hi` of each 32-bit lane in its two i16 halves,
/// zero-extended.
const fn pair_shuffle(lo: usize, hi: usize) -> [u8; 32] {
    let mut t = [0x80u8; 32];
    let mut i = 0;
    while i < 8 {
        let at = 4 * (i % 4) + 16 * (i / 4);
        t[at] = (4 * (i % 4) + lo) as u8;
        t[at + 2] = (4 * (i % 4) + hi) as u8;
        i += 1;
    }
    t
}

/// Byte `j` of each 32-bit lane in both i16 halves: a sub-block scale as the tile's panel holds
/// it (`(sc, sc)`).
const SCALE_TWICE: [[u8; 32]; 4] = [
    pair_shuffle(0, 0),
    pair_shuffle(1, 1),
    pair_shuffle(2, 2),
    pair_shuffle(3, 3),
];

/// Bytes `2p` and `2p + 1` of each 32-bit lane in its i16 halves: a pair of minimums as the
/// tile's panel holds them.
const MIN_PAIR: [[u8; 32]; 2] = [pair_shuffle(0, 1), pair_shuffle(2, 3)];

/// The 6-bit scales and minimums of half `h` (rows `8h..8h + 8`) of the group's super-block at
/// `src`, one row a 32-bit lane: `(scales 0..4, scales 4..8, minimums 0..4, minimums 4..8)`, a
/// byte each (ggml's `get_scale_min_k4` on the 12 packed bytes, whose three words the layout's
/// three scale lines hold).
///
/// # Safety
/// AVX2; `src` points at a super-block of a group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_mins(src: *const u8, h: usize) -> [__m256i; 4] {
    let at = src.add(q4_k::SCALES + 32 * h);
    let (s0, s1, s2) = (load32(at), load32(at.add(64)), load32(at.add(128)));
    let low6 = _mm256_set1_epi8(0x3f);
    let low4 = _mm256_set1_epi8(0x0f);
    let top2 = _mm256_set1_epi8(0x30);
    // 32-bit shifts move the neighbouring byte's bits into the top of each byte; the masks keep
    // only the byte's own.
    let high = |v: __m256i| _mm256_and_si256(_mm256_srli_epi32::<2>(v), top2);
    [
        _mm256_and_si256(s0, low6),
        _mm256_or_si256(_mm256_and_si256(s2, low4), high(s0)),
        _mm256_and_si256(s1, low6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(s2), low4), high(s1)),
    ]
}

/// Q4_K's interleaved layout (`kernels::interleaved::q4_k`).
pub(in crate::kernels::x86::gemm) struct Q4Layout;

impl Layout for Q4Layout {
    type F = Tile4;
    const BLOCKING: Blocking = q4_k::BLOCKING;
    const MIN_COLS: usize = Q4K::MIN_COLS;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(group: *const u8, _blocks: usize, b: usize, h: usize, dst: *mut u8) {
        let src = group.add(b * q4_k::GROUP_BLOCK);
        let low4 = _mm256_set1_epi8(0x0f);
        let store = |at: usize, v: __m256i| _mm256_storeu_si256(dst.add(at).cast(), v);
        for c in 0..4 {
            for v in 0..8 {
                let line = load32(src.add(q4_k::CODES + 64 * (8 * c + v) + 32 * h));
                store(2 * c * PIECE + 32 * v, _mm256_and_si256(line, low4));
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(line), low4);
                store((2 * c + 1) * PIECE + 32 * v, high);
            }
        }
        let [sc_lo, sc_hi, mn_lo, mn_hi] = scales_mins(src, h);
        for g in 0..8 {
            let bytes = if g < 4 { sc_lo } else { sc_hi };
            let sc = _mm256_shuffle_epi8(bytes, load32(SCALE_TWICE[g % 4].as_ptr()));
            store(Tile4::SCALES_AT + 32 * g, sc);
        }
        for p in 0..4 {
            let bytes = if p < 2 { mn_lo } else { mn_hi };
            let pair = _mm256_shuffle_epi8(bytes, load32(MIN_PAIR[p % 2].as_ptr()));
            store(Tile4::MINS_AT + 32 * p, pair);
        }
        let halves = |at: usize| _mm256_cvtph_ps(load16(src.add(at + 16 * h)));
        _mm256_storeu_ps(dst.add(Tile4::DMIN_LINE_AT).cast(), halves(q4_k::DMIN));
        _mm256_storeu_ps(dst.add(Tile4::D_LINE_AT).cast(), halves(0));
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
        let low4 = _mm256_set1_epi8(0x0f);
        let low_bytes = _mm256_set1_epi32(0x00ff_00ff);
        let mut acc = [_mm256_setzero_ps(); 2];
        for b in 0..blocks {
            let src = group.add(b * q4_k::GROUP_BLOCK);
            let yq = a.add(b * Q8K + Q8K_QS);
            let t = t0 + b;
            // The activation sums of the sub-blocks, in pairs as `MIN_PAIRS` orders them.
            let sums: [__m256i; 4] = std::array::from_fn(|p| {
                _mm256_set1_epi32(*terms.sums.get_unchecked(q4_k::TERMS * t + p))
            });
            let mut scale = [[_mm256_setzero_si256(); 8]; 2];
            let mut mins = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                let [sc_lo, sc_hi, mn_lo, mn_hi] = scales_mins(src, h);
                for (j, shuffle) in SCALE_TWICE.iter().enumerate() {
                    let shuffle = load32(shuffle.as_ptr());
                    scale[h][j] = _mm256_shuffle_epi8(sc_lo, shuffle);
                    scale[h][j + 4] = _mm256_shuffle_epi8(sc_hi, shuffle);
                }
                // Minimums (0, 2), (1, 3), then (4, 6), (5, 7), as i16 pairs.
                let pairs = [
                    _mm256_and_si256(mn_lo, low_bytes),
                    _mm256_srli_epi16::<8>(mn_lo),
                    _mm256_and_si256(mn_hi, low_bytes),
                    _mm256_srli_epi16::<8>(mn_hi),
                ];
                for p in 0..4 {
                    let wide = _mm256_madd_epi16(pairs[p], sums[p]);
                    mins[h] = _mm256_add_epi32(mins[h], wide);
                }
            }
            let mut isum = [_mm256_setzero_si256(); 2];
            for cc in 0..4 {
                prefetch_quarter(src, q4_k::GROUP_BLOCK, cc);
                // Sub-blocks 2cc (low nibbles) and 2cc + 1 (high): 8 lines of 4 codes each,
                // |sum| <= 8 * 2 * 15 * 127 = 30480 per i16.
                let mut s_lo = [_mm256_setzero_si256(); 2];
                let mut s_hi = [_mm256_setzero_si256(); 2];
                for v in 0..8 {
                    let a_lo = broadcast4(yq.add(64 * cc + 4 * v));
                    let a_hi = broadcast4(yq.add(64 * cc + 32 + 4 * v));
                    for h in 0..2 {
                        let line = load32(src.add(q4_k::CODES + 64 * (8 * cc + v) + 32 * h));
                        let lo = _mm256_and_si256(line, low4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(line), low4);
                        s_lo[h] = _mm256_add_epi16(s_lo[h], _mm256_maddubs_epi16(lo, a_lo));
                        s_hi[h] = _mm256_add_epi16(s_hi[h], _mm256_maddubs_epi16(hi, a_hi));
                    }
                }
                for h in 0..2 {
                    let lo = _mm256_madd_epi16(s_lo[h], scale[h][2 * cc]);
                    let hi = _mm256_madd_epi16(s_hi[h], scale[h][2 * cc + 1]);
                    isum[h] = _mm256_add_epi32(isum[h], _mm256_add_epi32(lo, hi));
                }
            }
            // The tile's f32 steps (`SuperBlocks::finish_block`), in its order.
            let da = _mm256_set1_ps(*terms.scales.get_unchecked(t));
            for h in 0..2 {
                let d = _mm256_cvtph_ps(load16(src.add(16 * h)));
                let dmin = _mm256_cvtph_ps(load16(src.add(q4_k::DMIN + 16 * h)));
                let sum = _mm256_cvtepi32_ps(isum[h]);
                acc[h] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, da), acc[h]);
                let m = _mm256_cvtepi32_ps(mins[h]);
                acc[h] = _mm256_fnmadd_ps(m, _mm256_mul_ps(dmin, da), acc[h]);
            }
        }
        for (h, v) in acc.into_iter().enumerate() {
            _mm256_storeu_ps(out.add(h * PANEL_ROWS), v);
        }
    }
}

/// Requests quarter `q` of the `bytes` of a super-block at `src`, [`PREFETCH`] bytes ahead (a
/// hint: it never faults past the end, hence `wrapping_add`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch_quarter(src: *const u8, bytes: usize, q: usize) {
    let quarter = bytes / 4;
    for l in 0..quarter.div_ceil(64) {
        let ahead = src.wrapping_add(PREFETCH + quarter * q + 64 * l);
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
    }
}
