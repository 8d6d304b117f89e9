//! The accumulation order of ggml's scalar k-quant dot products (Q3_K, Q4_K, Q5_K, Q6_K · Q8_K).
//!
//! Per super-block of 256, ggml keeps 8 integer lanes: element `e` adds
//! `scale[e / 16] * q[e] * p[e]` to lane `e % 8`. The lanes are exact (each |lane| < 2^24, so the
//! conversion to f32 is exact too). Each lane is then scaled by the block's f32 factor
//! `d_w * d_a` and accumulated in its own f32 sum across blocks; the 8 sums are added in lane
//! order only at the end. Keeping that order makes this reference reproduce ggml's scalar result,
//! not just approximate it.

use crate::blocks::QK_K;

/// Integer lane sums of one super-block; `scale16[g]` is the scale of elements `16g..16g+16`.
pub(crate) fn lane_sums(q: &[i8; QK_K], p: &[i8; QK_K], scale16: &[i32; QK_K / 16]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, (&qe, &pe)) in q.iter().zip(p).enumerate() {
        // |scale| <= 128, |q| <= 32, |p| <= 128, 32 elements per lane: at most 2^24, no overflow.
        lanes[e % 8] += scale16[e / 16] * (i32::from(qe) * i32::from(pe));
    }
    lanes
}

/// The 8 f32 lane sums carried across super-blocks.
#[derive(Default)]
pub(crate) struct LaneSums([f32; 8]);

impl LaneSums {
    pub(crate) fn add(&mut self, d: f32, lanes: &[i32; 8]) {
        for (sum, &lane) in self.0.iter_mut().zip(lanes) {
            *sum += d * lane as f32;
        }
    }

    /// Adds the lanes, in order, onto `start` (the min-term sum for Q4_K/Q5_K, 0 otherwise).
    pub(crate) fn finish(self, start: f32) -> f32 {
        self.0.iter().fold(start, |acc, &lane| acc + lane)
    }
}
