//! Q5_0: 32 weights per block, one f16 scale `d`, 5-bit codes `q` in 0..32.
//!
//! - Dequantize: `w[i] = (q[i] - 16) * d`.
//! - Packing: the low 4 bits as in Q4_0 (`qs[j]`: element `j` low nibble, `j + 16` high nibble);
//!   the 5th bit of element `i` is bit `i` of `qh` read as a little-endian u32.
//! - Dot with Q8_0 activations `a = da * p`: per block the exact integer sum `s = Σ (q - 16) * p`,
//!   then `sum += (d * da) * s` in f32 (ggml's `ggml_vec_dot_q5_0_q8_0`).
//! - Quantize (ggml's `quantize_row_q5_0_ref`): as Q4_0 with `d = max / -16` and
//!   `q = min(31, (int8_t)(x / d + 16.5))`.

use crate::blocks::{BlockQ5_0, BlockQ8_0, QK5_0};
use crate::cfloat::{c_i8, fp32_to_fp16};
use crate::q4_0::signed_max;

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

/// Packs 32 five-bit codes: low nibbles as Q4_0, the 5th bit of element `i` into bit `i` of `qh`.
pub(crate) fn pack5(codes: &[u8; QK5_0]) -> ([u8; QK5_0 / 2], [u8; 4]) {
    let (lo, hi) = codes.split_at(QK5_0 / 2);
    let mut qs = [0u8; QK5_0 / 2];
    let mut qh = 0u32;
    for (j, ((q, &a), &b)) in qs.iter_mut().zip(lo).zip(hi).enumerate() {
        *q = (a & 0x0F) | ((b & 0x0F) << 4);
        qh |= u32::from((a & 0x10) >> 4) << j;
        qh |= u32::from((b & 0x10) >> 4) << (j + QK5_0 / 2);
    }
    (qs, qh.to_le_bytes())
}

pub(crate) fn quantize_block(x: &[f32; QK5_0]) -> BlockQ5_0 {
    let d = signed_max(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let codes = x.map(|v| i32::from(c_i8(v * id + 16.5)).min(31) as u8);
    let (qs, qh) = pack5(&codes);
    BlockQ5_0 {
        d: half::f16::from_bits(fp32_to_fp16(d)),
        qh,
        qs,
    }
}
