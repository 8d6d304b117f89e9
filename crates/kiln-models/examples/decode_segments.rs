//! Where a decode step's time goes, segment by segment, on the CPU backend: each stretch
//! between two of the trace hook's points (see `kiln_models::Trace`) is named after what runs in
//! it (the norms, the Q/K/V projections, rope and the cache store, attention, O, gate/up and the
//! activation, down), summed over the layers; the output projection and a plain argmax (this
//! example's own, slower than the engine's sampler) follow. Times are summed over the steps and
//! reported per step.
//!
//! With BATCH > 1, each step is one batched forward pass of BATCH independent sequences (as
//! `kiln bench -b BATCH` runs them; rope and the norms of Q and K then fall in the attention
//! stretch), and the argmax is taken of every sequence's logits. The steps run twice over the
//! same caches and only the second pass is timed, as `kiln bench` repeats a test.
//!
//! `cargo run --release -p kiln-models --example decode_segments -- GGUF [THREADS] [STEPS] [BATCH]
//! [KV]` (KV: the cache's element type, `f16` (the default) or `f32`).

mod common;

use std::sync::Mutex;
use std::time::Instant;

use kiln_backend::{Backend, KvDtype};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_formats::{GgufFile, LoadMode};
use kiln_models::{KvCache, Trace};

struct Timer {
    last: Mutex<Instant>,
    /// Seconds per segment name, in first-seen order.
    sums: Mutex<Vec<(String, f64)>>,
}

impl Timer {
    fn mark(&self, name: &str) {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap();
        let dt = now.duration_since(*last).as_secs_f64();
        *last = now;
        let mut sums = self.sums.lock().unwrap();
        match sums.iter_mut().find(|(n, _)| n == name) {
            Some((_, s)) => *s += dt,
            None => sums.push((name.to_string(), dt)),
        }
    }
}

impl<B: Backend> Trace<B> for Timer {
    fn trace(&self, _b: &B, name: &str, _layer: usize, _x: &B::Tensor) {
        // Each point ends the stretch since the one before it.
        let label = match name {
            "attn_norm" => "residual add + attention norm",
            "q_proj" => "Q/K/V projections",
            "q" => "q/k norms + rope q",
            "k" => "rope k",
            "attn" => "(norms, rope,) cache store + attention",
            "attn_out" => "O projection",
            "ffn_norm" => "residual add-norm + FFN norm",
            "ffn_act" => "gate/up + activation",
            "ffn_out" => "down projection",
            "l_out" => "residual add-norm",
            other => other,
        };
        self.mark(label);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: decode_segments GGUF [THREADS] [STEPS] [BATCH] [f16|f32]");
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let steps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(128);
    let batch: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let kv = args.next().map_or(KvDtype::F16, |a| {
        KvDtype::parse(&a).expect("the KV cache type is f16 or f32")
    });
    let file = GgufFile::open_with(path.as_ref(), LoadMode::Read).expect("open");
    let b = CpuBackend::with_options(&CpuOptions {
        kv_dtype: kv,
        ..CpuOptions::threads(threads)
    })
    .expect("backend");
    let model = kiln_models::load_gguf_decoder(&b, &file).expect("load");
    let mut caches: Vec<_> = (0..batch)
        .map(|_| model.new_cache(&b, steps + 1).expect("cache"))
        .collect();
    let timer = Timer {
        last: Mutex::new(Instant::now()),
        sums: Mutex::new(Vec::new()),
    };
    let mut ids = vec![2u32; batch];
    let mut t0 = Instant::now();
    // Two passes over the same caches, as `kiln bench` repeats a test: the first touches the
    // caches' pages (a fresh cache page-faults as it fills) and is not counted.
    for step in 0..2 * steps {
        if step == steps {
            timer.sums.lock().unwrap().clear();
            caches.iter_mut().for_each(KvCache::clear);
            ids = vec![2u32; batch];
            t0 = Instant::now();
        }
        *timer.last.lock().unwrap() = Instant::now();
        let seqs: Vec<&[u32]> = ids.iter().map(std::slice::from_ref).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let h = model
            .forward_batch(&b, &seqs, &mut refs, &timer)
            .expect("forward");
        timer.mark("final norm");
        let logits = model.logits(&b, &h).expect("logits");
        timer.mark("output projection");
        ids = common::argmax_rows(&b.to_f32(&logits).expect("logits"), batch);
        timer.mark("logits copy + naive argmax (not the engine's sampler)");
    }
    let total: f64 = timer.sums.lock().unwrap().iter().map(|(_, s)| s).sum();
    println!(
        "{threads} threads, batch {batch}, {steps} steps, {kv} KV cache: {:.1} tok/s ({:.0} ms wall)",
        (steps * batch) as f64 / total,
        t0.elapsed().as_secs_f64() * 1e3
    );
    for (name, s) in timer.sums.lock().unwrap().iter() {
        println!(
            "{name:40} {:8.1} us/step  {:5.1}%",
            s / steps as f64 * 1e6,
            100.0 * s / total
        );
    }
}
