//! Q4_1: 32 weights per block, f16 scale `d` and f16 offset `m`, 4-bit codes `q` in 0..16.
//!
//! - Dequantize: `w[i] = q[i] * d + m`.
//! - Packing: as Q4_0, byte `qs[j]` holds element `j` (low nibble) and `j + 16` (high nibble).
//! - Dot with Q8_1 activations `a = da * p`, whose block also stores `s = f16(da * Σ p)`: per block
//!   the exact integer sum `t = Σ q * p`, then `sum += (d * da) * t + m * s` in f32
//!   (ggml's `ggml_vec_dot_q4_1_q8_1`). Because `s` is rounded to f16 (and computed from the f32
//!   `da`, whereas `a` uses the f16 one), the offset term differs from `m * Σ a` by up to about
//!   `|m * s| * 2^-10`: that is the format, not an error of this code.

use crate::blocks::{BlockQ4_1, BlockQ8_1, QK4_1};

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
