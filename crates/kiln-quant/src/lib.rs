//! kiln-quant: the ggml quantization formats, as plain scalar Rust.
//!
//! This crate is the *reference*: obviously-correct dequantizers and dot products that every
//! optimized kernel (kiln-cpu's SIMD paths, kiln-vulkan's kernels) is tested against. Speed is not
//! its job.
//!
//! - [`dequantize`] turns a row of any supported type into f32 exactly as ggml's
//!   `dequantize_row_*` does (bit for bit: every value is one f16→f32 widening and at most one
//!   rounded product or sum, evaluated in ggml's order).
//! - [`quantize_activations`] turns f32 activations into [`vec_dot_type`] of a weight type, as
//!   ggml's `quantize_row_q8_0_ref` / `q8_1_ref` / `q8_K_ref`.
//! - [`quantize()`] turns f32 weights into any of those formats exactly as ggml's
//!   `quantize_row_*_ref` does (what `llama-quantize` writes without an importance matrix), bit
//!   for bit, in parallel for large inputs. [`mix`] decides, as `llama-quantize` does, which
//!   type each tensor of a model gets for a mix such as Q4_K_M.
//! - [`vec_dot`] is the integer dot product of ggml's scalar `ggml_vec_dot_<w>_<a>_generic`:
//!   exact integer sums per block, then the same f32 operations in the same order. No fused
//!   multiply-add is used; a C build of ggml that contracts to FMA may differ in the last bits.
//!
//! Each format's formula and bit packing is in its module's documentation. Byte buffers are
//! GGUF's little-endian layout; a row may start at any byte offset (blocks are viewed in place
//! when aligned, copied when not), and no input can make these functions panic.

#[cfg(target_endian = "big")]
compile_error!(
    "kiln-quant views GGUF's little-endian blocks in place and needs a little-endian target"
);

pub mod blocks;
mod cfloat;
mod error;
mod float;
mod lanes;
pub mod mix;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_1;
mod q8_k;
mod quantize;
mod search;

pub use blocks::{as_blocks, as_bytes, Block};
pub use error::QuantError;
use kiln_core::GgmlType;
pub use mix::{plan_types, QuantMix};
pub use quantize::{can_quantize, quantize, quantized_size};

use blocks::{with_blocks, BlockQ8K, BlockQ8_0, BlockQ8_1};
use float::FloatFormat;

/// Dequantizes `dst.len()` elements of type `ty` from `src`, which must hold exactly
/// `dst.len() / block_size` blocks.
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, Q8_K, and Q8_1 (the
/// activation format, so that quantized activations can be inspected).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::UnsupportedType(ty));
    }
    expect_bytes("source", ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => float::dequantize(FloatFormat::F32, src, dst),
        GgmlType::F16 => float::dequantize(FloatFormat::F16, src, dst),
        GgmlType::BF16 => float::dequantize(FloatFormat::BF16, src, dst),
        GgmlType::Q4_0 => dequantize_blocks(src, dst, q4_0::dequantize_block)?,
        GgmlType::Q4_1 => dequantize_blocks(src, dst, q4_1::dequantize_block)?,
        GgmlType::Q5_0 => dequantize_blocks(src, dst, q5_0::dequantize_block)?,
        GgmlType::Q5_1 => dequantize_blocks(src, dst, q5_1::dequantize_block)?,
        GgmlType::Q8_0 => dequantize_blocks(src, dst, q8_0::dequantize_block)?,
        GgmlType::Q8_1 => dequantize_blocks(src, dst, q8_1::dequantize_block)?,
        GgmlType::Q2_K => dequantize_blocks(src, dst, q2_k::dequantize_block)?,
        GgmlType::Q3_K => dequantize_blocks(src, dst, q3_k::dequantize_block)?,
        GgmlType::Q4_K => dequantize_blocks(src, dst, q4_k::dequantize_block)?,
        GgmlType::Q5_K => dequantize_blocks(src, dst, q5_k::dequantize_block)?,
        GgmlType::Q6_K => dequantize_blocks(src, dst, q6_k::dequantize_block)?,
        GgmlType::Q8_K => dequantize_blocks(src, dst, q8_k::dequantize_block)?,
        other => return Err(QuantError::UnsupportedType(other)),
    }
    Ok(())
}

/// The activation format the dot product of weights of type `ty` consumes (ggml's
/// `vec_dot_type`, except that float weights take f32 activations):
/// Q4_0, Q5_0, Q8_0 → Q8_0; Q4_1, Q5_1 → Q8_1; Q2_K..Q6_K, Q8_K → Q8_K; F32, F16, BF16 → F32.
pub fn vec_dot_type(ty: GgmlType) -> Result<GgmlType, QuantError> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => Ok(F32),
        Q4_0 | Q5_0 | Q8_0 => Ok(Q8_0),
        Q4_1 | Q5_1 => Ok(Q8_1),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => Ok(Q8_K),
        other => Err(QuantError::UnsupportedType(other)),
    }
}

/// Bytes [`quantize_activations`] writes for `n` elements of `act_ty` (Q8_0, Q8_1, Q8_K or F32).
pub fn activation_bytes(act_ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    if !is_activation_type(act_ty) {
        return Err(QuantError::UnsupportedActivation(act_ty));
    }
    row_bytes(act_ty, n)
}

