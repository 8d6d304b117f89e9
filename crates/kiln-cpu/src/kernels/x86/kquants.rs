//! AVX2 dots of the k-quants (Q2_K..Q6_K, Q8_K) against Q8_K activations.
//!
//! A super-block of 256 weights is 8 or 16 sub-blocks, each with an integer scale. Per 32
//! weights: unpack to bytes, `maddubs` against the activations (16 i16 lanes), `madd` against the
//! sub-block scales broadcast to those lanes (8 i32 lanes); one f32 multiply-add per super-block.
//! Constant offsets of the quants (Q3_K's -4, Q6_K's -32) and the minimums of Q2_K/Q4_K/Q5_K are
//! folded in through the activation block's `bsums` (sums of 16 activation quants), which the
//! quantizer writes and keeps consistent with the quants.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use kiln_quant::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};

use super::{
    dot_i8_i8, f16_pair, f16_splat, hsum_ps, load16, load32, prefetch_ahead, read_f32, read_u32,
    row_dot,
};

const Q2K: usize = size_of::<BlockQ2K>();
const Q3K: usize = size_of::<BlockQ3K>();
const Q4K: usize = size_of::<BlockQ4K>();
const Q5K: usize = size_of::<BlockQ5K>();
const Q6K: usize = size_of::<BlockQ6K>();
const Q8K: usize = size_of::<BlockQ8K>();

const Q8K_QS: usize = offset_of!(BlockQ8K, qs);
const Q8K_BSUMS: usize = offset_of!(BlockQ8K, bsums);

/// Shuffle that broadcasts i16 lane `2k` of each 128-bit half to the low half and lane `2k + 1` to
/// the high half: the scales of the two 16-element sub-blocks of one 32-element chunk, when both
/// halves of the source hold the same 8 scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_scale_shuffle(k: usize) -> __m256i {
    let lo = (4 * k) as i16 | (((4 * k + 1) as i16) << 8);
    let hi = (4 * k + 2) as i16 | (((4 * k + 3) as i16) << 8);
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// Shuffle that broadcasts i16 lane `k` of each 128-bit half to all lanes of that half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_shuffle(k: usize) -> __m256i {
    _mm256_set1_epi16((2 * k) as i16 | (((2 * k + 1) as i16) << 8))
}

/// The 8 six-bit scales and 8 six-bit minimums of a Q4_K/Q5_K super-block (12 packed bytes at
/// `p`): the scales as i16 lanes 0..8 of both 128-bit halves; each minimum `mins[g]` twice, as
/// the i16 pair of 32-bit lane `g`; and the 16 bytes (scales, then minimums) in both halves.
///
/// # Safety
/// `p..p + 16` must be readable (the 4 bytes after the scales are loaded and ignored: the quants
/// follow them in both formats).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scales_mins(p: *const u8) -> (__m256i, __m256i, __m256i) {
    // Sub-blocks 0..4 keep their 6 bits in bytes 0..4 (scales) and 4..8 (mins); sub-blocks 4..8
    // have their low 4 bits in bytes 8..12 (scales low nibbles, mins high nibbles) and their top
    // 2 bits in the top bits of bytes 0..8.
    let v = load16(p);
    // Output byte order: scales 0..4, scales 4..8, mins 0..4, mins 4..8.
    let low = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    let top = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
    );
    let keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
    let nibble_hi = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
    // 16-bit shifts move bits of the neighbouring byte into the top of each byte; the masks
    // keep only bits that came from the byte itself.
    let bits = _mm_or_si128(
        _mm_and_si128(low, keep),
        _mm_and_si128(_mm_srli_epi16::<4>(low), nibble_hi),
    );
    let top2 = _mm_and_si128(_mm_srli_epi16::<2>(top), _mm_set1_epi8(0x30));
    let bytes = _mm256_broadcastsi128_si256(_mm_or_si128(bits, top2));
    let scales = _mm256_shuffle_epi8(bytes, load32(SCALES_WIDE.as_ptr()));
    let mins = _mm256_shuffle_epi8(bytes, load32(MINS_TWICE.as_ptr()));
    (scales, mins, bytes)
}

