//! `quantize` against ggml's own reference quantizers, byte for byte, and its round-trip error.
//!
//! The fixtures (`<TYPE>.quant.x` inputs, `<TYPE>.quant.bin` ggml's output) were written by
//! `scripts/gen_quant_fixtures.py --llama-cpp`, which compiles ggml's `quantize_row_*_ref` with
//! gcc (`-ffp-contract=off`). The inputs cover the cases the quantizers branch on (all-zero
//! blocks and groups, an outlier, values below `GROUP_MAX_EPS`, one-signed and constant blocks;
//! F16/BF16 ties, subnormals, overflow, infinities and NaN payloads). Any byte that differs is a
//! bug: ggml's reference is deterministic single-precision C, and kiln ports it operation for
//! operation.

mod common;

use common::{Placed, Rng};
use kiln_core::GgmlType;
use kiln_quant::{can_quantize, dequantize, quantize, quantized_size, QuantError};

/// Every type `quantize` writes (the weight types), with a ggml fixture for all but F32 (a plain
/// copy).
const QUANT_TYPES: [GgmlType; 14] = common::WEIGHT_TYPES;

/// ggml's inputs and output bytes for `ty`.
fn ggml_fixture(ty: GgmlType) -> (Vec<f32>, Vec<u8>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let x = common::f32s(&std::fs::read(dir.join(format!("{ty}.quant.x"))).unwrap());
    let expected = std::fs::read(dir.join(format!("{ty}.quant.bin"))).unwrap();
    (x, expected)
}

fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0xA5u8; quantized_size(ty, x.len()).unwrap()];
    quantize(ty, x, &mut out).unwrap();
    out
}

fn first_difference(ty: GgmlType, got: &[u8], expected: &[u8]) -> Option<String> {
    assert_eq!(got.len(), expected.len(), "{ty}: output length");
    let i = got.iter().zip(expected).position(|(g, e)| g != e)?;
    let block = i / ty.type_size();
    let at = block * ty.type_size();
    Some(format!(
        "{ty}: byte {i} (block {block}, byte {} of it) is {:#04x}, ggml wrote {:#04x}\n kiln: {:02x?}\n ggml: {:02x?}",
        i - at,
        got[i],
        expected[i],
        &got[at..at + ty.type_size()],
        &expected[at..at + ty.type_size()],
    ))
}

#[test]
fn every_type_matches_ggml_byte_for_byte() {
    for ty in QUANT_TYPES.into_iter().filter(|&t| t != GgmlType::F32) {
        let (x, expected) = ggml_fixture(ty);
        let got = quantized(ty, &x);
        if let Some(diff) = first_difference(ty, &got, &expected) {
            panic!("{diff}");
        }
    }
}

#[test]
fn output_at_any_byte_offset_is_the_same() {
    // A tensor's rows are written wherever the previous one ended: blocks go through bytes.
    for ty in QUANT_TYPES.into_iter().filter(|&t| t != GgmlType::F32) {
        let (x, expected) = ggml_fixture(ty);
        for misalign in 1..4 {
            let mut out = Placed::new(&vec![0u8; expected.len()], misalign);
            quantize(ty, &x, out.bytes_mut()).unwrap();
            assert!(out.bytes() == expected, "{ty} at offset {misalign}");
        }
    }
}

#[test]
fn large_inputs_split_across_threads_give_the_same_bytes() {
    // Well past the parallel threshold: the fixture repeated, so ggml's bytes repeat too.
    for ty in QUANT_TYPES.into_iter().filter(|&t| t != GgmlType::F32) {
        let (x, expected) = ggml_fixture(ty);
        let (x, expected) = if ty.block_size() == 1 {
            // F16/BF16 fixtures hold an odd count: repeat them whole.
            (x.repeat(200), expected.repeat(200))
        } else {
            let repeats = (100_000 / x.len()).max(2);
            (x.repeat(repeats), expected.repeat(repeats))
        };
        let got = quantized(ty, &x);
        if let Some(diff) = first_difference(ty, &got, &expected) {
            panic!("{diff}");
        }
    }
}

#[test]
fn f32_is_a_copy() {
    let x = [1.5f32, -0.0, f32::NAN, f32::INFINITY, 1e-45];
    let got = quantized(GgmlType::F32, &x);
    let back = common::f32s(&got);
    for (a, b) in x.iter().zip(&back) {
        assert_eq!(a.to_bits(), b.to_bits());
    }
}

/// Root-mean-square error of quantizing `x` to `ty` and back, relative to the RMS of `x`.
fn relative_rms_error(ty: GgmlType, x: &[f32]) -> f64 {
    let mut back = vec![0.0f32; x.len()];
    dequantize(ty, &quantized(ty, x), &mut back).unwrap();
    let err: f64 = x
        .iter()
        .zip(&back)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
    (err / norm).sqrt()
}

