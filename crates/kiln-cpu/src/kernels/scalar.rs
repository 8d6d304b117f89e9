//! The scalar level: plain `fn` wrappers over kiln-quant's reference dot and quantizer, one per
//! type (a `fn` pointer cannot carry the type as data).
//!
//! The reference returns a `Result` for bad lengths; here that is a broken caller contract (the
//! matmul driver validates shapes once per op), so it panics with the reference's message.
//!
//! The scalar GEMM of each type is the loop of its reference dot (`gemm::dot_loop`): the
//! definition the tile kernels are tested against.

use kiln_core::GgmlType;
use kiln_quant::QuantError;

use super::{gemm, GemmFn, QuantizeFn, VecDotFn};

macro_rules! reference_dots {
    ($($name:ident, $gemm:ident => $ty:ident),* $(,)?) => {
        $(
            fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
                match kiln_quant::vec_dot(GgmlType::$ty, n, w, a) {
                    Ok(dot) => dot,
                    Err(e) => panic!("{} row dot of {n} elements: {e}", GgmlType::$ty),
                }
            }

            fn $gemm(
                k: usize,
                w: &[u8],
                rows: usize,
                a: &[u8],
                cols: usize,
                out: &mut [f32],
                ldo: usize,
            ) {
                gemm::dot_loop(GgmlType::$ty, $name, k, w, rows, a, cols, out, ldo)
            }
        )*

        fn reference_dot(ty: GgmlType) -> Option<VecDotFn> {
            match ty {
                $(GgmlType::$ty => Some($name),)*
                _ => None,
            }
        }

        fn reference_gemm(ty: GgmlType) -> Option<GemmFn> {
            match ty {
                $(GgmlType::$ty => Some($gemm),)*
                _ => None,
            }
        }
    };
}

reference_dots! {
    dot_f32, gemm_f32 => F32,
    dot_f16, gemm_f16 => F16,
    dot_bf16, gemm_bf16 => BF16,
    dot_q4_0, gemm_q4_0 => Q4_0,
    dot_q4_1, gemm_q4_1 => Q4_1,
    dot_q5_0, gemm_q5_0 => Q5_0,
    dot_q5_1, gemm_q5_1 => Q5_1,
    dot_q8_0, gemm_q8_0 => Q8_0,
    dot_q2_k, gemm_q2_k => Q2_K,
    dot_q3_k, gemm_q3_k => Q3_K,
    dot_q4_k, gemm_q4_k => Q4_K,
    dot_q5_k, gemm_q5_k => Q5_K,
    dot_q6_k, gemm_q6_k => Q6_K,
    dot_q8_k, gemm_q8_k => Q8_K,
}

macro_rules! reference_quantizers {
    ($($name:ident => $ty:ident),* $(,)?) => {
        $(
            fn $name(x: &[f32], dst: &mut [u8]) {
                if let Err(e) = kiln_quant::quantize_activations(GgmlType::$ty, x, dst) {
                    panic!("{} quantization of {} activations: {e}", GgmlType::$ty, x.len());
                }
            }
        )*

        fn reference_quantizer(ty: GgmlType) -> Option<QuantizeFn> {
            match ty {
                $(GgmlType::$ty => Some($name),)*
                _ => None,
            }
        }
    };
}

reference_quantizers! {
    quantize_f32 => F32,
    quantize_q8_0 => Q8_0,
    quantize_q8_1 => Q8_1,
    quantize_q8_k => Q8_K,
}

/// The reference dot for weights of type `ty`.
pub(super) fn vec_dot_fn(ty: GgmlType) -> Result<VecDotFn, QuantError> {
    // kiln-quant decides which types it can dot; this table only names a `fn` for each of them.
    kiln_quant::vec_dot_type(ty)?;
    reference_dot(ty).ok_or(QuantError::UnsupportedType(ty))
}

/// The loop of the reference dot for weights of type `ty`.
pub(super) fn gemm_fn(ty: GgmlType) -> Result<GemmFn, QuantError> {
    kiln_quant::vec_dot_type(ty)?;
    reference_gemm(ty).ok_or(QuantError::UnsupportedType(ty))
}

/// The reference quantizer for activations of type `act_ty`.
pub(super) fn quantize_fn(act_ty: GgmlType) -> Result<QuantizeFn, QuantError> {
    kiln_quant::activation_bytes(act_ty, 0)?;
    reference_quantizer(act_ty).ok_or(QuantError::UnsupportedActivation(act_ty))
}
