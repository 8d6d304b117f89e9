//! AVX2+FMA dots of F32, F16 and BF16 weights against F32 activations (little-endian bytes).
//!
//! 32 elements per iteration into four independent accumulators (multiply-add latency), then 8 at a
//! time, then a scalar tail. F16 widens with F16C; BF16 is the top half of an f32, so it widens by
//! a 16-bit shift.

use std::arch::x86_64::*;

use super::{hsum_ps, load16, read_f32, row_dot};

/// `w . a` over `n` elements, where `widen(i)` loads weights `i..i + 8` as f32, `weight(i)` loads
/// one weight and `a` points at `n` f32 activations.
///
/// # Safety
/// `widen`, `weight` and `a` must be readable for every index below `n`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_acts(
    n: usize,
    a: *const u8,
    widen: impl Fn(usize) -> __m256,
    weight: impl Fn(usize) -> f32,
) -> f32 {
    let act = |i: usize| _mm256_loadu_ps(a.add(4 * i).cast());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            *lane = _mm256_fmadd_ps(widen(i + 8 * k), act(i + 8 * k), *lane);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(widen(i), act(i), acc[0]);
        i += 8;
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        sum += weight(i) * read_f32(a.add(4 * i));
        i += 1;
    }
    sum
}

row_dot!(
    /// F32 weights . F32 activations.
    f32_f32 => f32_f32_avx2, 1, 4, 4
);

/// # Safety
/// AVX2+FMA+F16C; `w` and `a` point at `n` readable f32 each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_f32_avx2(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_f32_acts(
        n,
        a,
        |i| _mm256_loadu_ps(w.add(4 * i).cast()),
        |i| read_f32(w.add(4 * i)),
    )
}

row_dot!(
    /// F16 weights . F32 activations.
    f16_f32 => f16_f32_avx2, 1, 2, 4
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `n` readable halves, `a` at `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f32_avx2(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_f32_acts(
        n,
        a,
        |i| _mm256_cvtph_ps(load16(w.add(2 * i))),
        |i| {
            let bits = u16::from_le(w.add(2 * i).cast::<u16>().read_unaligned());
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
        },
    )
}

row_dot!(
    /// BF16 weights . F32 activations.
    bf16_f32 => bf16_f32_avx2, 1, 2, 4
);

/// # Safety
/// AVX2+FMA+F16C; `w` points at `n` readable bf16, `a` at `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_f32_avx2(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_f32_acts(
        n,
        a,
        |i| {
            _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(load16(w.add(2 * i))),
                16,
            ))
        },
        |i| {
            let bits = u16::from_le(w.add(2 * i).cast::<u16>().read_unaligned());
            f32::from_bits(u32::from(bits) << 16)
        },
    )
}
