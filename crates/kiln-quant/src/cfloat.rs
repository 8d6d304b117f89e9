//! The C float semantics that ggml's reference quantizers rely on, reproduced bit for bit.
//!
//! ggml's `quantize_row_*_ref` functions are plain single-precision C (SSE on x86-64, no FMA
//! contraction in the build kiln compares against). Rust's `f32` arithmetic is the same IEEE
//! arithmetic, so a port that keeps every operation and its order gives the same bits. What
//! differs are the conversions, which this module pins down:
//!
//! - [`nearest_int`] is ggml's magic-number rounding (round half to even for |x| < 2^22, and for
//!   larger or non-finite inputs the same garbage the C returns, never a panic);
//! - [`c_int`] is a C cast from `float` to an integer type as x86-64 gcc compiles it: truncation
//!   toward zero through a 32-bit `cvttss2si`, whose result for NaN and out-of-range values is
//!   `i32::MIN`; the narrowing to `int8_t` / `uint8_t` that follows is a wrapping `as` cast;
//! - [`fp32_to_fp16`] and [`fp32_to_bf16`] are `ggml_compute_fp32_to_fp16` / `_bf16`: round to
//!   nearest even, overflow to infinity, and ggml's own NaN encodings (f16 NaN is always
//!   `0x7E00` with the sign kept; bf16 NaN keeps the top mantissa bits and sets the quiet bit).

/// ggml's `nearest_int`: adds 1.5 * 2^23 so the FPU rounds to an integer in the low mantissa bits.
pub(crate) fn nearest_int(x: f32) -> i32 {
    let biased = x + 12_582_912.0;
    (biased.to_bits() as i32 & 0x007F_FFFF) - 0x0040_0000
}

/// A C cast `(int)x` as x86-64 compiles it (`cvttss2si`): truncation toward zero, `i32::MIN` for
/// NaN and for values outside the `i32` range.
pub(crate) fn c_int(x: f32) -> i32 {
    // 2^31 is exactly representable; everything in [-2^31, 2^31) truncates into range.
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// `(int8_t)x`: [`c_int`] narrowed with wrap-around, as gcc does.
pub(crate) fn c_i8(x: f32) -> i8 {
    c_int(x) as i8
}

/// `(uint8_t)x`: [`c_int`] narrowed with wrap-around, as gcc does.
pub(crate) fn c_u8(x: f32) -> u8 {
    c_int(x) as u8
}

/// `ggml_compute_fp32_to_fp16`: the branch-free conversion of the FP16 library, including its
/// NaN encoding.
pub(crate) fn fp32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);

    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    let magnitude = if shl1_w > 0xFF00_0000 {
        0x7E00
    } else {
        nonsign
    };
    // `nonsign` is at most 0x7C00 + 0xFFF: the sum fits in 16 bits, as in the C.
    ((sign >> 16) | magnitude) as u16
}

/// `ggml_compute_fp32_to_bf16`: round to nearest even; NaN keeps its top bits and becomes quiet.
pub(crate) fn fp32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7FFF_FFFF) > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (3.49, 3),
            (-3.51, -4),
            (4_194_303.0, 4_194_303),
            (-4_194_303.0, -4_194_303),
        ];
        for (x, expected) in cases {
            assert_eq!(nearest_int(x), expected, "{x}");
        }
        // Out of range and non-finite: no panic, whatever the C returns.
        for x in [f32::NAN, f32::INFINITY, -1e30, 1e30] {
            let _ = nearest_int(x);
        }
    }

    #[test]
    fn c_int_truncates_and_saturates_like_cvttss2si() {
        assert_eq!(c_int(8.99), 8);
        assert_eq!(c_int(-8.99), -8);
        assert_eq!(c_int(f32::NAN), i32::MIN);
        assert_eq!(c_int(3e9), i32::MIN);
        assert_eq!(c_int(-3e9), i32::MIN);
        assert_eq!(c_int(-2_147_483_648.0), i32::MIN);
        assert_eq!(c_int(2_147_483_520.0), 2_147_483_520);
    }

    #[test]
    fn fp16_matches_round_to_nearest_even_on_finite_values() {
        // Every f16 value, the midpoints between neighbours and a little either side of them:
        // the `half` crate's conversion is an independent round-to-nearest-even.
        for bits in 0u16..0x7C00 {
            let lo = f16::from_bits(bits).to_f32();
            let hi = f16::from_bits(bits + 1).to_f32();
            let mid = lo + (hi - lo) / 2.0;
            for x in [
                lo,
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ] {
                for v in [x, -x] {
                    assert_eq!(fp32_to_fp16(v), f16::from_f32(v).to_bits(), "{v:e}");
                }
            }
        }
        assert_eq!(fp32_to_fp16(f32::INFINITY), 0x7C00);
        assert_eq!(fp32_to_fp16(-1e9), 0xFC00);
        assert_eq!(fp32_to_fp16(f32::NAN), 0x7E00);
        assert_eq!(fp32_to_fp16(-f32::NAN), 0xFE00);
        assert_eq!(fp32_to_fp16(f32::from_bits(0x7F80_0001)), 0x7E00);
    }

    #[test]
    fn bf16_matches_round_to_nearest_even_on_finite_values() {
        let mut x = 1.0e-40f32;
        while x < 3.0e38 {
            for v in [
                x,
                -x,
                f32::from_bits(x.to_bits() | 0x8000),
                f32::from_bits(x.to_bits() | 0x7FFF),
            ] {
                assert_eq!(fp32_to_bf16(v), bf16::from_f32(v).to_bits(), "{v:e}");
            }
            x *= 1.37;
        }
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(fp32_to_bf16(f32::from_bits(0xFFA0_0000)), 0xFFE0);
        assert_eq!(fp32_to_bf16(f32::INFINITY), 0x7F80);
    }
}
