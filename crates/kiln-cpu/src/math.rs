//! Branch-free f32 `exp` and `erf` that the compiler vectorizes, and the slice loops built on
//! them (softmax rows, exact GELU).
//!
//! `std`'s `f32::exp` is a libm call per element, which no loop around it can vectorize; softmax
//! over encoder attention scores and GELU over FFN activations call it millions of times per
//! batch. These versions are straight-line polynomial code, so a loop over a slice compiles to
//! 8-lane AVX2 when built with the feature enabled (`avx2_dispatch_impl!` defines each slice
//! function with an AVX2+FMA build picked at run time). Results are identical in both builds:
//! LLVM does not fuse `a * b + c` into an FMA without fast-math, so every build performs the
//! same roundings; where `exp` wants fused
//! multiply-adds it asks for them with `f32::mul_add`, exactly rounded everywhere (one
//! instruction with FMA, a libm call on the rare x86 CPUs without it).
//!
//! Accuracy (tested against f64): `exp` within 2 ulp on [-87, 88.37] (0 below, as the softmax
//! needs), `erf` within 5e-7 absolute.

use kiln_backend::Activation;

/// f32 dot product with eight independent accumulators (vectorizes; fixed summation order).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ta.iter().zip(tb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `Σ x²` in f64 over eight lanes (element `i` into lane `i % 8`), the lanes summed in a fixed
/// tree. Each square is exact in f64 (24-bit mantissas), so every build performs the same
/// roundings and gets the same bits; unlike one running sum, the loop vectorizes (an RMS norm
/// over a row of 640 took 1.2 ns an element with the running sum's chain of dependent adds).
#[inline(always)]
pub(crate) fn sum_squares_f64(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for v in chunks {
        for l in 0..8 {
            let y = v[l] as f64;
            acc[l] += y * y;
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        let y = v as f64;
        *a += y * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// One row of an RMS norm: `out = x / sqrt(mean(x²) + eps) · w` over each group of `w.len()`
/// elements (the mean from [`sum_squares_f64`]), plus `residual` when given.
#[inline(always)]
pub(crate) fn rms_norm_row(
    x: &[f32],
    w: &[f32],
    eps: f32,
    residual: Option<&[f32]>,
    out: &mut [f32],
) {
    let group = w.len();
    for (og, xg) in out.chunks_mut(group).zip(x.chunks(group)) {
        let mean = (sum_squares_f64(xg) / group as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in og.iter_mut().zip(xg).zip(w) {
            *o = (v * scale) * g;
        }
    }
    if let Some(res) = residual {
        for (o, &r) in out.iter_mut().zip(res) {
            *o += r;
        }
    }
}

/// Rotary embedding of one row of heads in place: pairs `(a, b)` of each head's first
/// `2 · sin.len()` values, `(i, i + half)` when `neox`, else `(2i, 2i + 1)`, turned by the
/// angles whose `sin` and `cos` are given.
#[inline(always)]
pub(crate) fn rope_row(row: &mut [f32], head_dim: usize, neox: bool, sin: &[f32], cos: &[f32]) {
    let half = sin.len();
    for head in row.chunks_mut(head_dim) {
        if neox {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for (((a, b), &s), &c) in lo.iter_mut().zip(hi.iter_mut()).zip(sin).zip(cos) {
                let (x0, x1) = (*a, *b);
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        } else {
            for ((pair, &s), &c) in head[..2 * half].chunks_exact_mut(2).zip(sin).zip(cos) {
                let (x0, x1) = (pair[0], pair[1]);
                pair[0] = x0 * c - x1 * s;
                pair[1] = x0 * s + x1 * c;
            }
        }
    }
}

/// `e^x` for `x` in f32's range; 0 for `x < -87.3` (including `-inf`), `+inf` above 88.37.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    if x > EXP_HI {
        f32::INFINITY
    } else {
        exp_nonpositive(x)
    }
}

/// Largest input whose rounded exponent n stays ≤ 127, so 2^n is one normal float.
const EXP_HI: f32 = 88.376_26;

/// [`exp`] for `x ≤ 88.37` (softmax calls it on `x - max ≤ 0`): the same bits there (NaN
/// stays NaN), without the overflow branch; larger `x` gives an unspecified value.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n·ln2 is exact for the |n| ≤ 127 we meet.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const LO: f32 = -87.336_55;
    // Adding 1.5·2²³ rounds to the nearest integer (ties to even) and leaves it in the low
    // mantissa bits, so n and 2^n come out of float adds and integer bit operations, which
    // vectorize; `round_ties_even` + `as i32` (a saturating conversion) do not.
    const SHIFT: f32 = 12_582_912.0;
    // Only the lower clamp: callers keep x ≤ EXP_HI. Written so that it is one `max`
    // instruction that lets a NaN through (`clamp` is two compares and two blends).
    let xc = if x < LO { LO } else { x };
    let t = xc.mul_add(LOG2E, SHIFT);
    let n = t - SHIFT;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    // exp(r) on |r| ≤ ln2/2: degree-6 minimax polynomial (Cephes expf), Horner with fused
    // multiply-adds (half the latency of separate ones; softmax rows are latency-bound).
    let p = 1.987_569_1e-4f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n through the exponent bits: n ∈ [-126, 127] after the clamp, and t's bits are
    // SHIFT's plus n.
    let biased = t.to_bits().wrapping_sub(SHIFT.to_bits()).wrapping_add(127);
    let v = y * f32::from_bits(biased << 23);
    if x < LO {
        0.0
    } else {
        v
    }
}

/// `erf(x)`: a rational minimax fit on [-4, 4] (±1 beyond, where f32 cannot tell the
/// difference).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = -2.726_142_3e-10f32;
    let p = p * x2 + 2.770_681_4e-8;
    let p = p * x2 - 2.101_024e-6;
    let p = p * x2 - 5.692_506_3e-5;
    let p = p * x2 - 7.349_906_3e-4;
    let p = p * x2 - 2.954_6e-3;
    let p = p * x2 - 1.609_603_3e-2;
    let q = -1.456_607_2e-5f32;
    let q = q * x2 - 2.133_740_5e-4;
    let q = q * x2 - 1.682_827e-3;
    let q = q * x2 - 7.373_329_2e-3;
    let q = q * x2 - 1.426_474e-2;
    x * p / q
}

/// `tanh(x)` (attention's soft-cap): an odd polynomial below |x| = 0.625 (Cephes tanhf), `1 −
/// 2 / (e^{2|x|} + 1)` with the sign of `x` above, where that form loses no relative accuracy;
/// branch-free (both are computed, one is kept) so that a loop over a slice vectorizes. Within
/// 3e-7 relative of the exact value (tested against f64).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let z = x * x;
    let p = (-5.704_988_7e-3f32).mul_add(z, 2.063_909e-2);
    let p = p.mul_add(z, -5.373_971_6e-2);
    let p = p.mul_add(z, 1.333_144_2e-1);
    let p = p.mul_add(z, -3.333_328e-1);
    let small = (p * z).mul_add(x, x);
    // e^{2|x|} overflows to +inf for |x| > 44, which gives exactly 1.
    let large = 1.0 - 2.0 / (exp(2.0 * x.abs()) + 1.0);
    if x.abs() < 0.625 {
        small
    } else {
        large.copysign(x)
    }
}

