//! What the CPU backend promises beyond the `Backend` trait. Every op against its scalar
//! reference, on every SIMD level, thread count and KV element type, is the conformance suite's
//! job (crates/kiln-conformance, `tests/cpu.rs`); here: the same bits whatever the thread count
//! or SIMD level, the interleaved weight layout, fused kernels that are their composition bit
//! for bit, and the CPU types' own constructors.

use std::sync::Arc;

use kiln_backend::{Activation, Backend, KvDtype, Linear, PackedAttentionParams, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuKv, CpuOptions, CpuTensor};

mod common;
use common::{backends, values};

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
fn quantized_products_are_the_same_bits_on_any_number_of_threads() {
    // The configurations of `backends()`: scalar on 1 and 3 threads, then this CPU's level on
    // 1, 2 and 3; each level's results must not depend on the thread count.
    let (n, k) = (37, 256);
    let w = values(n * k, 8);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
        let mut by_level: Vec<(SimdLevel, Vec<f32>)> = Vec::new();
        for b in backends() {
            let lin = quantized_weight(&b, ty, &w, n, k);
            let mut ys = Vec::new();
            for m in [1, 3, 17] {
                let x = b.tensor_from_f32(&values(m * k, 9), m, k).unwrap();
                ys.extend(b.to_f32(&b.matmul(&x, &lin).unwrap()).unwrap());
            }
            match by_level.iter().find(|(level, _)| *level == b.simd()) {
                Some((_, first)) => {
                    assert_eq!(
                        first,
                        &ys,
                        "{}: {ty}: the thread count changed a product",
                        b.name()
                    )
                }
                None => by_level.push((b.simd(), ys)),
            }
        }
    }
}

#[test]
fn weights_of_whole_groups_of_16_rows_are_interleaved_where_the_level_has_the_kernel() {
    let k = 256;
    for b in backends() {
        let vnni = b.simd() == SimdLevel::Avx512Vnni;
        // The AVX2 level (and AVX-512 without VNNI) has Q4_K's and Q5_0's.
        let avx2 = b.simd().has_avx2();
        for (ty, rows, interleaved) in [
            (GgmlType::Q8_0, 300, false),
            (GgmlType::Q8_0, 37, false),
            (GgmlType::Q8_0, 64, vnni),
            (GgmlType::Q5_0, 64, avx2),
            (GgmlType::Q4_K, 64, avx2),
            (GgmlType::Q4_K, 40, false),
            (GgmlType::Q6_K, 48, vnni),
            (GgmlType::Q4_0, 64, false),
        ] {
            let lin = quantized_weight(&b, ty, &values(rows * k, 11), rows, k);
            assert_eq!(
                lin.weight.is_interleaved(),
                interleaved,
                "{}: {ty} of {rows} rows",
                b.name()
            );
        }
    }
}

