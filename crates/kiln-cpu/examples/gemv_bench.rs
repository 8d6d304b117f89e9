//! Decode-shaped matrix-vector products through the backend (threads, task split and kernels
//! together), against the machine's read bandwidth: the measure of how close decode gets to its
//! memory-bound limit, op by op.
//!
//! For each case, a set of weight matrices is cycled through, one activation row at a time, so
//! that every product streams its weight from DRAM as a decode step does: at least the listed
//! copies, and more where they would not fill twice the probe's buffer (8 times the last-level
//! cache). Fewer let part of the set stay in the L3 across rounds: on a Zen 5 host with 32 MB of
//! L3, 32 copies of a 2.4 MB matrix (75 MB) measured 94-106 % of the probe, 160 copies 68-70 %,
//! as in the model; it prints GB/s of weight bytes and the fraction of `memory_bandwidth` (huge
//! pages, as the weights are held here like the GGUF loader holds them). The last cases use one
//! copy, which stays in cache: the compute rate, and the fixed cost of a product.
//!
//! `cargo run --release -p kiln-cpu --example gemv_bench [-- THREADS [ROWS_PER_STEP]]`

mod common;

use std::sync::Arc;
use std::time::Instant;

use kiln_backend::{Backend, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_cpu::CpuBackend;

/// (name, type, out rows, row length, fewest copies cycled).
const CASES: &[(&str, GgmlType, usize, usize, usize)] = &[
    ("Q8_0 output 262144x640", GgmlType::Q8_0, 262_144, 640, 2),
    ("Q5_0 ffn_up 2048x640", GgmlType::Q5_0, 2048, 640, 128),
    ("Q5_0 attn_k 256x640", GgmlType::Q5_0, 256, 640, 512),
    ("Q4_K attn_out 640x1024", GgmlType::Q4_K, 640, 1024, 256),
    ("Q6_K ffn_down 640x2048", GgmlType::Q6_K, 640, 2048, 128),
    ("Q8_0 attn_v 256x640", GgmlType::Q8_0, 256, 640, 512),
    // llama-3.2-1b's shapes (Q4_K_M): its largest products, and a 2048-square one.
    ("Q4_K ffn_up 8192x2048", GgmlType::Q4_K, 8192, 2048, 16),
    ("Q6_K ffn_down 2048x8192", GgmlType::Q6_K, 2048, 8192, 8),
    ("Q4_K attn_q 2048x2048", GgmlType::Q4_K, 2048, 2048, 32),
    ("Q6_K output 128256x2048", GgmlType::Q6_K, 128_256, 2048, 2),
    // One copy, so in cache after the first round: the kernels' compute rate, and (16 rows)
    // the fixed cost of a product.
    ("Q8_0 in cache 1024x640", GgmlType::Q8_0, 1024, 640, 1),
    ("Q8_0 in cache 16x640", GgmlType::Q8_0, 16, 640, 1),
    // The one-row k-quant kernels' compute rate (llama-3.2-1b's row length).
    ("Q4_K in cache 512x2048", GgmlType::Q4_K, 512, 2048, 1),
    ("Q6_K in cache 512x2048", GgmlType::Q6_K, 512, 2048, 1),
];

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = args.first().copied().unwrap_or(2);
    let m = args.get(1).copied().unwrap_or(1);
    let cpu = common::backend(threads);
    let bw = kiln_cpu::memory_bandwidth(threads, kiln_cpu::Pages::Huge).expect("probe");
    println!(
        "{} threads, {m} activation row(s); probe {:.1} GB/s",
        threads,
        bw.bytes_per_s / 1e9
    );
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for &(name, ty, n, k, copies) in CASES {
        let row_bytes = ty.row_bytes(k as u64).unwrap() as usize;
        // Streamed cases: enough copies to fill twice the probe's buffer (see the module docs).
        let copies = if copies > 1 {
            copies.max((2 * bw.buffer_bytes).div_ceil(n * row_bytes))
        } else {
            copies
        };
        let block = ty.type_size();
        let weights: Vec<Linear<CpuBackend>> = (0..copies)
            .map(|c| {
                // Anonymous memory advised to huge pages, as the GGUF loader holds a model.
                let mut bytes = memmap2::MmapOptions::new()
                    .len(n * row_bytes)
                    .map_anon()
                    .expect("map");
                let _ = bytes.advise(memmap2::Advice::HugePage);
                common::fill_blocks(&mut bytes, block, &mut seed);
                let data = WeightData {
                    name: format!("w{c}"),
                    ty,
                    dims: vec![k, n],
                    bytes: SharedBytes::new(Arc::new(bytes.make_read_only().expect("map"))),
                };
                Linear {
                    weight: Arc::new(cpu.upload_weight(&data).expect("upload")),
                    bias: None,
                    in_features: k,
                    out_features: n,
                    ty,
                }
            })
            .collect();
        let xs: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let x = cpu.tensor_from_f32(&xs, m, k).expect("x");
        let bytes_per = (n * row_bytes) as f64;
        let mut best = f64::INFINITY;
        for _round in 0..(if copies == 1 { 200 } else { 5 }) {
            let t0 = Instant::now();
            cpu.run(|| {
                for w in &weights {
                    std::hint::black_box(cpu.matmul(&x, w).expect("matmul"));
                }
            });
            best = best.min(t0.elapsed().as_secs_f64() / copies as f64);
        }
        let gbs = bytes_per / best / 1e9;
        println!(
            "{name:26} x{copies:<5} {:8.1} us  {:6.1} GB/s  {:5.1}% of probe",
            best * 1e6,
            gbs,
            100.0 * gbs * 1e9 / bw.bytes_per_s
        );
    }
}
