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
//! - Quantize (ggml's `quantize_row_q2_K_ref`): per group, [`make_qkx2_quants`] (weights `|x|`,
//!   absolute error) picks a scale and a minimum; the 16 scales and the 16 minimums are each
//!   quantized to 4 bits against their largest (`d = max_scale / 15`, `dmin = max_min / 15`);
//!   then every group whose quantized scale is nonzero is re-coded against the stored f16
//!   values, `q = clamp(nearest_int((x + dmin * mn) / (d * sc)), 0, 3)`.

use crate::blocks::{BlockQ2K, BlockQ8K, QK_K};
use crate::cfloat::{fp32_to_fp16, nearest_int};
use crate::search::{make_qkx2_quants, Qkx2};

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

/// Packs 256 two-bit codes: element `128h + 32j + l` into bits `2j..2j+2` of byte `32h + l`
/// (shared with the low bits of Q3_K).
pub(crate) fn pack2(codes: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for (i, q) in qs.iter_mut().enumerate() {
        let (h, l) = (i / 32, i % 32);
        let at = |j: usize| codes[128 * h + 32 * j + l] << (2 * j);
        *q = at(0) | at(1) | at(2) | at(3);
    }
    qs
}

const SEARCH: Qkx2 = Qkx2 {
    nmax: 3,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: true,
};

pub(crate) fn quantize_block(x: &[f32; QK_K]) -> BlockQ2K {
    const Q4SCALE: f32 = 15.0;
    let mut codes = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut mins = [0.0f32; QK_K / 16];
    let mut aux = [0u8; 16];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for (g, (xs, ls)) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .enumerate()
    {
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        let (scale, min) = make_qkx2_quants(&SEARCH, xs, &weights, ls, &mut aux);
        scales[g] = scale;
        mins[g] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let mut block = BlockQ2K {
        scales: [0; QK_K / 16],
        qs: [0; QK_K / 4],
        d: half::f16::ZERO,
        dmin: half::f16::ZERO,
    };
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (packed, &scale) in block.scales.iter_mut().zip(&scales) {
            *packed = nearest_int(iscale * scale) as u8;
        }
        block.d = half::f16::from_bits(fp32_to_fp16(max_scale / Q4SCALE));
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (packed, &min) in block.scales.iter_mut().zip(&mins) {
            *packed |= (nearest_int(iscale * min) << 4) as u8;
        }
        block.dmin = half::f16::from_bits(fp32_to_fp16(max_min / Q4SCALE));
    }

    let (d_all, dmin_all) = (block.d.to_f32(), block.dmin.to_f32());
    for ((xs, ls), &packed) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&block.scales)
    {
        let d = d_all * f32::from(packed & 0x0F);
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * f32::from(packed >> 4);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / d).clamp(0, 3) as u8;
        }
    }
    block.qs = pack2(&codes);
    block
}
