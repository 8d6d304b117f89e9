//! `kiln_cpu::kernels` against kiln-quant's scalar reference.
//!
//! Dots: random weight bytes (with finite scale fields) against activations quantized by the
//! reference, for every supported type and several row lengths. The integer part of a block dot is
//! exact in both implementations; they differ only in how the f32 per-block terms are rounded and
//! summed (the reference: ggml's scalar order, f64 sums for the float formats; the AVX2 kernels:
//! 8-lane accumulators with fused multiply-adds). Each implementation's error is at most about
//! `(k + c) * eps * S`, where `S` is the sum of the absolute values of the terms (bounded here by
//! `sum |w_i| * |x_i|` over the weights split into their scale and minimum parts, so that
//! cancellation inside a weight cannot hide a term), `k` the longest chain of f32 additions (at
//! most one per 8 elements: per-lane sums over blocks, or over 32-element steps for the float
//! formats, plus the final lane reduction) and `c` a few roundings per term (scale products,
//! int-to-float). The test allows `2 * (n / 8 + 8) * eps * S`, once per implementation. Measured
//! errors stay below 5% of that bound, while a real kernel bug (a wrong scale, a wrong nibble)
//! moves the result by a sizeable fraction of `S / sqrt(n)`, orders of magnitude above it.
//!
//! Quantizers: bit-identical output, with rounding ties, all-zero blocks, signed-maximum ties,
//! subnormal blocks (whose inverse scale overflows) and huge values included.
//!
//! The AVX2 half of each test is skipped, with a note, on a CPU without AVX2+FMA+F16C.

use std::mem::offset_of;
use std::panic::{catch_unwind, AssertUnwindSafe};

use half::f16;
use kiln_core::GgmlType;
use kiln_cpu::kernels::{gemm_fn, quantize_fn, simd_level, vec_dot_fn, SimdLevel};

mod common;
use common::quant::{avx2_available, scale_fields, Field, Rng, WEIGHT_TYPES};
use kiln_quant::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};

/// The types that must have a real AVX2 kernel (not the scalar fallback).
const AVX2_WEIGHT_TYPES: [GgmlType; 14] = WEIGHT_TYPES;

const ACTIVATION_TYPES: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K];

/// A finite value of moderate magnitude and random sign.
fn finite(rng: &mut Rng, magnitude: f32) -> f32 {
    let v = rng.signed() * magnitude;
    if v == 0.0 {
        magnitude
    } else {
        v
    }
}

