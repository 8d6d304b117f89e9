//! The CPU backend's ops against plain f64 reference implementations written from the
//! definitions, at both SIMD levels and several thread counts.

use std::sync::Arc;

use kiln_backend::{
    Activation, AttentionParams, Backend, KvDtype, Linear, RopeParams, RopeStyle, WeightData,
};
use kiln_core::{GgmlType, SharedBytes};
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuKv, CpuOptions, CpuTensor};

mod common;
use common::{backends, values};

/// An f32 weight on `b`.
fn weight(b: &CpuBackend, name: &str, dims: &[usize], v: &[f32]) -> kiln_cpu::CpuWeight {
    common::weight(b, name, GgmlType::F32, dims, v)
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn rms_norm_whole_rows_and_per_head_groups() {
    let (rows, cols) = (5, 64);
    let x = values(rows * cols, 1);
    for b in backends() {
        for group in [64, 16] {
            let w = values(group, 2);
            let t = b.tensor_from_f32(&x, rows, cols).unwrap();
            let y = b
                .to_f32(
                    &b.rms_norm(&t, &weight(&b, "w", &[group], &w), 1e-6)
                        .unwrap(),
                )
                .unwrap();
            let want: Vec<f64> = x
                .chunks(group)
                .flat_map(|g| {
                    let ms = g.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / group as f64;
                    let s = 1.0 / (ms + 1e-6).sqrt();
                    g.iter()
                        .zip(&w)
                        .map(move |(&v, &wv)| v as f64 * s * wv as f64)
                        .collect::<Vec<_>>()
                })
                .collect();
            assert_close(&y, &want, 1e-5, "rms_norm");
            // add_rms_norm = residual + norm(x)
            let r = b
                .tensor_from_f32(&values(rows * cols, 3), rows, cols)
                .unwrap();
            let fused = b
                .to_f32(
                    &b.add_rms_norm(&r, &t, &weight(&b, "w", &[group], &w), 1e-6)
                        .unwrap(),
                )
                .unwrap();
            let want_fused: Vec<f64> = want
                .iter()
                .zip(values(rows * cols, 3))
                .map(|(a, r)| a + r as f64)
                .collect();
            assert_close(&fused, &want_fused, 1e-5, "add_rms_norm");
        }
    }
}

#[test]
fn rope_reuses_its_angles_only_for_the_same_parameters_and_positions() {
    // A backend keeps the sines and cosines of its last few (parameters, positions): calls that
    // interleave more settings than it keeps, and repeat them, must each give the bits a fresh
    // backend gives.
    let (n_heads, head_dim) = (2, 8);
    let settings: Vec<(f32, f32, Vec<u32>)> = vec![
        (10_000.0, 1.0, vec![5, 6]),
        (1_000_000.0, 1.0, vec![5, 6]),
        (10_000.0, 1.0, vec![6, 5]),
        (10_000.0, 0.25, vec![5, 6]),
        (10_000.0, 1.0, vec![5, 6, 7]),
        (500.0, 1.0, vec![5, 6]),
    ];
    let b = CpuBackend::new(1).unwrap();
    for round in 0..3 {
        for (k, (base, freq_scale, positions)) in settings.iter().enumerate() {
            let p = RopeParams {
                n_heads,
                head_dim,
                rope_dim: head_dim,
                base: *base,
                freq_scale: *freq_scale,
                freq_factors: None,
                mscale: 1.0,
                style: RopeStyle::Neox,
            };
            let x = values(positions.len() * n_heads * head_dim, 10 + k as u64);
            let rope = |b: &CpuBackend| {
                let t = b
                    .tensor_from_f32(&x, positions.len(), n_heads * head_dim)
                    .unwrap();
                b.to_f32(&b.rope(&t, positions, &p).unwrap()).unwrap()
            };
            let fresh = rope(&CpuBackend::new(1).unwrap());
            let got = rope(&b);
            assert!(
                got.iter()
                    .zip(&fresh)
                    .all(|(g, f)| g.to_bits() == f.to_bits()),
                "round {round}, setting {k}: {got:?} vs {fresh:?}"
            );
        }
    }
}

#[test]
fn rope_rotates_pairs_by_position() {
    let (n_heads, head_dim) = (3, 16);
    let positions = [0u32, 1, 7, 1000];
    let x = values(positions.len() * n_heads * head_dim, 4);
    for b in backends() {
        for (style, rope_dim, scaled) in [
            (RopeStyle::Neox, 16, false),
            (RopeStyle::Normal, 16, false),
            (RopeStyle::Neox, 8, false),
            (RopeStyle::Neox, 16, true),
            (RopeStyle::Normal, 8, true),
        ] {
            // Scaled: per-pair frequency divisors (Llama 3.1, Phi-3) and a cos/sin factor.
            let factors: Vec<f32> = (0..rope_dim / 2).map(|i| 1.0 + i as f32 * 0.75).collect();
            let mscale = if scaled { 1.19 } else { 1.0 };
            let p = RopeParams {
                n_heads,
                head_dim,
                rope_dim,
                base: 10_000.0,
                freq_scale: 0.5,
                freq_factors: scaled.then(|| factors.clone().into()),
                mscale,
                style,
            };
            let t = b
                .tensor_from_f32(&x, positions.len(), n_heads * head_dim)
                .unwrap();
            let y = b.to_f32(&b.rope(&t, &positions, &p).unwrap()).unwrap();
            let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            for (r, &pos) in positions.iter().enumerate() {
                for h in 0..n_heads {
                    let base = r * n_heads * head_dim + h * head_dim;
                    for (i, &factor) in factors.iter().enumerate() {
                        let divisor = if scaled { factor as f64 } else { 1.0 };
                        let theta =
                            pos as f64 * 0.5 * 10_000f64.powf(-2.0 * i as f64 / rope_dim as f64)
                                / divisor;
                        let (sin, cos) = (mscale as f64 * theta.sin(), mscale as f64 * theta.cos());
                        let (a, c) = match style {
                            RopeStyle::Neox => (base + i, base + i + rope_dim / 2),
                            RopeStyle::Normal => (base + 2 * i, base + 2 * i + 1),
                        };
                        let (x0, x1) = (x[a] as f64, x[c] as f64);
                        want[a] = x0 * cos - x1 * sin;
                        want[c] = x0 * sin + x1 * cos;
                    }
                }
            }
            assert_close(&y, &want, 1e-5, "rope");
        }
    }
}

/// Attention from the definition: full score matrix, causal + window mask, softmax in f64.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    q_pos: usize,
    n_kv: usize,
    p: &AttentionParams,
) -> Vec<f64> {
    let hd = p.head_dim;
    let mut out = vec![0.0; n * p.n_heads * hd];
    for i in 0..n {
        let pos = q_pos + i;
        for h in 0..p.n_heads {
            let g = h / (p.n_heads / p.n_kv_heads);
            let visible: Vec<usize> = (0..n_kv)
                .filter(|&j| j <= pos && p.sliding_window.is_none_or(|w| pos - j < w))
                .collect();
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let mut s: f64 = (0..hd)
                        .map(|d| {
                            q[i * p.n_heads * hd + h * hd + d] as f64
                                * k[j * p.n_kv_heads * hd + g * hd + d] as f64
                        })
                        .sum::<f64>()
                        * p.scale as f64;
                    if let Some(c) = p.softcap {
                        s = c as f64 * (s / c as f64).tanh();
                    }
                    s
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (&j, w) in visible.iter().zip(&e) {
                for d in 0..hd {
                    out[i * p.n_heads * hd + h * hd + d] +=
                        w / sum * v[j * p.n_kv_heads * hd + g * hd + d] as f64;
                }
            }
        }
    }
    out
}