/// Exact (erf) GELU: `0.5·x·(1 + erf(x/√2))`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Defines `$name(avx2, args...)` that runs the `#[inline(always)]` function `$body` in a build
/// with AVX2+FMA enabled when `avx2` is true (the caller checked the CPU), so that its loops are
/// vectorized 8 wide, and as plain code otherwise.
macro_rules! avx2_dispatch_impl {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) => $body:path) => {
        $(#[$m])*
        $vis fn $name(avx2: bool, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn fast($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if avx2 {
                    // SAFETY: callers pass `avx2` only when the CPU reports AVX2 and FMA.
                    return unsafe { fast($($arg),*) };
                }
            }
            let _ = avx2;
            $body($($arg),*)
        }
    };
}

pub(crate) use avx2_dispatch_impl as avx2_dispatch;

avx2_dispatch!(
    /// [`gelu_slice`], vectorized when `avx2`.
    pub(crate) fn gelu_into(x: &[f32], out: &mut [f32]) => gelu_slice
);
avx2_dispatch!(
    /// [`softmax_in_place`], vectorized when `avx2` (attention calls it from its own AVX2 build).
    #[cfg(test)]
    pub(crate) fn softmax(row: &mut [f32]) => softmax_in_place
);

avx2_dispatch!(
    /// [`rms_norm_row`], vectorized when `avx2`.
    pub(crate) fn rms_norm_into(
        x: &[f32],
        w: &[f32],
        eps: f32,
        residual: Option<&[f32]>,
        out: &mut [f32]
    ) => rms_norm_row
);
avx2_dispatch!(
    /// [`rope_row`], vectorized when `avx2`.
    pub(crate) fn rope_into(
        row: &mut [f32],
        head_dim: usize,
        neox: bool,
        sin: &[f32],
        cos: &[f32]
    ) => rope_row
);

