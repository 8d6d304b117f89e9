//! How far a backend's f32 result may be from the exact (f64) reference, per op and type, and
//! why.
//!
//! Bounds are per output element and come from counting the rounded f32 operations an
//! implementation needs (Higham's γ_n = n·u / (1 − n·u) bounds a chain of n roundings relative
//! to the sum of the magnitudes of the terms involved), so they are as tight as the arithmetic
//! allows: a wrong element (a missed term, a wrong index, an extra 1e-3) is many times beyond
//! them. They are worst-case bounds, valid for any summation order, blocking, thread split or
//! fused multiply-add a backend chooses. Ops the trait defines as one IEEE operation or a copy
//! have no tolerance at all: those are compared bit for bit (see [`crate::check`]):
//!
//! - `add`, `mul`, `scale`: one correctly rounded IEEE operation per element.
//! - `rows`, `write_rows`, `gather_rows`, `embedding` of F32/F16/BF16 tables, f32 KV caches:
//!   copies (F16 and BF16 widen exactly).
//! - f16 KV caches: one rounding to the nearest f16, ties to even (`KvDtype::F16`).
//! - `scatter_add_rows`: `dst += w·src` in the order of the rows, with the product rounded or
//!   fused into the addition (either sequence's bits are accepted).
//! - `matmul_many`, `attention_many`, `write_paged_rows`: "the same values" as the one-by-one
//!   calls, per the trait.
//! - `paged_attention`: "the same results as over a contiguous copy".
//! - batch invariance (where claimed) and determinism: the same operations, the same bits.

use kiln_core::GgmlType;

/// The unit roundoff of f32: a correctly rounded f32 operation is exact within a relative `U`.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// γ_n: the relative error bound of a chain of `n` rounded f32 operations (a sum of `n + 1`
/// terms in any order, a product of `n + 1` factors), relative to the sum of the magnitudes.
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

// ---- element-wise -------------------------------------------------------------------------

/// Activations are `x` times a factor in [0, 1] (`Φ(x)` for GELU, `σ(x)` for SiLU, `σ(z(x))`
/// for tanh-GELU), so an error in the factor costs that error times `|x|`. The factor is an
/// `erf`, `tanh` or `exp` that a backend evaluates in f32 with a polynomial or rational fit: the
/// trait's own `erf` fit (`Activation::apply`) is within 1.2e-7, f32 evaluations of `exp` and
/// `tanh` within a few ulps; `ACTIVATION_FACTOR` allows 1.2e-7 plus 8 ulps of 1 (6.0e-7).
pub const ACTIVATION_FACTOR: f64 = 1.2e-7 + 8.0 * U;

/// The bound for one activation of `x` whose exact value is `y`: `ACTIVATION_FACTOR · |x|` plus
/// two roundings of `|y|` (the product and the conversion).
pub fn activation(x: f64, y: f64) -> f64 {
    ACTIVATION_FACTOR * x.abs() + 2.0 * U * y.abs()
}

/// The steepest slope of the activations (GELU's peaks at 1.129 near x = 2.4; tanh-GELU's is the
/// same to three digits; SiLU's is 1.0998): an error δ in an activation's input moves its output
/// by at most `ACTIVATION_SLOPE · δ`.
pub const ACTIVATION_SLOPE: f64 = 1.13;

/// `activation(x)` of a fused op whose input `x` was itself computed within `dx`.
pub fn activation_of_inexact(x: f64, y: f64, dx: f64) -> f64 {
    activation(x, y) + ACTIVATION_SLOPE * dx + ACTIVATION_FACTOR * dx
}

// ---- norms -----------------------------------------------------------------------------------

/// Roundings outside the sum of squares of an RMS norm: the division by the group size, `+ eps`,
/// the square root and its reciprocal, and the two products `x · s · w`: 6.
pub const RMS_NORM_OPS: usize = 6;

