//! Q4_0: 32 weights per block, one f16 scale `d`, 4-bit codes `q` in 0..16.
//!
//! - Dequantize: `w[i] = (q[i] - 8) * d`.
//! - Packing: byte `qs[j]` holds element `j` in its low nibble and element `j + 16` in its high
//!   nibble.
//! - Dot with Q8_0 activations `a = da * p`: per block the exact integer sum `s = Σ (q - 8) * p`,
//!   then `sum += (s * d) * da` in f32, blocks in order (ggml's `ggml_vec_dot_q4_0_q8_0`).
//! - Quantize (ggml's `quantize_row_q4_0_ref`): `max` = the first element of largest magnitude
//!   (sign kept), `d = max / -8`, `q = min(15, (int8_t)(x / d + 8.5))`: the extreme value maps
//!   to code 0 exactly and the other side gets at most 15, so one code (16) of the range is
//!   never used. The codes are computed with the f32 `d`, the block stores its f16 rounding.

use crate::blocks::{BlockQ4_0, BlockQ8_0, QK4_0};
use crate::cfloat::{c_i8, fp32_to_fp16};

/// The 32 codes of a block in element order, centred: `q - 8` in -8..8.
fn codes(block: &BlockQ4_0) -> [i8; QK4_0] {
    let mut q = [0i8; QK4_0];
    for (j, &byte) in block.qs.iter().enumerate() {
        q[j] = (byte & 0x0F) as i8 - 8;
        q[j + QK4_0 / 2] = (byte >> 4) as i8 - 8;
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ4_0) -> [f32; QK4_0] {
    let d = block.d.to_f32();
    codes(block).map(|q| f32::from(q) * d)
}

pub(crate) fn vec_dot(w: &[BlockQ4_0], act: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let isum: i32 = codes(wb)
            .iter()
            .zip(&ab.qs)
            .map(|(&q, &p)| i32::from(q) * i32::from(p))
            .sum();
        sum += isum as f32 * wb.d.to_f32() * ab.d.to_f32();
    }
    sum
}

/// The first element of largest magnitude, sign kept (ggml's `max` in the symmetric legacy
/// quantizers), shared with Q5_0.
pub(crate) fn signed_max(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

pub(crate) fn quantize_block(x: &[f32; QK4_0]) -> BlockQ4_0 {
    let d = signed_max(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // `MIN(15, (int8_t)(v * id + 8.5f))` in int, then the store to uint8_t wraps.
    let code = |v: f32| i32::from(c_i8(v * id + 8.5)).min(15) as u8;
    let (lo, hi) = x.split_at(QK4_0 / 2);
    let mut qs = [0u8; QK4_0 / 2];
    for ((q, &a), &b) in qs.iter_mut().zip(lo).zip(hi) {
        *q = code(a) | (code(b) << 4);
    }
    BlockQ4_0 {
        d: half::f16::from_bits(fp32_to_fp16(d)),
        qs,
    }
}
