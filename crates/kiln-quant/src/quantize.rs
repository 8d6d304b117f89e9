//! Weight quantization: f32 → any format kiln reads, bit-identical to ggml's reference path.
//!
//! [`quantize`] is what llama.cpp's `ggml_quantize_chunk` does without an importance matrix:
//! `quantize_row_<type>_ref` for the block formats, `ggml_fp32_to_fp16_row` /
//! `ggml_fp32_to_bf16_row_ref` for F16/BF16, a copy for F32. Each block's bytes depend on that
//! block's 32 or 256 inputs only, so the work is split into chunks of whole blocks and run on
//! rayon's pool when the input is large; the output does not depend on the split.
//!
//! Invariants: `src.len()` is a whole number of blocks and `dst` exactly
//! [`quantized_size`]`(ty, src.len())` bytes (both checked, typed errors otherwise); block
//! formats refuse NaN and infinite inputs ([`QuantError::NonFinite`]), for which ggml has no
//! meaningful answer (its debug build aborts in `nearest_int`, its release build writes
//! garbage that llama.cpp's validation then rejects). F16/BF16 convert them as ggml does.

use rayon::prelude::*;

use crate::blocks::{as_bytes, Block};
use crate::cfloat::{fp32_to_bf16, fp32_to_fp16};
use crate::{float, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_k};
use crate::{row_bytes, QuantError};
use kiln_core::GgmlType;

/// Inputs of at least this many elements are quantized in parallel (below it the threads cost
/// more than they save: a 256-element Q4_K block takes a few microseconds).
const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;
/// Elements per parallel task: 32 k-quant super-blocks, 256 legacy blocks.
const CHUNK_ELEMENTS: usize = 1 << 13;

/// The types [`quantize`] writes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
/// Q4_K, Q5_K, Q6_K and Q8_K (every type kiln computes with).
pub fn can_quantize(ty: GgmlType) -> bool {
    ty.is_supported()
}

/// Bytes of `n` elements of `ty`: whole blocks only (`n` a multiple of `ty.block_size()`).
pub fn quantized_size(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    row_bytes(ty, n)
}

/// Quantizes `src` (whole blocks of `ty`; any number of rows laid end to end) into `dst`, which
/// must be exactly [`quantized_size`]`(ty, src.len())` bytes.
///
/// The bytes are those ggml's reference path writes for the same input (`quantize_row_*_ref`,
/// `ggml_fp32_to_fp16_row`, `ggml_fp32_to_bf16_row_ref`): what `llama-quantize` produces without
/// an importance matrix. Large inputs are split across rayon's pool; each block depends only on
/// its own inputs, so the result does not depend on the split. Block formats refuse NaN and
/// infinite inputs with [`QuantError::NonFinite`]; F16 and BF16 convert them as ggml does.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !can_quantize(ty) {
        return Err(QuantError::NotQuantizable(ty));
    }
    let expected = row_bytes(ty, src.len())?;
    if dst.len() != expected {
        return Err(QuantError::LengthMismatch {
            what: "quantized buffer",
            ty,
            elements: src.len(),
            expected,
            actual: dst.len(),
        });
    }
    if ty.block_size() > 1 {
        if let Some((index, &v)) = src.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            let value = match v {
                f32::INFINITY => "inf",
                f32::NEG_INFINITY => "-inf",
                _ => "NaN",
            };
            return Err(QuantError::NonFinite { ty, index, value });
        }
    }
    match ty {
        GgmlType::F32 => float::write_f32(src, dst),
        GgmlType::F16 => convert(src, dst, fp32_to_fp16),
        GgmlType::BF16 => convert(src, dst, fp32_to_bf16),
        GgmlType::Q4_0 => quantize_blocks(src, dst, q4_0::quantize_block),
        GgmlType::Q4_1 => quantize_blocks(src, dst, q4_1::quantize_block),
        GgmlType::Q5_0 => quantize_blocks(src, dst, q5_0::quantize_block),
        GgmlType::Q5_1 => quantize_blocks(src, dst, q5_1::quantize_block),
        GgmlType::Q8_0 => quantize_blocks(src, dst, |x: &[f32; 32]| q8_0::quantize_block(x)),
        GgmlType::Q2_K => quantize_blocks(src, dst, q2_k::quantize_block),
        GgmlType::Q3_K => quantize_blocks(src, dst, q3_k::quantize_block),
        GgmlType::Q4_K => quantize_blocks(src, dst, q4_k::quantize_block),
        GgmlType::Q5_K => quantize_blocks(src, dst, q5_k::quantize_block),
        GgmlType::Q6_K => quantize_blocks(src, dst, q6_k::quantize_block),
        GgmlType::Q8_K => quantize_blocks(src, dst, |x: &[f32; 256]| q8_k::quantize_block(x)),
        other => return Err(QuantError::NotQuantizable(other)),
    }
    Ok(())
}

/// Runs `f` on matching chunks of `src` (`src_chunk` elements) and `dst` (`dst_chunk` bytes, what
/// those elements become), in parallel when the input is large.
fn split<F>(src: &[f32], dst: &mut [u8], src_chunk: usize, dst_chunk: usize, f: F)
where
    F: Fn(&[f32], &mut [u8]) + Sync,
{
    if src.len() < PARALLEL_MIN_ELEMENTS {
        f(src, dst);
    } else {
        src.par_chunks(src_chunk)
            .zip(dst.par_chunks_mut(dst_chunk))
            .for_each(|(s, d)| f(s, d));
    }
}

/// Quantizes whole blocks of `N` elements into `T`s (sizes already checked to agree). `dst` may
/// start at any offset, so each block is written through its bytes.
fn quantize_blocks<T: Block + Send, const N: usize>(
    src: &[f32],
    dst: &mut [u8],
    block: fn(&[f32; N]) -> T,
) {
    let bytes = std::mem::size_of::<T>();
    let per_chunk = (CHUNK_ELEMENTS / N).max(1);
    split(src, dst, per_chunk * N, per_chunk * bytes, |s, d| {
        let (xs, _) = s.as_chunks::<N>();
        for (x, out) in xs.iter().zip(d.chunks_exact_mut(bytes)) {
            out.copy_from_slice(as_bytes(std::slice::from_ref(&block(x))));
        }
    });
}

/// Element-wise conversion to a 16-bit float format, little-endian.
fn convert(src: &[f32], dst: &mut [u8], to_bits: fn(f32) -> u16) {
    split(src, dst, CHUNK_ELEMENTS, 2 * CHUNK_ELEMENTS, |s, d| {
        for (&v, out) in s.iter().zip(d.chunks_exact_mut(2)) {
            out.copy_from_slice(&to_bits(v).to_le_bytes());
        }
    });
}
