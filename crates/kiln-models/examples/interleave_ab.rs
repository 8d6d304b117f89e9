//! Decode with and without the CPU backend's interleaved Q8_0 layout
//! (`CpuOptions::interleave`), in one process, alternating: the same GGUF loaded twice on
//! one backend (once interleaved, once as the file has it), then rounds of STEPS batched decode
//! steps with each in turn, so that both see the same state of a noisy host. Prints each
//! round's tok/s and the medians.
//!
//! `cargo run --release -p kiln-models --example interleave_ab -- GGUF [THREADS] [STEPS] [BATCH] [ROUNDS]`

mod common;

use std::time::Instant;

use kiln_backend::Backend;
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_formats::{GgufFile, LoadMode};
use kiln_models::{Decoder, KvCache, NoTrace};

/// tok/s of `steps` batched decode steps of `model` over `caches` (cleared first).
fn run(
    b: &CpuBackend,
    model: &Decoder<CpuBackend>,
    caches: &mut [KvCache<CpuBackend>],
    steps: usize,
) -> f64 {
    caches.iter_mut().for_each(KvCache::clear);
    let batch = caches.len();
    let mut ids = vec![2u32; batch];
    let t0 = Instant::now();
    for _ in 0..steps {
        let seqs: Vec<&[u32]> = ids.iter().map(std::slice::from_ref).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let h = model
            .forward_batch(b, &seqs, &mut refs, &NoTrace)
            .expect("forward");
        let logits = b
            .to_f32(&model.logits(b, &h).expect("logits"))
            .expect("logits");
        ids = common::argmax_rows(&logits, batch);
    }
    (steps * batch) as f64 / t0.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: interleave_ab GGUF [THREADS] [STEPS] [BATCH] [ROUNDS]");
    let mut num = |default: usize| args.next().and_then(|a| a.parse().ok()).unwrap_or(default);
    let (threads, steps, batch, rounds) = (num(2), num(64), num(1).max(1), num(8));
    // Two private copies of the file: interleaving hands its source pages back (they become
    // the file's small pages again), which must not slow down the other model's weights.
    let open = || GgufFile::open_with(path.as_ref(), LoadMode::Read).expect("open");
    let (file, again) = (open(), open());
    // Both models run on `b`; the plain one is uploaded by a backend that interleaves nothing
    // (a weight carries its own layout and kernel, whichever backend runs it).
    let b = CpuBackend::new(threads).expect("backend");
    let no_interleave = CpuBackend::with_options(&CpuOptions {
        interleave: Vec::new(),
        ..CpuOptions::threads(1)
    })
    .expect("backend");
    let plain = kiln_models::load_gguf_decoder(&no_interleave, &file).expect("load");
    let interleaved = kiln_models::load_gguf_decoder(&b, &again).expect("load");
    let mut caches: Vec<_> = (0..batch)
        .map(|_| plain.new_cache(&b, steps + 1).expect("cache"))
        .collect();
    // Warm-up: page in the caches and both models' weights.
    run(&b, &plain, &mut caches, steps);
    run(&b, &interleaved, &mut caches, steps);
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so that neither always follows the other.
        let (x, y) = if round % 2 == 0 {
            let x = run(&b, &interleaved, &mut caches, steps);
            (x, run(&b, &plain, &mut caches, steps))
        } else {
            let y = run(&b, &plain, &mut caches, steps);
            (run(&b, &interleaved, &mut caches, steps), y)
        };
        println!(
            "round {round}: interleaved {x:7.1} tok/s, file layout {y:7.1} tok/s ({:+.1}%)",
            100.0 * (x / y - 1.0)
        );
        on.push(x);
        off.push(y);
    }
    let (x, y) = (median(on), median(off));
    println!(
        "{threads} threads, batch {batch}, {steps} steps x {rounds} rounds: medians interleaved {x:.1}, file layout {y:.1} tok/s ({:+.1}%)",
        100.0 * (x / y - 1.0)
    );
}