/// Byte shuffles of the paired form ([`k4_block_ints`] with paired activations): shuffle `j`
/// puts scale `2j` twice in each even 32-bit lane and scale `2j + 1` in each odd one.
const PAIR_SCALES: [[u8; 32]; QK_K / 64] = {
    let mut t = [[0x80u8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut lane = 0;
        while lane < 8 {
            let sc = (2 * j + lane % 2) as u8;
            t[j][4 * lane] = sc;
            t[j][4 * lane + 2] = sc;
            lane += 1;
        }
        j += 1;
    }
    t
};

/// The quants of a Q8_K block at `y` as the paired form takes them (`out`: 8 vectors). For each
/// 64 quants, sub-blocks `2j` (`a`) and `2j + 1` (`b`) with 32-bit lanes `a0..a8`, `b0..b8`:
/// vector `2j` is `a0 b1 a2 b3 ..`, vector `2j + 1` is `a1 b0 a3 b2 ..` — the lanes that the
/// weights' nibbles meet after [`k4_block_ints`] interleaves them the same way.
///
/// # Safety
/// AVX2+FMA+F16C; `y` points at a readable Q8_K block, `out` at 8 writable vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_pair_activations(y: *const u8, out: *mut __m256i) {
    let q8 = y.add(Q8K_QS);
    for j in 0..QK_K / 64 {
        let a = load32(q8.add(64 * j));
        let b = load32(q8.add(64 * j + 32));
        *out.add(2 * j) = _mm256_blend_epi32::<0xAA>(a, b);
        *out.add(2 * j + 1) = _mm256_shuffle_epi32::<0xB1>(_mm256_blend_epi32::<0xAA>(b, a));
    }
}

/// Byte shuffle of [`k4_scales_mins`]: bytes 0..8 of each half widened to i16 lanes.
const SCALES_WIDE: [u8; 32] = {
    let mut t = [0x80u8; 32];
    let mut i = 0;
    while i < 16 {
        t[2 * (i % 8) + 16 * (i / 8)] = (i % 8) as u8;
        i += 1;
    }
    t
};

/// Byte shuffle of [`k4_scales_mins`]: byte `8 + g` to both i16 halves of 32-bit lane `g`.
const MINS_TWICE: [u8; 32] = {
    let mut t = [0x80u8; 32];
    let mut g = 0;
    while g < 8 {
        let at = 4 * (g % 4) + 16 * (g / 4);
        t[at] = 8 + g as u8;
        t[at + 2] = 8 + g as u8;
        g += 1;
    }
    t
};

/// `mins[g] * (sum of the 32 activation quants of sub-block g)` over the 8 sub-blocks of a
/// Q4_K/Q5_K super-block, one per i32 lane; `mins_twice` as [`k4_scales_mins`]
/// gives them, `bsums` at `bsums_at`. Each product is
/// `mins[g] * bsums[2g] + mins[g] * bsums[2g + 1]`, one `madd` lane: exact in i32 for any `bsums`,
/// and equal to the product with the sum
/// `S[g]` that the tiles form (`gemm::superblocks::min_sums`) since `|S[g]| <= 32 * 128`.
///
/// # Safety
/// `bsums_at..bsums_at + 32` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_min_dot(mins_twice: __m256i, bsums_at: *const u8) -> __m256i {
    _mm256_madd_epi16(mins_twice, load32(bsums_at))
}

/// Sum of the 4 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_ps_128(x: __m128) -> f32 {
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

row_dot!(
    /// Q4_K weights . Q8_K activations.
    q4_k_q8_k => q4_k_q8_k_avx2, QK_K, Q4K, Q8K
);

