//! A tall product (200,000 rows, as an output projection over a large vocabulary has) computes
//! every row. Regression test: on lavapipe, which ends a shader invocation's loops after 65,535
//! iterations in all without a word, an early kernel that looped over rows within a few
//! workgroups returned zeros past row 169,472 of Gemma's head, while every conformance shape
//! passed.

use kiln_backend::{Backend, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_vulkan::VulkanBackend;

#[test]
fn every_row_of_a_tall_product_is_computed() {
    let Some(b) = kiln_vulkan::testing::backend("tall product") else {
        return;
    };
    // Q8_0 rows of twenty blocks (Gemma 3's width; fewer would stay under lavapipe's limit even
    // with the old kernel): scale 1.0 (f16 0x3c00), all codes (row % 7) − 3, so that row r of
    // x · Wᵀ with x all ones is exactly k · ((r % 7) − 3).
    let (k, n) = (640usize, 200_000usize);
    let mut bytes = Vec::with_capacity(n * 8 * 34);
    for r in 0..n {
        let q = ((r % 7) as i8 - 3) as u8;
        for _ in 0..k / 32 {
            bytes.extend_from_slice(&[0x00, 0x3c]);
            bytes.extend(std::iter::repeat_n(q, 32));
        }
    }
    let w = b
        .upload_weight(&WeightData {
            name: "tall".into(),
            ty: GgmlType::Q8_0,
            dims: vec![k, n],
            bytes: SharedBytes::from_vec(bytes),
        })
        .unwrap();
    let lin = Linear::<VulkanBackend> {
        weight: std::sync::Arc::new(w),
        bias: None,
        in_features: k,
        out_features: n,
        ty: GgmlType::Q8_0,
    };
    let x = b.tensor_from_f32(&vec![1.0; k], 1, k).unwrap();
    let y = b.to_f32(&b.matmul(&x, &lin).unwrap()).unwrap();
    let wrong: Vec<usize> = (0..n)
        .filter(|&r| y[r] != k as f32 * ((r % 7) as f32 - 3.0))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {n} rows wrong, first {:?}",
        wrong.len(),
        wrong.first()
    );
}
