//! Q4_1: 32 weights per block, f16 scale `d` and f16 offset `m`, 4-bit codes `q` in 0..16.
//!
//! - Dequantize: `w[i] = q[i] * d + m`.
//! - Packing: as Q4_0, byte `qs[j]` holds element `j` (low nibble) and `j + 16` (high nibble).
//! - Dot with Q8_1 activations `a = da * p`, whose block also stores `s = f16(da * Σ p)`: per block
//!   the exact integer sum `t = Σ q * p`, then `sum += (d * da) * t + m * s` in f32
//!   (ggml's `ggml_vec_dot_q4_1_q8_1`). Because `s` is rounded to f16 (and computed from the f32
//!   `da`, whereas `a` uses the f16 one), the offset term differs from `m * Σ a` by up to about
//!   `|m * s| * 2^-10`: that is the format, not an error of this code.
//! - Quantize (ggml's `quantize_row_q4_1_ref`): `d = (max - min) / 15`, `m = min`,
//!   `q = min(15, (int8_t)((x - min) / d + 0.5))`, codes from the f32 `d` and `min`, both stored
//!   rounded to f16.

use crate::blocks::{BlockQ4_1, BlockQ8_1, QK4_1};
use crate::cfloat::{c_i8, fp32_to_fp16};

/// The 32 codes of a block in element order, 0..16.
fn codes(block: &BlockQ4_1) -> [u8; QK4_1] {
    let mut q = [0u8; QK4_1];
    for (j, &byte) in block.qs.iter().enumerate() {
        q[j] = byte & 0x0F;
        q[j + QK4_1 / 2] = byte >> 4;
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ4_1) -> [f32; QK4_1] {
    let (d, m) = (block.d.to_f32(), block.m.to_f32());
    codes(block).map(|q| f32::from(q) * d + m)
}

pub(crate) fn vec_dot(w: &[BlockQ4_1], act: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let isum: i32 = codes(wb)
            .iter()
            .zip(&ab.qs)
            .map(|(&q, &p)| i32::from(q) * i32::from(p))
            .sum();
        sum += (wb.d.to_f32() * ab.d.to_f32()) * isum as f32 + wb.m.to_f32() * ab.s.to_f32();
    }
    sum
}

/// `(min, max)` of a block as ggml's `_1` quantizers find them (starting from ±FLT_MAX), shared
/// with Q5_1.
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub(crate) fn quantize_block(x: &[f32; QK4_1]) -> BlockQ4_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // `MIN(15, (int8_t)((v - min) * id + 0.5f))` in int, then the store to uint8_t wraps.
    let code = |v: f32| i32::from(c_i8((v - min) * id + 0.5)).min(15) as u8;
    let (lo, hi) = x.split_at(QK4_1 / 2);
    let mut qs = [0u8; QK4_1 / 2];
    for ((q, &a), &b) in qs.iter_mut().zip(lo).zip(hi) {
        *q = code(a) | (code(b) << 4);
    }
    BlockQ4_1 {
        d: half::f16::from_bits(fp32_to_fp16(d)),
        m: half::f16::from_bits(fp32_to_fp16(min)),
        qs,
    }
}
