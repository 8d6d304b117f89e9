//! F32, F16 and BF16: one element per "block", little-endian.
//!
//! - F32: `x = bits as f32`; F16: IEEE binary16 widened to f32; BF16: `x = f32 from (bits << 16)`.
//!   Both widenings are exact, so dequantization never rounds.
//! - Dot product with f32 activations, as ggml's scalar `ggml_vec_dot_f32/_f16/_bf16`: each product
//!   `w * a` rounded to f32, the products summed in f64, the sum rounded to f32 once.

use half::{bf16, f16};

/// The three float storage formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatFormat {
    F32,
    F16,
    BF16,
}

impl FloatFormat {
    pub(crate) fn width(self) -> usize {
        match self {
            FloatFormat::F32 => 4,
            FloatFormat::F16 | FloatFormat::BF16 => 2,
        }
    }

    /// Decodes one element; `bytes` is exactly `self.width()` long (callers use `chunks_exact`).
    fn decode(self, bytes: &[u8]) -> f32 {
        match (self, bytes) {
            (FloatFormat::F32, &[a, b, c, d]) => f32::from_le_bytes([a, b, c, d]),
            (FloatFormat::F16, &[a, b]) => f16::from_le_bytes([a, b]).to_f32(),
            (FloatFormat::BF16, &[a, b]) => bf16::from_le_bytes([a, b]).to_f32(),
            // Unreachable for chunks of `width()` bytes; NaN rather than a panic if it ever were.
            _ => f32::NAN,
        }
    }

    fn elements(self, bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
        bytes
            .chunks_exact(self.width())
            .map(move |chunk| self.decode(chunk))
    }
}

/// Widens `src` (already checked to hold `dst.len()` elements) into `dst`.
pub(crate) fn dequantize(format: FloatFormat, src: &[u8], dst: &mut [f32]) {
    for (out, x) in dst.iter_mut().zip(format.elements(src)) {
        *out = x;
    }
}

/// Dot of weights in `format` with f32 activations (both already checked to hold the same count).
pub(crate) fn vec_dot(format: FloatFormat, w: &[u8], act: &[u8]) -> f32 {
    let sum: f64 = format
        .elements(w)
        .zip(FloatFormat::F32.elements(act))
        .map(|(w, a)| f64::from(w * a))
        .sum();
    sum as f32
}

/// Writes `x` as little-endian f32 bytes (`dst` is exactly `4 * x.len()` long).
pub(crate) fn write_f32(x: &[f32], dst: &mut [u8]) {
    for (out, v) in dst.chunks_exact_mut(4).zip(x) {
        out.copy_from_slice(&v.to_le_bytes());
    }
}
