//! The cases: each `pub fn name<B: Backend>(target: &Target<B>)` checks one op (or one promise)
//! of the trait on backends from `target`, panicking with a message that names the case, the
//! shape and the element when a result is wrong. [`crate::suite!`] makes one test of each.

mod attention;
mod elementwise;
mod errors;
mod invariance;
mod matmul;
mod norms;
mod rope;
mod tensors;

pub use attention::{attention, attention_many, long_attention, packed_attention, paged_attention};
pub use elementwise::{activation, add_mul_scale, gated_activation};
pub use errors::shape_errors;
pub use invariance::{
    batch_invariant_attention, batch_invariant_matmul, batch_invariant_packed_attention,
    deterministic,
};
pub use matmul::{
    embedding, matmul_activation, matmul_bf16, matmul_f16, matmul_f32, matmul_gptq, matmul_many,
    matmul_q2_k, matmul_q3_k, matmul_q4_0, matmul_q4_1, matmul_q4_k, matmul_q5_0, matmul_q5_1,
    matmul_q5_k, matmul_q6_k, matmul_q8_0, matmul_q8_k,
};
pub use norms::{add_layer_norm, add_rms_norm, layer_norm, rms_norm};
pub use rope::{rope, rope_is_history_independent};
pub use tensors::{
    gather_rows, kv_cache_round_trip, scatter_add_rows, tensor_round_trip, write_paged_rows,
};
