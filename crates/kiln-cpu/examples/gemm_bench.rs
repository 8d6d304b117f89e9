//! Single-threaded throughput of the quantized GEMM kernels against the pairwise row-dot loop
//! they replace, on the prompt-processing shapes of Gemma 3 270M (Q4_K_M).
//!
//! For each weight type: n = 2048 weight rows x k (640, or 1024/2048 for the k-quants) x m = 512
//! activation rows, (a) every (weight row, activation row) pair through `vec_dot_fn` (weight row
//! outermost, as the matmul driver does) and (b) one `gemm_fn` call. The two run alternately,
//! a few rounds, and the best pass of each is reported as GMAC/s (multiply-adds per second) and
//! the ratio b / a. Passes are timed by the thread's time on a CPU where Linux reports it (on a
//! shared machine, time slices given to other processes do not count), else by the wall clock.
//!
//! A second table does the same for few activation rows (m = 1..16, decode and small batches) and
//! the model's types, to show where the tile kernel starts to pay for unpacking the weights into
//! its panels (below that, `gemm_fn`'s kernel loops over the row dot itself: ratio about 1).
//!
//! `cargo run --release -p kiln-cpu --example gemm_bench [FILTER]` (FILTER: a substring of the case
//! names, e.g. `Q5_0`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kiln_core::GgmlType;
use kiln_cpu::kernels::{gemm_fn, gemv_fn, quantize_fn, simd_level, vec_dot_fn, VecDotFn};

/// (weight type, k): the shapes of the model's matrices of that type.
const CASES: &[(GgmlType, usize)] = &[
    (GgmlType::Q5_0, 640),
    (GgmlType::Q4_K, 1024),
    (GgmlType::Q6_K, 2048),
    (GgmlType::Q8_0, 640),
    (GgmlType::Q4_0, 640),
    (GgmlType::Q5_K, 1024),
    (GgmlType::Q4_1, 640),
    (GgmlType::Q5_1, 640),
    (GgmlType::Q4_K, 2048),
];

/// Weight rows of every case.
const N: usize = 2048;
/// Activation rows of the main table.
const M: usize = 512;
/// Alternating rounds of (a) and (b).
const ROUNDS: usize = 4;
/// Shortest round.
const MIN_ROUND: Duration = Duration::from_millis(300);

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn signed(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `rows` weight rows of `k` elements of `ty`: random floats quantized by kiln-quant.
fn weights(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..rows * k).map(|_| rng.signed()).collect();
    let mut w = vec![0u8; kiln_quant::quantized_size(ty, rows * k).expect("whole blocks")];
    kiln_quant::quantize(ty, &x, &mut w).expect("quantizable type");
    w
}

/// `rows` activation rows of `k` elements for weights of `ty`, quantized.
fn activations(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let act_ty = kiln_quant::vec_dot_type(ty).expect("supported type");
    let row = kiln_quant::activation_bytes(act_ty, k).expect("whole blocks");
    let quantize = quantize_fn(act_ty, simd_level()).expect("activation type");
    let mut a = vec![0u8; rows * row];
    for out in a.chunks_exact_mut(row) {
        let x: Vec<f32> = (0..k).map(|_| rng.signed()).collect();
        quantize(&x, out);
    }
    a
}

/// One pass of the pairwise loop: `out[r * m + c] = dot(row r, activation c)`.
fn pairwise(dot: VecDotFn, k: usize, w: &[u8], a: &[u8], m: usize, out: &mut [f32]) {
    let (w_row, a_row) = (w.len() / N, a.len() / m);
    for (o, wrow) in out.chunks_exact_mut(m).zip(w.chunks_exact(w_row)) {
        for (v, arow) in o.iter_mut().zip(a.chunks_exact(a_row)) {
            *v = dot(black_box(k), wrow, arow);
        }
    }
}