#[test]
fn attention_causal_gqa_window_softcap() {
    let (n_heads, n_kv_heads, hd) = (4, 2, 8);
    let cap = 12;
    let k = values(cap * n_kv_heads * hd, 5);
    let v = values(cap * n_kv_heads * hd, 6);
    for b in backends() {
        for (window, softcap) in [(None, None), (Some(3), None), (Some(5), Some(2.0))] {
            let p = AttentionParams {
                n_heads,
                n_kv_heads,
                head_dim: hd,
                scale: 0.35,
                sliding_window: window,
                softcap,
            };
            // Prefill of 10 tokens at 0, and a decode step at position 10 (11 filled rows), over
            // caches of either type (the reference over the values as stored).
            for ((q_pos, n), dtype) in [(0, 10), (10, 1)]
                .into_iter()
                .zip([KvDtype::F32, KvDtype::F16])
            {
                let q = values(n * n_heads * hd, 7 + q_pos as u64);
                let kt = CpuKv::from_f32(&k, cap, n_kv_heads * hd, dtype).unwrap();
                let vt = CpuKv::from_f32(&v, cap, n_kv_heads * hd, dtype).unwrap();
                let qt = b.tensor_from_f32(&q, n, n_heads * hd).unwrap();
                let n_kv = q_pos + n;
                let y = b
                    .to_f32(&b.attention(&qt, &kt, &vt, q_pos, n_kv, &p).unwrap())
                    .unwrap();
                let (ks, vs) = (b.kv_to_f32(&kt).unwrap(), b.kv_to_f32(&vt).unwrap());
                assert_close(
                    &y,
                    &attention_ref(&q, &ks, &vs, n, q_pos, n_kv, &p),
                    1e-5,
                    "attention",
                );
            }
            // The f16 cache holds the values rounded once (relative error at most 2^-11).
            let kt = CpuKv::from_f32(&k, cap, n_kv_heads * hd, KvDtype::F16).unwrap();
            for (x, r) in k.iter().zip(b.kv_to_f32(&kt).unwrap()) {
                assert!((x - r).abs() <= x.abs() / 2048.0, "{x} stored as {r}");
            }
        }
    }
}

