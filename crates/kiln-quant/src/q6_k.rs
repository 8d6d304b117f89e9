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

use crate::blocks::{BlockQ6K, BlockQ8K, QK_K};
use crate::lanes::{lane_sums, LaneSums};

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
