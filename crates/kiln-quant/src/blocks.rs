//! Block layouts of the ggml quantization formats, byte for byte as `ggml-common.h` defines them.
//!
//! Every struct is `#[repr(C)]` with only `u8`/`i8`/`f16`/`f32`/`i16` fields and no padding; the
//! `const` asserts below pin each size to ggml's, so a layout mistake fails the build.
//!
//! Invariants that make the byte views here sound (see [`Block`]):
//! - every bit pattern is a valid value of every field, so any bytes are a valid block;
//! - there is no padding, so every byte of a block is initialized;
//! - multi-byte fields are read in native order, which is little-endian on every target kiln
//!   builds for (the crate refuses big-endian targets), matching GGUF.

use half::f16;
use kiln_core::GgmlType;

use crate::QuantError;

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

mod sealed {
    pub trait Sealed {}
}

/// A ggml block struct of this module: plain old data that may be viewed from raw bytes.
///
/// Sealed: only the structs above implement it, and each is `#[repr(C)]`, padding-free and valid
/// for every bit pattern (module invariants), which is what [`as_blocks`] and [`as_bytes`] rely on.
pub trait Block: sealed::Sealed + Copy + 'static {
    /// The ggml type whose blocks this struct lays out.
    const TYPE: GgmlType;
}

macro_rules! impl_block {
    ($($block:ty => $ty:expr),* $(,)?) => {
        $(
            // A layout mistake (a field of the wrong width, padding) fails the build here.
            const _: () = assert!(std::mem::size_of::<$block>() == $ty.type_size());
            impl sealed::Sealed for $block {}
            impl Block for $block {
                const TYPE: GgmlType = $ty;
            }
        )*
    };
}

impl_block! {
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

/// Views `bytes` as a slice of blocks without copying.
///
/// Fails with [`QuantError::PartialBlock`] when the length is not a multiple of the block size and
/// with [`QuantError::Misaligned`] when the slice does not start on `align_of::<T>()` (2 for the
/// f16-scaled blocks, 4 for Q8_K). GGUF aligns tensor data to 32 bytes, but a row inside a tensor
/// starts wherever the previous row ended, so callers that take rows must be ready for the second
/// error (the dequantizers and dot products of this crate copy in that case).
pub fn as_blocks<T: Block>(bytes: &[u8]) -> Result<&[T], QuantError> {
    let block_bytes = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(block_bytes) {
        return Err(QuantError::PartialBlock {
            ty: T::TYPE,
            bytes: bytes.len(),
            block_bytes,
        });
    }
    let align = std::mem::align_of::<T>();
    let offset = bytes.as_ptr() as usize % align;
    if offset != 0 {
        return Err(QuantError::Misaligned {
            ty: T::TYPE,
            align,
            offset,
        });
    }
    // SAFETY: the pointer is aligned for T (checked above), the length is a whole number of
    // blocks, every bit pattern is a valid T (Block invariant), and the returned slice borrows
    // `bytes`, so the memory stays alive and immutable for its lifetime.
    Ok(
        unsafe {
            std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / block_bytes)
        },
    )
}

/// The bytes of `blocks`, exactly as they would be stored in a GGUF file.
pub fn as_bytes<T: Block>(blocks: &[T]) -> &[u8] {
    // SAFETY: T has no padding (Block invariant), so all `size_of_val(blocks)` bytes are
    // initialized; u8 has alignment 1; the result borrows `blocks`.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

/// Runs `f` on `bytes` viewed as blocks: in place when the slice is aligned, otherwise on a copy
/// read block by block (one allocation; the reference trades that for never failing on a row that
/// starts at an odd offset).
pub(crate) fn with_blocks<T: Block, R>(
    bytes: &[u8],
    f: impl FnOnce(&[T]) -> R,
) -> Result<R, QuantError> {
    match as_blocks::<T>(bytes) {
        Ok(blocks) => Ok(f(blocks)),
        Err(QuantError::Misaligned { .. }) => {
            let copy: Vec<T> = bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(|chunk| {
                    // SAFETY: `chunk` is exactly size_of::<T>() readable bytes; read_unaligned
                    // has no alignment requirement, and any bit pattern is a valid T (Block
                    // invariant).
                    unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<T>()) }
                })
                .collect();
            Ok(f(&copy))
        }
        Err(other) => Err(other),
    }
}
