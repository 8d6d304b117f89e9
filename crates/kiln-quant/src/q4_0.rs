//! Q4_0: 32 weights per block, one f16 scale `d`, 4-bit codes `q` in 0..16.
//!
//! - Dequantize: `w[i] = (q[i] - 8) * d`.
//! - Packing: byte `qs[j]` holds element `j` in its low nibble and element `j + 16` in its high
//!   nibble.
//! - Dot with Q8_0 activations `a = da * p`: per block the exact integer sum `s = Σ (q - 8) * p`,
//!   then `sum += (s * d) * da` in f32, blocks in order (ggml's `ggml_vec_dot_q4_0_q8_0`).

use crate::blocks::{BlockQ4_0, BlockQ8_0, QK4_0};

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
