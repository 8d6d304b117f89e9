//! The packed GEMM of float weights (F32, F16, BF16) behind `Backend::matmul` keeps two promises
//! beyond the trait: bit-identical results for any thread count, and the AVX2 kernel within 1e-5
//! of the scalar one. (Its results against an f64 product at every edge of its blocking, on every
//! configuration, are the conformance suite's `matmul_f32`/`f16`/`bf16` cases.)

use std::sync::Arc;

use kiln_backend::{Backend, Linear};
use kiln_core::GgmlType;
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuOptions};

mod common;
use common::{encode, upload, values};

/// A linear layer `[n, k]` of type `ty` (and an f32 bias when given) on `b`.
fn linear(
    b: &CpuBackend,
    ty: GgmlType,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    k: usize,
) -> Linear<CpuBackend> {
    Linear {
        weight: Arc::new(upload(b, "w", ty, &[k, n], w.to_vec())),
        bias: bias.map(|v| upload(b, "b", GgmlType::F32, &[n], encode(GgmlType::F32, v).0)),
        in_features: k,
        out_features: n,
        ty,
    }
}

/// `y` against the f64 product. Bound: a sum of `k + 1` f32 terms (k products, the bias) is
/// within `γ_{k+2} · (Σ|x·w| + |bias|)` of the exact value, γ_j = j·u/(1 - j·u), u = 2⁻²⁴ (the
/// row-dot path for few rows and the blocked FMA path both satisfy it). A wrong element is off
/// by O(1).
fn check(
    y: &[f32],
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    (m, n, k): (usize, usize, usize),
    what: &str,
) {
    assert_eq!(y.len(), m * n);
    let u = f64::powi(2.0, -24);
    let gamma = (k + 2) as f64 * u / (1.0 - (k + 2) as f64 * u);
    for r in 0..m {
        for c in 0..n {
            let (mut sum, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                let t = x[r * k + p] as f64 * w[c * k + p] as f64;
                sum += t;
                mag += t.abs();
            }
            if let Some(b) = bias {
                sum += b[c] as f64;
                mag += (b[c] as f64).abs();
            }
            let got = y[r * n + c] as f64;
            assert!(
                (got - sum).abs() <= gamma * mag + f64::MIN_POSITIVE,
                "{what}: [{m}, {k}] x [{n}, {k}]ᵀ at ({r}, {c}): {got} vs {sum}"
            );
        }
    }
}

#[test]
fn results_are_bit_identical_for_one_two_and_three_threads() {
    let (m, n, k) = (517, 300, 700);
    let (bytes, w) = encode(GgmlType::F32, &values(n * k, 3));
    let (x, bias) = (values(m * k, 4), values(n, 5));
    let mut first: Option<Vec<f32>> = None;
    for threads in [1, 2, 3] {
        let b = CpuBackend::new(threads).unwrap();
        let lin = linear(&b, GgmlType::F32, &bytes, Some(&bias), n, k);
        let xt = b.tensor_from_f32(&x, m, k).unwrap();
        let y = b.to_f32(&b.matmul(&xt, &lin).unwrap()).unwrap();
        match &first {
            None => {
                check(&y, &x, &w, Some(&bias), (m, n, k), "1 thread");
                first = Some(y);
            }
            Some(f) => assert!(
                f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads differ from 1"
            ),
        }
    }
}

#[test]
fn avx2_is_within_1e5_of_scalar() {
    if !simd_level().has_avx2() {
        eprintln!("skipped: this CPU has no AVX2+FMA");
        return;
    }
    let scalar =
        CpuBackend::with_options(&CpuOptions::threads(1).simd_cap(SimdLevel::Scalar)).unwrap();
    let avx2 = CpuBackend::with_options(&CpuOptions::threads(2).simd_cap(SimdLevel::Avx2)).unwrap();
    for &(m, n, k) in &[
        (8, 16, 384),
        (100, 384, 384),
        (129, 200, 1536),
        (50, 1536, 384),
    ] {
        for ty in [GgmlType::F32, GgmlType::BF16] {
            let (bytes, w) = encode(ty, &values(n * k, (m + n) as u64));
            let (x, bias) = (values(m * k, 11), values(n, 12));
            let run = |b: &CpuBackend| {
                let lin = linear(b, ty, &bytes, Some(&bias), n, k);
                let xt = b.tensor_from_f32(&x, m, k).unwrap();
                b.to_f32(&b.matmul(&xt, &lin).unwrap()).unwrap()
            };
            let (s, v) = (run(&scalar), run(&avx2));
            // Relative to the scale of each sum, Σ|x·w| + |bias|: the two kernels differ only
            // in rounding (FMA vs multiply-then-add), about sqrt(k)·2⁻²⁴ of it.
            for r in 0..m {
                for c in 0..n {
                    let mag: f64 = (0..k)
                        .map(|p| (x[r * k + p] as f64 * w[c * k + p] as f64).abs())
                        .sum::<f64>()
                        + (bias[c] as f64).abs();
                    let d = (s[r * n + c] as f64 - v[r * n + c] as f64).abs();
                    assert!(
                        d <= 1e-5 * mag,
                        "{ty} [{m}, {k}] x [{n}, {k}]ᵀ at ({r}, {c}): {d} of {mag}"
                    );
                }
            }
        }
    }
}