/// The exact integer parts of one Q4_K super-block at `x` against the Q8_K block at `y`: the
/// quants' dot scaled by the sub-block scales (its sum over the 8 i32 lanes), and the minimums
/// against the activations' block sums (its sum over the 8 i32 lanes; weighed by `dmin`, it is
/// taken away). The row dot's; the tile-exact one-row product (`gemm::superblocks::rows_exact`)
/// forms the same integers with [`q4_k_block_ints_paired`] and reduces the lanes differently.
///
/// # Safety
/// AVX2+FMA+F16C; `x` points at a readable Q4_K block, `y` at a Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_block_ints(x: *const u8, y: *const u8) -> (__m256i, __m256i) {
    k4_block_ints(
        x,
        y,
        offset_of!(BlockQ4K, scales),
        offset_of!(BlockQ4K, qs),
        None,
        None,
    )
}

/// [`q4_k_block_ints`] against the paired activations of the Q8_K block at `y`
/// ([`k4_pair_activations`] at `yp`): the same integers, fewer shuffles and multiplies.
///
/// # Safety
/// As [`q4_k_block_ints`]; `yp` points at the 8 vectors that `k4_pair_activations(y)` wrote.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_block_ints_paired(
    x: *const u8,
    y: *const u8,
    yp: *const __m256i,
) -> (__m256i, __m256i) {
    k4_block_ints(
        x,
        y,
        offset_of!(BlockQ4K, scales),
        offset_of!(BlockQ4K, qs),
        None,
        Some(yp),
    )
}

/// The quants of sub-blocks `2j` (the low nibbles of `bits`) and `2j + 1` (the high ones), with
/// Q5_K's fifth bits from bits 0 and 1 of each byte of `high`, which then moves on by 2 bits.
/// Bit `2j` of `qh[l]` is the 5th bit of weight `l` of sub-block `2j`, bit `2j + 1` of sub-block
/// `2j + 1`; shifting whole 16-bit lanes right is safe because only bit 0 of each byte is kept,
/// and at most 7 bits of the neighbouring byte ever move in above it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_quants(bits: __m256i, high: Option<&mut __m256i>) -> (__m256i, __m256i) {
    let low4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let lo = _mm256_and_si256(bits, low4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), low4);
    let Some(high) = high else {
        return (lo, hi);
    };
    let h_lo = _mm256_slli_epi16::<4>(_mm256_and_si256(*high, one));
    let h_hi = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<1>(*high), one));
    *high = _mm256_srli_epi16::<2>(*high);
    (_mm256_or_si256(lo, h_lo), _mm256_or_si256(hi, h_hi))
}

