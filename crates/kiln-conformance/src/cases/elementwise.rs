//! Element-wise ops: `add`, `mul`, `scale` (exact), the activations, and the gated activation.

use kiln_backend::{Activation, Backend};

use super::tensors::SHAPES;
use crate::check;
use crate::data::{host, scaled, tensor, values};
use crate::reference::{self, Expected};
use crate::tolerance::{self, U};
use crate::Target;

/// Every activation the trait defines.
pub(crate) const ACTIVATIONS: [Activation; 3] =
    [Activation::GeluTanh, Activation::Gelu, Activation::Silu];

/// `add`, `mul` and `scale`: one IEEE operation per element, so the f32 result's bits.
pub fn add_mul_scale<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols) in SHAPES {
        let what = |op: &str| format!("{}: {op} [{rows}, {cols}]", b.name());
        let (x, y) = (
            scaled(rows * cols, 1, 4.0),
            values(rows * cols, 2 + rows as u64),
        );
        let (xt, yt) = (tensor(&b, &x, rows, cols), tensor(&b, &y, rows, cols));
        let sum: Vec<f32> = x.iter().zip(&y).map(|(a, c)| a + c).collect();
        check::bits(
            &what("add"),
            &host(&b, &b.add(&xt, &yt).unwrap()),
            &sum,
            cols,
        );
        let prod: Vec<f32> = x.iter().zip(&y).map(|(a, c)| a * c).collect();
        check::bits(
            &what("mul"),
            &host(&b, &b.mul(&xt, &yt).unwrap()),
            &prod,
            cols,
        );
        for s in [2.0f32, -0.37, 0.0, 1e-30] {
            let want: Vec<f32> = x.iter().map(|a| a * s).collect();
            check::bits(
                &what(&format!("scale by {s}")),
                &host(&b, &b.scale(&xt, s).unwrap()),
                &want,
                cols,
            );
        }
    }
}

/// Inputs of the activation cases: [-6, 6) (the range where the factors vary), rows of them,
/// and the far tails.
fn activation_inputs(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut x = scaled(rows * cols, seed, 6.0);
    let tails = [
        0.0f32, -0.0, 1e-3, -1e-3, 10.0, -10.0, 20.0, -20.0, 40.0, -40.0,
    ];
    let n = tails.len().min(x.len());
    x[..n].copy_from_slice(&tails[..n]);
    x
}

/// `activation` against its f64 definition.
pub fn activation<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for act in ACTIVATIONS {
        for (rows, cols) in SHAPES {
            let x = activation_inputs(rows, cols, 11);
            let got = host(&b, &b.activation(&tensor(&b, &x, rows, cols), act).unwrap());
            check::close(
                &format!("{}: activation {act:?} [{rows}, {cols}]", b.name()),
                &got,
                &reference::activations(act, &x),
                cols,
            );
        }
    }
}

/// `gated_activation` (`act(gate) · up`) against its definition, and against the unfused
/// `mul(activation(gate), up)` it defaults to (each within its bound of the exact value, so
/// within the sum of the bounds of each other).
pub fn gated_activation<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for act in ACTIVATIONS {
        for (rows, cols) in SHAPES {
            let g = activation_inputs(rows, cols, 12);
            let u = scaled(rows * cols, 13, 2.0);
            let (gt, ut) = (tensor(&b, &g, rows, cols), tensor(&b, &u, rows, cols));
            let fused = host(&b, &b.gated_activation(&gt, &ut, act).unwrap());
            let unfused = host(&b, &b.mul(&b.activation(&gt, act).unwrap(), &ut).unwrap());
            let mut want = Expected::with_capacity(g.len());
            for (&x, &v) in g.iter().zip(&u) {
                let a = reference::activation(act, x as f64);
                let y = a * v as f64;
                want.push(
                    y,
                    tolerance::activation(x as f64, a) * (v as f64).abs() + U * y.abs(),
                );
            }
            let what = format!("{}: gated_activation {act:?} [{rows}, {cols}]", b.name());
            check::close(&what, &fused, &want, cols);
            let against_unfused = Expected {
                value: unfused.iter().map(|&v| v as f64).collect(),
                tol: want.tol.iter().map(|t| 2.0 * t).collect(),
            };
            check::close(
                &format!("{what} vs unfused"),
                &fused,
                &against_unfused,
                cols,
            );
        }
    }
}
