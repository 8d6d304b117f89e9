//! `quantize_activations`: the ggml reference quantizers' scales, rounding, sums and error bound.
//!
//! Round-trip bound. Q8_K computes its codes from the very f32 `d` it stores, so
//! `|q * d - x| <= d/2` up to f32 rounding: `d * (1/2 + 127u) + 3u|x| + u|x'|` (u = 2^-24: the
//! rounding of `iscale * x`, of `d = 1/iscale`, and of the product `q * d`). Q8_0 and Q8_1 compute
//! their codes with the f32 `d = amax / 127` but store `f16(d)`, so their bound has one more term,
//! `|q| * |f16(d) - d|` (up to 127 * 2^-11 * d): "d/2" alone would be wrong for them by design of
//! the format, not by error of the code.

mod common;

use common::{Placed, Rng};
use half::f16;
use kiln_core::GgmlType;
use kiln_quant::{activation_bytes, dequantize, quantize_activations};

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0xA5u8; activation_bytes(ty, x.len()).unwrap()];
    quantize_activations(ty, x, &mut out).unwrap();
    out
}

fn round_trip(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / ty.type_size() * ty.block_size();
    let mut out = vec![0.0f32; n];
    dequantize(ty, bytes, &mut out).unwrap();
    out
}

/// A block's fields read straight from its bytes, independently of the library's structs.
struct Q8Block {
    d: f64,
    s: Option<f64>,
    qs: Vec<i8>,
    bsums: Vec<i16>,
}

fn parse(ty: GgmlType, block: &[u8]) -> Q8Block {
    let f16_at = |i: usize| f64::from(f16::from_le_bytes([block[i], block[i + 1]]).to_f32());
    let codes = |range: std::ops::Range<usize>| block[range].iter().map(|&b| b as i8).collect();
    match ty {
        GgmlType::Q8_0 => Q8Block {
            d: f16_at(0),
            s: None,
            qs: codes(2..34),
            bsums: vec![],
        },
        GgmlType::Q8_1 => Q8Block {
            d: f16_at(0),
            s: Some(f16_at(2)),
            qs: codes(4..36),
            bsums: vec![],
        },
        GgmlType::Q8_K => Q8Block {
            d: f64::from(f32::from_le_bytes(block[0..4].try_into().unwrap())),
            s: None,
            qs: codes(4..260),
            bsums: block[260..292]
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]))
                .collect(),
        },
        _ => unreachable!(),
    }
}

/// Random rows with the cases the quantizers special-case: an all-zero block, a block with one
/// non-zero value, a block whose largest value is negative, and outliers.
fn test_rows(rng: &mut Rng, block: usize) -> Vec<Vec<f32>> {
    let mut rows = vec![rng.activations(8 * block)];
    let mut special = vec![0.0f32; 3 * block];
    special[block + 5] = -3.25;
    for v in &mut special[2 * block..] {
        *v = rng.uniform();
    }
    special[2 * block + 9] = -7.5;
    rows.push(special);
    rows.push((0..4 * block).map(|_| rng.uniform() * 1e-3).collect());
    rows
}

#[test]
fn round_trip_error_is_within_half_a_step() {
    let mut rng = Rng::new(5);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        for x in test_rows(&mut rng, ty.block_size()) {
            let bytes = quantize(ty, &x);
            let back = round_trip(ty, &bytes);
            for (b, (block, xs)) in bytes
                .chunks_exact(ty.type_size())
                .zip(x.chunks_exact(ty.block_size()))
                .enumerate()
            {
                let parsed = parse(ty, block);
                let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // The f32 step the codes were computed with.
                let step = if ty == GgmlType::Q8_K {
                    parsed.d.abs()
                } else {
                    f64::from(amax / 127.0)
                };
                for (i, (&xv, &q)) in xs.iter().zip(&parsed.qs).enumerate() {
                    let back_v = f64::from(back[b * ty.block_size() + i]);
                    let xv = f64::from(xv);
                    let f16_step_error = f64::from(q).abs() * (parsed.d.abs() - step).abs();
                    let bound = step * (0.5 + 127.0 * U)
                        + 3.0 * U * xv.abs()
                        + U * back_v.abs()
                        + f16_step_error;
                    assert!(
                        (back_v - xv).abs() <= bound,
                        "{ty} block {b} element {i}: {xv:e} came back as {back_v:e} (bound {bound:e})"
                    );
                }
                if amax > 0.0 {
                    assert_eq!(
                        parsed.qs.iter().map(|q| q.unsigned_abs()).max(),
                        Some(127),
                        "{ty} block {b}: largest value is not ±127"
                    );
                } else {
                    assert_eq!(parsed.d, 0.0, "{ty} all-zero block {b}");
                    assert!(parsed.qs.iter().all(|&q| q == 0));
                }
            }
        }
    }
}