/// [`q4_k_block_ints`] of the block at `x` whose 12 scale bytes are at `scales_at`, packed
/// nibbles at `qs_at` and (Q5_K) fifth bits at `qh_at`; against the Q8_K block at `y`, or, where
/// `paired` is given, against its paired activations there ([`k4_pair_activations`]).
///
/// The paired form takes half the `madd`s and scale shuffles: the weights' 32-bit lanes are
/// interleaved as the paired activations are, so that each i16 lane of the two `maddubs`
/// results holds products of one sub-block only, the two results are added as i16 (|sum| <= 2 *
/// 2 * 31 * 128 = 15872) and one `madd` applies both sub-blocks' scales (even lanes `2j`, odd
/// `2j + 1`). The same integers either way.
///
/// # Safety
/// As [`q4_k_block_ints`], the offsets those of a Q4_K or Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_block_ints(
    x: *const u8,
    y: *const u8,
    scales_at: usize,
    qs_at: usize,
    qh_at: Option<usize>,
    paired: Option<*const __m256i>,
) -> (__m256i, __m256i) {
    let (scales, mins_twice, bytes) = k4_scales_mins(x.add(scales_at));
    let min_dot = k4_min_dot(mins_twice, y.add(Q8K_BSUMS));

    let qs = x.add(qs_at);
    let q8 = y.add(Q8K_QS);
    let mut high = qh_at.map_or(_mm256_setzero_si256(), |at| load32(x.add(at)));
    let mut sum = _mm256_setzero_si256();
    if let Some(yp) = paired {
        let low4 = _mm256_set1_epi8(0x0f);
        let nibble = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
        for (j, pair_scales) in PAIR_SCALES.iter().enumerate() {
            let bits = load32(qs.add(32 * j));
            // 32-bit lane m of x1: lane m of sub-block 2j (even m) or of 2j + 1 (odd m); of x2:
            // lane m + 1 of sub-block 2j (even m) or lane m - 1 of 2j + 1 (odd m).
            let (x1, x2) = if qh_at.is_some() {
                let (lo, hi) = k4_quants(bits, Some(&mut high));
                (
                    _mm256_blend_epi32::<0xAA>(lo, hi),
                    _mm256_shuffle_epi32::<0xB1>(_mm256_blend_epi32::<0xAA>(hi, lo)),
                )
            } else {
                // Q4_K: one variable shift picks each lane's nibble.
                (
                    _mm256_and_si256(_mm256_srlv_epi32(bits, nibble), low4),
                    _mm256_and_si256(
                        _mm256_srlv_epi32(_mm256_shuffle_epi32::<0xB1>(bits), nibble),
                        low4,
                    ),
                )
            };
            let p = _mm256_add_epi16(
                _mm256_maddubs_epi16(x1, *yp.add(2 * j)),
                _mm256_maddubs_epi16(x2, *yp.add(2 * j + 1)),
            );
            let sc = _mm256_shuffle_epi8(bytes, load32(pair_scales.as_ptr()));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, sc));
        }
        return (sum, min_dot);
    }
    for j in 0..QK_K / 64 {
        // 32 bytes hold 64 weights: the low nibbles are sub-block 2j, the high ones 2j + 1.
        let (lo, hi) = k4_quants(load32(qs.add(32 * j)), qh_at.map(|_| &mut high));
        let p_lo = _mm256_maddubs_epi16(lo, load32(q8.add(64 * j)));
        let p_hi = _mm256_maddubs_epi16(hi, load32(q8.add(64 * j + 32)));
        let p_lo = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, scale_shuffle(2 * j)), p_lo);
        let p_hi = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, scale_shuffle(2 * j + 1)), p_hi);
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(p_lo, p_hi));
    }
    (sum, min_dot)
}

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q4_K blocks, `a` at as many Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q8_k_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    const { assert!(offset_of!(BlockQ4K, dmin) == offset_of!(BlockQ4K, d) + 2) };
    k4_row_dot(blocks, w, a, Q4K, offset_of!(BlockQ4K, d), |x, y| {
        // SAFETY: as `k4_row_dot` promises its `ints`.
        unsafe { q4_k_block_ints(x, y) }
    })
}

/// The row dot of the formats with minimums (Q4_K, Q5_K): `blocks` super-blocks of `block` bytes
/// at `w`, their `d` and `dmin` adjacent at `d_at`, against as many Q8_K blocks at `a`; `ints`
/// forms a block's integers ([`q4_k_block_ints`]).
///
/// # Safety
/// AVX2+FMA+F16C; `w` and `a` point at `blocks` readable blocks each; `ints` is called with a
/// weight block and its Q8_K block only.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_row_dot(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    block: usize,
    d_at: usize,
    ints: impl Fn(*const u8, *const u8) -> (__m256i, __m256i),
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm_setzero_ps();
    for i in 0..blocks {
        let (x, y) = (w.add(i * block), a.add(i * Q8K));
        prefetch_ahead(x, block.div_ceil(64));

        // d and dmin are adjacent: [d * dy, dmin * dy] in lanes 0 and 1.
        let d_dmin = _mm_mul_ps(f16_pair(x.add(d_at)), _mm_set1_ps(read_f32(y)));
        let d = _mm256_broadcastss_ps(d_dmin);
        let dmin = _mm_shuffle_ps::<0x55>(d_dmin, d_dmin);

        let (sum, min_dot) = ints(x, y);
        let min_dot = _mm_add_epi32(
            _mm256_castsi256_si128(min_dot),
            _mm256_extracti128_si256::<1>(min_dot),
        );
        mins = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(min_dot), mins);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc);
    }
    hsum_ps(acc) - hsum_ps_128(mins)
}

