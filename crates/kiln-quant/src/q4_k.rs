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
//! - Quantize (ggml's `quantize_row_q4_K_ref`, shared with Q5_K through [`quantize_groups`]):
//!   per group, [`make_qkx2_quants`] with weights `sqrt(mean(x²)) + |x|` picks a scale and a
//!   minimum; scales and minimums are quantized to 6 bits against their largest
//!   (`d = max_scale / 63`, `dmin = max_min / 63`), then every group whose quantized scale is
//!   nonzero is re-coded against the stored values, `q = clamp(nearest_int((x + dm) / d), 0, nmax)`.

use half::f16;

use crate::blocks::{BlockQ4K, BlockQ8K, K_SCALE_SIZE, QK_K};
use crate::cfloat::{fp32_to_fp16, nearest_int};
use crate::lanes::{lane_sums, LaneSums};
use crate::search::{make_qkx2_quants, Qkx2};

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

/// What Q4_K and Q5_K store besides their code bits.
pub(crate) struct Groups {
    /// Codes in element order, 0..=nmax.
    pub codes: [u8; QK_K],
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
}

/// Quantizes a super-block into 8 groups of 32 with 6-bit scales and minimums (the common part
/// of `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref`; `search.nmax` is 15 or 31).
pub(crate) fn quantize_groups(x: &[f32; QK_K], search: &Qkx2) -> Groups {
    let mut codes = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut aux = [0u8; 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for (g, (xs, ls)) in x
        .chunks_exact(32)
        .zip(codes.chunks_exact_mut(32))
        .enumerate()
    {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) = make_qkx2_quants(search, xs, &weights, ls, &mut aux);
        scales[g] = scale;
        mins[g] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; K_SCALE_SIZE];
    for (g, (&scale, &min)) in scales.iter().zip(&mins).enumerate() {
        // `uint8_t ls = nearest_int(...)` wraps before MIN(63, ...), as in the C.
        let ls = (nearest_int(inv_scale * scale) as u8).min(63);
        let lm = (nearest_int(inv_min * min) as u8).min(63);
        if g < 4 {
            packed[g] = ls;
            packed[g + 4] = lm;
        } else {
            packed[g + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[g - 4] |= (ls >> 4) << 6;
            packed[g] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_bits(fp32_to_fp16(max_scale / 63.0));
    let dmin = f16::from_bits(fp32_to_fp16(max_min / 63.0));

    let (sc, mn) = scales_and_mins(&packed);
    for (((xs, ls), &sc), &mn) in x
        .chunks_exact(32)
        .zip(codes.chunks_exact_mut(32))
        .zip(&sc)
        .zip(&mn)
    {
        let step = d.to_f32() * f32::from(sc);
        if step == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(mn);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / step).clamp(0, search.nmax) as u8;
        }
    }
    Groups {
        codes,
        d,
        dmin,
        scales: packed,
    }
}

const SEARCH: Qkx2 = Qkx2 {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};

pub(crate) fn quantize_block(x: &[f32; QK_K]) -> BlockQ4K {
    let g = quantize_groups(x, &SEARCH);
    let mut qs = [0u8; QK_K / 2];
    for (i, q) in qs.iter_mut().enumerate() {
        let (c, l) = (i / 32, i % 32);
        *q = g.codes[64 * c + l] | (g.codes[64 * c + 32 + l] << 4);
    }
    BlockQ4K {
        d: g.d,
        dmin: g.dmin,
        scales: g.scales,
        qs,
    }
}
