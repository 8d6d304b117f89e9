//! AVX2 activation quantizers (Q8_0, Q8_1, Q8_K), bit-identical to kiln-quant's reference.
//!
//! Identity needs the same float operations in the same order wherever rounding happens: the
//! block scale and its inverse are computed as scalars exactly as the reference does, each
//! activation is multiplied by the inverse (one IEEE multiply, like the reference), and the
//! product is rounded the reference's way: half away from zero for Q8_0/Q8_1 (`f32::round`),
//! half to even for Q8_K (ggml's `nearest_int`). The maximum of absolute values is exact in any
//! order. Non-finite activations give unspecified (but memory-safe) blocks.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use kiln_quant::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1, QK8_0, QK8_1, QK_K};

use super::{blocks_of, hsum_epi32_128};

const Q8_0: usize = size_of::<BlockQ8_0>();
const Q8_1: usize = size_of::<BlockQ8_1>();
const Q8K: usize = size_of::<BlockQ8K>();

/// Defines the safe quantizer `$name(x, dst)` around the AVX2 kernel
/// `$kernel(blocks, x_ptr, dst_ptr)` for blocks of `$qk` activations in `$bytes` bytes.
macro_rules! quantizer {
    ($(#[$doc:meta])* $name:ident => $kernel:ident, $qk:expr, $bytes:expr) => {
        $(#[$doc])*
        pub(super) fn $name(x: &[f32], dst: &mut [u8]) {
            let Some(blocks) = blocks_of(x.len(), $qk, &[($bytes, dst.len())]) else {
                panic!(
                    "{}: {} activations do not fill {} output bytes",
                    stringify!($name),
                    x.len(),
                    dst.len()
                )
            };
            // SAFETY: the CPU has AVX2+FMA+F16C (module invariant), and the check above gives the
            // kernel exactly `blocks` whole blocks to read from `x` and write to `dst`.
            unsafe { $kernel(blocks, x.as_ptr(), dst.as_mut_ptr()) }
        }
    };
}

/// Eight f32 at `p`, unaligned.
///
/// # Safety
/// `p..p + 8` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs(v: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
}

/// The largest lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax_ps(v: __m256) -> f32 {
    let x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_max_ss(x, _mm_movehdup_ps(x));
    _mm_cvtss_f32(x)
}

/// Round to nearest, ties away from zero (`f32::round`), exactly, for |v| < 2^23: the truncation
/// and the fraction `v - trunc(v)` are both exact there, so comparing the fraction with 0.5
/// decides the tie the way `round` does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_half_away(v: __m256) -> __m256 {
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
    let up = _mm256_cmp_ps::<_CMP_GE_OQ>(abs(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5));
    let sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0));
    let step = _mm256_and_ps(up, _mm256_or_ps(sign, _mm256_set1_ps(1.0)));
    _mm256_add_ps(t, step)
}

/// [`round_half_away`] for |v| ≤ 256: `floor(|v| + (0.5 − 2⁻²⁵))` with `v`'s sign, checked
/// against `f32::round` for every f32 in `0..=256` (the constant just below 0.5 keeps the
/// largest float below a half from rounding up to 1 in the addition, and a true half still
/// rounds up to the next integer there). Five instructions where the general form takes eight.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_half_away_small(v: __m256) -> __m256 {
    let sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0));
    let below_half = _mm256_set1_ps(f32::from_bits(0.5f32.to_bits() - 1));
    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm256_add_ps(
        abs(v),
        below_half,
    ));
    _mm256_or_ps(r, sign)
}

/// Rust's `v as i8` (or `(v as i32).clamp(-128, 127)`) for an integral `v`: saturating at -128
/// and 127, NaN to 0. Only matters when the inverse scale overflows (a block of subnormals), where
/// the products are infinite or NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn saturating_i8(v: __m256) -> __m256i {
    let clamped = _mm256_min_ps(
        _mm256_max_ps(v, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    let not_nan = _mm256_cmp_ps::<_CMP_ORD_Q>(v, v);
    _mm256_cvtps_epi32(_mm256_and_ps(clamped, not_nan))
}

/// Round to nearest, ties to even (`f32::round_ties_even`, ggml's `nearest_int`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_half_even(v: __m256) -> __m256 {
    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
}

/// 32 i32 (in -128..=127) packed to 32 bytes in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack_i8(q: [__m256i; 4]) -> __m256i {
    // The packs work per 128-bit half, leaving 4-element groups in the order 0 2 4 6 1 3 5 7.
    let lo = _mm256_packs_epi32(q[0], q[1]);
    let hi = _mm256_packs_epi32(q[2], q[3]);
    let bytes = _mm256_packs_epi16(lo, hi);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Writes the half of `v` at `p`, unaligned.