#[test]
fn attention_rejects_bad_shapes() {
    let b = CpuBackend::new(1).unwrap();
    let p = AttentionParams {
        n_heads: 4,
        n_kv_heads: 3,
        head_dim: 8,
        scale: 1.0,
        sliding_window: None,
        softcap: None,
    };
    let q = b.zeros(1, 32).unwrap();
    let kv = b.kv_zeros(4, 24).unwrap();
    assert!(b.attention(&q, &kv, &kv, 0, 1, &p).is_err());
    let p = AttentionParams { n_kv_heads: 2, ..p };
    let kv = b.kv_zeros(4, 16).unwrap();
    assert!(
        b.attention(&q, &kv, &kv, 4, 5, &p).is_err(),
        "n_kv beyond the cache"
    );
}

/// A Q8_0 matrix built from `rows × k` values (so the dequantized weights are known exactly).
fn q8_0_weight(b: &CpuBackend, w: &[f32], rows: usize, k: usize) -> (Linear<CpuBackend>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut deq = Vec::new();
    for block in w.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(amax / 127.0);
        bytes.extend_from_slice(&d.to_le_bytes());
        for &v in block {
            let q = if d.to_f32() == 0.0 {
                0
            } else {
                (v / d.to_f32()).round().clamp(-127.0, 127.0) as i8
            };
            bytes.push(q as u8);
            deq.push(q as f32 * d.to_f32());
        }
    }
    let data = WeightData {
        name: "w".into(),
        ty: GgmlType::Q8_0,
        dims: vec![k, rows],
        bytes: SharedBytes::from_vec(bytes),
    };
    let weight = b.upload_weight(&data).unwrap();
    (
        Linear {
            weight: Arc::new(weight),
            bias: None,
            in_features: k,
            out_features: rows,
            ty: GgmlType::Q8_0,
        },
        deq,
    )
}

