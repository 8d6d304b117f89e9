//! Error cases: every bad input is a typed error that names the type and sizes; no input panics.

mod common;

use common::{Placed, Rng, WEIGHT_TYPES};
use kiln_core::GgmlType;
use kiln_quant::blocks::{BlockQ4_0, BlockQ8K};
use kiln_quant::{
    activation_bytes, as_blocks, as_bytes, dequantize, quantize_activations, vec_dot, vec_dot_type,
    QuantError,
};

#[test]
fn unsupported_types_name_themselves() {
    for ty in GgmlType::ALL {
        if WEIGHT_TYPES.contains(&ty) {
            continue;
        }
        let bytes = vec![0u8; ty.type_size()];
        let mut out = vec![0.0f32; ty.block_size()];
        let err = vec_dot(ty, ty.block_size(), &bytes, &bytes).unwrap_err();
        assert_eq!(err, QuantError::UnsupportedType(ty));
        assert!(
            err.to_string()
                .starts_with(&format!("{} is not supported", ty.name())),
            "{err}"
        );
        assert_eq!(vec_dot_type(ty), Err(QuantError::UnsupportedType(ty)));
        if ty != GgmlType::Q8_1 {
            assert_eq!(
                dequantize(ty, &bytes, &mut out),
                Err(QuantError::UnsupportedType(ty))
            );
        }
    }
    let err = QuantError::UnsupportedType(GgmlType::IQ2_XXS).to_string();
    assert!(err.starts_with("IQ2_XXS is not supported"), "{err}");
}

#[test]
fn q8_1_is_an_activation_format_only() {
    // Dequantizable (to inspect activations) but never a weight of a dot product.
    let mut out = [0.0f32; 32];
    dequantize(GgmlType::Q8_1, &[0u8; 36], &mut out).unwrap();
    assert_eq!(
        vec_dot(GgmlType::Q8_1, 32, &[0u8; 36], &[0u8; 36]),
        Err(QuantError::UnsupportedType(GgmlType::Q8_1))
    );
}

#[test]
fn vec_dot_types_are_llamas() {
    use GgmlType::*;
    for (w, a) in [
        (F32, F32),
        (F16, F32),
        (BF16, F32),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2_K, Q8_K),
        (Q3_K, Q8_K),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
        (Q8_K, Q8_K),
    ] {
        assert_eq!(vec_dot_type(w), Ok(a), "{w}");
    }
}

#[test]
fn wrong_lengths_are_reported_with_sizes() {
    let mut out = vec![0.0f32; 256];
    // One byte short of 8 Q4_0 blocks.
    let err = dequantize(GgmlType::Q4_0, &[0u8; 8 * 18 - 1], &mut out).unwrap_err();
    assert_eq!(
        err,
        QuantError::LengthMismatch {
            what: "source",
            ty: GgmlType::Q4_0,
            elements: 256,
            expected: 144,
            actual: 143
        }
    );
    assert_eq!(
        err.to_string(),
        "source: 256 elements of Q4_0 take 144 bytes, got 143"
    );
    // An element count that is not whole blocks.
    let err = dequantize(GgmlType::Q4_K, &[0u8; 144], &mut out[..100]).unwrap_err();
    assert_eq!(
        err,
        QuantError::NotBlockAligned {
            ty: GgmlType::Q4_K,
            elements: 100,
            block_size: 256
        }
    );
    // Activations of the wrong size for the weight row.
    let act = vec![0u8; 292];
    let err = vec_dot(GgmlType::Q4_K, 512, &[0u8; 288], &act).unwrap_err();
    assert_eq!(
        err,
        QuantError::LengthMismatch {
            what: "activations",
            ty: GgmlType::Q8_K,
            elements: 512,
            expected: 584,
            actual: 292
        }
    );
    let err = vec_dot(GgmlType::Q8_0, 48, &[0u8; 34], &[0u8; 34]).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::NotBlockAligned {
                elements: 48,
                block_size: 32,
                ..
            }
        ),
        "{err}"
    );
    // A count whose byte size overflows usize.
    let err = vec_dot(GgmlType::F32, usize::MAX, &[], &[]).unwrap_err();
    assert_eq!(
        err,
        QuantError::TooLarge {
            ty: GgmlType::F32,
            elements: usize::MAX
        }
    );
}

