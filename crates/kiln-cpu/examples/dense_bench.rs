//! Throughput of the dense float matmul path at encoder shapes, against the `gemm` crate and the
//! machine's FMA peak, all in the same run:
//! `cargo run --release -p kiln-cpu --example dense_bench [threads] [reps] [MxKxN,..]` (threads:
//! the multi-threaded setting besides 1, default 2; reps: timed rounds, default 7; shapes: `m`
//! activation rows, `k` inputs, `n` outputs each, default a set of encoder shapes).
//!
//! The peak is a register-only loop of independent FMAs on one thread (and on `threads` threads at
//! once, which shows whether the cores share their FMA units), 512-bit where kiln's SIMD level is
//! AVX-512 (its GEMM kernel is then the zmm one; Zen 4 splits a zmm FMA in two, Zen 5 and Intel
//! Xeons do not) and 256-bit otherwise. Each shape is timed in
//! interleaved rounds (kiln 1 thread, gemm 1 thread, kiln N, gemm N, repeated), so that the noise
//! of a shared host falls on all variants alike; the best and the median round are printed.

mod common;

use std::sync::Arc;
use std::time::Instant;

use kiln_backend::{Backend, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_cpu::CpuBackend;

const SHAPES: &[(usize, usize, usize)] = &[
    (800, 384, 384),
    (800, 384, 1536),
    (800, 1536, 384),
    (64, 384, 384),
    (4096, 384, 1536),
    (8000, 1536, 384),
];

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(2);
    let reps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(7);
    let shapes: Vec<(usize, usize, usize)> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|s| {
                let d: Vec<usize> = s.split('x').filter_map(|v| v.parse().ok()).collect();
                match d[..] {
                    [m, k, n] if m > 0 && k > 0 && n > 0 => (m, k, n),
                    _ => panic!("shape {s:?} is not MxKxN"),
                }
            })
            .collect(),
        None => SHAPES.to_vec(),
    };

    let peak1 = fma_peak(1);
    let peak_n = fma_peak(threads);
    let bits = if wide() { 512 } else { 256 };
    println!(
        "FMA peak (register-only loop, {bits}-bit): 1 thread {peak1:.1} GFLOP/s, {threads} threads \
         {peak_n:.1} GFLOP/s"
    );
    println!("GFLOP/s, best (median) of {reps} rounds; ratio = kiln / gemm crate, best rounds");

    let kiln1 = common::backend(1);
    let kiln_n = common::backend(threads);
    let pool1 = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let pool_n = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();

    for &(m, k, n) in &shapes {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7 % 17) as f32 - 8.0) * 0.01)
            .collect();
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let data = WeightData {
            name: "w".into(),
            ty: GgmlType::F32,
            dims: vec![k, n],
            bytes: SharedBytes::from_vec(bytes),
        };
        let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
        let flops = 2.0 * (m * n * k) as f64;
        // Enough calls per round for ~50 ms of work at 100 GFLOP/s, and at least three: one
        // call of a few milliseconds mostly timed the team's wake-up.
        let calls = ((5e9 / flops) as usize).clamp(3, 500);

        let kiln = |b: &CpuBackend| {
            let lin = Linear::<CpuBackend> {
                weight: Arc::new(b.upload_weight(&data).unwrap()),
                bias: None,
                in_features: k,
                out_features: n,
                ty: GgmlType::F32,
            };
            let xt = b.tensor_from_f32(&x, m, k).unwrap();
            b.run(|| b.matmul(&xt, &lin).unwrap()); // packs the weight
            move |b: &CpuBackend| {
                let t0 = Instant::now();
                b.run(|| {
                    for _ in 0..calls {
                        std::hint::black_box(b.matmul(&xt, &lin).unwrap());
                    }
                });
                t0.elapsed().as_secs_f64() / calls as f64
            }
        };
        let (run_kiln1, run_kiln_n) = (kiln(&kiln1), kiln(&kiln_n));
        let run_gemm = |pool: &rayon::ThreadPool| {
            let t0 = Instant::now();
            pool.install(|| {
                for _ in 0..calls {
                    std::hint::black_box(gemm_crate(&x, &w, m, k, n, pool.current_num_threads()));
                }
            });
            t0.elapsed().as_secs_f64() / calls as f64
        };

        let mut times: [Vec<f64>; 4] = Default::default();
        for _ in 0..reps {
            times[0].push(run_kiln1(&kiln1));
            times[1].push(run_gemm(&pool1));
            times[2].push(run_kiln_n(&kiln_n));
            times[3].push(run_gemm(&pool_n));
        }
        let g: Vec<(f64, f64)> = times
            .iter_mut()
            .map(|t| {
                t.sort_by(f64::total_cmp);
                (flops / t[0] / 1e9, flops / t[t.len() / 2] / 1e9)
            })
            .collect();
        println!(
            "m={m:5} k={k:5} n={n:5}: 1t kiln {:6.1} ({:6.1}) gemm {:6.1} ({:6.1}) x{:.2} {:3.0}% of peak | \
             {threads}t kiln {:6.1} ({:6.1}) gemm {:6.1} ({:6.1}) x{:.2} | kiln {threads}t/1t {:.2}",
            g[0].0,
            g[0].1,
            g[1].0,
            g[1].1,
            g[0].0 / g[1].0,
            100.0 * g[0].0 / peak1,
            g[2].0,
            g[2].1,
            g[3].0,
            g[3].1,
            g[2].0 / g[3].0,
            g[2].0 / g[0].0,
        );
    }
}

