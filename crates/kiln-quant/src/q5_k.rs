//! Q5_K: super-blocks of 256 weights in 8 groups of 32; f16 `d` and `dmin`, 6-bit scales and mins
//! packed as in Q4_K, 5-bit codes `q` in 0..32.
//!
//! - Dequantize: `w[e] = (d * sc[g]) * q[e] - dmin * mn[g]` with `g = e / 32`.
//! - Packing: element `e = 64c + 32k + l` (`c` in 0..4, `k` in 0..2, `l` in 0..32) takes its low 4
//!   bits from nibble `k` of `qs[32c + l]` (as Q4_K) and its 5th bit from bit `2c + k` of `qh[l]`.
//! - Dot with Q8_K activations: as Q4_K (ggml's `ggml_vec_dot_q5_K_q8_K` has the same order).
//! - Quantize (ggml's `quantize_row_q5_K_ref`): as Q4_K with 31 levels and a narrower search
//!   (`rmin = -0.5`, 16 steps).

use crate::blocks::{BlockQ5K, BlockQ8K, QK_K};
use crate::q4_k::{dequantize_with, quantize_groups, vec_dot_with};
use crate::search::Qkx2;

/// The 256 codes in element order, 0..32.
fn codes(block: &BlockQ5K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, code) in q.iter_mut().enumerate() {
        let (c, k, l) = (e / 64, (e % 64) / 32, e % 32);
        let low = (block.qs[32 * c + l] >> (4 * k)) & 0x0F;
        let high = (block.qh[l] >> (2 * c + k)) & 1;
        *code = (low | (high << 4)) as i8;
    }
    q
}

pub(crate) fn dequantize_block(block: &BlockQ5K) -> [f32; QK_K] {
    dequantize_with(
        &codes(block),
        block.d.to_f32(),
        block.dmin.to_f32(),
        &block.scales,
    )
}

pub(crate) fn vec_dot(w: &[BlockQ5K], act: &[BlockQ8K]) -> f32 {
    vec_dot_with(w, act, |b| {
        (codes(b), b.d.to_f32(), b.dmin.to_f32(), b.scales)
    })
}

const SEARCH: Qkx2 = Qkx2 {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: false,
};

pub(crate) fn quantize_block(x: &[f32; QK_K]) -> BlockQ5K {
    let g = quantize_groups(x, &SEARCH);
    let mut qs = [0u8; QK_K / 2];
    let mut qh = [0u8; QK_K / 8];
    for (i, q) in qs.iter_mut().enumerate() {
        let (c, l) = (i / 32, i % 32);
        let (lo, hi) = (g.codes[64 * c + l], g.codes[64 * c + 32 + l]);
        *q = (lo & 0x0F) | ((hi & 0x0F) << 4);
        qh[l] |= ((lo >> 4) & 1) << (2 * c);
        qh[l] |= ((hi >> 4) & 1) << (2 * c + 1);
    }
    BlockQ5K {
        d: g.d,
        dmin: g.dmin,
        scales: g.scales,
        qh,
        qs,
    }
}
