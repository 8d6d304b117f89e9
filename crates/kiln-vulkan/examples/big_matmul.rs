//! A tall Q8_0 product (Gemma's tied head shape) against a host reference: which rows come out.

use kiln_backend::{Backend, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_vulkan::{VulkanBackend, VulkanOptions};

fn main() {
    let b = VulkanBackend::new(&VulkanOptions::default()).unwrap();
    let (k, n) = (640usize, 262144usize);
    let ty = GgmlType::Q8_0;
    let values: Vec<f32> = (0..k * n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut bytes = vec![0u8; kiln_quant::quantized_size(ty, k * n).unwrap()];
    kiln_quant::quantize(ty, &values, &mut bytes).unwrap();
    let w = b
        .upload_weight(&WeightData {
            name: "w".into(),
            ty,
            dims: vec![k, n],
            bytes: SharedBytes::from_vec(bytes),
        })
        .unwrap();
    let lin = Linear::<VulkanBackend> {
        weight: std::sync::Arc::new(w),
        bias: None,
        in_features: k,
        out_features: n,
        ty,
    };
    let x = b.tensor_from_f32(&vec![1.0; k], 1, k).unwrap();
    let y = b.to_f32(&b.matmul(&x, &lin).unwrap()).unwrap();
    let zeros: Vec<usize> = (0..n).filter(|&i| y[i] == 0.0).collect();
    println!("{} zero outputs, first {:?}", zeros.len(), zeros.first());
}