/// The previous dense path: `y = x · Wᵀ` through the `gemm` crate, `y` freshly allocated.
fn gemm_crate(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, threads: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: y is [m, n] row-major (column stride 1, row stride n), x is [m, k] row-major, and
    // Wᵀ is read from the row-major [n, k] weight with row stride 1 and column stride k: every
    // index stays inside its slice; y aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
    y
}

/// Whether the peak loop runs in zmm registers: the backend runs its AVX-512 GEMM kernel, i.e.
/// the CPU's level under `KILN_SIMD`'s cap (as `common::backend` sets it) has AVX-512.
fn wide() -> bool {
    kiln_cpu::CpuOptions::default()
        .with_settings(std::env::var("KILN_SIMD").ok().as_deref(), None)
        .unwrap_or_else(|e| panic!("{e}"))
        .simd_level()
        .has_avx512()
}

/// Best GFLOP/s of a register-only FMA loop on `threads` threads at once (5 rounds of ~0.1 s).
fn fma_peak(threads: usize) -> f64 {
    const ITERS: u64 = 20_000_000;
    let lanes: u64 = if wide() { 16 } else { 8 };
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t0 = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|_| std::thread::spawn(|| fma_loop(ITERS)))
            .collect();
        for h in handles {
            std::hint::black_box(h.join().unwrap());
        }
        // 12 chains of `lanes`-lane FMAs, 2 flops each.
        let flops = (ITERS * 12 * lanes * 2 * threads as u64) as f64;
        best = best.max(flops / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

#[cfg(target_arch = "x86_64")]
fn fma_loop(iters: u64) -> f32 {
    if wide() {
        // SAFETY: kiln's level has AVX-512 F only where the CPU does.
        return unsafe { fma_loop_avx512(iters) };
    }
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return f32::NAN;
    }
    // SAFETY: AVX2 and FMA were detected just above.
    unsafe { fma_loop_avx2(iters) }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_loop(_iters: u64) -> f32 {
    f32::NAN
}

/// [`fma_loop_avx2`] in zmm registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.0); 12];
    let a = _mm512_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm512_set1_ps(std::hint::black_box(1e-7));
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm512_fmadd_ps(*r, a, b);
        }
    }
    acc.iter().map(|&r| _mm512_reduce_add_ps(r)).sum()
}

/// 12 independent accumulator chains (enough to cover the FMA latency on two pipes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(0.0); 12];
    let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm256_set1_ps(std::hint::black_box(1e-7));
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm256_fmadd_ps(*r, a, b);
        }
    }
    let mut s = _mm256_setzero_ps();
    for r in acc {
        s = _mm256_add_ps(s, r);
    }
    let mut out = [0.0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum()
}
