//! Single-threaded throughput of the row-dot kernels on the weight shapes of Gemma 3 270M
//! (Q4_K_M): every row of a matrix dotted with one quantized activation row, the decode pattern.
//!
//! Prints, per matrix, the time of one pass and the weight bytes read per second for the scalar
//! reference (kiln-quant) and the AVX2 kernels, and their ratio.
//!
//! `cargo run --release -p kiln-cpu --example kernel_bench [--avx2-only | --exact] [FILTER]`
//! (FILTER: a substring of the case names, e.g. `Q8_0`; `--avx2-only` skips the slow scalar
//! passes; `--exact` puts batch-invariant mode's one-row product, `kernels::rows_exact_fn` at the
//! AVX2 level, in the first column instead of the scalar reference, where the type has one).

use std::hint::black_box;

mod common;

use common::time_pass;
use kiln_core::GgmlType;
use kiln_cpu::kernels::{
    quantize_fn, rows_exact_fn, simd_level, vec_dot_fn, RowsFn, SimdLevel, VecDotFn,
};

/// (name, weight type, rows, row length).
const CASES: &[(&str, GgmlType, usize, usize)] = &[
    ("Q8_0 output 262144x640", GgmlType::Q8_0, 262_144, 640),
    ("Q5_0 ffn_up 2048x640", GgmlType::Q5_0, 2048, 640),
    ("Q4_K ffn_down 640x2048", GgmlType::Q4_K, 640, 2048),
    ("Q4_K attn_out 640x1024", GgmlType::Q4_K, 640, 1024),
    ("Q6_K ffn_down 640x2048", GgmlType::Q6_K, 640, 2048),
    ("Q5_0 DRAM 65536x2048", GgmlType::Q5_0, 65_536, 2048),
    ("Q4_K DRAM 65536x2048", GgmlType::Q4_K, 65_536, 2048),
    ("Q6_K DRAM 65536x2048", GgmlType::Q6_K, 65_536, 2048),
    ("Q8_0 L2 128x2048", GgmlType::Q8_0, 128, 2048),
    ("Q5_0 L2 128x2048", GgmlType::Q5_0, 128, 2048),
    ("Q4_K L2 128x2048", GgmlType::Q4_K, 128, 2048),
    ("Q6_K L2 128x2048", GgmlType::Q6_K, 128, 2048),
    ("Q8_0 8192x2048", GgmlType::Q8_0, 8192, 2048),
    ("Q5_0 8192x2048", GgmlType::Q5_0, 8192, 2048),
    ("Q4_K 8192x2048", GgmlType::Q4_K, 8192, 2048),
    ("Q6_K 8192x2048", GgmlType::Q6_K, 8192, 2048),
    ("Q4_0 8192x2048", GgmlType::Q4_0, 8192, 2048),
    ("Q4_1 8192x2048", GgmlType::Q4_1, 8192, 2048),
    ("Q5_1 8192x2048", GgmlType::Q5_1, 8192, 2048),
    ("Q2_K 8192x2048", GgmlType::Q2_K, 8192, 2048),
    ("Q3_K 8192x2048", GgmlType::Q3_K, 8192, 2048),
    ("Q5_K 8192x2048", GgmlType::Q5_K, 8192, 2048),
    ("Q8_K 8192x2048", GgmlType::Q8_K, 8192, 2048),
    ("F16 2048x2048", GgmlType::F16, 2048, 2048),
    ("BF16 2048x2048", GgmlType::BF16, 2048, 2048),
    ("F32 2048x2048", GgmlType::F32, 2048, 2048),
];

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

/// Random weight bytes whose f16/f32 scale fields (and float elements) are small finite numbers,
/// so that no kernel meets infinities or NaNs.
fn weights(ty: GgmlType, rows: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
    let mut w: Vec<u8> = (0..rows * row_bytes)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let half = |v: f32| half::f16::from_f32(v).to_le_bytes();
    // Byte offsets of the f16 scale fields within a block, per ggml's layouts.
    let f16_fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    match ty {
        GgmlType::F32 => w
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&rng.signed().to_le_bytes())),
        GgmlType::F16 => w
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&half(rng.signed()))),
        GgmlType::BF16 => w.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&((rng.signed().to_bits() >> 16) as u16).to_le_bytes())
        }),
        GgmlType::Q8_K => w
            .chunks_exact_mut(ty.type_size())
            .for_each(|b| b[..4].copy_from_slice(&(0.01 * rng.signed()).to_le_bytes())),
        _ => w.chunks_exact_mut(ty.type_size()).for_each(|b| {
            for &at in f16_fields {
                b[at..at + 2].copy_from_slice(&half(0.01 * rng.signed()));
            }
        }),
    }
    w
}

/// One pass of the row dot `dot` over every row of `w`.
fn dot_pass(dot: VecDotFn, n: usize, w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
        *o = dot(black_box(n), row, a);
    }
    black_box(&*out);
}

/// One pass of the one-row product `rows` over all of `w`.
fn rows_pass(rows: RowsFn, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let count = out.len();
    rows(black_box(n), w, count, a, out);
    black_box(&*out);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let avx2_only = args.iter().any(|a| a == "--avx2-only");
    let exact = args.iter().any(|a| a == "--exact");
    let filter = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_default();
    println!(
        "kiln-cpu row-dot kernels, one thread, detected SIMD level {:?}",
        simd_level()
    );
    println!(
        "{:<26} {:>9} | {:>10} {:>8} | {:>10} {:>8} | {:>7}",
        "case",
        "MB",
        if exact { "exact ms" } else { "scalar ms" },
        "GB/s",
        "avx2 ms",
        "GB/s",
        "speedup"
    );
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for &(name, ty, rows, n) in CASES {
        if !name.contains(filter.as_str()) {
            continue;
        }
        let row_bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
        let w = weights(ty, rows, n, &mut rng);
        let act_ty = kiln_quant::vec_dot_type(ty).expect("supported type");
        let x: Vec<f32> = (0..n).map(|_| rng.signed()).collect();
        let mut a = vec![0u8; kiln_quant::activation_bytes(act_ty, n).expect("whole blocks")];
        quantize_fn(act_ty, simd_level()).expect("activation type")(&x, &mut a);
        let mut out = vec![0f32; rows];

        let mb = w.len() as f64 / 1e6;
        let mut times = [f64::NAN; 2];
        if exact {
            if let Some(rows_fn) = rows_exact_fn(ty, SimdLevel::Avx2) {
                times[0] = time_pass(|| rows_pass(rows_fn, n, &w, &a, &mut out));
            }
        } else if !avx2_only {
            let dot = vec_dot_fn(ty, SimdLevel::Scalar).expect("supported type");
            times[0] = time_pass(|| dot_pass(dot, n, &w, row_bytes, &a, &mut out));
        }
        let dot = vec_dot_fn(ty, SimdLevel::Avx2).expect("supported type");
        times[1] = time_pass(|| dot_pass(dot, n, &w, row_bytes, &a, &mut out));
        // Skipped measurements print as NaN.
        println!(
            "{:<26} {:>9.1} | {:>10.3} {:>8.2} | {:>10.3} {:>8.2} | {:>6.1}x",
            name,
            mb,
            times[0] * 1e3,
            mb / 1e3 / times[0],
            times[1] * 1e3,
            mb / 1e3 / times[1],
            times[0] / times[1]
        );
    }
}
