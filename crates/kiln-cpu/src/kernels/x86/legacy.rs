//! AVX2 dots of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against Q8_0 / Q8_1
//! activations.
//!
//! Each block turns into 32 bytes of integer quants and one f32 scale; `sum_blocks` multiplies
//! the block's integer dot (exact, in 8 i32 lanes) by the scale, four blocks at a time.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use kiln_quant::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK8_0, QK8_1,
};

use super::{
    bits_to_bytes32, dot_i8_i8, dot_u8_i8, hsum_ps, load32, nibbles32, prefetch_ahead,
    read_f16_bits, read_u32, row_dot,
};

const Q4_0: usize = size_of::<BlockQ4_0>();
const Q4_1: usize = size_of::<BlockQ4_1>();
const Q5_0: usize = size_of::<BlockQ5_0>();
const Q5_1: usize = size_of::<BlockQ5_1>();
const Q8_0: usize = size_of::<BlockQ8_0>();
const Q8_1: usize = size_of::<BlockQ8_1>();

/// The addresses of block `i`'s two f16 factors: in the weight block and in the activation block.
type Factors = (*const u8, *const u8);

/// Where each block's factors live.
trait FactorsAt: Fn(usize) -> Factors {}
impl<F: Fn(usize) -> Factors> FactorsAt for F {}

/// The `mins` argument of [`sum_blocks`] for the formats without a minimum.
const NO_MINS: Option<&fn(usize) -> Factors> = None;

/// `x * y` for the halves at `x` and `y`, both widened exactly, through one conversion (see
/// `f16_splat` for why a lone half is avoided).
///
/// # Safety
/// Both halves must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_product(x: *const u8, y: *const u8) -> f32 {
    let bits = u32::from(read_f16_bits(x)) | (u32::from(read_f16_bits(y)) << 16);
    let both = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    _mm_cvtss_f32(_mm_mul_ss(both, _mm_movehdup_ps(both)))
}

/// `[x_k * y_k]` for the factors of blocks `i..i + 4`: the eight halves go through one conversion.
///
/// # Safety
/// The factors of blocks `i..i + 4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_products4(at: &impl FactorsAt, i: usize) -> __m128 {
    let (mut xs, mut ys) = (0u64, 0u64);
    for k in 0..4 {
        let (x, y) = at(i + k);
        xs |= u64::from(read_f16_bits(x)) << (16 * k);
        ys |= u64::from(read_f16_bits(y)) << (16 * k);
    }
    let halves = _mm256_cvtph_ps(_mm_set_epi64x(ys as i64, xs as i64));
    _mm_mul_ps(
        _mm256_castps256_ps128(halves),
        _mm256_extractf128_ps(halves, 1),
    )
}

/// `sum over blocks i of d_i * sum(lanes of quants(i))`, with `d_i` the product of the two halves
/// at `scales(i)`; plus, when `mins` is given, the products of the halves at `mins(i)` (the `m * s`
/// term of the `_1` formats).
///
/// Four blocks per iteration: their eight (or sixteen) halves convert at once, and four
/// accumulators keep consecutive multiply-adds independent.
///
/// # Safety
/// Everything `scales`, `mins` and `quants` point at for blocks `0..blocks` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_blocks(
    blocks: usize,
    scales: &impl FactorsAt,
    mins: Option<&impl FactorsAt>,
    mut quants: impl FnMut(usize) -> __m256i,
) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut min_acc = _mm_setzero_ps();
    let mut i = 0;
    while i + 4 <= blocks {
        // Four blocks are at most 4 * 36 bytes: three cache lines.
        prefetch_ahead(scales(i).0, 3);
        let d = f16_products4(scales, i);
        let d = _mm256_set_m128(d, d);
        let q = [quants(i), quants(i + 1), quants(i + 2), quants(i + 3)];
        acc[0] = _mm256_fmadd_ps(
            _mm256_shuffle_ps::<0x00>(d, d),
            _mm256_cvtepi32_ps(q[0]),
            acc[0],
        );
        acc[1] = _mm256_fmadd_ps(
            _mm256_shuffle_ps::<0x55>(d, d),
            _mm256_cvtepi32_ps(q[1]),
            acc[1],
        );
        acc[2] = _mm256_fmadd_ps(
            _mm256_shuffle_ps::<0xaa>(d, d),
            _mm256_cvtepi32_ps(q[2]),
            acc[2],
        );
        acc[3] = _mm256_fmadd_ps(
            _mm256_shuffle_ps::<0xff>(d, d),
            _mm256_cvtepi32_ps(q[3]),
            acc[3],
        );
        if let Some(mins) = mins {
            min_acc = _mm_add_ps(min_acc, f16_products4(mins, i));
        }
        i += 4;
    }
    let mut tail_mins = 0.0f32;
    while i < blocks {
        let (x, y) = scales(i);
        let d = _mm256_set1_ps(f16_product(x, y));
        acc[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(quants(i)), acc[0]);
        if let Some(mins) = mins {
            let (m, s) = mins(i);
            tail_mins += f16_product(m, s);
        }
        i += 1;
    }
    let total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let min_sum = _mm_add_ps(min_acc, _mm_movehl_ps(min_acc, min_acc));
    let min_sum = _mm_add_ss(min_sum, _mm_movehdup_ps(min_sum));
    hsum_ps(total) + (_mm_cvtss_f32(min_sum) + tail_mins)
}