row_dot!(
    /// Q5_K weights . Q8_K activations.
    q5_k_q8_k => q5_k_q8_k_avx2, QK_K, Q5K, Q8K
);

/// [`q4_k_block_ints`] of a Q5_K super-block.
///
/// # Safety
/// AVX2+FMA+F16C; `x` points at a readable Q5_K block, `y` at a Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_block_ints(x: *const u8, y: *const u8) -> (__m256i, __m256i) {
    k4_block_ints(
        x,
        y,
        offset_of!(BlockQ5K, scales),
        offset_of!(BlockQ5K, qs),
        Some(offset_of!(BlockQ5K, qh)),
        None,
    )
}

/// [`q5_k_block_ints`] against paired activations (see [`q4_k_block_ints_paired`]).
///
/// # Safety
/// As [`q4_k_block_ints_paired`], of a Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k_block_ints_paired(
    x: *const u8,
    y: *const u8,
    yp: *const __m256i,
) -> (__m256i, __m256i) {
    k4_block_ints(
        x,
        y,
        offset_of!(BlockQ5K, scales),
        offset_of!(BlockQ5K, qs),
        Some(offset_of!(BlockQ5K, qh)),
        Some(yp),
    )
}

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q5_K blocks, `a` at as many Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_q8_k_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    const { assert!(offset_of!(BlockQ5K, dmin) == offset_of!(BlockQ5K, d) + 2) };
    k4_row_dot(blocks, w, a, Q5K, offset_of!(BlockQ5K, d), |x, y| {
        // SAFETY: as `k4_row_dot` promises its `ints`.
        unsafe { q5_k_block_ints(x, y) }
    })
}

row_dot!(
    /// Q6_K weights . Q8_K activations.
    q6_k_q8_k => q6_k_q8_k_avx2, QK_K, Q6K, Q8K
);

/// The exact integer dot of one Q6_K super-block at `x` against the Q8_K block at `y`, scaled by
/// the sub-block scales and less the quants' offset (its sum over the 8 i32 lanes). Shared as
/// [`q4_k_block_ints`] is.
///
/// # Safety
/// AVX2+FMA+F16C; `x` points at a readable Q6_K block, `y` at a Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_block_ints(x: *const u8, y: *const u8) -> __m256i {
    let low4 = _mm256_set1_epi8(0x0f);
    let low2 = _mm256_set1_epi8(0x03);
    // 16 signed 8-bit scales, one per 16 weights, widened to i16.
    let scales16 = _mm256_cvtepi8_epi16(load16(x.add(offset_of!(BlockQ6K, scales))));
    // The quants are stored as q + 32 (0..64): dot the unsigned values, then take away
    // 32 * sum(scale * bsum), the offset's share.
    let offset = _mm256_slli_epi32(_mm256_madd_epi16(scales16, load32(y.add(Q8K_BSUMS))), 5);
    let mut sum = _mm256_sub_epi32(_mm256_setzero_si256(), offset);

    let ql = x.add(offset_of!(BlockQ6K, ql));
    let qh = x.add(offset_of!(BlockQ6K, qh));
    let q8 = y.add(Q8K_QS);
    for half in 0..QK_K / 128 {
        let scales = if half == 0 {
            _mm256_permute2x128_si256(scales16, scales16, 0x00)
        } else {
            _mm256_permute2x128_si256(scales16, scales16, 0x11)
        };
        let l0 = load32(ql.add(64 * half));
        let l1 = load32(ql.add(64 * half + 32));
        let h = load32(qh.add(32 * half));
        // Weight l + 32k of this half: 4 low bits from ql (nibble k / 2 of byte l + 32 (k % 2)),
        // 2 high bits from bits 2k..2k+2 of qh[l].
        let q = [
            _mm256_or_si256(
                _mm256_and_si256(l0, low4),
                _mm256_slli_epi16(_mm256_and_si256(h, low2), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(l1, low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), low2), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), low2), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), low2), 4),
            ),
        ];
        for (k, qk) in q.into_iter().enumerate() {
            let p = _mm256_maddubs_epi16(qk, load32(q8.add(128 * half + 32 * k)));
            let p = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, pair_scale_shuffle(k)), p);
            sum = _mm256_add_epi32(sum, p);
        }
    }
    sum
}

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q6_K blocks, `a` at as many Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_q8_k_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..blocks {
        let (x, y) = (w.add(i * Q6K), a.add(i * Q8K));
        prefetch_ahead(x, 4); // a block is 210 bytes
        let d = _mm256_mul_ps(
            f16_splat(x.add(offset_of!(BlockQ6K, d))),
            _mm256_set1_ps(read_f32(y)),
        );
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q6_k_block_ints(x, y)), acc);
    }
    hsum_ps(acc)
}

