//! `vec_dot` against an f64 dot product of the dequantized operands.
//!
//! For each weight type the weights are the gguf-checked fixture row; the activations are random,
//! quantized with `quantize_activations(vec_dot_type(ty), ..)`, and dequantized again for the
//! reference, so the reference sees exactly the values the integer kernel multiplies.
//!
//! Tolerance. The per-block integer sums are exact, so the only errors are f32 roundings
//! (unit roundoff u = 2^-24): per block at most 4 (the scale product `d_w * d_a`, its product with
//! the integer sum, the same two for a min/offset term) plus one per accumulation into a running
//! sum, and the k-quants' 8 lane sums add 8 more at the end: fewer than `4 + nb + 8` roundings in
//! all, each relative to a partial sum bounded by `S = Σ |w_i a_i|` times the ratio between a
//! block's scale-plus-min terms and its `Σ |w a|` (at most a few for these fixtures, whose scales
//! and mins come from the same range). We allow `8 * (nb + 16) * 2u * S`. That is still tight
//! enough to see a single wrong code: one element contributes about `S / n`, over 20 times the
//! tolerance for every fixture here. F32/F16/BF16 weights round each product to f32 once and sum
//! in f64, then round once more: `2 * 2u * S` covers them.
//!
//! The `_1` formats (Q4_1, Q5_1 with Q8_1) define their offset term through the activation block
//! sum `s = f16(d_a * Σ p)`, not through the dequantized activations, so their reference is
//! `Σ_b [Σ_i (w_i - m_b) a_i + m_b * s_b]` (still in f64 from the dequantized weights); that `s`
//! itself is what `quantize_row_q8_1_ref` writes is checked in tests/activations.rs.

mod common;

use common::{fixture, Placed, Rng, WEIGHT_TYPES};
use half::f16;
use kiln_core::GgmlType;
use kiln_quant::{activation_bytes, dequantize, quantize_activations, vec_dot, vec_dot_type};

fn quantized_activations(ty: GgmlType, x: &[f32]) -> (GgmlType, Vec<u8>) {
    let act_ty = vec_dot_type(ty).unwrap();
    let mut act = vec![0u8; activation_bytes(act_ty, x.len()).unwrap()];
    quantize_activations(act_ty, x, &mut act).unwrap();
    (act_ty, act)
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The f64 reference dot and the magnitude `S` it is compared at.
fn reference(ty: GgmlType, w: &[u8], w_deq: &[f32], act: &[u8], a_deq: &[f32]) -> (f64, f64) {
    let pairs = w_deq
        .iter()
        .zip(a_deq)
        .map(|(&w, &a)| (f64::from(w), f64::from(a)));
    if !matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        return pairs.fold((0.0, 0.0), |(dot, mag), (w, a)| {
            (dot + w * a, mag + (w * a).abs())
        });
    }
    let mut dot = 0.0;
    let mut mag = 0.0;
    let w_blocks = w.chunks_exact(ty.type_size());
    let a_blocks = act.chunks_exact(GgmlType::Q8_1.type_size());
    let value_blocks = w_deq.chunks_exact(32).zip(a_deq.chunks_exact(32));
    for ((wb, ab), (wv, av)) in w_blocks.zip(a_blocks).zip(value_blocks) {
        let m = f64::from(f16_at(wb, 2));
        let s = f64::from(f16_at(ab, 2));
        for (&w, &a) in wv.iter().zip(av) {
            let scaled = (f64::from(w) - m) * f64::from(a);
            dot += scaled;
            mag += scaled.abs();
        }
        dot += m * s;
        mag += (m * s).abs();
    }
    (dot, mag)
}

#[test]
fn vec_dot_matches_the_f64_dot_of_dequantized_operands() {
    let mut rng = Rng::new(7);
    for ty in WEIGHT_TYPES {
        let (w, w_deq) = fixture(ty);
        let n = w_deq.len();
        let blocks = (n / ty.block_size()) as f64;
        for round in 0..4 {
            let x = rng.activations(n);
            let (act_ty, act) = quantized_activations(ty, &x);
            let mut a_deq = vec![0.0f32; n];
            dequantize(act_ty, &act, &mut a_deq).unwrap();

            let (reference, magnitude) = reference(ty, &w, &w_deq, &act, &a_deq);
            let roundings = if ty.block_size() == 1 {
                2.0
            } else {
                8.0 * (blocks + 16.0)
            };
            let tolerance = roundings * f64::from(f32::EPSILON) * magnitude;
            // The tolerance must stay below what one wrong element would change.
            assert!(
                tolerance * 20.0 < magnitude / n as f64,
                "{ty}: tolerance too loose to mean anything"
            );

            let got = vec_dot(ty, n, &w, &act).unwrap();
            let err = (f64::from(got) - reference).abs();
            assert!(
                err <= tolerance,
                "{ty} round {round}: vec_dot {got:e}, f64 reference {reference:e}, error {err:e} > {tolerance:e}"
            );
        }
    }
}

#[test]
fn vec_dot_does_not_depend_on_where_the_rows_start() {
    let mut rng = Rng::new(11);
    for ty in WEIGHT_TYPES {
        let (w, w_deq) = fixture(ty);
        let n = w_deq.len();
        let (_, act) = quantized_activations(ty, &rng.activations(n));
        let aligned = vec_dot(
            ty,
            n,
            Placed::new(&w, 0).bytes(),
            Placed::new(&act, 0).bytes(),
        )
        .unwrap();
        for (mw, ma) in [(1, 0), (0, 1), (2, 3), (3, 2), (5, 7)] {
            let got = vec_dot(
                ty,
                n,
                Placed::new(&w, mw).bytes(),
                Placed::new(&act, ma).bytes(),
            )
            .unwrap();
            assert_eq!(
                got.to_bits(),
                aligned.to_bits(),
                "{ty} at offsets ({mw}, {ma})"
            );
        }
    }
}

#[test]
fn q8_0_weights_against_themselves_are_exact_on_integer_scales() {
    // With d_w = d_a = 1 every product and partial sum is a small integer, so the integer kernel
    // must return the exact dot: a check that does not lean on any tolerance.
    let mut rng = Rng::new(3);
    let blocks = 8;
    let mut w = Vec::new();
    let mut a = Vec::new();
    let (mut qw, mut qa) = (Vec::new(), Vec::new());
    for _ in 0..blocks {
        for (bytes, codes) in [(&mut w, &mut qw), (&mut a, &mut qa)] {
            bytes.extend_from_slice(&f16::from_f32(1.0).to_le_bytes());
            for _ in 0..32 {
                let q = rng.next_u64() as i8;
                codes.push(i64::from(q));
                bytes.push(q as u8);
            }
        }
    }
    let exact: i64 = qw.iter().zip(&qa).map(|(x, y)| x * y).sum();
    let got = vec_dot(GgmlType::Q8_0, blocks * 32, &w, &a).unwrap();
    assert_eq!(got, exact as f32);
}

#[test]
fn zero_length_rows_dot_to_zero() {
    for ty in WEIGHT_TYPES {
        assert_eq!(vec_dot(ty, 0, &[], &[]).unwrap(), 0.0, "{ty}");
    }
}
