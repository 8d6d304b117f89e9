//! Q3_K: super-blocks of 256 weights in 16 groups of 16; one f16 `d`, per group a signed 6-bit
//! scale, 3-bit codes (2 low bits in `qs`, the third in `hmask`).
//!
//! - Dequantize: `w[e] = (d * (s[g] - 32)) * c[e]` with `g = e / 16`, `s` in 0..64 and
//!   `c = low - (high bit set ? 0 : 4)` in -4..4 (a *clear* high bit subtracts 4).
//! - Packing of element `e = 128h + 32j + l` (`h` in 0..2, `j` in 0..4, `l` in 0..32): low bits are
//!   bits `2j..2j+2` of `qs[32h + l]`; the high bit is bit `4h + j` of `hmask[l]`.
//! - Scales: 16 six-bit values in 12 bytes. Scale `g`'s low nibble is the low nibble of byte `g`
//!   for `g < 8` and the high nibble of byte `g - 8` for `g >= 8`; its top two bits are bits
//!   `2(g / 4)..2(g / 4) + 2` of byte `8 + g % 4`.
//! - Dot with Q8_K activations `a = da * p`: integer lane sums of `(s - 32) * c * p`
//!   ([`crate::lanes`]), each lane scaled by `d * da` and summed in f32
//!   (ggml's `ggml_vec_dot_q3_K_q8_K`).
//! - Quantize (ggml's `quantize_row_q3_K_ref`): per group, [`make_q3_quants`] picks a signed
//!   scale; the 16 scales are quantized to 6 bits against the one of largest magnitude
//!   (`d = -max_scale / 32`, so that scale maps to -32), then every group whose quantized scale
//!   is nonzero is re-coded against the stored values, `c = clamp(nearest_int(x / (d * s)), -4, 3)`.

use crate::blocks::{BlockQ3K, BlockQ8K, QK_K};
use crate::cfloat::{fp32_to_fp16, nearest_int};
use crate::lanes::{lane_sums, LaneSums};
use crate::q2_k::pack2;
use crate::search::make_q3_quants;

/// The 16 group scales, already centred: -32..32.
fn scales_of(block: &BlockQ3K) -> [i32; QK_K / 16] {
    let packed = &block.scales;
    let mut s = [0i32; QK_K / 16];
    for (g, scale) in s.iter_mut().enumerate() {
        let low = if g < 8 {
            packed[g] & 0x0F
        } else {
            packed[g - 8] >> 4
        };
        let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 3;
        *scale = i32::from(low | (high << 4)) - 32;
    }
    s
}

/// The 256 codes in element order, -4..4.
fn codes(block: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, code) in q.iter_mut().enumerate() {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((block.qs[32 * h + l] >> (2 * j)) & 3) as i8;
        let high_set = (block.hmask[l] >> (4 * h + j)) & 1 == 1;
        *code = if high_set { low } else { low - 4 };
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ3K) -> [f32; QK_K] {
    let d = block.d.to_f32();
    let s = scales_of(block);
    let q = codes(block);
    let mut out = [0.0f32; QK_K];
    for (e, x) in out.iter_mut().enumerate() {
        *x = (d * s[e / 16] as f32) * f32::from(q[e]);
    }
    out
}

pub(crate) fn vec_dot(w: &[BlockQ3K], act: &[BlockQ8K]) -> f32 {
    let mut sums = LaneSums::default();
    for (wb, ab) in w.iter().zip(act) {
        let lanes = lane_sums(&codes(wb), &ab.qs, &scales_of(wb));
        sums.add(wb.d.to_f32() * ab.d, &lanes);
    }
    sums.finish(0.0)
}

pub(crate) fn quantize_block(x: &[f32; QK_K]) -> BlockQ3K {
    let mut codes = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for ((scale, xs), ls) in scales
        .iter_mut()
        .zip(x.chunks_exact(16))
        .zip(codes.chunks_exact_mut(16))
    {
        *scale = make_q3_quants(4, xs, ls);
        if scale.abs() > amax {
            amax = scale.abs();
            max_scale = *scale;
        }
    }

    let mut block = BlockQ3K {
        hmask: [0; QK_K / 8],
        qs: [0; QK_K / 4],
        scales: [0; 12],
        d: half::f16::ZERO,
    };
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (g, &scale) in scales.iter().enumerate() {
            // `int8_t l = nearest_int(...)` narrows before the clamp, as in the C.
            let l = (i32::from(nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32) as u8;
            if g < 8 {
                block.scales[g] = l & 0x0F;
            } else {
                block.scales[g - 8] |= (l & 0x0F) << 4;
            }
            block.scales[8 + g % 4] |= (l >> 4) << (2 * (g / 4));
        }
        block.d = half::f16::from_bits(fp32_to_fp16(1.0 / iscale));
    }

    let d_all = block.d.to_f32();
    let signed_scales = scales_of(&block);
    for ((xs, ls), &sc) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&signed_scales)
    {
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-4, 3) + 4) as i8;
        }
    }

    // Codes are 0..8 here: the high bit goes to `hmask`, element `e` at bit `e / 32` of byte
    // `e % 32`; the low two bits are packed as Q2_K's.
    let mut low = [0u8; QK_K];
    for (e, (&code, out)) in codes.iter().zip(low.iter_mut()).enumerate() {
        let mut code = code as u8;
        if code > 3 {
            block.hmask[e % 32] |= 1 << (e / 32);
            code -= 4;
        }
        *out = code;
    }
    block.qs = pack2(&low);
    block
}
