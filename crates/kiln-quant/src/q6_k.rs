//! Q6_K: super-blocks of 256 weights in 16 groups of 16; one f16 `d`, per group a signed 8-bit
//! scale `s`, 6-bit codes (4 low bits in `ql`, 2 high bits in `qh`).
//!
//! - Dequantize: `w[e] = (d * s[g]) * (q[e] - 32)` with `g = e / 16`, `q` in 0..64.
//! - Packing of element `e = 128h + 32k + l` (`h` in 0..2, `k` in 0..4, `l` in 0..32): the low 4
//!   bits are the low (`k` = 0, 1) or high (`k` = 2, 3) nibble of `ql[64h + 32(k % 2) + l]`; the
//!   high 2 bits are bits `2k..2k+2` of `qh[32h + l]`.
//! - Dot with Q8_K activations `a = da * p`: integer lane sums of `s * (q - 32) * p`
//!   ([`crate::lanes`]), each lane scaled by `d * da` and summed in f32
//!   (ggml's `ggml_vec_dot_q6_K_q8_K`).
//! - Quantize (ggml's `quantize_row_q6_K_ref`): per group, [`make_qx_quants`] picks a signed
//!   scale; the scales are quantized to 8 bits against the one of largest magnitude
//!   (`d = -max_scale / 128`, scales `min(127, nearest_int(s / d))`), then every group whose
//!   quantized scale is nonzero is re-coded, `q = clamp(nearest_int(x / (d * s)), -32, 31) + 32`.
//!   A super-block whose scales are all below `GROUP_MAX_EPS` is all zero bytes.

use crate::blocks::{BlockQ6K, BlockQ8K, QK_K};
use crate::cfloat::{fp32_to_fp16, nearest_int};
use crate::lanes::{lane_sums, LaneSums};
use crate::search::{make_qx_quants, GROUP_MAX_EPS};

/// The 256 codes in element order, centred: -32..32.
fn codes(block: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, code) in q.iter_mut().enumerate() {
        let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = (block.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
        let high = (block.qh[32 * h + l] >> (2 * k)) & 3;
        *code = (low | (high << 4)) as i8 - 32;
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ6K) -> [f32; QK_K] {
    let d = block.d.to_f32();
    let q = codes(block);
    let mut out = [0.0f32; QK_K];
    for (e, x) in out.iter_mut().enumerate() {
        *x = (d * f32::from(block.scales[e / 16])) * f32::from(q[e]);
    }
    out
}

pub(crate) fn vec_dot(w: &[BlockQ6K], act: &[BlockQ8K]) -> f32 {
    let mut sums = LaneSums::default();
    for (wb, ab) in w.iter().zip(act) {
        let scale16 = wb.scales.map(i32::from);
        sums.add(
            wb.d.to_f32() * ab.d,
            &lane_sums(&codes(wb), &ab.qs, &scale16),
        );
    }
    sums.finish(0.0)
}

pub(crate) fn quantize_block(x: &[f32; QK_K]) -> BlockQ6K {
    let mut codes = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ((scale, xs), ls) in scales
        .iter_mut()
        .zip(x.chunks_exact(16))
        .zip(codes.chunks_exact_mut(16))
    {
        *scale = make_qx_quants(32, xs, ls);
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = *scale;
        }
    }

    let mut block = BlockQ6K {
        ql: [0; QK_K / 2],
        qh: [0; QK_K / 4],
        scales: [0; QK_K / 16],
        d: half::f16::ZERO,
    };
    if max_abs_scale < GROUP_MAX_EPS {
        return block;
    }
    let iscale = -128.0 / max_scale;
    block.d = half::f16::from_bits(fp32_to_fp16(1.0 / iscale));
    for (packed, &scale) in block.scales.iter_mut().zip(&scales) {
        *packed = nearest_int(iscale * scale).min(127) as i8;
    }

    let d_all = block.d.to_f32();
    for ((xs, ls), &sc) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&block.scales)
    {
        let d = d_all * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-32, 31) + 32) as i8;
        }
    }

    // Element `128h + 32k + l`: low nibble into `ql[64h + 32(k % 2) + l]` (nibble k / 2), high
    // two bits into bits `2k..2k+2` of `qh[32h + l]`.
    for (e, &code) in codes.iter().enumerate() {
        let code = code as u8;
        let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
        block.ql[64 * h + 32 * (k % 2) + l] |= (code & 0x0F) << (4 * (k / 2));
        block.qh[32 * h + l] |= (code >> 4) << (2 * k);
    }
    block
}