#[test]
fn scales_and_sums_are_ggmls() {
    let mut rng = Rng::new(9);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        for x in test_rows(&mut rng, ty.block_size()) {
            let bytes = quantize(ty, &x);
            for (block, xs) in bytes
                .chunks_exact(ty.type_size())
                .zip(x.chunks_exact(ty.block_size()))
            {
                let parsed = parse(ty, block);
                let sum: i32 = parsed.qs.iter().map(|&q| i32::from(q)).sum();
                match ty {
                    GgmlType::Q8_0 | GgmlType::Q8_1 => {
                        let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
                        assert_eq!(parsed.d, f64::from(f16::from_f32(d).to_f32()));
                        if let Some(s) = parsed.s {
                            assert_eq!(
                                s,
                                f64::from(f16::from_f32(sum as f32 * d).to_f32()),
                                "Q8_1 s"
                            );
                        }
                    }
                    _ => {
                        // d = 1 / (-127 / max) with max the first value of largest magnitude.
                        let max = xs
                            .iter()
                            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                        let expected = if max == 0.0 {
                            0.0
                        } else {
                            1.0 / (-127.0 / max)
                        };
                        assert_eq!(parsed.d, f64::from(expected));
                        let group_sums: Vec<i16> = parsed
                            .qs
                            .chunks_exact(16)
                            .map(|g| g.iter().map(|&q| i16::from(q)).sum())
                            .collect();
                        assert_eq!(
                            parsed.bsums, group_sums,
                            "Q8_K bsums are not the sums of the codes"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn rounding_follows_ggml_per_format() {
    // With amax = 127 the step is exactly 1, so the codes are the roundings of x itself:
    // Q8_0/Q8_1 use roundf (ties away from zero); Q8_K negates (iscale = -1 for max = 127) and
    // uses nearest_int (ties to even), so it stores d = -1 and codes -round_even(x).
    let mut x = vec![0.0f32; 256];
    x[0] = 127.0;
    let ties = [0.5f32, 1.5, 2.5, -0.5, -2.5, 3.5];
    x[1..7].copy_from_slice(&ties);
    let q8_0 = parse(GgmlType::Q8_0, &quantize(GgmlType::Q8_0, &x[..32]));
    assert_eq!(q8_0.d, 1.0);
    assert_eq!(&q8_0.qs[..7], &[127, 1, 2, 3, -1, -3, 4]);
    let q8_k = parse(GgmlType::Q8_K, &quantize(GgmlType::Q8_K, &x));
    assert_eq!(q8_k.d, -1.0);
    assert_eq!(&q8_k.qs[..7], &[-127, 0, -2, -2, 0, 2, -4]);
}

#[test]
fn f32_activations_are_little_endian_floats() {
    let x = [1.0f32, -2.5, 3.0e-8, f32::MAX];
    let bytes = quantize(GgmlType::F32, &x);
    let expected: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(bytes, expected);
}

#[test]
fn output_may_start_at_any_offset() {
    let x = Rng::new(13).activations(512);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
        GgmlType::F32,
    ] {
        let reference = quantize(ty, &x);
        for misalign in 1..4 {
            let mut placed = Placed::new(&reference, misalign);
            let dst = placed.bytes_mut();
            dst.fill(0);
            quantize_activations(ty, &x, dst).unwrap();
            assert_eq!(
                placed.bytes(),
                &reference[..],
                "{ty} written at offset {misalign}"
            );
        }
    }
}