#[test]
fn interleaved_weights_give_the_file_layout_s_results() {
    // At the VNNI level a Q8_0, Q5_0, Q4_K or Q6_K matrix of whole groups of 16 rows is held
    // interleaved, at the AVX2 level a Q4_K or Q5_0 one: its embedding rows must be the file's, its
    // products those of the file layout up to the order of the f32 additions (at AVX2 the same
    // bits where the file layout runs the tile's arithmetic too), and each row's product the
    // same bits alone or batched.
    let level = simd_level();
    if !level.has_avx2() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let interleaving = CpuBackend::new(1).unwrap();
    let plain = CpuBackend::with_options(&CpuOptions {
        interleave: Vec::new(),
        ..CpuOptions::threads(1)
    })
    .unwrap();
    let rows = 48;
    let types: &[(GgmlType, usize)] = if level == SimdLevel::Avx512Vnni {
        &[
            (GgmlType::Q8_0, 128),
            (GgmlType::Q5_0, 160),
            (GgmlType::Q4_K, 512),
        ]
    } else {
        &[
            (GgmlType::Q4_K, 512),
            (GgmlType::Q4_K, 1024),
            (GgmlType::Q5_0, 160),
            (GgmlType::Q5_0, 640),
        ]
    };
    for &(ty, k) in types {
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
                // (Not at 2 rows, which the file layout runs as row dots, not as a tile.)
                if level != SimdLevel::Avx512Vnni && m != 2 {
                    assert_eq!(g.to_bits(), e.to_bits(), "{ty} m={m} [{i}]: {g} vs {e}");
                }
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
fn packed_attention_is_the_same_bits_on_every_configuration() {
    // Whatever the thread count or SIMD level; and a sequence alone gives the bits it gets
    // inside the batch (outside batch-invariant mode too). Head dims: multiples of 16 (the
    // AVX-512 build's 16 x 16 transposes), of 8 only (AVX2's 8 x 8 everywhere), and neither (the
    // element-wise copies).
    let lens = [5usize, 1, 0, 70, 130, 64];
    let total: usize = lens.iter().sum();
    for (heads, hd) in [(3, 16), (2, 32), (2, 40), (2, 12)] {
        let cols = heads * hd;
        let q: Vec<f32> = values(total * cols, 4).iter().map(|x| x * 2.0).collect();
        let (k, v) = (values(total * cols, 5), values(total * cols, 6));
        for radius in [None, Some(4), Some(40)] {
            let p = PackedAttentionParams {
                n_heads: heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                radius,
            };
            let mut first: Option<Vec<f32>> = None;
            for b in backends() {
                let t = |x: &[f32], rows| b.tensor_from_f32(x, rows, cols).unwrap();
                let all = b
                    .to_f32(
                        &b.packed_attention(&t(&q, total), &t(&k, total), &t(&v, total), &lens, &p)
                            .unwrap(),
                    )
                    .unwrap();
                let (s, l) = (6 * cols, 70 * cols); // the 70-token sequence after 5 + 1 + 0 rows
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
                assert_eq!(&all[s..s + l], &one[..], "{} hd {hd}: alone", b.name());
                match &first {
                    None => first = Some(all),
                    Some(f) => assert_eq!(f, &all, "{} hd {hd} radius {radius:?}", b.name()),
                }
            }
        }
    }
}

#[test]
fn fused_kernels_are_their_composition_bit_for_bit() {
    // The suite allows fused ops the rounding of either form; the CPU's fused kernels perform
    // the same operations as the unfused ones.
    let (rows, cols) = (37, 96);
    let x: Vec<f32> = values(rows * cols, 1)
        .iter()
        .map(|v| v * 3.0 + 0.5)
        .collect();
    for b in backends() {
        let xt = b.tensor_from_f32(&x, rows, cols).unwrap();
        let gw = common::weight(&b, "w", GgmlType::F32, &[cols], &values(cols, 2));
        let bw = common::weight(&b, "b", GgmlType::F32, &[cols], &values(cols, 3));
        let r = b
            .tensor_from_f32(&values(rows * cols, 9), rows, cols)
            .unwrap();
        let fused = b.add_layer_norm(&r, &xt, &gw, Some(&bw), 1e-12).unwrap();
        let sum = b.add(&r, &xt).unwrap();
        let plain = b.layer_norm(&sum, &gw, Some(&bw), 1e-12).unwrap();
        assert_eq!(
            b.to_f32(&fused).unwrap(),
            b.to_f32(&plain).unwrap(),
            "{}",
            b.name()
        );
    }
    let b = CpuBackend::new(2).unwrap();
    let n = 50_000; // above the parallel threshold
    let g: Vec<f32> = values(n, 11).iter().map(|v| v * 6.0).collect();
    let up = values(n, 12);
    let gt = b.tensor_from_f32(&g, 100, n / 100).unwrap();
    let ut = b.tensor_from_f32(&up, 100, n / 100).unwrap();
    let act = b
        .to_f32(&b.activation(&gt, Activation::Gelu).unwrap())
        .unwrap();
    let gated = b
        .to_f32(&b.gated_activation(&gt, &ut, Activation::Gelu).unwrap())
        .unwrap();
    for i in 0..n {
        assert_eq!(gated[i], act[i] * up[i], "{}", g[i]);
    }
}

#[test]
fn constructors_check_their_input() {
    let _ = CpuTensor::new(vec![0.0; 3], 2, 2).unwrap_err();
    // `CpuKv::from_f32` stores f16 values rounded once (relative error at most 2⁻¹¹).
    let k = values(16 * 24, 5);
    let kt = CpuKv::from_f32(&k, 16, 24, KvDtype::F16).unwrap();
    let b = CpuBackend::new(1).unwrap();
    for (x, r) in k.iter().zip(b.kv_to_f32(&kt).unwrap()) {
        assert!((x - r).abs() <= x.abs() / 2048.0, "{x} stored as {r}");
    }
    assert!(CpuKv::from_f32(&k, 16, 23, KvDtype::F32).is_err());
}