row_dot!(
    /// Q8_0 weights . Q8_0 activations.
    q8_0_q8_0 => q8_0_q8_0_avx2, QK8_0, Q8_0, Q8_0
);

/// # Safety
/// AVX2+FMA+F16C; `w` and `a` point at `blocks` readable Q8_0 blocks each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let scales = |i: usize| (w.add(i * Q8_0), a.add(i * Q8_0));
    sum_blocks(blocks, &scales, NO_MINS, |i| {
        let (x, y) = (w.add(i * Q8_0), a.add(i * Q8_0));
        dot_i8_i8(
            load32(x.add(offset_of!(BlockQ8_0, qs))),
            load32(y.add(offset_of!(BlockQ8_0, qs))),
        )
    })
}

row_dot!(
    /// Q4_0 weights . Q8_0 activations.
    q4_0_q8_0 => q4_0_q8_0_avx2, QK8_0, Q4_0, Q8_0
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q4_0 blocks, `a` at as many Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let scales = |i: usize| (w.add(i * Q4_0), a.add(i * Q8_0));
    sum_blocks(blocks, &scales, NO_MINS, |i| {
        let (x, y) = (w.add(i * Q4_0), a.add(i * Q8_0));
        let qx = _mm256_sub_epi8(
            nibbles32(x.add(offset_of!(BlockQ4_0, qs))),
            _mm256_set1_epi8(8),
        );
        dot_i8_i8(qx, load32(y.add(offset_of!(BlockQ8_0, qs))))
    })
}

row_dot!(
    /// Q5_0 weights . Q8_0 activations.
    q5_0_q8_0 => q5_0_q8_0_avx2, QK8_0, Q5_0, Q8_0
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q5_0 blocks, `a` at as many Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let scales = |i: usize| (w.add(i * Q5_0), a.add(i * Q8_0));
    sum_blocks(blocks, &scales, NO_MINS, |i| {
        let (x, y) = (w.add(i * Q5_0), a.add(i * Q8_0));
        // q - 16 as a signed byte: the nibble when the 5th bit is set, else nibble - 16, i.e.
        // the nibble with the upper four bits all ones.
        let high = bits_to_bytes32(read_u32(x.add(offset_of!(BlockQ5_0, qh))));
        let unset = _mm256_cmpeq_epi8(high, _mm256_setzero_si256());
        let qx = _mm256_or_si256(
            nibbles32(x.add(offset_of!(BlockQ5_0, qs))),
            _mm256_and_si256(unset, _mm256_set1_epi8(0xf0_u8 as i8)),
        );
        dot_i8_i8(qx, load32(y.add(offset_of!(BlockQ8_0, qs))))
    })
}

row_dot!(
    /// Q4_1 weights . Q8_1 activations.
    q4_1_q8_1 => q4_1_q8_1_avx2, QK8_1, Q4_1, Q8_1
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q4_1 blocks, `a` at as many Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    // w = d*q + m against x = d8*q8 with s = d8*sum(q8): the minimum contributes m*s per block.
    let scales = |i: usize| (w.add(i * Q4_1), a.add(i * Q8_1));
    let mins = |i: usize| {
        let (x, y) = scales(i);
        (
            x.add(offset_of!(BlockQ4_1, m)),
            y.add(offset_of!(BlockQ8_1, s)),
        )
    };
    sum_blocks(blocks, &scales, Some(&mins), |i| {
        let (x, y) = scales(i);
        dot_u8_i8(
            nibbles32(x.add(offset_of!(BlockQ4_1, qs))),
            load32(y.add(offset_of!(BlockQ8_1, qs))),
        )
    })
}

row_dot!(
    /// Q5_1 weights . Q8_1 activations.
    q5_1_q8_1 => q5_1_q8_1_avx2, QK8_1, Q5_1, Q8_1
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q5_1 blocks, `a` at as many Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let scales = |i: usize| (w.add(i * Q5_1), a.add(i * Q8_1));
    let mins = |i: usize| {
        let (x, y) = scales(i);
        (
            x.add(offset_of!(BlockQ5_1, m)),
            y.add(offset_of!(BlockQ8_1, s)),
        )
    };
    sum_blocks(blocks, &scales, Some(&mins), |i| {
        let (x, y) = scales(i);
        let high = bits_to_bytes32(read_u32(x.add(offset_of!(BlockQ5_1, qh))));
        // The 5th bit as 16: clamp the isolated bit to 1, then shift it up (within each byte).
        let fifth = _mm256_slli_epi16(_mm256_min_epu8(high, _mm256_set1_epi8(1)), 4);
        let qx = _mm256_or_si256(nibbles32(x.add(offset_of!(BlockQ5_1, qs))), fifth);
        dot_u8_i8(qx, load32(y.add(offset_of!(BlockQ8_1, qs))))
    })
}
