//! The ops encoders add (layer norm, packed bidirectional attention, dense float matmul, exact
//! GELU) against f64 references written from their definitions.

use std::sync::Arc;

use kiln_backend::{Activation, Backend, Linear, PackedAttentionParams};
use kiln_core::GgmlType;
use kiln_cpu::CpuBackend;

mod common;
use common::{backends, values};

fn max_diff(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max)
}

#[test]
fn layer_norm_with_and_without_bias() {
    let (rows, cols) = (37, 96);
    let x: Vec<f32> = values(rows * cols, 1)
        .iter()
        .map(|v| v * 3.0 + 0.5)
        .collect();
    let (g, bias) = (values(cols, 2), values(cols, 3));
    for b in backends() {
        let xt = b.tensor_from_f32(&x, rows, cols).unwrap();
        let gw = common::weight(&b, "w", GgmlType::F32, &[cols], &g);
        let bw = common::weight(&b, "w", GgmlType::F32, &[cols], &bias);
        for with_bias in [false, true] {
            let y = b
                .layer_norm(&xt, &gw, with_bias.then_some(&bw), 1e-5)
                .unwrap();
            let mut want = Vec::new();
            for r in x.chunks(cols) {
                let mean = r.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
                let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
                for (i, &v) in r.iter().enumerate() {
                    let n = (v as f64 - mean) / (var + 1e-5).sqrt() * g[i] as f64;
                    want.push(n + if with_bias { bias[i] as f64 } else { 0.0 });
                }
            }
            assert!(
                max_diff(&b.to_f32(&y).unwrap(), &want) < 2e-6,
                "{}",
                b.name()
            );
        }
        // The fused residual form equals add then norm.
        let r = b
            .tensor_from_f32(&values(rows * cols, 9), rows, cols)
            .unwrap();
        let fused = b.add_layer_norm(&r, &xt, &gw, Some(&bw), 1e-12).unwrap();
        let sum = b.add(&r, &xt).unwrap();
        let plain = b.layer_norm(&sum, &gw, Some(&bw), 1e-12).unwrap();
        assert_eq!(b.to_f32(&fused).unwrap(), b.to_f32(&plain).unwrap());
    }
    let b = CpuBackend::new(1).unwrap();
    let xt = b.tensor_from_f32(&x, rows, cols).unwrap();
    let short = common::weight(&b, "w", GgmlType::F32, &[cols - 1], &g[1..]);
    assert!(b.layer_norm(&xt, &short, None, 1e-5).is_err());
    let gw = common::weight(&b, "w", GgmlType::F32, &[cols], &g);
    let fewer_rows = b.tensor_from_f32(&x[cols..], rows - 1, cols).unwrap();
    assert!(b.add_layer_norm(&fewer_rows, &xt, &gw, None, 1e-5).is_err());
}

/// Attention of one sequence (rows `start..start+len`) in f64, from the definition.
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    lens: &[usize],
    heads: usize,
    hd: usize,
    radius: Option<usize>,
) -> Vec<f64> {
    let cols = heads * hd;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0.0; q.len()];
    let mut start = 0;
    for &len in lens {
        for h in 0..heads {
            for i in 0..len {
                let visible: Vec<usize> = (0..len)
                    .filter(|&j| radius.is_none_or(|r| i.abs_diff(j) <= r))
                    .collect();
                let s: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        (0..hd)
                            .map(|d| {
                                q[(start + i) * cols + h * hd + d] as f64
                                    * k[(start + j) * cols + h * hd + d] as f64
                            })
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    out[(start + i) * cols + h * hd + d] = visible
                        .iter()
                        .zip(&e)
                        .map(|(&j, w)| w / z * v[(start + j) * cols + h * hd + d] as f64)
                        .sum();
                }
            }
        }
        start += len;
    }
    out
}

/// Packed attention over `lens` against the f64 reference, with and without a window, on
/// every backend configuration: within 2e-6, and the same bits on all of them.
fn packed_attention_case(lens: &[usize], heads: usize, hd: usize) {
    let cols = heads * hd;
    let total: usize = lens.iter().sum();
    let q: Vec<f32> = values(total * cols, 4).iter().map(|x| x * 2.0).collect();
    let (k, v) = (values(total * cols, 5), values(total * cols, 6));
    for radius in [None, Some(4), Some(40)] {
        let want = attention_ref(&q, &k, &v, lens, heads, hd, radius);
        let mut first: Option<Vec<f32>> = None;
        for b in backends() {
            let t = |x: &[f32]| b.tensor_from_f32(x, total, cols).unwrap();
            let p = PackedAttentionParams {
                n_heads: heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                radius,
            };
            let y = b
                .to_f32(
                    &b.packed_attention(&t(&q), &t(&k), &t(&v), lens, &p)
                        .unwrap(),
                )
                .unwrap();
            let err = max_diff(&y, &want);
            assert!(err < 2e-6, "{} hd {hd} radius {radius:?}: {err}", b.name());
            // Same bits whatever the thread count or SIMD level.
            match &first {
                None => first = Some(y),
                Some(f) => assert_eq!(f, &y, "{} hd {hd}", b.name()),
            }
        }
    }
}