avx2_dispatch!(
    /// [`gated_slice`], vectorized when `avx2`.
    pub(crate) fn gated_into(act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) => gated_slice
);

/// `out[i] = act(g[i]) · u[i]`, in one pass over the three rows (a gated FFN's middle).
///
/// The tanh GELU and SiLU are written as `x · σ(z)` (`0.5·x·(1 + tanh(z/2)) = x / (1 + e^-z)`),
/// through [`exp`], so that the loop vectorizes and no libm call is made per element.
#[inline(always)]
pub(crate) fn gated_slice(act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) {
    match act {
        Activation::GeluTanh => {
            // z = 2·√(2/π)·(x + 0.044715·x³)
            const C1: f32 = 2.0 * 0.797_884_6;
            const C3: f32 = 2.0 * 0.797_884_6 * 0.044715;
            for ((o, &x), &v) in out.iter_mut().zip(g).zip(u) {
                let z = x * x.mul_add(x * C3, C1);
                *o = x / (1.0 + exp(-z)) * v;
            }
        }
        Activation::Silu => {
            for ((o, &x), &v) in out.iter_mut().zip(g).zip(u) {
                *o = x / (1.0 + exp(-x)) * v;
            }
        }
        Activation::Gelu => {
            for ((o, &x), &v) in out.iter_mut().zip(g).zip(u) {
                *o = gelu(x) * v;
            }
        }
    }
}

/// `out[i] = gelu(x[i])`.
#[inline(always)]
pub(crate) fn gelu_slice(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu(v);
    }
}

