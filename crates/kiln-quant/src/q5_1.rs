//! Q5_1: 32 weights per block, f16 scale `d` and f16 offset `m`, 5-bit codes `q` in 0..32.
//!
//! - Dequantize: `w[i] = q[i] * d + m`.
//! - Packing: as Q5_0 (low nibbles in `qs`, 5th bit of element `i` = bit `i` of `qh` as LE u32).
//! - Dot with Q8_1 activations `a = da * p` (block sum `s = f16(da * Σ p)`): per block the exact
//!   integer sum `t = Σ q * p`, then `sum += (d * da) * t + m * s` in f32
//!   (ggml's `ggml_vec_dot_q5_1_q8_1`; the f16 `s` costs about `|m * s| * 2^-10`, as in Q4_1).
//! - Quantize (ggml's `quantize_row_q5_1_ref`): as Q4_1 with `d = (max - min) / 31` and
//!   `q = (uint8_t)((x - min) / d + 0.5)` (no clamp: the largest value lands on 31).

use crate::blocks::{BlockQ5_1, BlockQ8_1, QK5_1};
use crate::cfloat::{c_u8, fp32_to_fp16};
use crate::q4_1::min_max;
use crate::q5_0::{codes5, pack5};

pub(crate) fn dequantize_block(block: &BlockQ5_1) -> [f32; QK5_1] {
    let (d, m) = (block.d.to_f32(), block.m.to_f32());
    codes5(&block.qs, block.qh).map(|q| f32::from(q) * d + m)
}

pub(crate) fn vec_dot(w: &[BlockQ5_1], act: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let isum: i32 = codes5(&wb.qs, wb.qh)
            .iter()
            .zip(&ab.qs)
            .map(|(&q, &p)| i32::from(q) * i32::from(p))
            .sum();
        sum += (wb.d.to_f32() * ab.d.to_f32()) * isum as f32 + wb.m.to_f32() * ab.s.to_f32();
    }
    sum
}

pub(crate) fn quantize_block(x: &[f32; QK5_1]) -> BlockQ5_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let codes = x.map(|v| c_u8((v - min) * id + 0.5));
    let (qs, qh) = pack5(&codes);
    BlockQ5_1 {
        d: half::f16::from_bits(fp32_to_fp16(d)),
        m: half::f16::from_bits(fp32_to_fp16(min)),
        qh,
        qs,
    }
}
