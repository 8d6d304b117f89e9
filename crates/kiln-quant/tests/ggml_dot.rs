//! Bit-exactness against ggml's own C: `quantize_activations` must write the bytes of ggml's
//! `quantize_row_q8_*_ref`, and `vec_dot` must return the very f32 of ggml's scalar
//! `ggml_vec_dot_<type>_<q8>` (fixtures written by `scripts/gen_quant_fixtures.py --llama-cpp`,
//! which compiles ggml's generic C without FMA contraction; see tests/fixtures/README.md).
//!
//! No tolerance: the integer sums are exact and the f32 operations are the same operations in
//! the same order, so any difference means the accumulation order or a rounding rule drifted.

mod common;

use common::{fixture, Placed};
use kiln_core::GgmlType;
use kiln_quant::{activation_bytes, quantize_activations, vec_dot, vec_dot_type};

const TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn read(name: &str) -> Vec<u8> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::read(dir.join(name)).unwrap()
}

#[test]
fn quantized_activations_and_dots_equal_ggmls_bit_for_bit() {
    for ty in TYPES {
        let (w, w_values) = fixture(ty);
        let n = w_values.len();
        let act_ty = vec_dot_type(ty).unwrap();
        let row_act = activation_bytes(act_ty, n).unwrap();
        let xs = common::f32s(&read(&format!("{ty}.dot.x")));
        let ggml_act = read(&format!("{ty}.dot.act"));
        let ggml_dot = common::f32s(&read(&format!("{ty}.dot.out")));
        assert!(!ggml_dot.is_empty());
        assert_eq!(xs.len(), n * ggml_dot.len(), "{ty} fixture rows");

        for (row, ((x, expected_act), &expected)) in xs
            .chunks_exact(n)
            .zip(ggml_act.chunks_exact(row_act))
            .zip(&ggml_dot)
            .enumerate()
        {
            let mut act = vec![0u8; row_act];
            quantize_activations(act_ty, x, &mut act).unwrap();
            if let Some(at) = act.iter().zip(expected_act).position(|(a, b)| a != b) {
                panic!("{ty} row {row}: {act_ty} activations differ from ggml's at byte {at} (block {})", at / act_ty.type_size());
            }
            let got = vec_dot(ty, n, Placed::new(&w, 1).bytes(), &act).unwrap();
            assert_eq!(
                got.to_bits(),
                expected.to_bits(),
                "{ty} row {row}: kiln {got:e}, ggml {expected:e}"
            );
        }
    }
}
