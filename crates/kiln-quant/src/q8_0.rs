//! Q8_0: 32 values per block, one f16 scale `d`, signed 8-bit codes `q`. A weight format and the
//! activation format of Q4_0, Q5_0 and Q8_0 weights.
//!
//! - Dequantize: `x[i] = q[i] * d`.
//! - Quantize (ggml's `quantize_row_q8_0_ref`): `amax = max |x|`, `d = amax / 127` in f32,
//!   `q = round_half_away(x * (1/d))` (0 when `d == 0`); the block stores `f16(d)`, while the codes
//!   were computed with the f32 `d`. So `|q * f16(d) - x| <= d/2 + 127 * |f16(d) - d|` (plus f32
//!   rounding), slightly more than half a step.
//! - Dot of Q8_0 weights with Q8_0 activations: per block the exact integer sum `s = Σ q * p`,
//!   then `sum += s * (d * da)` in f32 (ggml's `ggml_vec_dot_q8_0_q8_0`).

use half::f16;

use crate::blocks::{BlockQ8_0, QK8_0};

/// `max |x|` with ggml's `MAX(a, b) = a > b ? a : b`, so a NaN input propagates as it does there.
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(
        0.0f32,
        |amax, v| if amax > v.abs() { amax } else { v.abs() },
    )
}

/// The scale `amax / 127` (f32) and its reciprocal (0 for an all-zero block), shared with Q8_1.
pub(crate) fn scale_and_inverse(x: &[f32]) -> (f32, f32) {
    let d = abs_max(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// `x * id` rounded half away from zero (C's `roundf`); |x * id| <= 127 up to rounding, and the
/// `as` conversion saturates, so a NaN or infinite input cannot wrap.
pub(crate) fn code(v: f32, id: f32) -> i8 {
    (v * id).round() as i8
}

/// Quantizes 32 values (`x.len() == 32`, guaranteed by the caller's `chunks_exact`).
pub(crate) fn quantize_block(x: &[f32]) -> BlockQ8_0 {
    let (d, id) = scale_and_inverse(x);
    let mut qs = [0i8; QK8_0];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = code(v, id);
    }
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs,
    }
}

pub(crate) fn dequantize_block(block: &BlockQ8_0) -> [f32; QK8_0] {
    let d = block.d.to_f32();
    block.qs.map(|q| f32::from(q) * d)
}

pub(crate) fn vec_dot(w: &[BlockQ8_0], act: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let isum: i32 = wb
            .qs
            .iter()
            .zip(&ab.qs)
            .map(|(&q, &p)| i32::from(q) * i32::from(p))
            .sum();
        sum += isum as f32 * (wb.d.to_f32() * ab.d.to_f32());
    }
    sum
}
