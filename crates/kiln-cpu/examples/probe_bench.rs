//! The memory-bandwidth probe on small and on huge pages, repeatedly, to see how far apart the
//! two are and how much each moves on a shared host:
//! `cargo run --release -p kiln-cpu --example probe_bench [THREADS] [RUNS]`.
fn main() {
    let mut args = std::env::args().skip(1);
    let threads = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let runs = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    for i in 0..runs {
        for pages in [kiln_cpu::Pages::Small, kiln_cpu::Pages::Huge] {
            let t = std::time::Instant::now();
            match kiln_cpu::memory_bandwidth(threads, pages) {
                Ok(b) => println!(
                    "run {i}: {pages:?} pages: {:.1} GB/s over {} MiB ({:.0} ms)",
                    b.bytes_per_s / 1e9,
                    b.buffer_bytes >> 20,
                    t.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => println!("run {i}: {e}"),
            }
        }
    }
}
