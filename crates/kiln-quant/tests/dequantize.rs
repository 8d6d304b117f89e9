//! Dequantization against the independent reference: the `gguf` Python package (llama.cpp's own
//! numpy dequantizers; Q8_K from its ggml definition, see tests/fixtures/README.md).
//!
//! The comparison is bit-exact. Every expected value is one f16→f32 (or bf16→f32) widening, which
//! is exact, followed by products of a few small integers with that scale and at most one final
//! subtraction or addition. For all formats but Q6_K and Q8_K the product `d * scale * code` has at
//! most 11 + 6 + 5 = 22 significant bits (Q5_K), so it is exact in f32 whatever the association; the only
//! rounding is the final `- min` / `+ m`, done identically (round-to-nearest-even, no FMA) by numpy
//! and Rust. Q6_K's `(d * s) * q` and Q8_K's `d * q` round once, the same single rounding of the
//! same exact product on both sides. So any difference at all is a bug.

mod common;

use common::{fixture, Placed, WEIGHT_TYPES};
use kiln_quant::dequantize;

fn assert_bits_equal(ty: kiln_core::GgmlType, got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            g.to_bits() == e.to_bits(),
            "{ty} element {i} (block {}): got {g:e}, gguf says {e:e}",
            i / ty.block_size().max(1)
        );
    }
}

#[test]
fn every_type_matches_gguf_bit_for_bit() {
    for ty in WEIGHT_TYPES {
        let (raw, expected) = fixture(ty);
        assert_eq!(
            raw.len(),
            ty.row_bytes(expected.len() as u64).unwrap() as usize,
            "{ty} fixture"
        );
        let mut got = vec![f32::NAN; expected.len()];
        dequantize(ty, Placed::new(&raw, 0).bytes(), &mut got).unwrap();
        assert_bits_equal(ty, &got, &expected);
    }
}

#[test]
fn rows_at_any_byte_offset_dequantize_identically() {
    // GGUF rows of 18-byte Q4_0 blocks start at even offsets, and a caller may hand any slice:
    // misaligned rows are copied, never read through a misaligned reference.
    for ty in WEIGHT_TYPES {
        let (raw, expected) = fixture(ty);
        for misalign in 1..8 {
            let mut got = vec![f32::NAN; expected.len()];
            dequantize(ty, Placed::new(&raw, misalign).bytes(), &mut got).unwrap();
            assert_bits_equal(ty, &got, &expected);
        }
    }
}

#[test]
fn a_row_is_the_concatenation_of_its_blocks() {
    for ty in WEIGHT_TYPES {
        let (raw, expected) = fixture(ty);
        let (block_bytes, block_elems) = (ty.type_size(), ty.block_size());
        for (b, chunk) in raw.chunks_exact(block_bytes).enumerate() {
            let mut one = vec![0.0f32; block_elems];
            dequantize(ty, chunk, &mut one).unwrap();
            assert_bits_equal(ty, &one, &expected[b * block_elems..(b + 1) * block_elems]);
        }
    }
}

#[test]
fn empty_rows_are_fine() {
    for ty in WEIGHT_TYPES {
        dequantize(ty, &[], &mut []).unwrap();
    }
}
