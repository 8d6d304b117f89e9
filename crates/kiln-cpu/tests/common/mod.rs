//! Inputs shared by the CPU backend's integration tests (each test file uses part of this).
#![allow(dead_code)]

pub mod quant;

use kiln_backend::{Backend, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuOptions, CpuWeight};

/// Deterministic pseudo-random values in [-1, 1) (xorshift64).
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Every configuration the results must agree across: the scalar kernels on one and three
/// threads, the CPU's SIMD level on one, two and three, and (on an AVX-512 CPU) AVX2 on one and
/// three.
pub fn backends() -> Vec<CpuBackend> {
    let mut v = vec![
        CpuBackend::with_options(&CpuOptions::threads(1).simd_cap(SimdLevel::Scalar)).unwrap(),
        CpuBackend::with_options(&CpuOptions::threads(3).simd_cap(SimdLevel::Scalar)).unwrap(),
    ];
    if simd_level() != SimdLevel::Scalar {
        for threads in 1..=3 {
            v.push(CpuBackend::new(threads).unwrap());
        }
    }
    // Where the CPU has AVX-512, the AVX2 build too: the float kernels of the two levels give
    // the same bits.
    if simd_level() > SimdLevel::Avx2 {
        for threads in [1, 3] {
            let options = CpuOptions::threads(threads).simd_cap(SimdLevel::Avx2);
            v.push(CpuBackend::with_options(&options).unwrap());
        }
    }
    v
}

/// The bytes of `v` as float type `ty` (F32, F16 or BF16), and the f32 values those bytes hold
/// (what a product must use).
pub fn encode(ty: GgmlType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    match ty {
        GgmlType::F32 => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.to_vec()),
        GgmlType::F16 => {
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            (
                h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                h.iter().map(|x| x.to_f32()).collect(),
            )
        }
        GgmlType::BF16 => {
            let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
            (
                h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                h.iter().map(|x| x.to_f32()).collect(),
            )
        }
        _ => panic!("{ty} is not a float type"),
    }
}

/// `bytes` uploaded to `b` as a weight of type `ty` and GGUF dims `dims`.
pub fn upload(
    b: &CpuBackend,
    name: &str,
    ty: GgmlType,
    dims: &[usize],
    bytes: Vec<u8>,
) -> CpuWeight {
    b.upload_weight(&WeightData {
        name: name.into(),
        ty,
        dims: dims.to_vec(),
        bytes: SharedBytes::from_vec(bytes),
    })
    .unwrap()
}

/// `v` uploaded to `b` as a float weight of type `ty`.
pub fn weight(b: &CpuBackend, name: &str, ty: GgmlType, dims: &[usize], v: &[f32]) -> CpuWeight {
    upload(b, name, ty, dims, encode(ty, v).0)
}
