//! The interleaved Q8_0 and Q5_0 products (`kernels::interleaved_gemm_fn`) against the file
//! layout's VNNI kernels (one-row product, narrow kernel, tile kernel), one thread, weights in
//! cache: ns per 16 rows x 1 block x activation row, for 1, 8 and 64 activation rows, rows of
//! 640 (Gemma 3 270M's width).
//!
//! `cargo run --release -p kiln-cpu --example interleave_bench [-- GROUPS]` (groups of 16 rows;
//! 64 by default, 700 KB of Q8_0)

mod common;

use std::time::Instant;

use kiln_core::GgmlType;
use kiln_cpu::kernels::{self, SimdLevel};

fn main() {
    let groups: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(64);
    let (k, rows) = (640, groups * kernels::INTERLEAVE_ROWS);
    let blocks = k / 32;
    let quantize = kernels::quantize_fn(GgmlType::Q8_0, SimdLevel::Avx512Vnni).unwrap();
    let x: Vec<f32> = (0..64 * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut a = vec![0u8; 64 * blocks * 34];
    for (xr, ar) in x.chunks(k).zip(a.chunks_mut(blocks * 34)) {
        quantize(xr, ar);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = vec![0f32; 64 * rows];
    let reps = (200_000 / groups).max(10);
    let per = |t: f64, cols: usize| t * 1e9 / (reps * groups * blocks * cols) as f64;
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
        let Some(gemm) = kernels::interleaved_gemm_fn(ty, SimdLevel::Avx512Vnni) else {
            println!("no AVX-512 VNNI: nothing to measure");
            return;
        };
        let block = ty.type_size();
        let mut w = vec![0u8; rows * blocks * block];
        common::fill_blocks(&mut w, block, &mut seed);
        let mut il = vec![0u8; w.len()];
        kernels::interleave(ty, k, &w, &mut il);
        let gemv = kernels::gemv_fn(ty, SimdLevel::Avx512Vnni).unwrap();
        let narrow = kernels::strided_gemm_fn(ty, SimdLevel::Avx512Vnni).unwrap();
        let tile = kernels::gemm_fn(ty, SimdLevel::Avx512Vnni).unwrap();
        for cols in [1, 8, 64] {
            let a = &a[..cols * blocks * 34];
            let terms = kernels::activation_terms(a);
            let (mut new, mut old) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..3 {
                let t0 = Instant::now();
                for _ in 0..reps {
                    // SAFETY: `out` holds `cols` rows of `rows` outputs, used by nothing else.
                    unsafe { gemm(k, &il, rows, a, &terms, cols, out.as_mut_ptr(), rows) };
                }
                new = new.min(per(t0.elapsed().as_secs_f64(), cols));
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
                old = old.min(per(t0.elapsed().as_secs_f64(), cols));
            }
            println!(
                "{ty} {groups} groups, {cols:2} activation rows: interleaved {new:5.2} ns, file \
                 layout {old:5.2} ns per 16 rows x block x activation row ({:.2}x)",
                old / new
            );
        }
    }
}