/// RMS norm of a group of `group` elements, relative to the result: the sum of `group` squares
/// (positive terms: γ_group relative), halved by the square root, plus [`RMS_NORM_OPS`].
pub fn rms_norm(group: usize) -> f64 {
    gamma(group) / 2.0 + gamma(RMS_NORM_OPS)
}

/// Roundings of a layer norm outside its two sums: the two divisions by the row length, `+ eps`,
/// the square root and its reciprocal, `x − mean`, `· inv`, `· w`, `+ b`: 9.
pub const LAYER_NORM_OPS: usize = 9;

/// Layer norm of one element of a row of `cols`: `y = (x − μ)·inv·w + b`. The mean carries
/// γ_cols of `mean|x|`, which reaches `y` through `inv·|w|`; the variance (a sum of squares:
/// γ_cols relative, halved by the root) and the remaining [`LAYER_NORM_OPS`] are relative to
/// `|(x − μ)·inv·w|`; the bias is added once.
pub fn layer_norm(cols: usize, mean_abs_x: f64, inv: f64, w: f64, centered: f64, b: f64) -> f64 {
    gamma(cols) * mean_abs_x * inv * w.abs()
        + (gamma(cols) / 2.0 + gamma(LAYER_NORM_OPS)) * (centered * inv * w).abs()
        + U * b.abs()
}

// ---- rope ------------------------------------------------------------------------------------

/// Ulps of the angle `θ = pos · freq_scale · base^(−2i/d) / factor` a backend may be off by when
/// it computes `θ` in f32 (as llama.cpp does): the power (≤ 2 ulps) and three products.
pub const ROPE_ANGLE_ULPS: f64 = 5.0;

/// One rotated element `mscale·(x0·cos θ ∓ x1·sin θ)`: the angle's error moves cos and sin by at
/// most `ROPE_ANGLE_ULPS·u·|θ|`; cos and sin are rounded (u each) and scaled by `mscale` (u);
/// then two products and a sum (γ_3 of `|x0·cos| + |x1·sin|`).
pub fn rope(theta: f64, mscale: f64, x0: f64, x1: f64) -> f64 {
    let trig = ROPE_ANGLE_ULPS * U * theta.abs() + 2.0 * U;
    mscale.abs() * (x0.abs() + x1.abs()) * (trig + gamma(3))
}

// ---- products --------------------------------------------------------------------------------

/// A float product `y = Σ_k x·w + b` of `k` terms: the `k` products and `k` additions in any
/// order (blocked, split, fused multiply-add or not) are within γ_{k+2} of `Σ|x·w| + |b|`.
pub fn float_product(k: usize) -> f64 {
    gamma(k + 2)
}

/// A quantized product against activations as the backend saw them (the reference multiplies
/// the same dequantized values in f64): exact integer sums inside a block, then per (sub-)block
/// a few scale products (`d_w·d_a`, the sub-block scale, the minimum's term; the reference's
/// dequantized values carry up to 2 roundings of their own, which a kernel's exact integer sums
/// do not: ≤ 8 in all) and one f32 addition per sub-block of 16 (the smallest scale group) into
/// the sum: γ_{k/16 + 8} of the magnitudes of the terms (see
/// [`crate::reference::quant_magnitude`]: a type with a minimum multiplies `d·q` and `m` apart,
/// and each can be larger than their difference).
pub fn quantized_product(k: usize) -> f64 {
    gamma(k / 16 + 8)
}

/// A quantized product against f32 activations (a backend that does not quantize them):
/// dequantized weight times f32 activation, `k` products and additions plus the scale products.
pub fn quantized_product_f32_activations(k: usize) -> f64 {
    gamma(k + 8)
}

/// A product of F32 weights on operands split into two BF16 parts each (`v = hi + lo + e`,
/// `|v − hi| ≤ 2⁻⁸·|v|`, `|e| ≤ 2⁻¹⁷·|v|`), three of the four part products exact and summed in
/// f32: the dropped `lo·lo` (≤ 2⁻¹⁶·(1 + 2⁻⁹)²) and the two parts' errors (2⁻¹⁷ each, to first
/// order) leave each term within 2⁻¹⁵·(1 + 2⁻⁸) of its magnitude, and the `3k` products and the
/// bias are added in f32 (γ_{3k+2}).
pub fn split_product(k: usize) -> f64 {
    f64::powi(2.0, -15) * (1.0 + f64::powi(2.0, -8)) + gamma(3 * k + 2)
}