row_dot!(
    /// Q3_K weights . Q8_K activations.
    q3_k_q8_k => q3_k_q8_k_avx2, QK_K, Q3K, Q8K
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q3_K blocks, `a` at as many Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_q8_k_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let low2 = _mm256_set1_epi8(0x03);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    for i in 0..blocks {
        let (x, y) = (w.add(i * Q3K), a.add(i * Q8K));
        prefetch_ahead(x, 2); // a block is 110 bytes
        let d = _mm256_mul_ps(
            f16_splat(x.add(offset_of!(BlockQ3K, d))),
            _mm256_set1_ps(read_f32(y)),
        );

        // 16 six-bit scales (stored + 32): low 4 bits in the nibbles of bytes 0..8, top 2 bits in
        // bytes 8..12, two bits per scale.
        let sp = x.add(offset_of!(BlockQ3K, scales));
        let (a0, a1, a2) = (read_u32(sp), read_u32(sp.add(4)), read_u32(sp.add(8)));
        let packed = _mm_set_epi32(
            (((a1 >> 4) & LOW4) | (((a2 >> 6) & LOW2) << 4)) as i32,
            (((a0 >> 4) & LOW4) | (((a2 >> 4) & LOW2) << 4)) as i32,
            ((a1 & LOW4) | (((a2 >> 2) & LOW2) << 4)) as i32,
            ((a0 & LOW4) | ((a2 & LOW2) << 4)) as i32,
        );
        let scales16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(packed, _mm_set1_epi8(32)));
        // A weight is (2 low bits) + 4 * (high bit) - 4: dot the unsigned 0..8 value and take away
        // 4 * sum(scale * bsum), the offset's share.
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(scales16, load32(y.add(Q8K_BSUMS))), 2);
        let mut sum = _mm256_sub_epi32(_mm256_setzero_si256(), offset);

        let qs = x.add(offset_of!(BlockQ3K, qs));
        let q8 = y.add(Q8K_QS);
        // Bit b of hmask[l] is the high bit of weight 32b + l.
        let mut high = load32(x.add(offset_of!(BlockQ3K, hmask)));
        for half in 0..QK_K / 128 {
            let scales = if half == 0 {
                _mm256_permute2x128_si256(scales16, scales16, 0x00)
            } else {
                _mm256_permute2x128_si256(scales16, scales16, 0x11)
            };
            let mut bits = load32(qs.add(32 * half));
            for k in 0..4 {
                // Shifting whole 16-bit lanes is safe: only the low bits of each byte are kept,
                // and never more than 7 bits of the neighbouring byte move in above them.
                let h = _mm256_slli_epi16(_mm256_and_si256(high, one), 2);
                let q = _mm256_or_si256(_mm256_and_si256(bits, low2), h);
                high = _mm256_srli_epi16(high, 1);
                bits = _mm256_srli_epi16(bits, 2);
                let p = _mm256_maddubs_epi16(q, load32(q8.add(128 * half + 32 * k)));
                let p = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, pair_scale_shuffle(k)), p);
                sum = _mm256_add_epi32(sum, p);
            }
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc);
    }
    hsum_ps(acc)
}

