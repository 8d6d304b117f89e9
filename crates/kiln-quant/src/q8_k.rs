//! Q8_K: 256 activations per block, an f32 scale `d`, signed 8-bit codes `q`, and `bsums[g]`,
//! the sum of the codes of group `g` (16 groups of 16). The activation format of the k-quants.
//!
//! - Dequantize: `x[i] = d * q[i]`.
//! - Quantize (ggml's `quantize_row_q8_K_ref`): `max` = the first element of largest magnitude
//!   (sign kept); `iscale = -127 / max`; `q = min(127, round_half_even(iscale * x))`;
//!   `d = 1 / iscale`. The sign flip is ggml's (it keeps the AVX paths of IQ2_XXS simple); the
//!   product `q * d` is unaffected. An all-zero block gets `d = 0`, zero codes and zero sums.
//!   Since `q` is computed from the very `d` that is stored, `|q * d - x| <= d/2` up to f32 rounding.
//! - Dot of Q8_K with Q8_K (kiln's own: ggml has none): per block the exact integer sum
//!   `s = Σ q * p`, then `sum += (d * da) * s` in f32.

use crate::blocks::{BlockQ8K, QK_K};

/// Quantizes 256 values (`x.len() == 256`, guaranteed by the caller's `chunks_exact`).
pub(crate) fn quantize_block(x: &[f32]) -> BlockQ8K {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut block = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
    if amax == 0.0 {
        return block;
    }
    let iscale = -127.0 / max;
    for (q, &v) in block.qs.iter_mut().zip(x) {
        // ggml's nearest_int rounds half to even; |iscale * x| <= 127 up to one rounding, and the
        // saturating `as` keeps a NaN or infinite input from wrapping.
        let code = (iscale * v).round_ties_even() as i32;
        *q = code.clamp(-128, 127) as i8;
    }
    for (sum, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
        // 16 codes of at most 128 in magnitude: fits in i16.
        *sum = group.iter().map(|&q| i16::from(q)).sum();
    }
    block.d = 1.0 / iscale;
    block
}

pub(crate) fn dequantize_block(block: &BlockQ8K) -> [f32; QK_K] {
    block.qs.map(|q| block.d * f32::from(q))
}

pub(crate) fn vec_dot(w: &[BlockQ8K], act: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let isum: i32 = wb
            .qs
            .iter()
            .zip(&ab.qs)
            .map(|(&q, &p)| i32::from(q) * i32::from(p))
            .sum();
        sum += (wb.d * ab.d) * isum as f32;
    }
    sum
}
