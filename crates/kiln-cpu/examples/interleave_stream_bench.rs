//! One thread, no pool: the product of one (or a few) activation rows with a weight matrix in
//! the file layout (the tile-exact one-row kernel, `kernels::rows_exact_fn`, or the GEMM for
//! several rows) against the same matrix in the interleaved layout (`kernels::interleaved_gemm_fn`
//! of the best level), with the weights in L2, in L3 and streamed from DRAM: GB/s of weight bytes
//! and the ratio. Separates a kernel's arithmetic rate from what memory gives one thread.
//!
//! `cargo run --release -p kiln-cpu --example interleave_stream_bench [-- TYPE [COLS]]` (TYPE:
//! `q4_k` by default, `q6_k`, `q5_0`, `q8_0`; COLS activation rows, 1 by default)

mod common;

use std::hint::black_box;

use common::time_pass;
use kiln_core::GgmlType;
use kiln_cpu::kernels::{
    activation_terms, gemm_fn, interleave, interleaved_gemm_fn, quantize_fn, rows_exact_fn,
    simd_level,
};

fn main() {
    let ty = match std::env::args().nth(1).as_deref() {
        Some("q6_k") => GgmlType::Q6_K,
        Some("q5_0") => GgmlType::Q5_0,
        Some("q8_0") => GgmlType::Q8_0,
        _ => GgmlType::Q4_K,
    };
    let cols: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let level = simd_level();
    println!("{ty}, {cols} activation row(s), one thread, level {level:?}");
    // In L2, in L3, from DRAM (rows of 2048).
    for rows in [128usize, 1024, 65536] {
        let k = 2048;
        let row_bytes = ty.row_bytes(k as u64).unwrap() as usize;
        // Random bytes with a small finite scale first in every block (`fill_blocks`); the
        // k-quants' `d` (and Q4_K's `dmin`) lie elsewhere: made small and finite too.
        let mut w = vec![0u8; rows * row_bytes];
        common::fill_blocks(&mut w, ty.type_size(), &mut 0x1234_5678u64);
        let k_scales: &[usize] = match ty {
            GgmlType::Q4_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => &[],
        };
        for block in w.chunks_exact_mut(ty.type_size()) {
            for &at in k_scales {
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
        let act = kiln_quant::vec_dot_type(ty).unwrap();
        let act_row = kiln_quant::activation_bytes(act, k).unwrap();
        let x: Vec<f32> = (0..k * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let quantize = quantize_fn(act, level).unwrap();
        let mut a = vec![0u8; act_row * cols];
        for (row, q) in x.chunks_exact(k).zip(a.chunks_exact_mut(act_row)) {
            quantize(row, q);
        }
        let mut out = vec![0f32; rows * cols];
        let file = match rows_exact_fn(ty, level).filter(|_| cols == 1) {
            Some(one_row) => time_pass(|| {
                one_row(black_box(k), &w, rows, &a, &mut out);
                black_box(&out);
            }),
            None => {
                let gemm = gemm_fn(ty, level).unwrap();
                time_pass(|| {
                    gemm(black_box(k), &w, rows, &a, cols, &mut out, rows);
                    black_box(&out);
                })
            }
        };
        let mut il = vec![0u8; w.len()];
        interleave(ty, level, k, &w, &mut il);
        let interleaved = match interleaved_gemm_fn(ty, level) {
            Some(gemm) => {
                let terms = activation_terms(act, &a, cols);
                time_pass(|| {
                    // SAFETY: `out` holds `cols` rows of `rows` outputs, used by nothing else.
                    unsafe {
                        gemm(
                            black_box(k),
                            &il,
                            rows,
                            &a,
                            &terms,
                            cols,
                            out.as_mut_ptr(),
                            rows,
                        )
                    };
                    black_box(&out);
                })
            }
            None => f64::NAN,
        };
        let mb = (rows * row_bytes) as f64 / 1e6;
        println!(
            "{rows:>6} x {k} ({mb:6.1} MB): file layout {:8.3} ms {:5.1} GB/s | interleaved \
             {:8.3} ms {:5.1} GB/s | {:.2}x",
            file * 1e3,
            mb / file / 1e3,
            interleaved * 1e3,
            mb / interleaved / 1e3,
            file / interleaved
        );
    }
}