/// Nanoseconds this thread has spent on a CPU (Linux: `/proc/thread-self/schedstat`).
fn on_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// Seconds per call of `f`, called repeatedly for at least `MIN_ROUND` of wall time: the time
/// this thread spent on a CPU where the OS says it (on a shared machine, time slices given to
/// other processes do not count; Linux accounts it in scheduler ticks, hence the long rounds),
/// the wall time otherwise.
fn per_call(f: &mut dyn FnMut()) -> f64 {
    let (start, cpu_start) = (Instant::now(), on_cpu_ns());
    let mut calls = 0u32;
    while calls == 0 || start.elapsed() < MIN_ROUND {
        f();
        calls += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    let seconds = match (cpu_start, on_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 * 1e-9,
        _ => wall,
    };
    seconds / f64::from(calls)
}

/// A GEMM-shaped call: `(k, w, rows, a, cols, out, ldo)`, as `GemmFn` takes it.
type Product<'a> = dyn Fn(usize, &[u8], usize, &[u8], usize, &mut [f32], usize) + 'a;

/// Best seconds per pass of (a) pairwise and (b) gemm over `ROUNDS` alternating rounds, after
/// one warm-up pass each; also checks that both computed the same products.
fn measure(
    ty: GgmlType,
    k: usize,
    m: usize,
    dot: VecDotFn,
    gemm: &Product<'_>,
    rng: &mut Rng,
) -> (f64, f64) {
    let w = weights(ty, N, k, rng);
    let a = activations(ty, m, k, rng);
    let mut by_rows = vec![0f32; N * m];
    let mut by_cols = vec![0f32; N * m];
    let mut run_a = || pairwise(dot, k, &w, &a, m, black_box(&mut by_rows));
    let mut run_b = || gemm(black_box(k), &w, N, &a, m, black_box(&mut by_cols), N);
    let (mut best_a, mut best_b) = (f64::INFINITY, f64::INFINITY);
    run_a();
    run_b();
    for _ in 0..ROUNDS {
        best_a = best_a.min(per_call(&mut run_a));
        best_b = best_b.min(per_call(&mut run_b));
    }
    // Same products up to rounding: a cheap guard against timing a broken kernel.
    for r in (0..N).step_by(97) {
        for c in 0..m {
            let (x, y) = (by_rows[r * m + c], by_cols[c * N + r]);
            assert!(
                (x - y).abs() <= 1e-3 * (1.0 + x.abs()),
                "{ty} k={k} m={m}: row {r} col {c}: {x} vs {y}"
            );
        }
    }
    (best_a, best_b)
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let level = simd_level();
    println!("kiln-cpu quantized GEMM, one thread, SIMD level {level:?}; best of {ROUNDS} alternating rounds of at least {MIN_ROUND:?}");
    println!(
        "{:<22} | {:>10} {:>8} | {:>10} {:>8} | {:>6}",
        "case", "pairs ms", "GMAC/s", "gemm ms", "GMAC/s", "ratio"
    );
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for &(ty, k) in CASES {
        let name = format!("{ty} {N}x{k} m={M}");
        if !name.contains(filter.as_str()) {
            continue;
        }
        let dot = vec_dot_fn(ty, level).expect("supported type");
        let gemm = gemm_fn(ty, level).expect("supported type");
        let (ta, tb) = measure(ty, k, M, dot, &gemm, &mut rng);
        let macs = (N * k * M) as f64 / 1e9;
        println!(
            "{name:<22} | {:>10.2} {:>8.2} | {:>10.2} {:>8.2} | {:>5.2}x",
            ta * 1e3,
            macs / ta,
            tb * 1e3,
            macs / tb,
            ta / tb
        );
    }
    println!();
    println!("few activation rows (decode, small batches):");
    println!(
        "{:<22} | {:>10} {:>8} | {:>10} {:>8} | {:>6}",
        "case", "pairs us", "GMAC/s", "gemm us", "GMAC/s", "ratio"
    );
    for &(ty, k) in &CASES[..5] {
        for m in [1, 2, 4, 8, 16] {
            let name = format!("{ty} {N}x{k} m={m}");
            if !name.contains(filter.as_str()) {
                continue;
            }
            let dot = vec_dot_fn(ty, level).expect("supported type");
            let gemm = gemm_fn(ty, level).expect("supported type");
            let (ta, tb) = measure(ty, k, m, dot, &gemm, &mut rng);
            let macs = (N * k * m) as f64 / 1e9;
            println!(
                "{name:<22} | {:>10.1} {:>8.2} | {:>10.1} {:>8.2} | {:>5.2}x",
                ta * 1e6,
                macs / ta,
                tb * 1e6,
                macs / tb,
                ta / tb
            );
        }
    }
    println!();
    println!("one activation row, the one-row product (`gemv_fn`) where the level has one:");
    println!(
        "{:<22} | {:>10} {:>8} | {:>10} {:>8} | {:>6}",
        "case", "pairs us", "GMAC/s", "gemv us", "GMAC/s", "ratio"
    );
    for &(ty, k) in CASES {
        let name = format!("{ty} {N}x{k} m=1");
        let Some(rows_fn) = gemv_fn(ty, level) else {
            continue;
        };
        if !name.contains(filter.as_str()) {
            continue;
        }
        let dot = vec_dot_fn(ty, level).expect("supported type");
        let gemv =
            |k: usize, w: &[u8], rows: usize, a: &[u8], _: usize, out: &mut [f32], _: usize| {
                rows_fn(k, w, rows, a, out)
            };
        let (ta, tb) = measure(ty, k, 1, dot, &gemv, &mut rng);
        let macs = (N * k) as f64 / 1e9;
        println!(
            "{name:<22} | {:>10.1} {:>8.2} | {:>10.1} {:>8.2} | {:>5.2}x",
            ta * 1e6,
            macs / ta,
            tb * 1e6,
            macs / tb,
            ta / tb
        );
    }
}