#[test]
fn activation_sizes_and_errors() {
    assert_eq!(activation_bytes(GgmlType::Q8_0, 64), Ok(68));
    assert_eq!(activation_bytes(GgmlType::Q8_1, 64), Ok(72));
    assert_eq!(activation_bytes(GgmlType::Q8_K, 512), Ok(584));
    assert_eq!(activation_bytes(GgmlType::F32, 3), Ok(12));
    assert!(matches!(
        activation_bytes(GgmlType::Q8_K, 100),
        Err(QuantError::NotBlockAligned { .. })
    ));
    let err = activation_bytes(GgmlType::Q4_0, 32).unwrap_err();
    assert_eq!(err, QuantError::UnsupportedActivation(GgmlType::Q4_0));
    assert!(
        err.to_string()
            .starts_with("Q4_0 is not an activation format"),
        "{err}"
    );

    let x = [0.5f32; 64];
    let mut short = [0u8; 67];
    let err = quantize_activations(GgmlType::Q8_0, &x, &mut short).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::LengthMismatch {
                expected: 68,
                actual: 67,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        quantize_activations(GgmlType::Q6_K, &x, &mut [0u8; 68]),
        Err(QuantError::UnsupportedActivation(GgmlType::Q6_K))
    );
}

#[test]
fn as_blocks_checks_length_and_alignment() {
    let raw: Vec<u8> = (0..292u32 * 2).map(|i| i as u8).collect();
    let aligned = Placed::new(&raw, 0);
    let blocks = as_blocks::<BlockQ8K>(aligned.bytes()).unwrap();
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        as_bytes(blocks),
        aligned.bytes(),
        "as_bytes inverts as_blocks"
    );
    assert_eq!(blocks[1].qs[0], raw[292 + 4] as i8);

    let err = as_blocks::<BlockQ8K>(&aligned.bytes()[..291]).unwrap_err();
    assert_eq!(
        err,
        QuantError::PartialBlock {
            ty: GgmlType::Q8_K,
            bytes: 291,
            block_bytes: 292
        }
    );
    for misalign in 1..4 {
        let placed = Placed::new(&raw, misalign);
        let err = as_blocks::<BlockQ8K>(placed.bytes()).unwrap_err();
        assert_eq!(
            err,
            QuantError::Misaligned {
                ty: GgmlType::Q8_K,
                align: 4,
                offset: misalign
            }
        );
    }
    // f16-scaled blocks need only 2: a Q4_0 row at an even offset is viewed in place.
    assert!(as_blocks::<BlockQ4_0>(Placed::new(&raw[..18 * 4], 2).bytes()).is_ok());
    assert!(as_blocks::<BlockQ4_0>(Placed::new(&raw[..18 * 4], 3).bytes()).is_err());
}

#[test]
fn arbitrary_bytes_never_panic() {
    // Garbage blocks (NaN/Inf scales, inconsistent sums) give garbage numbers, not panics.
    let mut rng = Rng::new(17);
    for ty in WEIGHT_TYPES {
        for misalign in [0, 1] {
            let n = 2 * ty.block_size().max(32);
            let w = Placed::new(
                &rng.bytes(ty.row_bytes(n as u64).unwrap() as usize),
                misalign,
            );
            let mut out = vec![0.0f32; n];
            dequantize(ty, w.bytes(), &mut out).unwrap();
            let act_ty = vec_dot_type(ty).unwrap();
            let act = Placed::new(
                &rng.bytes(act_ty.row_bytes(n as u64).unwrap() as usize),
                misalign,
            );
            vec_dot(ty, n, w.bytes(), act.bytes()).unwrap();
        }
    }
    // Non-finite activations quantize without panicking too.
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        let mut x = vec![1.0f32; 256];
        x[3] = f32::NAN;
        x[40] = f32::INFINITY;
        x[200] = f32::NEG_INFINITY;
        let mut out = vec![0u8; activation_bytes(ty, 256).unwrap()];
        quantize_activations(ty, &x, &mut out).unwrap();
    }
}
