//! Q4_K: super-blocks of 256 weights in 8 groups of 32; f16 `d` and `dmin`, per group a 6-bit
//! scale `sc` and 6-bit min `mn`, 4-bit codes `q` in 0..16.
//!
//! - Dequantize: `w[e] = (d * sc[g]) * q[e] - dmin * mn[g]` with `g = e / 32`.
//! - Packing: element `e = 64c + 32k + l` (`c` in 0..4, `k` in 0..2, `l` in 0..32) is the low
//!   (`k = 0`) or high (`k = 1`) nibble of `qs[32c + l]`.
//! - Scales and mins (12 bytes, shared with Q5_K): for `g < 4`, `sc[g]` = low 6 bits of byte `g`
//!   and `mn[g]` = low 6 bits of byte `g + 4`; for `g >= 4`, the low nibble of byte `g + 4` holds
//!   `sc[g]`'s low 4 bits and its high nibble `mn[g]`'s, while the top 2 bits of bytes `g - 4` and
//!   `g` supply the top 2 bits of `sc[g]` and `mn[g]`.
//! - Dot with Q8_K activations `a = da * p`: integer lane sums of `sc * q * p` ([`crate::lanes`])
//!   scaled by `d * da`, and per block `sum -= (dmin * da) * Σ_g mn[g/2] * bsums[g]`
//!   (groups of 16), in ggml's `ggml_vec_dot_q4_K_q8_K` order.

use crate::blocks::{BlockQ4K, BlockQ8K, K_SCALE_SIZE, QK_K};
use crate::lanes::{lane_sums, LaneSums};

/// Unpacks the 8 six-bit scales and 8 six-bit mins of a Q4_K/Q5_K super-block.
pub(crate) fn scales_and_mins(packed: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for g in 0..4 {
        sc[g] = packed[g] & 0x3F;
        mn[g] = packed[g + 4] & 0x3F;
    }
    for g in 4..8 {
        sc[g] = (packed[g + 4] & 0x0F) | ((packed[g - 4] >> 6) << 4);
        mn[g] = (packed[g + 4] >> 4) | ((packed[g] >> 6) << 4);
    }
    (sc, mn)
}

/// Dequantizes 256 codes with per-32 scales and mins: `(d * sc) * q - dmin * mn`.
pub(crate) fn dequantize_with(
    q: &[i8; QK_K],
    d: f32,
    dmin: f32,
    packed: &[u8; K_SCALE_SIZE],
) -> [f32; QK_K] {
    let (sc, mn) = scales_and_mins(packed);
    let mut out = [0.0f32; QK_K];
    for (e, x) in out.iter_mut().enumerate() {
        let g = e / 32;
        *x = (d * f32::from(sc[g])) * f32::from(q[e]) - dmin * f32::from(mn[g]);
    }
    out
}

/// The Q4_K/Q5_K dot of one weight row given each super-block's codes, f16 scales and packing.
pub(crate) fn vec_dot_with<W>(
    w: &[W],
    act: &[BlockQ8K],
    unpack: impl Fn(&W) -> ([i8; QK_K], f32, f32, [u8; K_SCALE_SIZE]),
) -> f32 {
    let mut sum = 0.0f32;
    let mut lanes_sum = LaneSums::default();
    for (wb, ab) in w.iter().zip(act) {
        let (q, d, dmin, packed) = unpack(wb);
        let (sc, mn) = scales_and_mins(&packed);
        let scale16: [i32; QK_K / 16] = std::array::from_fn(|g| i32::from(sc[g / 2]));
        let mins: i32 = ab
            .bsums
            .iter()
            .enumerate()
            .map(|(g, &b)| i32::from(b) * i32::from(mn[g / 2]))
            .sum();
        lanes_sum.add(d * ab.d, &lane_sums(&q, &ab.qs, &scale16));
        sum -= (dmin * ab.d) * mins as f32;
    }
    lanes_sum.finish(sum)
}

/// The 256 codes in element order, 0..16.
fn codes(block: &BlockQ4K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, code) in q.iter_mut().enumerate() {
        let (c, k, l) = (e / 64, (e % 64) / 32, e % 32);
        *code = ((block.qs[32 * c + l] >> (4 * k)) & 0x0F) as i8;
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ4K) -> [f32; QK_K] {
    dequantize_with(
        &codes(block),
        block.d.to_f32(),
        block.dmin.to_f32(),
        &block.scales,
    )
}

pub(crate) fn vec_dot(w: &[BlockQ4K], act: &[BlockQ8K]) -> f32 {
    vec_dot_with(w, act, |b| {
        (codes(b), b.d.to_f32(), b.dmin.to_f32(), b.scales)
    })
}