///
/// # Safety
/// `p..p + 2` must be writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn write_f16(p: *mut u8, v: f32) {
    // F16C's conversion, to nearest even: `f16::from_f32`'s bits (which takes the same
    // instruction, behind a run-time check and a call, where the CPU has it).
    let h = _mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(v));
    p.cast::<u16>()
        .write_unaligned((_mm_extract_epi16::<0>(h) as u16).to_le());
}

/// One Q8_0/Q8_1 block: the scale `d`, and the 32 quants as i32 lanes (already written at `qs`).
///
/// # Safety
/// `x..x + 32` readable, `qs..qs + 32` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_block32(x: *const f32, qs: *mut u8) -> (f32, [__m256i; 4]) {
    let v = [
        load8(x),
        load8(x.add(8)),
        load8(x.add(16)),
        load8(x.add(24)),
    ];
    let amax = hmax_ps(_mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    ));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    // With a normal (or zero) scale each product is within 127 (plus rounding) of zero, where
    // `round_half_away_small` is exact and the conversion needs no clamp; otherwise (subnormal
    // or non-finite blocks) the general rounding and `as i8`'s clamp.
    let q = if d.is_normal() || d == 0.0 {
        v.map(|v| _mm256_cvtps_epi32(round_half_away_small(_mm256_mul_ps(v, id))))
    } else {
        v.map(|v| saturating_i8(round_half_away(_mm256_mul_ps(v, id))))
    };
    _mm256_storeu_si256(qs.cast(), pack_i8(q));
    (d, q)
}

quantizer!(
    /// Q8_0 activations.
    q8_0 => q8_0_avx2, QK8_0, Q8_0
);

/// # Safety
/// AVX2+FMA+F16C; `x` holds `32 * blocks` readable f32, `y` `blocks` writable Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(blocks: usize, x: *const f32, y: *mut u8) {
    for i in 0..blocks {
        let out = y.add(i * Q8_0);
        let (d, _) = q8_block32(x.add(i * QK8_0), out.add(offset_of!(BlockQ8_0, qs)));
        write_f16(out.add(offset_of!(BlockQ8_0, d)), d);
    }
}

quantizer!(
    /// Q8_1 activations.
    q8_1 => q8_1_avx2, QK8_1, Q8_1
);

/// # Safety
/// AVX2+FMA+F16C; `x` holds `32 * blocks` readable f32, `y` `blocks` writable Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_1_avx2(blocks: usize, x: *const f32, y: *mut u8) {
    for i in 0..blocks {
        let out = y.add(i * Q8_1);
        let (d, q) = q8_block32(x.add(i * QK8_1), out.add(offset_of!(BlockQ8_1, qs)));
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum = hsum_epi32_128(_mm_add_epi32(
            _mm256_castsi256_si128(total),
            _mm256_extracti128_si256(total, 1),
        ));
        write_f16(out.add(offset_of!(BlockQ8_1, d)), d);
        write_f16(out.add(offset_of!(BlockQ8_1, s)), sum as f32 * d);
    }
}

quantizer!(
    /// Q8_K activations.
    q8_k => q8_k_avx2, QK_K, Q8K
);

