//! Q5_0: 32 weights per block, one f16 scale `d`, 5-bit codes `q` in 0..32.
//!
//! - Dequantize: `w[i] = (q[i] - 16) * d`.
//! - Packing: the low 4 bits as in Q4_0 (`qs[j]`: element `j` low nibble, `j + 16` high nibble);
//!   the 5th bit of element `i` is bit `i` of `qh` read as a little-endian u32.
//! - Dot with Q8_0 activations `a = da * p`: per block the exact integer sum `s = Σ (q - 16) * p`,
//!   then `sum += (d * da) * s` in f32 (ggml's `ggml_vec_dot_q5_0_q8_0`).

use crate::blocks::{BlockQ5_0, BlockQ8_0, QK5_0};

/// The 5-bit codes of a Q5_0/Q5_1 block in element order, 0..32.
pub(crate) fn codes5(qs: &[u8; QK5_0 / 2], qh: [u8; 4]) -> [u8; QK5_0] {
    let high = u32::from_le_bytes(qh);
    let mut q = [0u8; QK5_0];
    for (j, &byte) in qs.iter().enumerate() {
        let hi_bit = |i: usize| (((high >> i) & 1) as u8) << 4;
        q[j] = (byte & 0x0F) | hi_bit(j);
        q[j + QK5_0 / 2] = (byte >> 4) | hi_bit(j + QK5_0 / 2);
    }
    q
}

/// Codes centred on 16: -16..16.
fn codes(block: &BlockQ5_0) -> [i8; QK5_0] {
    codes5(&block.qs, block.qh).map(|q| q as i8 - 16)
}

pub(crate) fn dequantize_block(block: &BlockQ5_0) -> [f32; QK5_0] {
    let d = block.d.to_f32();
    codes(block).map(|q| f32::from(q) * d)
}

pub(crate) fn vec_dot(w: &[BlockQ5_0], act: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let isum: i32 = codes(wb)
            .iter()
            .zip(&ab.qs)
            .map(|(&q, &p)| i32::from(q) * i32::from(p))
            .sum();
        sum += (wb.d.to_f32() * ab.d.to_f32()) * isum as f32;
    }
    sum
}
