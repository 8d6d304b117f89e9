//! Block layouts of the ggml quantization formats, byte for byte as `ggml-common.h` defines them.
//!
//! Every struct is `#[repr(C)]` with only `u8`/`i8`/`f16`/`f32`/`i16` fields and no padding; the
//! `const` asserts below pin each size to ggml's, so a layout mistake fails the build.

use half::f16;
use kiln_core::GgmlType;

pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
pub use kiln_core::QK_K;
/// Bytes of packed 6-bit scales/mins in Q4_K and Q5_K super-blocks.
pub const K_SCALE_SIZE: usize = 12;

/// 32 weights: `w = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: f16,
    /// Low nibbles hold elements 0..16, high nibbles 16..32.
    pub qs: [u8; QK4_0 / 2],
}

/// 32 weights: `w = d * q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK4_1 / 2],
}

/// 32 weights: `w = d * (q - 16)`, q 5 bits: low 4 in `qs`, 5th bit in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}

/// 32 weights: `w = d * q + m`, q 5 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}

/// 32 weights: `w = d * q`, q signed 8 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}

/// 32 activations: `x = d * q`, plus `s = d * sum(q)` (used against the `_1` formats' minimum).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK8_1],
}

/// 256 weights in 16 sub-blocks of 16: 2-bit quants, 4-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: min, per sub-block.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// 256 weights in 16 sub-blocks of 16: 3-bit quants (2 low bits + high-bit mask), 6-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}

/// 256 weights in 8 sub-blocks of 32: 4-bit quants, 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 8 sub-blocks of 32: 5-bit quants, 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 16 sub-blocks of 16: 6-bit quants (4 low bits + 2 high bits), 8-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// 256 activations: `x = d * q`, with the sums of each group of 16 quants precomputed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

macro_rules! assert_layout {
    ($($block:ty => $ty:expr),* $(,)?) => {
        $(const _: () = assert!(std::mem::size_of::<$block>() == $ty.type_size());)*
    };
}

assert_layout! {
    BlockQ4_0 => GgmlType::Q4_0,
    BlockQ4_1 => GgmlType::Q4_1,
    BlockQ5_0 => GgmlType::Q5_0,
    BlockQ5_1 => GgmlType::Q5_1,
    BlockQ8_0 => GgmlType::Q8_0,
    BlockQ8_1 => GgmlType::Q8_1,
    BlockQ2K => GgmlType::Q2_K,
    BlockQ3K => GgmlType::Q3_K,
    BlockQ4K => GgmlType::Q4_K,
    BlockQ5K => GgmlType::Q5_K,
    BlockQ6K => GgmlType::Q6_K,
    BlockQ8K => GgmlType::Q8_K,
}
