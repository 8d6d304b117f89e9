//! Q2_K: super-blocks of 256 weights in 16 groups of 16; f16 `d` and `dmin`, per group a 4-bit
//! scale `sc` and 4-bit min `mn` (byte `scales[g]`: `sc` low nibble, `mn` high nibble), 2-bit
//! codes `q` in 0..4.
//!
//! - Dequantize: `w[e] = (d * sc[g]) * q[e] - dmin * mn[g]` with `g = e / 16`.
//! - Packing: element `e = 128h + 32j + l` (`h` in 0..2, `j` in 0..4, `l` in 0..32) is bits
//!   `2j..2j+2` of `qs[32h + l]`.
//! - Dot with Q8_K activations `a = da * p` (with `bsums[g] = Σ p` over group `g`): per block the
//!   exact integers `t = Σ_g sc[g] * Σ_{e in g} q * p` and `u = Σ_g mn[g] * bsums[g]`, then
//!   `sum += (da * d) * t - (da * dmin) * u` in f32 (ggml's `ggml_vec_dot_q2_K_q8_K`).

use crate::blocks::{BlockQ2K, BlockQ8K, QK_K};

/// The 256 codes in element order, 0..4.
fn codes(block: &BlockQ2K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, code) in q.iter_mut().enumerate() {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        *code = ((block.qs[32 * h + l] >> (2 * j)) & 3) as i8;
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ2K) -> [f32; QK_K] {
    let (d, dmin) = (block.d.to_f32(), block.dmin.to_f32());
    let q = codes(block);
    let mut out = [0.0f32; QK_K];
    for (e, x) in out.iter_mut().enumerate() {
        let packed = block.scales[e / 16];
        let scale = d * f32::from(packed & 0x0F);
        let min = dmin * f32::from(packed >> 4);
        *x = scale * f32::from(q[e]) - min;
    }
    out
}

pub(crate) fn vec_dot(w: &[BlockQ2K], act: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let q = codes(wb);
        let mut scaled = 0i32;
        let mut mins = 0i32;
        for (g, &packed) in wb.scales.iter().enumerate() {
            let group = 16 * g..16 * g + 16;
            let dot: i32 = q[group.clone()]
                .iter()
                .zip(&ab.qs[group])
                .map(|(&qe, &pe)| i32::from(qe) * i32::from(pe))
                .sum();
            scaled += i32::from(packed & 0x0F) * dot;
            mins += i32::from(packed >> 4) * i32::from(ab.bsums[g]);
        }
        let dall = ab.d * wb.d.to_f32();
        let dmin = ab.d * wb.dmin.to_f32();
        sum += dall * scaled as f32 - dmin * mins as f32;
    }
    sum
}
