//! The interleaved Q8_0 product (`kernels::interleaved_gemm_fn`) against the original layout's
//! VNNI kernels (one-row product, narrow kernel, tile kernel), one thread, weights in cache: ns
//! per 16 rows x 1 block x activation row, for 1, 8 and 64 activation rows.
//!
//! `cargo run --release -p kiln-cpu --example interleave_bench [-- GROUPS]`

mod common;

use std::time::Instant;

use kiln_core::GgmlType;
use kiln_cpu::kernels::{self, SimdLevel};

fn main() {
    let groups: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let (k, rows) = (640, groups * kernels::INTERLEAVE_ROWS);
    let blocks = k / 32;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut w = vec![0u8; rows * blocks * 34];
    common::fill_blocks(&mut w, 34, &mut seed);
    let mut il = vec![0u8; w.len()];
    kernels::interleave_q8_0(k, &w, &mut il);
    let quantize = kernels::quantize_fn(GgmlType::Q8_0, SimdLevel::Avx512Vnni).unwrap();
    let x: Vec<f32> = (0..64 * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut a = vec![0u8; 64 * blocks * 34];
    for (xr, ar) in x.chunks(k).zip(a.chunks_mut(blocks * 34)) {
        quantize(xr, ar);
    }
    let Some(gemm) = kernels::interleaved_gemm_fn(SimdLevel::Avx512Vnni) else {
        println!("no AVX-512 VNNI: nothing to measure");
        return;
    };
    let gemv = kernels::gemv_fn(GgmlType::Q8_0, SimdLevel::Avx512Vnni).unwrap();
    let narrow = kernels::strided_gemm_fn(GgmlType::Q8_0, SimdLevel::Avx512Vnni).unwrap();
    let mut out = vec![0f32; 64 * rows];
    let tile = kernels::gemm_fn(GgmlType::Q8_0, SimdLevel::Avx512Vnni).unwrap();
    let reps = (200_000 / groups).max(10);
    let per = |t: f64, cols: usize| t * 1e9 / (reps * groups * blocks * cols) as f64;
    for cols in [1, 8, 64] {
        let a = &a[..cols * blocks * 34];
        for _ in 0..3 {
            let t0 = Instant::now();
            for _ in 0..reps {
                // SAFETY: `out` holds `cols` rows of `rows` outputs, used by nothing else.
                unsafe { gemm(k, &il, rows, a, cols, out.as_mut_ptr(), rows) };
            }
            let new = per(t0.elapsed().as_secs_f64(), cols);
            let t0 = Instant::now();
            for _ in 0..reps {
                if cols == 1 {
                    gemv(k, &w, rows, a, &mut out[..rows]);
                } else if cols <= 8 {
                    // SAFETY: as above.
                    unsafe { narrow(0, k, &w, rows, a, cols, out.as_mut_ptr(), rows) };
                } else {
                    tile(k, &w, rows, a, cols, &mut out, rows);
                }
            }
            let old = per(t0.elapsed().as_secs_f64(), cols);
            println!("{groups} groups, {cols} activation rows: interleaved {new:6.2} ns, original {old:6.2} ns per 16 rows x block x activation row");
        }
    }
}
