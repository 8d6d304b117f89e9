//! The scale searches of ggml's k-quant reference quantizers, ported operation for operation.
//!
//! Each function picks a scale (and for the asymmetric formats a minimum) for one group of 16 or
//! 32 values and writes the group's codes. They are the helpers `quantize_row_q*_K_ref` call
//! without an importance matrix, and only in the variants those call:
//!
//! - [`make_qx_quants`]: symmetric, `rmse_type = 1` (weights `x²`), no `qw` (Q6_K);
//! - [`make_q3_quants`]: symmetric with `do_rmse` (Q3_K);
//! - [`make_qkx2_quants`]: scale and minimum over weighted codes (Q2_K, Q4_K, Q5_K).
//!
//! Invariant: every float operation is the C's, in the C's order and association (`a*b*c` is
//! `(a*b)*c`; an `int` operand is converted to `float` first), without fused multiply-adds,
//! so the result is bit-identical to ggml built with `-ffp-contract=off`. Integer codes go
//! through [`nearest_int`]. Slices are the caller's fixed-size groups (`x`, `weights` and the code
//! buffers have the same length); all loops zip them, so nothing can index out of bounds.

use crate::cfloat::nearest_int;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The first element of largest magnitude, with its sign (`max`), and that magnitude (`amax`).
fn signed_abs_max(x: &[f32]) -> (f32, f32) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`: codes `L` in `0..2*nmax`, the
/// returned scale `s` makes `s * (L - nmax)` approximate `x`. Tries 18 scales around `nmax / max`
/// and keeps the best by the `x²`-weighted least-squares criterion.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], codes: &mut [i8]) -> f32 {
    let (max, amax) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let weighted_sums = |iscale: f32| {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for &v in x {
            let l = clamp(nearest_int(iscale * v)) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let write_codes = |iscale: f32, codes: &mut [i8]| {
        for (code, &v) in codes.iter_mut().zip(x) {
            *code = (nmax + clamp(nearest_int(iscale * v))) as i8;
        }
    };

    let iscale = -(nmax as f32) / max;
    write_codes(iscale, codes);
    let (sumlx, suml2) = weighted_sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = weighted_sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write_codes(iscale, codes);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: codes `L` in `0..2*nmax` and a scale, refined
/// by up to 5 passes of single-code changes that improve the `x²`-weighted fit.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], codes: &mut [i8]) -> f32 {
    let (max, amax) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (code, &v) in codes.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *code = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (code, &v) in codes.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*code);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*code) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *code = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for code in codes.iter_mut() {
        *code += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search parameters of one `make_qkx2_quants` call site.
pub(crate) struct Qkx2 {
    /// Largest code.
    pub nmax: i32,
    /// The candidate inverse scales are `(rmin + rdelta * is + nmax) / (max - min)`,
    /// `is` in `0..=nstep`.
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Weighted absolute error (Q2_K) rather than weighted squared error.
    pub use_mad: bool,
}

/// `make_qkx2_quants`: codes `L` in `0..=nmax`, a scale `s` (returned) and a minimum `m` (the
/// second value, stored negated as ggml's `the_min`) so that `s * L - m` approximates `x`.
/// `aux` is scratch space as long as `x`.
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    codes: &mut [u8],
    aux: &mut [u8],
) -> (f32, f32) {
    let (Some(&x0), Some(&w0)) = (x.first(), weights.first()) else {
        return (0.0, 0.0);
    };
    let mut min = x0;
    let mut max = x0;
    let mut sum_w = w0;
    let mut sum_x = sum_w * x0;
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        codes.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax;
    let error = |scale: f32, min: f32, codes: &[u8]| {
        let mut total = 0.0f32;
        for ((&l, &v), &w) in codes.iter().zip(x).zip(weights) {
            let diff = scale * f32::from(l) + min - v;
            let diff = if p.use_mad { diff.abs() } else { diff * diff };
            total += w * diff;
        }
        total
    };

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    for (code, &v) in codes.iter_mut().zip(x) {
        *code = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    }
    let mut best_error = error(scale, min, codes);
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for ((code, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            let l = nearest_int(iscale * (v - min)).clamp(0, nmax);
            *code = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = error(this_scale, this_min, aux);
            if cur_error < best_error {
                codes.copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}
