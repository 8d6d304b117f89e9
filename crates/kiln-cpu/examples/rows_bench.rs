//! One thread, no pool: the one-row product (`kernels::gemv_fn`, Q8_0 against a Q8_0 row, the
//! shape of Gemma 3 270M's output projection) on weights in cache, streamed from DRAM on huge
//! pages, and cycled through in pieces of decode-sized matrices. Separates the kernel's compute
//! rate from what the memory gives it.
//!
//! `cargo run --release -p kiln-cpu --example rows_bench`

mod common;

use std::time::Instant;

use kiln_core::GgmlType;
use kiln_cpu::kernels::{gemv_fn, quantize_fn, simd_level};

/// Random blocks of `block` bytes, each with a small finite f16 scale first (Q8_0, Q5_0, Q4_0).
fn fill(bytes: &mut [u8], block: usize) {
    common::fill_blocks(bytes, block, &mut 0x9e37_79b9_7f4a_7c15u64);
}

fn main() {
    let k = 640;
    let level = simd_level();
    let Some(f) = gemv_fn(GgmlType::Q8_0, level) else {
        println!("no one-row kernel at {level:?}");
        return;
    };
    let quantize = quantize_fn(GgmlType::Q8_0, level).expect("quantizer");
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut a = vec![0u8; k / 32 * 34];
    quantize(&x, &mut a);
    let row = k / 32 * 34;
    let blocks = |rows: usize| (rows * k / 32) as f64;
    let report = |what: &str, rows: usize, secs: f64| {
        println!(
            "{what:28} {:6.2} ns/block  {:5.1} GB/s",
            secs * 1e9 / blocks(rows),
            (rows * row) as f64 / secs / 1e9
        )
    };

    let mut hot = vec![0u8; 512 * row];
    fill(&mut hot, 34);
    let mut out = vec![0f32; 262_144];
    let mut best = f64::INFINITY;
    for _ in 0..2000 {
        let t = Instant::now();
        f(k, &hot, 512, &a, &mut out[..512]);
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("in cache, 512 rows", 512, best);

    let rows = 262_144;
    let mut cold = memmap2::MmapOptions::new()
        .len(2 * rows * row)
        .map_anon()
        .expect("map");
    let _ = cold.advise(memmap2::Advice::HugePage);
    fill(&mut cold, 34);
    let mut best = f64::INFINITY;
    for i in 0..6 {
        let w = &cold[(i % 2) * rows * row..][..rows * row];
        let t = Instant::now();
        f(k, w, rows, &a, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("DRAM, 262144 rows", rows, best);

    // The other formats with a one-row kernel, in cache (their own block layouts: the scale
    // first, then the quants; random quants and a small scale).
    for (ty, block) in [(GgmlType::Q5_0, 22usize), (GgmlType::Q4_0, 18)] {
        let Some(g) = gemv_fn(ty, level) else {
            continue;
        };
        let row = k / 32 * block;
        let mut w = vec![0u8; 512 * row];
        fill(&mut w, block);
        let mut best = f64::INFINITY;
        for _ in 0..2000 {
            let t = Instant::now();
            g(k, &w, 512, &a, &mut out[..512]);
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{:28} {:6.2} ns/block  {:5.1} GB/s",
            format!("{ty:?} in cache, 512 rows"),
            best * 1e9 / blocks(512),
            (512 * row) as f64 / best / 1e9
        );
    }

    for n in [64usize, 256, 1024, 4096] {
        let bytes = n * row;
        let count = (2 * rows * row) / bytes;
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            let t = Instant::now();
            for c in 0..count {
                f(k, &cold[c * bytes..][..bytes], n, &a, &mut out[..n]);
            }
            best = best.min(t.elapsed().as_secs_f64() / count as f64);
        }
        report(&format!("DRAM, {count} x {n} rows"), n, best);
    }
}