#[test]
fn packed_attention_matches_per_sequence_reference() {
    // Lengths that are not whole 16-query groups or 6-key panels, a single token and an empty
    // sequence; head sizes of one whole panel and of two and a half.
    let lens = [5usize, 1, 0, 70, 130, 64];
    let total: usize = lens.iter().sum();
    for (heads, hd) in [(3, 16), (2, 40)] {
        packed_attention_case(&lens, heads, hd);
    }
    let (heads, hd) = (3, 16);
    let cols = heads * hd;
    let q: Vec<f32> = values(total * cols, 4).iter().map(|x| x * 2.0).collect();
    let (k, v) = (values(total * cols, 5), values(total * cols, 6));
    // A sequence alone gives the same bits as inside the batch.
    let b = CpuBackend::new(2).unwrap();
    let p = PackedAttentionParams {
        n_heads: heads,
        head_dim: hd,
        scale: 0.25,
        radius: None,
    };
    let t = |x: &[f32], rows| b.tensor_from_f32(x, rows, cols).unwrap();
    let all = b
        .to_f32(
            &b.packed_attention(&t(&q, total), &t(&k, total), &t(&v, total), &lens, &p)
                .unwrap(),
        )
        .unwrap();
    let (s, l) = (6 * cols, 70 * cols); // the 70-token sequence starts after 5 + 1 + 0 rows
    let one = b
        .to_f32(
            &b.packed_attention(
                &t(&q[s..s + l], 70),
                &t(&k[s..s + l], 70),
                &t(&v[s..s + l], 70),
                &[70],
                &p,
            )
            .unwrap(),
        )
        .unwrap();
    assert_eq!(&all[s..s + l], &one[..]);
    // Lengths that do not add up to the rows are refused.
    assert!(b
        .packed_attention(&t(&q, total), &t(&k, total), &t(&v, total), &[3, 4], &p)
        .is_err());
}

#[test]
fn dense_float_matmul_with_bias_for_every_float_type() {
    let (n, k) = (45, 72);
    let w = values(n * k, 7);
    let bias = values(n, 8);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        // The reference uses the weights as stored (rounded to the type).
        let stored: Vec<f64> = w
            .iter()
            .map(|&x| match ty {
                GgmlType::F16 => half::f16::from_f32(x).to_f64(),
                GgmlType::BF16 => half::bf16::from_f32(x).to_f64(),
                _ => x as f64,
            })
            .collect();
        for m in [1usize, 7, 8, 33] {
            let x = values(m * k, 10 + m as u64);
            let mut want = Vec::new();
            for r in x.chunks(k) {
                for (o, wr) in stored.chunks(k).enumerate() {
                    want.push(
                        r.iter().zip(wr).map(|(&a, b)| a as f64 * b).sum::<f64>() + bias[o] as f64,
                    );
                }
            }
            for b in backends() {
                let lin = Linear::<CpuBackend> {
                    weight: Arc::new(common::weight(&b, "w", ty, &[k, n], &w)),
                    bias: Some(common::weight(&b, "b", GgmlType::F32, &[n], &bias)),
                    in_features: k,
                    out_features: n,
                    ty,
                };
                let y = b
                    .matmul(&b.tensor_from_f32(&x, m, k).unwrap(), &lin)
                    .unwrap();
                let d = max_diff(&b.to_f32(&y).unwrap(), &want);
                assert!(d < 1e-5, "{ty} m={m} {}: {d}", b.name());
            }
        }
    }
}

#[test]
fn exact_gelu_activation_and_gate() {
    let b = CpuBackend::new(2).unwrap();
    let n = 50_000; // above the parallel threshold
    let x: Vec<f32> = values(n, 11).iter().map(|v| v * 6.0).collect();
    let up = values(n, 12);
    let xt = b.tensor_from_f32(&x, 100, n / 100).unwrap();
    let ut = b.tensor_from_f32(&up, 100, n / 100).unwrap();
    let g = b
        .to_f32(&b.activation(&xt, Activation::Gelu).unwrap())
        .unwrap();
    let gg = b
        .to_f32(&b.gated_activation(&xt, &ut, Activation::Gelu).unwrap())
        .unwrap();
    for i in 0..n {
        let want = Activation::Gelu.apply(x[i]);
        assert!((g[i] - want).abs() < 2e-6, "{}: {} vs {want}", x[i], g[i]);
        assert_eq!(gg[i], g[i] * up[i]);
    }
}
