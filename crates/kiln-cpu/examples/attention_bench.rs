//! Throughput of packed (encoder) attention: `cargo run --release -p kiln-cpu --example
//! attention_bench [THREADS [L,..]]`. 32 sequences of L tokens (25, 128 and 256 by default), 12
//! heads of 32 (MiniLM's shape); the best of 5 rounds of at least 50 ms each.

mod common;

use std::time::Instant;

use kiln_backend::{Backend, PackedAttentionParams};

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let b = common::backend(threads);
    let (heads, hd) = (12, 32);
    let lens_arg: Vec<usize> = std::env::args()
        .nth(2)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![25, 128, 256]);
    for len in lens_arg {
        let lens = vec![len; 32];
        let total = len * 32;
        let x: Vec<f32> = (0..total * heads * hd)
            .map(|i| ((i % 97) as f32 - 48.0) * 0.02)
            .collect();
        let t = b.tensor_from_f32(&x, total, heads * hd).unwrap();
        let p = PackedAttentionParams {
            n_heads: heads,
            head_dim: hd,
            scale: 0.17,
            radius: None,
        };
        b.packed_attention(&t, &t, &t, &lens, &p).unwrap();
        // Best of 5 rounds of at least 50 ms each (a short shape's one pass is noise).
        let mut s = f64::INFINITY;
        for _round in 0..5 {
            let (mut reps, t0) = (0, Instant::now());
            while reps < 3 || t0.elapsed().as_secs_f64() < 0.05 {
                std::hint::black_box(b.packed_attention(&t, &t, &t, &lens, &p).unwrap());
                reps += 1;
            }
            s = s.min(t0.elapsed().as_secs_f64() / reps as f64);
        }
        let flops = 4.0 * (32 * heads * len * len * hd) as f64;
        println!(
            "L={len:4}: {:8.3} ms per layer-batch, {:6.1} GFLOP/s",
            s * 1e3,
            flops / s / 1e9
        );
    }
}
