//! Helpers shared by the benchmark examples (not an example itself).

#![allow(dead_code)] // each example uses a different part

use std::time::{Duration, Instant};

use kiln_cpu::{CpuBackend, CpuOptions};

/// A CPU backend of `threads` threads, with the SIMD cap and interleaving that the environment
/// variables `KILN_SIMD` and `KILN_INTERLEAVE` name, as the `kiln` binary takes them (for A/B runs
/// of kernel paths on one machine).
pub fn backend(threads: usize) -> CpuBackend {
    let options = CpuOptions::threads(threads)
        .with_settings(
            std::env::var("KILN_SIMD").ok().as_deref(),
            std::env::var("KILN_INTERLEAVE").ok().as_deref(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    CpuBackend::with_options(&options).expect("the CPU backend")
}

/// Fills `bytes` with xorshift bytes from `seed` (advanced, so that successive calls differ),
/// then gives every block of `block` bytes a small finite f16 scale in its first two bytes. The
/// formats timed here (Q8_0, Q5_0, Q4_0, ...) store their scale first; for the K-quants, whose
/// scale lies elsewhere, random bytes stay finite often enough not to matter for timing.
pub fn fill_blocks(bytes: &mut [u8], block: usize, seed: &mut u64) {
    for b in bytes.iter_mut() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = *seed as u8;
    }
    for blk in bytes.chunks_exact_mut(block) {
        blk[0] = 0x00;
        blk[1] = 0x1c;
    }
}

/// Seconds per pass: the fastest of the passes run in about 1.5 s (after one to warm caches and
/// page the data in). Each pass is timed alone, so that passes interrupted by other processes (a
/// busy machine) drop out.
pub fn time_pass(mut pass: impl FnMut()) -> f64 {
    pass();
    let mut best = f64::INFINITY;
    let budget = Instant::now();
    while budget.elapsed() < Duration::from_millis(1500) {
        let start = Instant::now();
        pass();
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}
