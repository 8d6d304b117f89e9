//! RMS norm (whole rows and per-head groups), layer norm, and their fused residual forms.

use kiln_backend::Backend;

use crate::check;
use crate::data::{host, scaled, tensor, values, vector};
use crate::reference::{self, Expected};
use crate::Target;

/// `(rows, cols, group)`: whole rows, per-head groups of 16 and 32, a row of 3, 70 rows, and a
/// tensor above the CPU's parallel threshold.
const RMS_SHAPES: [(usize, usize, usize); 7] = [
    (5, 64, 64),
    (5, 64, 16),
    (1, 3, 3),
    (70, 96, 96),
    (70, 96, 32),
    (17, 2048, 2048),
    (17, 2048, 128),
];

/// `rms_norm` against its definition.
pub fn rms_norm<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols, group) in RMS_SHAPES {
        let x = scaled(rows * cols, 1 + cols as u64, 3.0);
        let w = values(group, 2);
        let xt = tensor(&b, &x, rows, cols);
        for eps in [1e-6f32, 1e-2] {
            let y = host(&b, &b.rms_norm(&xt, &vector(&b, "w", &w), eps).unwrap());
            check::close(
                &format!(
                    "{}: rms_norm [{rows}, {cols}] in groups of {group}, eps {eps}",
                    b.name()
                ),
                &y,
                &reference::rms_norm(&x, &w, eps),
                cols,
            );
        }
    }
}

/// `add_rms_norm` (`residual + rms_norm(x)`) against its definition and against the unfused
/// `add(residual, rms_norm(x))`.
pub fn add_rms_norm<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols, group) in RMS_SHAPES {
        let x = scaled(rows * cols, 1 + cols as u64, 3.0);
        let r = values(rows * cols, 3);
        let w = values(group, 2);
        let (xt, rt, wt) = (
            tensor(&b, &x, rows, cols),
            tensor(&b, &r, rows, cols),
            vector(&b, "w", &w),
        );
        let what = format!(
            "{}: add_rms_norm [{rows}, {cols}] in groups of {group}",
            b.name()
        );
        let fused = host(&b, &b.add_rms_norm(&rt, &xt, &wt, 1e-6).unwrap());
        let want = reference::add_rms_norm(&r, &x, &w, 1e-6);
        check::close(&what, &fused, &want, cols);
        let unfused = host(
            &b,
            &b.add(&rt, &b.rms_norm(&xt, &wt, 1e-6).unwrap()).unwrap(),
        );
        check::close(
            &format!("{what} vs unfused"),
            &fused,
            &doubled(&unfused, &want),
            cols,
        );
    }
}

/// `got` as the expected value, with twice `want`'s bounds: two results each within the bound
/// of the exact value are within twice of each other.
fn doubled(got: &[f32], want: &Expected) -> Expected {
    Expected {
        value: got.iter().map(|&v| v as f64).collect(),
        tol: want.tol.iter().map(|t| 2.0 * t).collect(),
    }
}

/// `(rows, cols)` of the layer-norm cases (BERT's 384 and 768, a row of 5, 70 rows, one above
/// the parallel threshold).
const LN_SHAPES: [(usize, usize); 5] = [(37, 96), (1, 5), (70, 384), (3, 768), (20, 2048)];

/// `layer_norm` with and without a bias against its definition (biased variance).
pub fn layer_norm<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols) in LN_SHAPES {
        // An offset mean, as real activations have, so that centring matters.
        let x: Vec<f32> = scaled(rows * cols, 1, 3.0)
            .iter()
            .map(|v| v + 0.5)
            .collect();
        let (g, bias) = (values(cols, 2), values(cols, 3));
        let xt = tensor(&b, &x, rows, cols);
        let (gw, bw) = (vector(&b, "w", &g), vector(&b, "b", &bias));
        for with_bias in [false, true] {
            for eps in [1e-5f32, 1e-12] {
                let bias_w = with_bias.then_some(&bw);
                let y = host(&b, &b.layer_norm(&xt, &gw, bias_w, eps).unwrap());
                let want = reference::layer_norm(&x, cols, &g, with_bias.then_some(&bias[..]), eps);
                check::close(
                    &format!(
                        "{}: layer_norm [{rows}, {cols}], bias {with_bias}, eps {eps}",
                        b.name()
                    ),
                    &y,
                    &want,
                    cols,
                );
            }
        }
    }
}

/// `add_layer_norm` (`layer_norm(residual + x)`) against its definition and against the unfused
/// `layer_norm(add(residual, x))`.
pub fn add_layer_norm<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols) in LN_SHAPES {
        let x: Vec<f32> = scaled(rows * cols, 1, 3.0)
            .iter()
            .map(|v| v + 0.5)
            .collect();
        let r = values(rows * cols, 9);
        let (g, bias) = (values(cols, 2), values(cols, 3));
        let (xt, rt) = (tensor(&b, &x, rows, cols), tensor(&b, &r, rows, cols));
        let (gw, bw) = (vector(&b, "w", &g), vector(&b, "b", &bias));
        for with_bias in [false, true] {
            let bias_w = with_bias.then_some(&bw);
            let what = format!(
                "{}: add_layer_norm [{rows}, {cols}], bias {with_bias}",
                b.name()
            );
            let fused = host(&b, &b.add_layer_norm(&rt, &xt, &gw, bias_w, 1e-12).unwrap());
            let want =
                reference::add_layer_norm(&r, &x, cols, &g, with_bias.then_some(&bias[..]), 1e-12);
            check::close(&what, &fused, &want, cols);
            let sum = b.add(&rt, &xt).unwrap();
            let unfused = host(&b, &b.layer_norm(&sum, &gw, bias_w, 1e-12).unwrap());
            check::close(
                &format!("{what} vs unfused"),
                &fused,
                &doubled(&unfused, &want),
                cols,
            );
        }
    }
}