/// In-place softmax of `row` (which must be non-empty): `e^(v - max) / Σ`, the reference for the
/// tests. (Attention runs its softmax inside its own loops and divides by the sum after the
/// product with `V`.)
#[cfg(test)]
#[inline(always)]
pub(crate) fn softmax_in_place(row: &mut [f32]) {
    let inv = 1.0 / exp_shifted_in_place(row);
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// The unnormalized softmax: `row[i] = e^(row[i] - max)` (`row` non-empty), returning the sum
/// `Σ row[i]` (at least 1), in a fixed order of eight partial sums.
#[cfg(test)]
#[inline(always)]
pub(crate) fn exp_shifted_in_place(row: &mut [f32]) -> f32 {
    // Eight running maxima and sums over whole chunks of 8 (the tail goes to lane i of its
    // chunk), so that both loops are one vector operation per chunk.
    let (chunks, tail) = row.split_at_mut(row.len() / 8 * 8);
    let mut maxes = [f32::NEG_INFINITY; 8];
    for chunk in chunks.chunks_exact(8) {
        for (m, &v) in maxes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    for (m, &v) in maxes.iter_mut().zip(tail.iter()) {
        *m = if v > *m { v } else { *m };
    }
    let max = maxes.into_iter().fold(f32::NEG_INFINITY, f32::max);
    // The exponentials have no dependency between elements: a loop of their own keeps several
    // vectors in flight. The sum follows from L1.
    for v in chunks.iter_mut() {
        *v = exp(*v - max);
    }
    for v in tail.iter_mut() {
        *v = exp(*v - max);
    }
    let mut sums = [0.0f32; 8];
    for chunk in chunks.chunks_exact(8) {
        for (s, &v) in sums.iter_mut().zip(chunk) {
            *s += v;
        }
    }
    for (s, &v) in sums.iter_mut().zip(tail.iter()) {
        *s += v;
    }
    ((sums[0] + sums[4]) + (sums[1] + sums[5])) + ((sums[2] + sums[6]) + (sums[3] + sums[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.37 {
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps(exp(x), want));
            x += 0.000_731;
        }
        assert!(worst <= 2, "worst {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan() && exp_nonpositive(f32::NAN).is_nan());
        // The softmax's version is the same function below the overflow branch.
        let mut x = -90.0f32;
        while x <= 1.0 {
            assert_eq!(exp_nonpositive(x).to_bits(), exp(x).to_bits(), "{x}");
            x += 0.000_37;
        }
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    /// erf in f64 by its Taylor series (|x| ≤ 3) and asymptotic continued fraction beyond.
    fn erf64(x: f64) -> f64 {
        if x.abs() > 3.0 {
            let z = x.abs();
            // erfc(z) = e^{-z²}/(z√π) · 1/(1 + 1/(2z²)/(1 + 2/(2z²)/(1 + ...)))
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (z + f);
            }
            let erfc = (-z * z).exp() / std::f64::consts::PI.sqrt() / (z + f);
            return (1.0 - erfc).copysign(x);
        }
        let mut term = x;
        let mut sum = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn erf_is_within_5e7() {
        let mut worst = 0.0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            worst = worst.max((erf(x) as f64 - erf64(x as f64)).abs());
            x += 0.000_37;
        }
        assert!(worst < 5e-7, "worst {worst:e}");
    }

    #[test]
    fn gated_activations_match_the_scalar_definitions() {
        let avx2 = crate::kernels::simd_level().has_avx2();
        let g: Vec<f32> = (-4000..4000)
            .map(|i| i as f32 * 0.0037)
            .chain([-90.0, -20.0, 20.0, 90.0])
            .collect();
        let u: Vec<f32> = g
            .iter()
            .enumerate()
            .map(|(i, _)| 1.0 + (i % 7) as f32 * 0.25)
            .collect();
        for act in [Activation::GeluTanh, Activation::Silu, Activation::Gelu] {
            for fast in [false, avx2] {
                let mut out = vec![0.0f32; g.len()];
                gated_into(fast, act, &g, &u, &mut out);
                for ((&o, &x), &v) in out.iter().zip(&g).zip(&u) {
                    // The exact GELU is `gelu` (tested against the definition on its own).
                    let want = match act {
                        Activation::Gelu => gelu(x) * v,
                        _ => act.apply(x) * v,
                    };
                    // The references round tanh to ±1 in the tails, where the σ form keeps tiny values.
                    let tol = 2e-6 * want.abs() + 2e-6;
                    assert!((o - want).abs() <= tol, "{act:?}({x}) * {v}: {o} vs {want}");
                }
            }
        }
    }

    #[test]
    fn tanh_is_within_3e7_relative() {
        let mut worst = 0.0f64;
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = (x as f64).tanh();
            worst = worst.max((tanh(x) as f64 - want).abs() / want.abs().max(1e-30));
            x += 0.000_53;
        }
        assert!(worst < 3e-7, "worst {worst:e}");
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-1e30), -1.0);
    }

    #[test]
    fn gelu_matches_the_scalar_definition() {
        for i in -2000..2000 {
            let x = i as f32 * 0.004;
            let want = 0.5 * x as f64 * (1.0 + erf64(x as f64 / 2f64.sqrt()));
            // erf's absolute error, scaled by the 0.5·x in front of it.
            let tol = 0.5 * x.abs() as f64 * 5e-7 + 1e-7;
            assert!((gelu(x) as f64 - want).abs() < tol, "{x}");
        }
    }

    #[test]
    fn avx2_build_gives_identical_bits() {
        let avx2 = crate::kernels::simd_level().has_avx2();
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let (mut a, mut b) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        gelu_slice(&x, &mut a);
        gelu_into(avx2, &x, &mut b);
        assert_eq!(a, b);
        let (mut s1, mut s2) = (x.clone(), x.clone());
        softmax_in_place(&mut s1);
        softmax(avx2, &mut s2);
        assert_eq!(s1, s2);
        assert!((s1.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }

    #[test]
    fn rms_norm_rows_match_f64_with_the_same_bits_in_both_builds() {
        let avx2 = crate::kernels::simd_level().has_avx2();
        // Lengths with and without a tail of fewer than eight; groups of a whole row and of
        // heads.
        for (len, group) in [(640, 640), (1003, 1003), (1024, 256), (21, 7)] {
            let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.61).cos() * 3.0).collect();
            let w: Vec<f32> = (0..group).map(|i| 1.0 + (i as f32 * 0.13).sin()).collect();
            let res: Vec<f32> = (0..len).map(|i| i as f32 * 1e-3).collect();
            let squares: f64 = x[..group].iter().map(|&v| (v as f64) * (v as f64)).sum();
            let got = sum_squares_f64(&x[..group]);
            assert!(
                (got - squares).abs() <= 1e-12 * squares,
                "{got} vs {squares}"
            );
            for residual in [None, Some(&res[..])] {
                let (mut plain, mut fast) = (vec![0.0; len], vec![0.0; len]);
                rms_norm_row(&x, &w, 1e-6, residual, &mut plain);
                rms_norm_into(avx2, &x, &w, 1e-6, residual, &mut fast);
                assert_eq!(plain, fast, "len {len} group {group}");
                for (i, (&y, &v)) in plain.iter().zip(&x).enumerate() {
                    let g = &x[i / group * group..][..group];
                    let ms = g.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / group as f64;
                    let want = v as f64 / (ms + 1e-6).sqrt() * w[i % group] as f64
                        + residual.map_or(0.0, |r| r[i] as f64);
                    assert!((y as f64 - want).abs() < 1e-5, "{i}: {y} vs {want}");
                }
            }
        }
    }

    #[test]
    fn rope_rows_rotate_the_right_pairs_with_the_same_bits_in_both_builds() {
        let avx2 = crate::kernels::simd_level().has_avx2();
        // Two heads of 20 with 16 rotated values each (a partial rotary dimension), 8 angles.
        let (head_dim, half) = (20, 8);
        let row: Vec<f32> = (0..2 * head_dim).map(|i| i as f32 * 0.5 - 7.0).collect();
        let angles: Vec<f64> = (0..half).map(|i| 0.3 + i as f64 * 0.7).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
        for neox in [true, false] {
            let (mut plain, mut fast) = (row.clone(), row.clone());
            rope_row(&mut plain, head_dim, neox, &sin, &cos);
            rope_into(avx2, &mut fast, head_dim, neox, &sin, &cos);
            assert_eq!(plain, fast, "neox {neox}");
            for h in 0..2 {
                let base = h * head_dim;
                for (i, angle) in angles.iter().enumerate() {
                    let (a, b) = if neox {
                        (i, i + half)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (row[base + a] as f64, row[base + b] as f64);
                    let (s, c) = (angle.sin(), angle.cos());
                    assert!((plain[base + a] as f64 - (x0 * c - x1 * s)).abs() < 1e-5);
                    assert!((plain[base + b] as f64 - (x0 * s + x1 * c)).abs() < 1e-5);
                }
                // Past the rotary dimension: unchanged.
                assert_eq!(
                    plain[base + 2 * half..base + head_dim],
                    row[base + 2 * half..base + head_dim]
                );
            }
        }
    }
}