#[test]
fn matmul_matches_dequantized_product_and_is_thread_invariant() {
    let (n, k) = (37, 128);
    let w = values(n * k, 8);
    let mut results: Vec<Vec<f32>> = Vec::new();
    for b in backends() {
        let (lin, deq) = q8_0_weight(&b, &w, n, k);
        for m in [1, 3, 17] {
            let x = values(m * k, 9);
            let y = b
                .to_f32(
                    &b.matmul(&b.tensor_from_f32(&x, m, k).unwrap(), &lin)
                        .unwrap(),
                )
                .unwrap();
            let want: Vec<f64> = (0..m)
                .flat_map(|t| {
                    let (x, deq) = (&x, &deq);
                    (0..n).map(move |r| {
                        (0..k)
                            .map(|c| x[t * k + c] as f64 * deq[r * k + c] as f64)
                            .sum::<f64>()
                    })
                })
                .collect();
            // Activations are quantized to 8 bits (as llama.cpp does): error up to ~1/254 of
            // each activation block's max, summed over k products.
            assert_close(&y, &want, 0.05, "matmul");
            if m == 17 {
                results.push(y);
            }
        }
    }
    // Same SIMD level → bit-identical whatever the thread count.
    for pair in results.chunks(2) {
        if let [a, c] = pair {
            assert_eq!(a, c, "thread count changed a matmul result");
        }
    }
}

#[test]
fn matmul_many_is_each_matmul_bit_for_bit() {
    // Products of one input with several weights run as one job (one row, and the several
    // rows of batched decode), in two activation formats (Q8_0 for Q8_0 weights, Q8_K for
    // Q4_K): every value must be the one a lone `matmul` computes, at any row count.
    let k = 256;
    for b in backends() {
        let (q, _) = q8_0_weight(&b, &values(300 * k, 11), 300, k);
        let (v, _) = q8_0_weight(&b, &values(37 * k, 12), 37, k);
        // Whole groups of 16 rows: interleaved where the backend interleaves.
        let (o, _) = q8_0_weight(&b, &values(64 * k, 15), 64, k);
        let vnni = b.name().contains("Avx512Vnni");
        assert_eq!(o.weight.is_interleaved(), vnni, "{}", b.name());
        assert!(!v.weight.is_interleaved() && !q.weight.is_interleaved());
        let rows = 64;
        let mut bytes = vec![0u8; rows * GgmlType::Q4_K.row_bytes(k as u64).unwrap() as usize];
        kiln_quant::quantize(GgmlType::Q4_K, &values(rows * k, 13), &mut bytes).unwrap();
        let data = WeightData {
            name: "q4k".into(),
            ty: GgmlType::Q4_K,
            dims: vec![k, rows],
            bytes: SharedBytes::from_vec(bytes),
        };
        let g = Linear {
            weight: Arc::new(b.upload_weight(&data).unwrap()),
            bias: None,
            in_features: k,
            out_features: rows,
            ty: GgmlType::Q4_K,
        };
        // Q5_0, 64 rows: interleaved too, sharing the Q8_0 activations (and their terms).
        let mut bytes = vec![0u8; 64 * GgmlType::Q5_0.row_bytes(k as u64).unwrap() as usize];
        kiln_quant::quantize(GgmlType::Q5_0, &values(64 * k, 18), &mut bytes).unwrap();
        let data = WeightData {
            name: "q5".into(),
            ty: GgmlType::Q5_0,
            dims: vec![k, 64],
            bytes: SharedBytes::from_vec(bytes),
        };
        let f: Linear<CpuBackend> = Linear {
            weight: Arc::new(b.upload_weight(&data).unwrap()),
            bias: None,
            in_features: k,
            out_features: 64,
            ty: GgmlType::Q5_0,
        };
        assert_eq!(f.weight.is_interleaved(), vnni, "{}", b.name());
        let lins = [&q, &g, &v, &o, &f];
        for m in [1, 2, 3, 5, 8, 9, 16, 17] {
            let x = b.tensor_from_f32(&values(m * k, 14), m, k).unwrap();
            let fused = b.matmul_many(&x, &lins).unwrap();
            assert_eq!(fused.len(), lins.len());
            for (y, lin) in fused.iter().zip(lins) {
                let alone = b.matmul(&x, lin).unwrap();
                assert_eq!(b.shape(y), (m, lin.out_features), "{} m={m}", b.name());
                assert_eq!(
                    b.to_f32(y).unwrap(),
                    b.to_f32(&alone).unwrap(),
                    "{} m={m}: {} outputs",
                    b.name(),
                    lin.out_features
                );
            }
        }
    }
}