/// Random weight bytes of a row of `n` elements of `ty`, every scale (or float element) finite.
fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
    let mut w = rng.bytes(bytes);
    match ty {
        GgmlType::F32 => {
            for c in w.chunks_exact_mut(4) {
                c.copy_from_slice(&finite(rng, 2.0).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(finite(rng, 2.0)).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in w.chunks_exact_mut(2) {
                let bits = (finite(rng, 2.0).to_bits() >> 16) as u16;
                c.copy_from_slice(&bits.to_le_bytes());
            }
        }
        _ => {
            for block in w.chunks_exact_mut(ty.type_size()) {
                for (at, field) in scale_fields(ty) {
                    match field {
                        Field::ScaleF16 | Field::MinF16 => {
                            let v = f16::from_f32(finite(rng, 0.05));
                            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        }
                        Field::ScaleF32 => {
                            let v = finite(rng, 0.05);
                            block[at..at + 4].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
        }
    }
    w
}

/// Random activations: uniform in a random order of magnitude, with some exact zeros.
fn random_activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    let magnitude = 10f32.powf(4.0 * rng.unit() - 2.0);
    (0..n)
        .map(|_| {
            if rng.below(50) == 0 {
                0.0
            } else {
                rng.signed() * magnitude
            }
        })
        .collect()
}

/// The activation row as the reference quantizes it for weights of `ty`.
fn reference_activations(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
    let mut a = vec![0u8; kiln_quant::activation_bytes(act_ty, x.len()).unwrap()];
    kiln_quant::quantize_activations(act_ty, x, &mut a).unwrap();
    a
}

/// The values an activation row stands for (`d * q`, or the raw f32).
fn activation_values(ty: GgmlType, a: &[u8]) -> Vec<f32> {
    let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
    let f16_at = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    let blocks = |size: usize, d: &dyn Fn(&[u8]) -> f32, qs: usize, count: usize| {
        a.chunks_exact(size)
            .flat_map(|b| {
                let d = d(b);
                b[qs..qs + count]
                    .iter()
                    .map(move |&q| d * f32::from(q as i8))
            })
            .collect::<Vec<f32>>()
    };
    match act_ty {
        GgmlType::F32 => a
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::Q8_0 => blocks(34, &|b| f16_at(b, 0), offset_of!(BlockQ8_0, qs), 32),
        GgmlType::Q8_1 => blocks(36, &|b| f16_at(b, 0), offset_of!(BlockQ8_1, qs), 32),
        GgmlType::Q8_K => blocks(
            292,
            &|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            offset_of!(BlockQ8K, qs),
            256,
        ),
        other => panic!("unexpected activation type {other}"),
    }
}

/// `w` with every field of kind `zero` set to 0, dequantized.
fn dequantized_without(ty: GgmlType, w: &[u8], n: usize, zero: Field) -> Vec<f32> {
    let mut w = w.to_vec();
    if !scale_fields(ty).is_empty() {
        for block in w.chunks_exact_mut(ty.type_size()) {
            for (at, field) in scale_fields(ty) {
                if field == zero {
                    let width = if field == Field::ScaleF32 { 4 } else { 2 };
                    block[at..at + width].fill(0);
                }
            }
        }
    }
    let mut out = vec![0f32; n];
    kiln_quant::dequantize(ty, &w, &mut out).unwrap();
    out
}

/// The allowed difference between two implementations of the dot of `w` and `a` (see the module
/// docs for the derivation).
fn tolerance(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let x = activation_values(ty, a);
    // The weights split into their scale part (minimums zeroed) and minimum part (scales zeroed):
    // the terms a kernel adds are bounded by these parts, not by their (possibly cancelling) sum.
    let scaled = dequantized_without(ty, w, n, Field::MinF16);
    let mins = dequantized_without(ty, w, n, Field::ScaleF16);
    let has_mins = scale_fields(ty).iter().any(|&(_, f)| f == Field::MinF16);
    let magnitude: f64 = (0..n)
        .map(|i| {
            let wi = if has_mins {
                f64::from(scaled[i].abs()) + f64::from(mins[i].abs())
            } else {
                f64::from(scaled[i].abs())
            };
            wi * f64::from(x[i].abs())
        })
        .sum();
    let chain = n / 8;
    let per_implementation = (chain + 8) as f64 * f64::from(f32::EPSILON) * magnitude;
    (2.0 * per_implementation) as f32 + f32::MIN_POSITIVE
}

/// Row lengths to test for `ty`: one block, a few (odd counts reach the tails of two-block loops),
/// and the model's row lengths where they are whole blocks.
fn lengths(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size();
    let mut ns = if bs == 1 {
        vec![1, 7, 8, 9, 31, 32, 33, 100]
    } else {
        vec![bs, 2 * bs, 3 * bs, 7 * bs]
    };
    for n in [640, 1024, 2048, 2560] {
        if n % bs == 0 {
            ns.push(n);
        }
    }
    ns
}

#[test]
fn simd_level_is_what_the_cpu_has() {
    #[cfg(target_arch = "x86_64")]
    let avx512_vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    #[cfg(target_arch = "x86_64")]
    let avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq");
    #[cfg(target_arch = "x86_64")]
    let expected = if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        match (avx512, avx512_vnni) {
            (true, true) => SimdLevel::Avx512Vnni,
            (true, false) => SimdLevel::Avx512,
            _ => SimdLevel::Avx2,
        }
    } else {
        SimdLevel::Scalar
    };
    #[cfg(not(target_arch = "x86_64"))]
    let expected = SimdLevel::Scalar;
    assert_eq!(simd_level(), expected);
    assert_eq!(simd_level(), simd_level());
}

#[test]
fn unsupported_types_are_refused_at_every_level() {
    for level in [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Avx512Vnni,
    ] {
        for ty in [GgmlType::IQ2_XXS, GgmlType::I32, GgmlType::MXFP4] {
            assert!(vec_dot_fn(ty, level).is_err(), "{ty} at {level:?}");
        }
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16] {
            assert!(quantize_fn(ty, level).is_err(), "{ty} at {level:?}");
        }
    }
}

#[test]
fn avx2_kernels_exist_for_every_listed_type() {
    if !avx2_available("avx2_kernels_exist_for_every_listed_type") {
        return;
    }
    for ty in AVX2_WEIGHT_TYPES {
        let simd = vec_dot_fn(ty, SimdLevel::Avx2).unwrap() as usize;
        let scalar = vec_dot_fn(ty, SimdLevel::Scalar).unwrap() as usize;
        assert_ne!(simd, scalar, "{ty} has no AVX2 kernel");
    }
    for ty in ACTIVATION_TYPES {
        let simd = quantize_fn(ty, SimdLevel::Avx2).unwrap() as usize;
        let scalar = quantize_fn(ty, SimdLevel::Scalar).unwrap() as usize;
        assert_ne!(simd, scalar, "{ty} has no AVX2 quantizer");
    }
}

#[test]
fn scalar_kernels_are_the_reference() {
    let mut rng = Rng::new(1);
    for ty in WEIGHT_TYPES {
        let dot = vec_dot_fn(ty, SimdLevel::Scalar).unwrap();
        for n in lengths(ty) {
            let w = random_weights(ty, n, &mut rng);
            let a = reference_activations(ty, &random_activations(n, &mut rng));
            let expected = kiln_quant::vec_dot(ty, n, &w, &a).unwrap();
            assert_eq!(dot(n, &w, &a).to_bits(), expected.to_bits(), "{ty} n={n}");
        }
    }
}

#[test]
fn avx2_dots_match_the_reference() {
    if !avx2_available("avx2_dots_match_the_reference") {
        return;
    }
    let mut rng = Rng::new(2);
    for ty in WEIGHT_TYPES {
        let dot = vec_dot_fn(ty, SimdLevel::Avx2).unwrap();
        for n in lengths(ty) {
            for trial in 0..4 {
                let w = random_weights(ty, n, &mut rng);
                let a = reference_activations(ty, &random_activations(n, &mut rng));
                let expected = kiln_quant::vec_dot(ty, n, &w, &a).unwrap();
                let got = dot(n, &w, &a);
                let tol = tolerance(ty, n, &w, &a);
                assert!(
                    (got - expected).abs() <= tol,
                    "{ty} n={n} trial {trial}: avx2 {got} vs reference {expected} (tolerance {tol})"
                );
            }
        }
    }
}

#[test]
fn avx2_dots_handle_extreme_quants() {
    // Weight bytes all 0x00 or all 0xff put every quant at an end of its range (Q8_0's -128,
    // Q4_0's 15, every high bit set), against activations at +-127.
    if !avx2_available("avx2_dots_handle_extreme_quants") {
        return;
    }
    let mut rng = Rng::new(3);
    for ty in WEIGHT_TYPES.into_iter().filter(|t| t.block_size() > 1) {
        let dot = vec_dot_fn(ty, SimdLevel::Avx2).unwrap();
        for fill in [0x00u8, 0xff, 0x80, 0x7f] {
            let n = 2 * ty.block_size();
            let mut w = random_weights(ty, n, &mut rng);
            let fields = scale_fields(ty);
            for block in w.chunks_exact_mut(ty.type_size()) {
                for (i, byte) in block.iter_mut().enumerate() {
                    let in_scale = fields.iter().any(|&(at, f)| {
                        let width = if f == Field::ScaleF32 { 4 } else { 2 };
                        (at..at + width).contains(&i)
                    });
                    if !in_scale {
                        *byte = fill;
                    }
                }
            }
            let x: Vec<f32> = (0..n)
                .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect();
            let a = reference_activations(ty, &x);
            let expected = kiln_quant::vec_dot(ty, n, &w, &a).unwrap();
            let got = dot(n, &w, &a);
            let tol = tolerance(ty, n, &w, &a);
            assert!(
                (got - expected).abs() <= tol,
                "{ty} fill {fill:#x}: avx2 {got} vs reference {expected} (tolerance {tol})"
            );
        }
    }
}

/// Activation rows that exercise the quantizers' corner cases, `n` a multiple of 256.
fn quantizer_inputs(n: usize, rng: &mut Rng) -> Vec<Vec<f32>> {
    let mut rows = vec![
        random_activations(n, rng),
        vec![0.0; n],
        vec![-0.0; n],
        // Subnormal and near-underflow blocks: the inverse scale overflows.
        (0..n).map(|i| (i % 5) as f32 * 1e-41).collect(),
        (0..n).map(|i| (i as f32 - 100.0) * 1e-39).collect(),
        // Huge values: the f16 scale overflows to infinity.
        (0..n).map(|i| (i as f32 - 7.0) * 1e36).collect(),
    ];
    // Exact rounding ties: with a maximum magnitude of 127 the scale is 1 and x * (1/d) = x.
    let ties = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 63.5, 0.0];
    for max in [127.0f32, -127.0] {
        rows.push(
            (0..n)
                .map(|i| {
                    if i % 32 == 5 {
                        max
                    } else {
                        ties[i % ties.len()]
                    }
                })
                .collect(),
        );
    }
    // The maximum magnitude appears with both signs; the first one decides Q8_K's sign.
    for first in [3.0f32, -3.0] {
        rows.push(
            (0..n)
                .map(|i| match i % 64 {
                    7 => first,
                    40 => -first,
                    _ => rng.signed(),
                })
                .collect(),
        );
    }
    // Blocks of very different magnitudes in one row, some of them all zero.
    rows.push(
        (0..n)
            .map(|i| {
                let block = i / 32;
                if block % 4 == 3 {
                    0.0
                } else {
                    rng.signed() * 10f32.powi(block as i32 % 9 - 4)
                }
            })
            .collect(),
    );
    rows
}

#[test]
fn quantizers_are_bit_identical_to_the_reference() {
    let levels: &[SimdLevel] = if avx2_available("quantizers_are_bit_identical_to_the_reference") {
        &[SimdLevel::Scalar, SimdLevel::Avx2]
    } else {
        &[SimdLevel::Scalar]
    };
    let mut rng = Rng::new(4);
    for &level in levels {
        for act_ty in [
            GgmlType::Q8_0,
            GgmlType::Q8_1,
            GgmlType::Q8_K,
            GgmlType::F32,
        ] {
            let quantize = quantize_fn(act_ty, level).unwrap();
            for n in [256, 512, 2560] {
                for x in quantizer_inputs(n, &mut rng) {
                    let bytes = kiln_quant::activation_bytes(act_ty, n).unwrap();
                    let mut expected = vec![0xa5u8; bytes];
                    kiln_quant::quantize_activations(act_ty, &x, &mut expected).unwrap();
                    let mut got = vec![0x5au8; bytes];
                    quantize(&x, &mut got);
                    if let Some(at) = (0..bytes).find(|&i| got[i] != expected[i]) {
                        panic!(
                            "{act_ty} at {level:?}, n={n}: first difference at byte {at} \
                             (block {}): {} vs reference {}; row starts {:?}",
                            at / act_ty.type_size(),
                            got[at],
                            expected[at],
                            &x[..8]
                        );
                    }
                }
            }
        }
    }
}

/// Copies `bytes` to an odd address (`offset` bytes into a fresh buffer).
fn shifted(bytes: &[u8], offset: usize) -> Vec<u8> {
    let mut v = vec![0u8; offset];
    v.extend_from_slice(bytes);
    v
}

#[test]
fn kernels_read_and_write_misaligned_slices() {
    let mut levels = vec![SimdLevel::Scalar];
    if avx2_available("kernels_read_and_write_misaligned_slices") {
        levels.push(SimdLevel::Avx2);
    }
    let mut rng = Rng::new(5);
    for &level in &levels {
        for ty in WEIGHT_TYPES {
            let dot = vec_dot_fn(ty, level).unwrap();
            for n in [ty.block_size() * 3, 1024] {
                let w = random_weights(ty, n, &mut rng);
                let a = reference_activations(ty, &random_activations(n, &mut rng));
                let aligned = dot(n, &w, &a);
                for offset in [1, 3] {
                    let (ws, as_) = (shifted(&w, offset), shifted(&a, offset));
                    let got = dot(n, &ws[offset..], &as_[offset..]);
                    assert_eq!(
                        got.to_bits(),
                        aligned.to_bits(),
                        "{ty} {level:?} offset {offset}"
                    );
                }
            }
        }
        for act_ty in [
            GgmlType::Q8_0,
            GgmlType::Q8_1,
            GgmlType::Q8_K,
            GgmlType::F32,
        ] {
            let quantize = quantize_fn(act_ty, level).unwrap();
            let x = random_activations(512, &mut rng);
            let bytes = kiln_quant::activation_bytes(act_ty, 512).unwrap();
            let mut aligned = vec![0u8; bytes];
            quantize(&x, &mut aligned);
            let mut buffer = vec![0u8; bytes + 1];
            quantize(&x, &mut buffer[1..]);
            assert_eq!(&buffer[1..], &aligned[..], "{act_ty} {level:?}");
            // Activations starting at an odd f32 index (still f32-aligned, as `&[f32]` must be).
            let mut odd = vec![0f32; 513];
            odd[1..].copy_from_slice(&x);
            let mut from_odd = vec![0u8; bytes];
            quantize(&odd[1..], &mut from_odd);
            assert_eq!(from_odd, aligned, "{act_ty} {level:?} odd start");
        }
    }
}

#[test]
fn wrong_lengths_panic_instead_of_reading_out_of_bounds() {
    let mut levels = vec![SimdLevel::Scalar];
    if avx2_available("wrong_lengths_panic_instead_of_reading_out_of_bounds") {
        levels.push(SimdLevel::Avx2);
    }
    let mut rng = Rng::new(6);
    for &level in &levels {
        for ty in WEIGHT_TYPES {
            let dot = vec_dot_fn(ty, level).unwrap();
            let n = 2 * ty.block_size().max(16);
            let w = random_weights(ty, n, &mut rng);
            let a = reference_activations(ty, &random_activations(n, &mut rng));
            let cases: [(usize, &[u8], &[u8]); 4] = [
                (n, &w[..w.len() - 1], &a),
                (n, &w, &a[..a.len() - 1]),
                (n + ty.block_size(), &w, &a),
                (usize::MAX - 7, &w, &a),
            ];
            for (i, (n, w, a)) in cases.into_iter().enumerate() {
                let result = catch_unwind(AssertUnwindSafe(|| dot(n, w, a)));
                assert!(result.is_err(), "{ty} {level:?} case {i} did not panic");
            }
        }
        for act_ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            let quantize = quantize_fn(act_ty, level).unwrap();
            let x = vec![1.0f32; 256];
            let bytes = kiln_quant::activation_bytes(act_ty, 256).unwrap();
            let mut short = vec![0u8; bytes - 1];
            assert!(catch_unwind(AssertUnwindSafe(|| quantize(&x, &mut short))).is_err());
            let mut out = vec![0u8; bytes];
            assert!(catch_unwind(AssertUnwindSafe(|| quantize(&x[..255], &mut out))).is_err());
        }
    }
}

