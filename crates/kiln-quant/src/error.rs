//! Errors of kiln-quant: every failure names the type and the sizes involved.

use kiln_core::GgmlType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// A weight type kiln has no dequantizer or dot product for (IQ*, TQ*, MXFP4, integer types,
    /// and Q8_1, which exists only as an activation format).
    #[error(
        "{0} is not supported (kiln computes with F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, \
         Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K)"
    )]
    UnsupportedType(GgmlType),

    /// `quantize_activations` / `activation_bytes` asked for a type that is not an activation
    /// format.
    #[error("{0} is not an activation format (expected Q8_0, Q8_1, Q8_K or F32)")]
    UnsupportedActivation(GgmlType),

    /// [`crate::quantize()`] asked for a type it cannot write.
    #[error(
        "kiln cannot quantize to {0} (it writes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, \
         Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K)"
    )]
    NotQuantizable(GgmlType),

    /// A NaN or infinite input to a block quantizer (which has no meaningful code for it).
    #[error("cannot quantize to {ty}: element {index} is {value}")]
    NonFinite {
        ty: GgmlType,
        index: usize,
        /// "NaN", "inf" or "-inf".
        value: &'static str,
    },

    /// A quantization mix name that [`crate::mix::QuantMix`] does not know.
    #[error(
        "unknown quantization type {0:?} (expected one of q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, \
         q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, f16, bf16)"
    )]
    UnknownMix(String),

    /// A tensor of a mixture-of-experts model whose layer the mix rules cannot tell.
    #[error("cannot place tensor {tensor} in a layer: {reason}")]
    MixLayer { tensor: String, reason: String },

    /// An element count that does not fill whole blocks.
    #[error("{elements} elements of {ty} is not a whole number of {block_size}-element blocks")]
    NotBlockAligned {
        ty: GgmlType,
        elements: usize,
        block_size: usize,
    },

    /// A byte buffer whose length does not match the element count.
    #[error("{what}: {elements} elements of {ty} take {expected} bytes, got {actual}")]
    LengthMismatch {
        what: &'static str,
        ty: GgmlType,
        elements: usize,
        expected: usize,
        actual: usize,
    },

    /// A byte buffer that ends inside a block.
    #[error("{bytes} bytes is not a whole number of {ty} blocks ({block_bytes} bytes each)")]
    PartialBlock {
        ty: GgmlType,
        bytes: usize,
        block_bytes: usize,
    },

    /// A byte buffer that cannot be viewed in place as blocks because of where it starts.
    /// Only [`crate::as_blocks`] reports this; the dequantizers and dot products copy instead.
    #[error("{ty} blocks need {align}-byte alignment; the slice starts {offset} bytes past it")]
    Misaligned {
        ty: GgmlType,
        align: usize,
        offset: usize,
    },

    /// An element count whose byte size does not fit in `usize`.
    #[error("{elements} elements of {ty} do not fit in memory")]
    TooLarge { ty: GgmlType, elements: usize },
}
