//! Throughput of packed (encoder) attention: `cargo run --release -p kiln-cpu --example
//! attention_bench [THREADS [L,.. [cold]]]`. 32 sequences of L tokens (25, 128 and 256 by
//! default), 12 heads of 32 (MiniLM's shape); the best of 5 rounds of at least 50 ms each. By
//! default Q, K and V are one tensor that stays in cache from call to call; with `cold` they are
//! three, and 64 MiB are written before each (timed alone) call, as in a model where three
//! products just wrote them (on a Zen 5 host, L = 128: 5-12 % slower than warm).

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
    let cold = std::env::args().nth(3).is_some_and(|a| a == "cold");
    for len in lens_arg {
        let lens = vec![len; 32];
        let total = len * 32;
        let x: Vec<f32> = (0..total * heads * hd)
            .map(|i| ((i % 97) as f32 - 48.0) * 0.02)
            .collect();
        let t = b.tensor_from_f32(&x, total, heads * hd).unwrap();
        // Cold: separate Q, K and V, and the caches flushed before each call (as in a model,
        // where three products just wrote them), each call timed alone.
        let shifted = |by: usize| {
            let y: Vec<f32> = (0..x.len()).map(|i| x[(i + by) % x.len()]).collect();
            b.tensor_from_f32(&y, total, heads * hd).unwrap()
        };
        let (tk, tv) = if cold {
            (shifted(7), shifted(13))
        } else {
            (t.clone(), t.clone())
        };
        let mut flush = vec![0u8; if cold { 64 << 20 } else { 0 }];
        let p = PackedAttentionParams {
            n_heads: heads,
            head_dim: hd,
            scale: 0.17,
            radius: None,
        };
        b.packed_attention(&t, &tk, &tv, &lens, &p).unwrap();
        // Best of 5 rounds of at least 50 ms each (a short shape's one pass is noise).
        let mut s = f64::INFINITY;
        for round in 0..5 {
            let (mut reps, mut spent) = (0, 0.0);
            while reps < 3 || spent < 0.05 {
                if cold {
                    flush
                        .iter_mut()
                        .for_each(|v| *v = v.wrapping_add(round as u8 + 1));
                    std::hint::black_box(&flush);
                }
                let t0 = Instant::now();
                std::hint::black_box(b.packed_attention(&t, &tk, &tv, &lens, &p).unwrap());
                spent += t0.elapsed().as_secs_f64();
                reps += 1;
            }
            s = s.min(spent / reps as f64);
        }
        let flops = 4.0 * (32 * heads * len * len * hd) as f64;
        println!(
            "L={len:4}: {:8.3} ms per layer-batch, {:6.1} GFLOP/s",
            s * 1e3,
            flops / s / 1e9
        );
    }
}