/// # Safety
/// AVX2+FMA+F16C; `x` holds `256 * blocks` readable f32, `y` `blocks` writable Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_k_avx2(blocks: usize, x: *const f32, y: *mut u8) {
    for i in 0..blocks {
        let src = x.add(i * QK_K);
        let out = y.add(i * Q8K);

        // Four running maxima: one chain of 32 dependent `max`es was the pass's latency.
        let mut amax_v = [_mm256_setzero_ps(); 4];
        for k in (0..QK_K / 8).step_by(4) {
            for (j, m) in amax_v.iter_mut().enumerate() {
                *m = _mm256_max_ps(*m, abs(load8(src.add(8 * (k + j)))));
            }
        }
        let amax = hmax_ps(_mm256_max_ps(
            _mm256_max_ps(amax_v[0], amax_v[1]),
            _mm256_max_ps(amax_v[2], amax_v[3]),
        ));

        let qs_out = out.add(offset_of!(BlockQ8K, qs));
        let mut d = 0.0f32;
        // Per 32 quants (`g`), their 8 sums of 4 in i32 lanes: 0..4 the 16-quant group `2g`,
        // 4..8 the group `2g + 1` (exact: at most 4 * 128).
        let mut quads = [_mm256_setzero_si256(); QK_K / 32];
        if amax != 0.0 {
            // The scale follows the signed value of the first element of largest magnitude.
            let target = _mm256_set1_ps(amax);
            let mut max = amax;
            for k in 0..QK_K / 8 {
                let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                    abs(load8(src.add(8 * k))),
                    target,
                ));
                if hits != 0 {
                    max = *src.add(8 * k + hits.trailing_zeros() as usize);
                    break;
                }
            }
            let iscale = -127.0 / max;
            let scale = _mm256_set1_ps(iscale);
            let ones8 = _mm256_set1_epi8(1);
            let ones16 = _mm256_set1_epi16(1);
            // With a finite maximum and scale every product is within 127 (plus rounding) of
            // zero, where the conversion needs no clamp; otherwise clamp as `as i8` does.
            let plain = amax.is_finite() && iscale.is_finite();
            for (g, quad) in quads.iter_mut().enumerate() {
                let p = src.add(32 * g);
                let q = [0, 8, 16, 24].map(|o| {
                    let v = round_half_even(_mm256_mul_ps(load8(p.add(o)), scale));
                    if plain {
                        _mm256_cvtps_epi32(v)
                    } else {
                        saturating_i8(v)
                    }
                });
                let bytes = pack_i8(q);
                _mm256_storeu_si256(qs_out.add(32 * g).cast(), bytes);
                // 1 x each signed quant, pairs to i16, then pairs of those to i32.
                *quad = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16);
            }
            d = 1.0 / iscale;
        } else {
            qs_out.write_bytes(0, QK_K);
        }

        out.add(offset_of!(BlockQ8K, d))
            .cast::<u32>()
            .write_unaligned(d.to_bits().to_le());
        // Each half of `c` holds the sums of one group per 32 quants: the low half groups 0, 2,
        // 4, 6 (of `quads[0..4]`), the high half 1, 3, 5, 7; `e` the same for groups 8..16.
        let c = _mm256_hadd_epi32(
            _mm256_hadd_epi32(quads[0], quads[1]),
            _mm256_hadd_epi32(quads[2], quads[3]),
        );
        let e = _mm256_hadd_epi32(
            _mm256_hadd_epi32(quads[4], quads[5]),
            _mm256_hadd_epi32(quads[6], quads[7]),
        );
        let in_order = |v: __m256i| {
            let (even, odd) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            (_mm_unpacklo_epi32(even, odd), _mm_unpackhi_epi32(even, odd))
        };
        let (c0, c1) = in_order(c);
        let (e0, e1) = in_order(e);
        // Sums of 16 quants (at most 2048 in magnitude) fit an i16: the packs do not saturate.
        let bsums_out = out.add(offset_of!(BlockQ8K, bsums));
        _mm_storeu_si128(bsums_out.cast(), _mm_packs_epi32(c0, c1));
        _mm_storeu_si128(bsums_out.add(16).cast(), _mm_packs_epi32(e0, e1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `round_half_away_small` is `f32::round` for every f32 of magnitude up to 256, both signs
    /// (about 2.3·10⁹ values, 8 a vector).
    #[test]
    fn small_rounding_is_round_for_every_float_up_to_256() {
        if !super::super::cpu_has_avx2_fma_f16c() {
            eprintln!("skipped: no AVX2+FMA+F16C");
            return;
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        fn first_difference(top: u32, sign: u32) -> Option<f32> {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mut bits = 0u32;
            while bits <= top {
                let v = _mm256_castsi256_ps(_mm256_or_si256(
                    _mm256_add_epi32(_mm256_set1_epi32(bits as i32), lanes),
                    _mm256_set1_epi32(sign as i32),
                ));
                let fast = round_half_away_small(v);
                let want = round_half_away(v);
                let same = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(fast, want));
                // Equal values of different zero signs are fine (both convert to 0).
                if same != 0xff {
                    let lane = (!same).trailing_zeros();
                    return Some(f32::from_bits((bits + lane) | sign));
                }
                bits += 8;
            }
            None
        }
        let top = 256.0f32.to_bits();
        for sign in [0, 0x8000_0000] {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
            let bad = unsafe { first_difference(top, sign) };
            assert_eq!(bad, None, "first value where the two roundings differ");
        }
        // The general form is `f32::round` (its own tests compare the quantizers with the
        // reference); spot-check the values where a plain `+ 0.5` goes wrong.
        for v in [
            0.5f32,
            -0.5,
            0.49999997,
            -0.49999997,
            1.5,
            2.5,
            126.5,
            127.49999,
        ] {
            // SAFETY: as above.
            let r = unsafe {
                let mut out = [0f32; 8];
                _mm256_storeu_ps(out.as_mut_ptr(), round_half_away_small(_mm256_set1_ps(v)));
                out[0]
            };
            assert_eq!(r, v.round(), "{v}");
        }
    }
}
