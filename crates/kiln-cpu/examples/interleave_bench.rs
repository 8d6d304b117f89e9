//! The interleaved Q8_0, Q5_0, Q4_K and Q6_K products (`kernels::interleaved_gemm_fn`) against
//! the file layout's VNNI kernels (one-row product or row dots, narrow kernel, tile kernel), one
//! thread, weights in cache: ns per 16 rows x 32 elements x activation row, for 1, 8, 64 and 512
//! activation rows, rows of 640 (Q8_0, Q5_0: Gemma 3 270M's width), 1024 (Q4_K: its attention
//! output's) and 2048 (Q6_K: its FFN down projection's).
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
    let level = SimdLevel::Avx512Vnni;
    let rows = groups * kernels::INTERLEAVE_ROWS;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = vec![0f32; 512 * rows];
    for (ty, k) in [
        (GgmlType::Q8_0, 640),
        (GgmlType::Q5_0, 640),
        (GgmlType::Q4_K, 1024),
        (GgmlType::Q6_K, 2048),
    ] {
        let Some(gemm) = kernels::interleaved_gemm_fn(ty, level) else {
            println!("no AVX-512 VNNI: nothing to measure");
            return;
        };
        let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
        let act_row = kiln_quant::activation_bytes(act_ty, k).unwrap();
        let quantize = kernels::quantize_fn(act_ty, level).unwrap();
        let x: Vec<f32> = (0..512 * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut acts = vec![0u8; 512 * act_row];
        for (xr, ar) in x.chunks(k).zip(acts.chunks_mut(act_row)) {
            quantize(xr, ar);
        }
        let mut w = vec![0u8; rows * ty.row_bytes(k as u64).unwrap() as usize];
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            // Quantized from floats: random bytes would give random (often huge) f16 scales.
            let xs: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 104_729) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            kiln_quant::quantize(ty, &xs, &mut w).unwrap();
        } else {
            common::fill_blocks(&mut w, ty.type_size(), &mut seed);
        }
        let mut il = vec![0u8; w.len()];
        kernels::interleave(ty, level, k, &w, &mut il);
        let gemv = kernels::gemv_fn(ty, level);
        let dot = kernels::vec_dot_fn(ty, level).unwrap();
        let narrow = kernels::strided_gemm_fn(ty, level);
        let tile = kernels::gemm_fn(ty, level).unwrap();
        let row_bytes = w.len() / rows;
        for cols in [1, 8, 64, 512] {
            let a = &acts[..cols * act_row];
            let terms = kernels::activation_terms(act_ty, a, cols);
            let reps = (400_000 / (groups * cols)).max(3);
            let per = |t: f64| t * 1e9 / (reps * groups * (k / 32) * cols) as f64;
            let (mut new, mut old) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..3 {
                let t0 = Instant::now();
                for _ in 0..reps {
                    // SAFETY: `out` holds `cols` rows of `rows` outputs, used by nothing else.
                    unsafe { gemm(k, &il, rows, a, &terms, cols, out.as_mut_ptr(), rows) };
                }
                new = new.min(per(t0.elapsed().as_secs_f64()));
                let t0 = Instant::now();
                for _ in 0..reps {
                    // SAFETY (narrow): as above.
                    let done = match (cols, gemv, narrow) {
                        (1, Some(gemv), _) => {
                            gemv(k, &w, rows, a, &mut out[..rows]);
                            true
                        }
                        (1, None, _) => {
                            for (o, wr) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
                                *o = dot(k, wr, a);
                            }
                            true
                        }
                        (2..=8, _, Some(narrow)) => unsafe {
                            narrow(0, k, &w, rows, a, cols, out.as_mut_ptr(), rows)
                        },
                        _ => false,
                    };
                    if !done {
                        tile(k, &w, rows, a, cols, &mut out, rows);
                    }
                }
                old = old.min(per(t0.elapsed().as_secs_f64()));
            }
            println!(
                "{ty} {groups} groups, {cols:3} activation rows: interleaved {new:5.2} ns, file \
                 layout {old:5.2} ns per 16 rows x 32 elements x activation row ({:.2}x)",
                old / new
            );
        }
    }
}
