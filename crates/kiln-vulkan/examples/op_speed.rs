//! Times a few ops on the first usable Vulkan device (a kernel-tuning aid, not a benchmark of
//! record): `cargo run --release -p kiln-vulkan --example op_speed`.

use std::time::Instant;

use kiln_backend::{AttentionParams, Backend, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_vulkan::{VulkanBackend, VulkanOptions};

fn time(b: &VulkanBackend, what: &str, macs: f64, mut op: impl FnMut()) {
    op();
    b.synchronize().unwrap();
    let t0 = Instant::now();
    let mut calls = 0;
    while t0.elapsed().as_secs_f64() < 0.5 {
        op();
        b.synchronize().unwrap();
        calls += 1;
    }
    let secs = t0.elapsed().as_secs_f64() / calls as f64;
    println!(
        "{what}: {:.3} ms, {:.3} GMAC/s",
        secs * 1e3,
        macs / secs / 1e9
    );
}

fn main() {
    let b = VulkanBackend::new(&VulkanOptions::default()).expect("a Vulkan device");
    println!("{}", b.name());
    for (ty, k, n) in [
        (GgmlType::Q8_0, 640, 8192),
        (GgmlType::Q4_K, 2048, 640),
        (GgmlType::F32, 640, 2048),
    ] {
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
        for m in [1, 8, 64] {
            let x = b.tensor_from_f32(&vec![0.25; m * k], m, k).unwrap();
            time(
                &b,
                &format!("{ty} [{m}, {k}] x [{n}, {k}]"),
                (m * k * n) as f64,
                || {
                    b.matmul(&x, &lin).unwrap();
                },
            );
        }
    }
    let (hd, heads, kvh) = (256, 4, 1);
    for n_kv in [64, 512] {
        let q = b
            .tensor_from_f32(&vec![0.1; heads * hd], 1, heads * hd)
            .unwrap();
        let kc = b.kv_zeros(n_kv, kvh * hd).unwrap();
        let vc = b.kv_zeros(n_kv, kvh * hd).unwrap();
        let p = AttentionParams {
            n_heads: heads,
            n_kv_heads: kvh,
            head_dim: hd,
            scale: 0.0625,
            sliding_window: None,
            softcap: None,
        };
        time(
            &b,
            &format!("decode attention over {n_kv}"),
            (n_kv * heads * hd * 2) as f64,
            || {
                b.attention(&q, &kc, &vc, n_kv - 1, n_kv, &p).unwrap();
            },
        );
    }
}