#[test]
fn simd_levels_are_ordered_and_parsed_by_name() {
    assert!(SimdLevel::Scalar < SimdLevel::Avx2 && SimdLevel::Avx2 < SimdLevel::Avx512);
    assert!(SimdLevel::Avx512 < SimdLevel::Avx512Vnni);
    assert!(!SimdLevel::Scalar.has_avx2());
    assert!(SimdLevel::Avx2.has_avx2() && SimdLevel::Avx512Vnni.has_avx2());
    assert!(!SimdLevel::Avx2.has_avx512() && SimdLevel::Avx512.has_avx512());
    assert!(SimdLevel::Avx512Vnni.has_avx512());
    assert_eq!(SimdLevel::parse("scalar"), Some(SimdLevel::Scalar));
    assert_eq!(SimdLevel::parse("AVX2"), Some(SimdLevel::Avx2));
    assert_eq!(SimdLevel::parse("avx512vnni"), Some(SimdLevel::Avx512Vnni));
    assert_eq!(SimdLevel::parse("AVX512"), Some(SimdLevel::Avx512));
    assert_eq!(SimdLevel::parse("avx512f"), None);
    assert_eq!(SimdLevel::parse(""), None);
    // A level above the CPU's hands out the CPU's kernels: asking for VNNI on an AVX2-only CPU
    // gives the AVX2 GEMM, never an instruction the CPU lacks.
    if simd_level() == SimdLevel::Avx2 {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
            let vnni = gemm_fn(ty, SimdLevel::Avx512Vnni).unwrap() as usize;
            assert_eq!(vnni, gemm_fn(ty, SimdLevel::Avx2).unwrap() as usize, "{ty}");
        }
    }
}