/// Bell-shaped weights (a sum of four uniforms, sigma about 0.012), like a trained matrix's.
fn weights(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (0..4).map(|_| rng.uniform()).sum::<f32>() * 0.01)
        .collect()
}

#[test]
fn round_trip_error_fits_the_bits_of_each_format() {
    // Each bit of code halves a uniform quantizer's error (RMS about step / sqrt(12)), so on the
    // same data the formats line up by bits per weight. Each limit is what the format achieves
    // on this seeded data plus about 25%, and lies below what the next coarser format achieves:
    // a quantizer that lost a bit (a wrong scale, a code off by one, a clamp too early) fails.
    let limits = [
        (GgmlType::F16, 2.6e-4),
        (GgmlType::BF16, 2.1e-3),
        (GgmlType::Q8_0, 6.3e-3),
        (GgmlType::Q8_K, 7.7e-3),
        (GgmlType::Q6_K, 2.1e-2),
        (GgmlType::Q5_1, 4.6e-2),
        (GgmlType::Q5_K, 4.3e-2),
        (GgmlType::Q5_0, 5.1e-2),
        (GgmlType::Q4_1, 9.4e-2),
        (GgmlType::Q4_K, 8.5e-2),
        (GgmlType::Q4_0, 1.02e-1),
        (GgmlType::Q3_K, 1.82e-1),
        (GgmlType::Q2_K, 3.6e-1),
    ];
    let mut rng = Rng::new(11);
    let x = weights(&mut rng, 64 * 256);
    let mut report = Vec::new();
    for (ty, limit) in limits {
        let err = relative_rms_error(ty, &x);
        report.push(format!("{ty}: {err:.5} (limit {limit})"));
        assert!(err <= limit, "{}", report.join("\n"));
    }
}

#[test]
fn zero_blocks_come_back_as_zeros_and_exact_codes_are_exact() {
    for ty in QUANT_TYPES {
        let n = ty.block_size().max(32) * 2;
        let back = |x: &[f32]| {
            let mut out = vec![f32::NAN; x.len()];
            dequantize(ty, &quantized(ty, x), &mut out).unwrap();
            out
        };
        assert!(back(&vec![0.0; n]).iter().all(|&v| v == 0.0), "{ty}");
    }
    // Values already on a Q8_0 grid (integers up to 127 times a power of two) survive exactly.
    let x: Vec<f32> = (0..64)
        .map(|i| ((i * 37) % 255 - 127) as f32 * 0.25)
        .collect();
    let mut back = vec![0.0f32; x.len()];
    dequantize(GgmlType::Q8_0, &quantized(GgmlType::Q8_0, &x), &mut back).unwrap();
    assert_eq!(back, x);
}

#[test]
fn sizes_and_types_are_checked() {
    for ty in GgmlType::ALL {
        assert_eq!(can_quantize(ty), QUANT_TYPES.contains(&ty), "{ty}");
        if !can_quantize(ty) {
            let n = ty.block_size();
            let mut out = vec![0u8; ty.type_size()];
            let err = quantize(ty, &vec![0.0; n], &mut out).unwrap_err();
            assert_eq!(err, QuantError::NotQuantizable(ty));
            assert!(err.to_string().contains(ty.name()), "{err}");
        }
    }
    let mut out = vec![0u8; 144];
    assert_eq!(
        quantize(GgmlType::Q4_K, &[0.0; 255], &mut out),
        Err(QuantError::NotBlockAligned {
            ty: GgmlType::Q4_K,
            elements: 255,
            block_size: 256
        })
    );
    assert_eq!(
        quantize(GgmlType::Q4_K, &[0.0; 256], &mut out[..143]),
        Err(QuantError::LengthMismatch {
            what: "quantized buffer",
            ty: GgmlType::Q4_K,
            elements: 256,
            expected: 144,
            actual: 143
        })
    );
    assert_eq!(quantized_size(GgmlType::Q6_K, 512), Ok(420));
    assert_eq!(quantized_size(GgmlType::BF16, 3), Ok(6));
    assert!(quantized_size(GgmlType::Q8_0, 33).is_err());
    quantize(GgmlType::Q5_K, &[], &mut []).unwrap();
}

#[test]
fn block_formats_refuse_nan_and_infinity_and_name_the_element() {
    for (bad, name) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let mut x = vec![0.5f32; 512];
            x[300] = bad;
            let mut out = vec![0u8; quantized_size(ty, x.len()).unwrap()];
            let err = quantize(ty, &x, &mut out).unwrap_err();
            assert_eq!(
                err,
                QuantError::NonFinite {
                    ty,
                    index: 300,
                    value: name
                }
            );
            assert!(err.to_string().contains("element 300"), "{err}");
        }
    }
    // The float formats represent them (ggml's conversions; see the F16/BF16 fixtures).
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let mut out = [0u8; 4];
        quantize(ty, &[f32::NAN, f32::NEG_INFINITY], &mut out).unwrap();
    }
}