/// A `rows x k` weight of `ty` quantized by kiln-quant from `w`.
fn quantized_weight(
    b: &CpuBackend,
    ty: GgmlType,
    w: &[f32],
    rows: usize,
    k: usize,
) -> Linear<CpuBackend> {
    let mut bytes = vec![0u8; rows * ty.row_bytes(k as u64).unwrap() as usize];
    kiln_quant::quantize(ty, w, &mut bytes).unwrap();
    let data = WeightData {
        name: "w".into(),
        ty,
        dims: vec![k, rows],
        bytes: SharedBytes::from_vec(bytes),
    };
    Linear {
        weight: Arc::new(b.upload_weight(&data).unwrap()),
        bias: None,
        in_features: k,
        out_features: rows,
        ty,
    }
}

#[test]
fn interleaved_weights_give_the_file_layout_s_results() {
    // At the VNNI level a Q8_0, Q5_0, Q4_K or Q6_K matrix of whole groups of 16 rows is held
    // interleaved: its embedding rows must be the file's, its products those of the file layout
    // up to the order of the f32 additions, and each row's product the same bits alone or
    // batched.
    if simd_level() != SimdLevel::Avx512Vnni {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let interleaving = CpuBackend::new(1).unwrap();
    let plain = CpuBackend::with_options(&CpuOptions {
        interleave: Vec::new(),
        ..CpuOptions::threads(1)
    })
    .unwrap();
    let rows = 48;
    for (ty, k) in [
        (GgmlType::Q8_0, 128),
        (GgmlType::Q5_0, 160),
        (GgmlType::Q4_K, 512),
    ] {
        let w = values(rows * k, 16);
        let lin = quantized_weight(&interleaving, ty, &w, rows, k);
        assert!(lin.weight.is_interleaved(), "{ty}");
        let file = quantized_weight(&plain, ty, &w, rows, k);
        assert!(!file.weight.is_interleaved(), "{ty}");
        let b = &plain;
        let ids = [0u32, 17, 47, 5];
        assert_eq!(
            b.to_f32(&b.embedding(&lin.weight, &ids).unwrap()).unwrap(),
            b.to_f32(&b.embedding(&file.weight, &ids).unwrap()).unwrap(),
            "{ty}"
        );
        assert!(
            b.embedding(&lin.weight, &[48]).is_err(),
            "{ty}: a row past the table"
        );
        let x = values(17 * k, 17);
        let alone: Vec<Vec<f32>> = x
            .chunks(k)
            .map(|row| {
                let t = b.tensor_from_f32(row, 1, k).unwrap();
                b.to_f32(&b.matmul(&t, &lin).unwrap()).unwrap()
            })
            .collect();
        for m in [1, 2, 8, 9, 17] {
            let t = b.tensor_from_f32(&x[..m * k], m, k).unwrap();
            let y = b.to_f32(&b.matmul(&t, &lin).unwrap()).unwrap();
            let want = b.to_f32(&b.matmul(&t, &file).unwrap()).unwrap();
            for (i, (&g, &e)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{ty} m={m} [{i}]: {g} vs {e}"
                );
            }
            for (row, single) in y.chunks(rows).zip(&alone) {
                assert_eq!(
                    row,
                    single.as_slice(),
                    "{ty} m={m}: a row batched is not the row alone"
                );
            }
        }
    }
}