/// A product on f16 operands (matrix units) against the same operands rounded in the reference:
/// `k` exact products summed in f32 in the device's order, plus the scale products (γ_{k+8}),
/// and a dequantized weight that the kernel computed in f32 a rounding away from the reference's
/// may round to the neighbouring f16: one f16 ulp (2⁻¹⁰ relative) of each term at most.
pub fn half_product(k: usize) -> f64 {
    gamma(k + 8) + 1.0 / 1024.0
}

/// Q4_1 and Q5_1 weights meet Q8_1 activations through the block sum `s = d·Σq`, which ggml's
/// format stores in f16 (computed from the unrounded f32 `d`): the term `m_w · s` differs from
/// the dequantized `m_w · d16 · Σq` by the rounding of `d` to f16 (2⁻¹¹ relative) and of `s`
/// (2⁻¹¹): `Q8_1_SUM · |m_w · s|` per block, with twice that for margin.
pub const Q8_1_SUM: f64 = 2.0 * (1.0 / 2048.0 + 1.0 / 2048.0);

/// A GPTQ product on f32 activations: per group, `group` products summed, scaled once, and the
/// groups added: γ_{k + groups + 2} of `Σ|w·x|`, with `w = s·(q − z)` exact in f32.
pub fn gptq_product(k: usize, groups: usize) -> f64 {
    gamma(k + groups + 2)
}

/// Embedding rows of a quantized type: each value is one or two rounded f32 operations (`d·q`,
/// `d·q + m`, `d·sc·q − dmin·m`) on terms no larger than the row's largest value plus its
/// block minimum: 4 ulps of the largest magnitude in the block (float types are exact).
pub fn dequantized(block_max: f64) -> f64 {
    4.0 * U * block_max
}

// ---- attention -------------------------------------------------------------------------------

/// Roundings of an attention output outside the score products and the weighted sum: the
/// exponential (a polynomial: ≤ 4 ulps), the soft-cap's `tanh` and its two products (≤ 6), the
/// online softmax's rescalings (≤ 4 per output), the final division: 16.
pub const ATTENTION_OPS: usize = 16;

/// One output element of attention `o = Σ_j p_j v_j / Σ_j p_j`, given `score_err`, the largest
/// error of a visible score (see [`attention_score`]), and `weighted`, `Σ_j p_j |v_j|` with the
/// exact weights. A score error δ, and as much on the running maximum subtracted from it,
/// scales each weight `e^{s − max}` by a factor within `e^{±2δ}`; numerator and denominator
/// both move, so the output moves by at most `2·(e^{2δ} − 1)·Σ p|v|` (≈ 4δ). The
/// [`ATTENTION_OPS`] roundings and the `n_kv`-term weighted sum add γ_{n_kv + 16} of it.
pub fn attention(n_kv: usize, score_err: f64, weighted: f64) -> f64 {
    (2.0 * ((2.0 * score_err).exp() - 1.0) + gamma(n_kv + ATTENTION_OPS)) * weighted
}

/// The error of one attention score `scale·q·k` (`hd` products and sums, the scale): γ_{hd+2}
/// of `scale·Σ|q_d·k_d|`; a soft cap `c·tanh(s/c)` passes it on (slope ≤ 1) and adds its own
/// evaluation, within [`ATTENTION_OPS`]'s share of `|c|`.
pub fn attention_score(hd: usize, magnitude: f64, softcap: Option<f64>) -> f64 {
    gamma(hd + 2) * magnitude + softcap.map_or(0.0, |c| 6.0 * U * c.abs())
}

/// Whether `ty` is one of the float types (products on f32 activations, exact embedding).
pub fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}
