//! AVX2 dots of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against Q8_0 / Q8_1
//! activations.
//!
//! Each block turns into 32 bytes of integer quants and one f32 scale; `sum_blocks` multiplies
//! the block's integer dot (exact, in 8 i32 lanes) by the scale into two interleaved accumulators,
//! so consecutive blocks do not wait on each other's multiply-add.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use kiln_quant::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK8_0, QK8_1,
};

use super::{
    bits_to_bytes32, dot_i8_i8, dot_u8_i8, hsum_ps, load32, nibbles32, read_f16, read_u32,
    row_dot,
};

const Q4_0: usize = size_of::<BlockQ4_0>();
const Q4_1: usize = size_of::<BlockQ4_1>();
const Q5_0: usize = size_of::<BlockQ5_0>();
const Q5_1: usize = size_of::<BlockQ5_1>();
const Q8_0: usize = size_of::<BlockQ8_0>();
const Q8_1: usize = size_of::<BlockQ8_1>();

/// `sum over blocks i of d_i * sum(lanes of q_i)` where `block(i) = (d_i, q_i)`: two blocks per
/// iteration into two accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sum_blocks(blocks: usize, mut block: impl FnMut(usize) -> (f32, __m256i)) -> f32 {
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 2 <= blocks {
        let (d0, q0) = block(i);
        let (d1, q1) = block(i + 1);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(q0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(q1), acc1);
        i += 2;
    }
    if i < blocks {
        let (d0, q0) = block(i);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(q0), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

row_dot!(
    /// Q8_0 weights . Q8_0 activations.
    q8_0_q8_0 => q8_0_q8_0_avx2, QK8_0, Q8_0, Q8_0
);

/// # Safety
/// AVX2+FMA+F16C; `w` and `a` point at `blocks` readable Q8_0 blocks each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    sum_blocks(blocks, |i| {
        let (x, y) = (w.add(i * Q8_0), a.add(i * Q8_0));
        let q = dot_i8_i8(
            load32(x.add(offset_of!(BlockQ8_0, qs))),
            load32(y.add(offset_of!(BlockQ8_0, qs))),
        );
        (read_f16(x) * read_f16(y), q)
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
    sum_blocks(blocks, |i| {
        let (x, y) = (w.add(i * Q4_0), a.add(i * Q8_0));
        let qx = _mm256_sub_epi8(
            nibbles32(x.add(offset_of!(BlockQ4_0, qs))),
            _mm256_set1_epi8(8),
        );
        let q = dot_i8_i8(qx, load32(y.add(offset_of!(BlockQ8_0, qs))));
        (read_f16(x) * read_f16(y), q)
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
    sum_blocks(blocks, |i| {
        let (x, y) = (w.add(i * Q5_0), a.add(i * Q8_0));
        // q - 16 as a signed byte: the nibble when the 5th bit is set, else nibble - 16, i.e.
        // the nibble with the upper four bits all ones.
        let high = bits_to_bytes32(read_u32(x.add(offset_of!(BlockQ5_0, qh))));
        let qx = _mm256_or_si256(
            nibbles32(x.add(offset_of!(BlockQ5_0, qs))),
            _mm256_andnot_si256(high, _mm256_set1_epi8(0xf0_u8 as i8)),
        );
        let q = dot_i8_i8(qx, load32(y.add(offset_of!(BlockQ8_0, qs))));
        (read_f16(x) * read_f16(y), q)
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
    let mut mins = 0.0f32;
    let dot = sum_blocks(blocks, |i| {
        let (x, y) = (w.add(i * Q4_1), a.add(i * Q8_1));
        mins += read_f16(x.add(offset_of!(BlockQ4_1, m))) * read_f16(y.add(offset_of!(BlockQ8_1, s)));
        let q = dot_u8_i8(
            nibbles32(x.add(offset_of!(BlockQ4_1, qs))),
            load32(y.add(offset_of!(BlockQ8_1, qs))),
        );
        (read_f16(x) * read_f16(y), q)
    });
    dot + mins
}

row_dot!(
    /// Q5_1 weights . Q8_1 activations.
    q5_1_q8_1 => q5_1_q8_1_avx2, QK8_1, Q5_1, Q8_1
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `blocks` readable Q5_1 blocks, `a` at as many Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1_avx2(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let mut mins = 0.0f32;
    let dot = sum_blocks(blocks, |i| {
        let (x, y) = (w.add(i * Q5_1), a.add(i * Q8_1));
        mins += read_f16(x.add(offset_of!(BlockQ5_1, m))) * read_f16(y.add(offset_of!(BlockQ8_1, s)));
        let high = bits_to_bytes32(read_u32(x.add(offset_of!(BlockQ5_1, qh))));
        let qx = _mm256_or_si256(
            nibbles32(x.add(offset_of!(BlockQ5_1, qs))),
            _mm256_and_si256(high, _mm256_set1_epi8(0x10)),
        );
        let q = dot_u8_i8(qx, load32(y.add(offset_of!(BlockQ8_1, qs))));
        (read_f16(x) * read_f16(y), q)
    });
    dot + mins
}