#[test]
fn elementwise_ops_and_embedding() {
    let b = CpuBackend::new(2).unwrap();
    let a = b.tensor_from_f32(&[1.0, -2.0, 3.0, 0.5], 2, 2).unwrap();
    let c = b.tensor_from_f32(&[2.0, 2.0, -1.0, 4.0], 2, 2).unwrap();
    assert_eq!(
        b.to_f32(&b.add(&a, &c).unwrap()).unwrap(),
        vec![3.0, 0.0, 2.0, 4.5]
    );
    assert_eq!(
        b.to_f32(&b.mul(&a, &c).unwrap()).unwrap(),
        vec![2.0, -4.0, -3.0, 2.0]
    );
    assert_eq!(
        b.to_f32(&b.scale(&a, 2.0).unwrap()).unwrap(),
        vec![2.0, -4.0, 6.0, 1.0]
    );
    let g = b
        .to_f32(&b.gated_activation(&a, &c, Activation::GeluTanh).unwrap())
        .unwrap();
    for (i, (x, u)) in [1.0f32, -2.0, 3.0, 0.5]
        .iter()
        .zip([2.0f32, 2.0, -1.0, 4.0])
        .enumerate()
    {
        assert!((g[i] - Activation::GeluTanh.apply(*x) * u).abs() < 1e-6);
    }
    assert!(b.add(&a, &b.zeros(1, 2).unwrap()).is_err());
    let table = weight(&b, "embd", &[2, 3], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    assert_eq!(
        b.to_f32(&b.embedding(&table, &[2, 0]).unwrap()).unwrap(),
        vec![20.0, 21.0, 0.0, 1.0]
    );
    assert!(b.embedding(&table, &[3]).is_err());
    let t = b
        .tensor_from_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2)
        .unwrap();
    assert_eq!(
        b.to_f32(&b.rows(&t, 1..3).unwrap()).unwrap(),
        vec![3.0, 4.0, 5.0, 6.0]
    );
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let b = CpuBackend::with_options(&CpuOptions {
            kv_dtype: dtype,
            ..CpuOptions::threads(1)
        })
        .unwrap();
        let mut dst = b.kv_zeros(4, 2).unwrap();
        assert_eq!((b.kv_dtype(), b.kv_shape(&dst)), (dtype, (4, 2)));
        b.write_kv_rows(&mut dst, 2, &b.rows(&t, 0..2).unwrap())
            .unwrap();
        assert_eq!(
            b.kv_to_f32(&dst).unwrap(),
            vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
        );
        assert!(b.write_kv_rows(&mut dst, 3, &t).is_err());
    }
    let mut dst = b.zeros(4, 2).unwrap();
    b.write_rows(&mut dst, 2, &b.rows(&t, 0..2).unwrap())
        .unwrap();
    assert_eq!(
        b.to_f32(&dst).unwrap(),
        vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    );
    assert!(b.write_rows(&mut dst, 3, &t).is_err());
    assert!(b.write_rows(&mut dst, usize::MAX, &t).is_err());
    let _ = CpuTensor::new(vec![0.0; 3], 2, 2).unwrap_err();
}

#[test]
fn gather_and_scatter_add_rows() {
    let (rows, cols) = (5, 7);
    let x = values(rows * cols, 9);
    for b in backends() {
        let t = b.tensor_from_f32(&x, rows, cols).unwrap();
        let g = b.to_f32(&b.gather_rows(&t, &[3, 0, 3]).unwrap()).unwrap();
        assert_eq!(&g[..cols], &x[3 * cols..4 * cols]);
        assert_eq!(&g[cols..2 * cols], &x[..cols]);
        assert_eq!(&g[2 * cols..], &x[3 * cols..4 * cols]);
        assert!(b.gather_rows(&t, &[5]).is_err());

        // dst[i[r]] += w[r] * src[r], a repeated index accumulating in order.
        let mut dst = b.tensor_from_f32(&x, rows, cols).unwrap();
        let src = values(3 * cols, 10);
        let s = b.tensor_from_f32(&src, 3, cols).unwrap();
        b.scatter_add_rows(&mut dst, &[4, 1, 4], &s, &[0.5, 2.0, -1.0])
            .unwrap();
        let got = b.to_f32(&dst).unwrap();
        let mut want = x.clone();
        for (r, (&i, &w)) in [4usize, 1, 4].iter().zip(&[0.5f32, 2.0, -1.0]).enumerate() {
            for c in 0..cols {
                want[i * cols + c] += src[r * cols + c] * w;
            }
        }
        assert_eq!(got, want);
        assert!(b
            .scatter_add_rows(&mut dst, &[5], &b.rows(&s, 0..1).unwrap(), &[1.0])
            .is_err());
        assert!(b
            .scatter_add_rows(&mut dst, &[0, 1], &s, &[1.0, 1.0])
            .is_err());
    }
}