/// Quantizes activations `x` into `act_ty`, writing exactly `activation_bytes(act_ty, x.len())`
/// bytes to `dst`: Q8_0, Q8_1 and Q8_K as ggml's reference quantizers (same rounding, same
/// scales, Q8_1 block sums and Q8_K group sums), F32 as plain little-endian floats.
pub fn quantize_activations(act_ty: GgmlType, x: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let expected = activation_bytes(act_ty, x.len())?;
    if dst.len() != expected {
        return Err(QuantError::LengthMismatch {
            what: "activation buffer",
            ty: act_ty,
            elements: x.len(),
            expected,
            actual: dst.len(),
        });
    }
    match act_ty {
        GgmlType::F32 => float::write_f32(x, dst),
        GgmlType::Q8_0 => quantize_blocks::<BlockQ8_0>(x, dst, q8_0::quantize_block),
        GgmlType::Q8_1 => quantize_blocks::<BlockQ8_1>(x, dst, q8_1::quantize_block),
        GgmlType::Q8_K => quantize_blocks::<BlockQ8K>(x, dst, q8_k::quantize_block),
        other => return Err(QuantError::UnsupportedActivation(other)),
    }
    Ok(())
}

/// Dot product of one weight row (`n` elements of type `ty`, bytes `w`) with activations `act`
/// already in `vec_dot_type(ty)` (as written by [`quantize_activations`]; the k-quants read the
/// Q8_K group sums and the `_1` formats the Q8_1 block sums, which must therefore be consistent
/// with the codes).
///
/// Computed as ggml's scalar dot for the pair: integer sums per block, then scaled in f32. For
/// F32/F16/BF16 weights `act` is f32 bytes; products are rounded to f32 and summed in f64.
/// Q8_K · Q8_K (which ggml lacks) is an exact integer sum per block scaled by `d_w * d_a`.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    let act_ty = vec_dot_type(ty)?;
    expect_bytes("weights", ty, n, w.len())?;
    expect_bytes("activations", act_ty, n, act.len())?;
    match ty {
        GgmlType::F32 => Ok(float::vec_dot(FloatFormat::F32, w, act)),
        GgmlType::F16 => Ok(float::vec_dot(FloatFormat::F16, w, act)),
        GgmlType::BF16 => Ok(float::vec_dot(FloatFormat::BF16, w, act)),
        GgmlType::Q4_0 => dot_blocks(w, act, q4_0::vec_dot),
        GgmlType::Q4_1 => dot_blocks(w, act, q4_1::vec_dot),
        GgmlType::Q5_0 => dot_blocks(w, act, q5_0::vec_dot),
        GgmlType::Q5_1 => dot_blocks(w, act, q5_1::vec_dot),
        GgmlType::Q8_0 => dot_blocks(w, act, q8_0::vec_dot),
        GgmlType::Q2_K => dot_blocks(w, act, q2_k::vec_dot),
        GgmlType::Q3_K => dot_blocks(w, act, q3_k::vec_dot),
        GgmlType::Q4_K => dot_blocks(w, act, q4_k::vec_dot),
        GgmlType::Q5_K => dot_blocks(w, act, q5_k::vec_dot),
        GgmlType::Q6_K => dot_blocks(w, act, q6_k::vec_dot),
        GgmlType::Q8_K => dot_blocks(w, act, q8_k::vec_dot),
        other => Err(QuantError::UnsupportedType(other)),
    }
}

fn can_dequantize(ty: GgmlType) -> bool {
    ty == GgmlType::Q8_1 || vec_dot_type(ty).is_ok()
}

fn is_activation_type(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32 | GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K
    )
}

/// Bytes of `n` elements of `ty`, refusing partial blocks and sizes beyond `usize`.
fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    let block_size = ty.block_size();
    if !n.is_multiple_of(block_size) {
        return Err(QuantError::NotBlockAligned {
            ty,
            elements: n,
            block_size,
        });
    }
    (n / block_size)
        .checked_mul(ty.type_size())
        .ok_or(QuantError::TooLarge { ty, elements: n })
}

fn expect_bytes(
    what: &'static str,
    ty: GgmlType,
    n: usize,
    actual: usize,
) -> Result<(), QuantError> {
    let expected = row_bytes(ty, n)?;
    if actual != expected {
        return Err(QuantError::LengthMismatch {
            what,
            ty,
            elements: n,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Dequantizes whole blocks; the caller has checked that `src` holds `dst.len() / N` blocks.
fn dequantize_blocks<T: Block, const N: usize>(
    src: &[u8],
    dst: &mut [f32],
    block: fn(&T) -> [f32; N],
) -> Result<(), QuantError> {
    with_blocks(src, |blocks: &[T]| {
        for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(N)) {
            out.copy_from_slice(&block(b));
        }
    })
}

/// Quantizes whole blocks; the caller has checked the sizes. `dst` may start at any offset, so
/// each block is written through its bytes.
fn quantize_blocks<T: Block>(x: &[f32], dst: &mut [u8], block: fn(&[f32]) -> T) {
    let elements = T::TYPE.block_size();
    let bytes = std::mem::size_of::<T>();
    for (xs, out) in x.chunks_exact(elements).zip(dst.chunks_exact_mut(bytes)) {
        out.copy_from_slice(as_bytes(std::slice::from_ref(&block(xs))));
    }
}

/// Runs a block dot product on weight and activation bytes (sizes already checked to agree).
fn dot_blocks<W: Block, A: Block>(
    w: &[u8],
    act: &[u8],
    dot: fn(&[W], &[A]) -> f32,
) -> Result<f32, QuantError> {
    with_blocks(w, |wb: &[W]| with_blocks(act, |ab: &[A]| dot(wb, ab)))?
}