row_dot!(
    /// Q2_K weights . Q8_K activations.
    q2_k_q8_k => q2_k_q8_k_avx2, QK_K, Q2K, Q8K
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q2_K blocks, `a` at as many Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_q8_k_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let low4 = _mm_set1_epi8(0x0f);
    let low2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm_setzero_ps();
    for i in 0..blocks {
        let (x, y) = (w.add(i * Q2K), a.add(i * Q8K));
        prefetch_ahead(x, 2); // a block is 84 bytes

        // d and dmin are adjacent: [d * dy, dmin * dy] in lanes 0 and 1.
        const { assert!(offset_of!(BlockQ2K, dmin) == offset_of!(BlockQ2K, d) + 2) };
        let d_dmin = _mm_mul_ps(
            f16_pair(x.add(offset_of!(BlockQ2K, d))),
            _mm_set1_ps(read_f32(y)),
        );
        let d = _mm256_broadcastss_ps(d_dmin);
        let dmin = _mm_shuffle_ps::<0x55>(d_dmin, d_dmin);

        // One byte per 16 weights: scale in the low nibble, minimum in the high one.
        let packed = load16(x.add(offset_of!(BlockQ2K, scales)));
        let scales16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
        let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
        let min_dot = _mm256_madd_epi16(mins16, load32(y.add(Q8K_BSUMS)));
        let min_dot = _mm_add_epi32(
            _mm256_castsi256_si128(min_dot),
            _mm256_extracti128_si256(min_dot, 1),
        );
        mins = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(min_dot), mins);

        let qs = x.add(offset_of!(BlockQ2K, qs));
        let q8 = y.add(Q8K_QS);
        let mut sum = _mm256_setzero_si256();
        for half in 0..QK_K / 128 {
            let scales = if half == 0 {
                _mm256_permute2x128_si256(scales16, scales16, 0x00)
            } else {
                _mm256_permute2x128_si256(scales16, scales16, 0x11)
            };
            // Bits 2k..2k+2 of byte l are weight 32k + l of this half.
            let mut bits = load32(qs.add(32 * half));
            for k in 0..4 {
                let q = _mm256_and_si256(bits, low2);
                bits = _mm256_srli_epi16(bits, 2);
                let p = _mm256_maddubs_epi16(q, load32(q8.add(128 * half + 32 * k)));
                let p = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, pair_scale_shuffle(k)), p);
                sum = _mm256_add_epi32(sum, p);
            }
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc);
    }
    hsum_ps(acc) - hsum_ps_128(mins)
}

row_dot!(
    /// Q8_K weights . Q8_K activations.
    q8_k_q8_k => q8_k_q8_k_avx2, QK_K, Q8K, Q8K
);

/// # Safety
/// AVX2+FMA+F16C; `w` and `a` point at `blocks` readable Q8_K blocks each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_k_q8_k_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..blocks {
        let (x, y) = (w.add(i * Q8K), a.add(i * Q8K));
        prefetch_ahead(x, 5); // a block is 292 bytes
        let d = _mm256_set1_ps(read_f32(x) * read_f32(y));
        let mut sum = _mm256_setzero_si256();
        for k in 0..QK_K / 32 {
            let q = dot_i8_i8(
                load32(x.add(Q8K_QS + 32 * k)),
                load32(y.add(Q8K_QS + 32 * k)),
            );
            sum = _mm256_add_epi32(sum, q);
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc);
    }
    hsum_ps(acc)
}
