//! Q8_1: 32 activations per block, f16 scale `d`, f16 block sum `s`, signed 8-bit codes `q`. The
//! activation format of Q4_1 and Q5_1 weights; never a weight format in kiln.
//!
//! - Dequantize: `x[i] = q[i] * d`.
//! - Quantize (ggml's `quantize_row_q8_1_ref`): codes and `d` exactly as Q8_0, plus
//!   `s = f16(d * Σ q)` with the f32 `d`, which lets the `_1` weight formats fold their offset `m`
//!   into one multiply per block.

use half::f16;

use crate::blocks::{BlockQ8_1, QK8_1};
use crate::q8_0::{code, scale_and_inverse};

/// Quantizes 32 values (`x.len() == 32`, guaranteed by the caller's `chunks_exact`).
pub(crate) fn quantize_block(x: &[f32]) -> BlockQ8_1 {
    let (d, id) = scale_and_inverse(x);
    let mut qs = [0i8; QK8_1];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = code(v, id);
    }
    let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    BlockQ8_1 {
        d: f16::from_f32(d),
        s: f16::from_f32(sum as f32 * d),
        qs,
    }
}

pub(crate) fn dequantize_block(block: &BlockQ8_1) -> [f32; QK8_1] {
    let d = block.d.to_f32();
    block.qs.map(|q| f32::from(q) * d)
}
