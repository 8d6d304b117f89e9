//! Quantized-block inputs shared by the kernel tests (`kernels.rs`, `gemm.rs`).

use std::mem::offset_of;

use kiln_core::GgmlType;
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0,
};

/// Every weight type kiln can dot.
pub const WEIGHT_TYPES: [GgmlType; 14] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q8_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// xorshift64*: deterministic, dependency-free randomness.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        2.0 * self.unit() - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A nonzero value in (-magnitude, magnitude).
    pub fn finite(&mut self, magnitude: f32) -> f32 {
        let v = self.signed() * magnitude;
        if v == 0.0 {
            magnitude / 2.0
        } else {
            v
        }
    }
}

/// What a scale field holds, and how to fill it with a finite value.
#[derive(Clone, Copy, PartialEq)]
pub enum Field {
    /// The block's multiplier (`d`).
    ScaleF16,
    /// The block's minimum or its multiplier (`m`, `dmin`).
    MinF16,
    /// The f32 multiplier of Q8_K.
    ScaleF32,
}

/// Offsets of the scale fields of one block of `ty`.
pub fn scale_fields(ty: GgmlType) -> Vec<(usize, Field)> {
    use Field::*;
    match ty {
        GgmlType::Q4_0 => vec![(offset_of!(BlockQ4_0, d), ScaleF16)],
        GgmlType::Q4_1 => vec![
            (offset_of!(BlockQ4_1, d), ScaleF16),
            (offset_of!(BlockQ4_1, m), MinF16),
        ],
        GgmlType::Q5_0 => vec![(offset_of!(BlockQ5_0, d), ScaleF16)],
        GgmlType::Q5_1 => vec![
            (offset_of!(BlockQ5_1, d), ScaleF16),
            (offset_of!(BlockQ5_1, m), MinF16),
        ],
        GgmlType::Q8_0 => vec![(offset_of!(BlockQ8_0, d), ScaleF16)],
        GgmlType::Q2_K => vec![
            (offset_of!(BlockQ2K, d), ScaleF16),
            (offset_of!(BlockQ2K, dmin), MinF16),
        ],
        GgmlType::Q3_K => vec![(offset_of!(BlockQ3K, d), ScaleF16)],
        GgmlType::Q4_K => vec![
            (offset_of!(BlockQ4K, d), ScaleF16),
            (offset_of!(BlockQ4K, dmin), MinF16),
        ],
        GgmlType::Q5_K => vec![
            (offset_of!(BlockQ5K, d), ScaleF16),
            (offset_of!(BlockQ5K, dmin), MinF16),
        ],
        GgmlType::Q6_K => vec![(offset_of!(BlockQ6K, d), ScaleF16)],
        GgmlType::Q8_K => vec![(offset_of!(BlockQ8K, d), ScaleF32)],
        // Every element of a float row is a "scale": all of it is overwritten below.
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Vec::new(),
        other => panic!("no generator for {other}"),
    }
}

pub fn avx2_available(test: &str) -> bool {
    let ok = simd_level().has_avx2();
    if !ok {
        println!("{test}: skipping its AVX2 part, this CPU lacks AVX2+FMA+F16C");
    }
    ok
}

/// Whether the CPU runs the AVX-512 VNNI kernels; says so when a test skips them.
pub fn vnni_available(test: &str) -> bool {
    let ok = simd_level() == SimdLevel::Avx512Vnni;
    if !ok {
        println!("{test}: skipping its VNNI part, this CPU lacks AVX-512 F/BW/VL/VNNI");
    }
    ok
}
