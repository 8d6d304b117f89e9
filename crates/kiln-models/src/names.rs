//! Tensor names by role: one table per family, as llama.cpp's `LLM_TENSOR_NAMES` maps tensor
//! roles to file names.
//!
//! Model code asks for a tensor by its [`Role`] (and layer, and expert); only these tables know
//! how a file spells it. Each entry gives the name GGUF files use (llama.cpp's names, the same
//! for every architecture) and the name Hugging Face checkpoints use (the family's own).
//!
//! Invariants:
//! - a name is a pattern without its suffix: `{i}` is the layer, `{e}` the expert; the loader
//!   appends `.weight`, `.bias`, ... (and, for a checkpoint, puts the exporter's prefix before);
//! - a role missing from a family's table, or with no name in a format, is a tensor files of
//!   that family and format do not have;
//! - an `optional` role is one a model of the family may lack (it then does without: tied
//!   output, QK-norm, sandwich norms, a fused matrix instead of separate ones); every other role
//!   a model loads is required, and its absence is an error naming the tensor as the file would.
//! - GGUF stacks a layer's experts in one 3-D tensor (its pattern has no `{e}`); Hugging Face
//!   stores one tensor per expert.

/// What a tensor is in the model, whatever the file calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Token embedding table.
    TokenEmbd,
    /// Absolute position embedding table (BERT).
    PosEmbd,
    /// Token type embedding table (BERT).
    TypeEmbd,
    /// Layer norm over the embeddings (encoders).
    EmbdNorm,
    /// Final norm.
    OutputNorm,
    /// Output matrix (absent when tied to the token embeddings).
    Output,
    /// Norm before attention.
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    /// Q, K and V fused in one matrix, in that order.
    AttnQkv,
    /// QK-norm of queries and keys.
    AttnQNorm,
    AttnKNorm,
    /// Attention output projection.
    AttnOut,
    /// Post-norm after the attention residual (BERT).
    AttnOutNorm,
    /// Sandwich norm of the attention's output (Gemma).
    PostAttnNorm,
    /// Norm before the FFN.
    FfnNorm,
    FfnGate,
    FfnUp,
    /// Gate and up fused in one matrix, gate first (Phi-3's Hugging Face `gate_up_proj`).
    FfnGateUp,
    FfnDown,
    /// Sandwich norm of the FFN's output (Gemma).
    PostFfnNorm,
    /// Post-norm after the FFN residual (BERT).
    LayerOutNorm,
    /// Mixture-of-experts router.
    FfnGateInp,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    /// The shared expert's gate: one row, `sigmoid(x · w)` scales its output (Qwen2-MoE).
    FfnGateInpShexp,
    /// The shared expert's gated FFN (Qwen2-MoE).
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
}

/// How the files of a family name one role.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub role: Role,
    pub gguf: Option<&'static str>,
    pub hf: Option<&'static str>,
    pub optional: bool,
}

/// The names of one family's tensors.
#[derive(Debug)]
pub(crate) struct NameTable {
    pub family: &'static str,
    entries: &'static [Entry],
    /// The family's Hugging Face checkpoints store RMSNorm weights as `w` for a scale of
    /// `1 + w` (Gemma); its GGUFs store `1 + w` (the converter adds the 1), as kiln computes.
    pub hf_norm_plus_one: bool,
}

impl NameTable {
    /// How this family names `role`, `None` when its models have no such tensor.
    pub(crate) fn entry(&self, role: Role) -> Option<&'static Entry> {
        self.entries.iter().find(|e| e.role == role)
    }
}

/// A required role.
const fn req(role: Role, gguf: &'static str, hf: &'static str) -> Entry {
    Entry {
        role,
        gguf: Some(gguf),
        hf: Some(hf),
        optional: false,
    }
}

/// An optional role.
const fn opt(role: Role, gguf: Option<&'static str>, hf: Option<&'static str>) -> Entry {
    Entry {
        role,
        gguf,
        hf,
        optional: true,
    }
}

/// Llama, Mistral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE and Phi-3 (`qkv_proj`, `gate_up_proj`; its GGUFs
/// fuse gate and up in `ffn_up`).
pub(crate) static LLAMA: NameTable = NameTable {
    family: "llama",
    hf_norm_plus_one: false,
    entries: &[
        req(Role::TokenEmbd, "token_embd", "model.embed_tokens"),
        req(Role::OutputNorm, "output_norm", "model.norm"),
        opt(Role::Output, Some("output"), Some("lm_head")),
        req(
            Role::AttnNorm,
            "blk.{i}.attn_norm",
            "model.layers.{i}.input_layernorm",
        ),
        req(
            Role::AttnQ,
            "blk.{i}.attn_q",
            "model.layers.{i}.self_attn.q_proj",
        ),
        req(
            Role::AttnK,
            "blk.{i}.attn_k",
            "model.layers.{i}.self_attn.k_proj",
        ),
        req(
            Role::AttnV,
            "blk.{i}.attn_v",
            "model.layers.{i}.self_attn.v_proj",
        ),
        opt(
            Role::AttnQkv,
            Some("blk.{i}.attn_qkv"),
            Some("model.layers.{i}.self_attn.qkv_proj"),
        ),
        opt(
            Role::AttnQNorm,
            Some("blk.{i}.attn_q_norm"),
            Some("model.layers.{i}.self_attn.q_norm"),
        ),
        opt(
            Role::AttnKNorm,
            Some("blk.{i}.attn_k_norm"),
            Some("model.layers.{i}.self_attn.k_norm"),
        ),
        req(
            Role::AttnOut,
            "blk.{i}.attn_output",
            "model.layers.{i}.self_attn.o_proj",
        ),
        req(
            Role::FfnNorm,
            "blk.{i}.ffn_norm",
            "model.layers.{i}.post_attention_layernorm",
        ),
        req(
            Role::FfnGate,
            "blk.{i}.ffn_gate",
            "model.layers.{i}.mlp.gate_proj",
        ),
        req(
            Role::FfnUp,
            "blk.{i}.ffn_up",
            "model.layers.{i}.mlp.up_proj",
        ),
        opt(
            Role::FfnGateUp,
            None,
            Some("model.layers.{i}.mlp.gate_up_proj"),
        ),
        req(
            Role::FfnDown,
            "blk.{i}.ffn_down",
            "model.layers.{i}.mlp.down_proj",
        ),
        req(
            Role::FfnGateInp,
            "blk.{i}.ffn_gate_inp",
            "model.layers.{i}.mlp.gate",
        ),
        req(
            Role::FfnGateExps,
            "blk.{i}.ffn_gate_exps",
            "model.layers.{i}.mlp.experts.{e}.gate_proj",
        ),
        req(
            Role::FfnUpExps,
            "blk.{i}.ffn_up_exps",
            "model.layers.{i}.mlp.experts.{e}.up_proj",
        ),
        req(
            Role::FfnDownExps,
            "blk.{i}.ffn_down_exps",
            "model.layers.{i}.mlp.experts.{e}.down_proj",
        ),
        req(
            Role::FfnGateInpShexp,
            "blk.{i}.ffn_gate_inp_shexp",
            "model.layers.{i}.mlp.shared_expert_gate",
        ),
        req(
            Role::FfnGateShexp,
            "blk.{i}.ffn_gate_shexp",
            "model.layers.{i}.mlp.shared_expert.gate_proj",
        ),
        req(
            Role::FfnUpShexp,
            "blk.{i}.ffn_up_shexp",
            "model.layers.{i}.mlp.shared_expert.up_proj",
        ),
        req(
            Role::FfnDownShexp,
            "blk.{i}.ffn_down_shexp",
            "model.layers.{i}.mlp.shared_expert.down_proj",
        ),
    ],
};

/// Mixtral: Llama's names, but `block_sparse_moe.gate` and `block_sparse_moe.experts.E.w1/w3/w2`.
pub(crate) static MIXTRAL: NameTable = NameTable {
    family: "mixtral",
    hf_norm_plus_one: false,
    entries: &[
        req(Role::TokenEmbd, "token_embd", "model.embed_tokens"),
        req(Role::OutputNorm, "output_norm", "model.norm"),
        opt(Role::Output, Some("output"), Some("lm_head")),
        req(
            Role::AttnNorm,
            "blk.{i}.attn_norm",
            "model.layers.{i}.input_layernorm",
        ),
        req(
            Role::AttnQ,
            "blk.{i}.attn_q",
            "model.layers.{i}.self_attn.q_proj",
        ),
        req(
            Role::AttnK,
            "blk.{i}.attn_k",
            "model.layers.{i}.self_attn.k_proj",
        ),
        req(
            Role::AttnV,
            "blk.{i}.attn_v",
            "model.layers.{i}.self_attn.v_proj",
        ),
        req(
            Role::AttnOut,
            "blk.{i}.attn_output",
            "model.layers.{i}.self_attn.o_proj",
        ),
        req(
            Role::FfnNorm,
            "blk.{i}.ffn_norm",
            "model.layers.{i}.post_attention_layernorm",
        ),
        req(
            Role::FfnGateInp,
            "blk.{i}.ffn_gate_inp",
            "model.layers.{i}.block_sparse_moe.gate",
        ),
        req(
            Role::FfnGateExps,
            "blk.{i}.ffn_gate_exps",
            "model.layers.{i}.block_sparse_moe.experts.{e}.w1",
        ),
        req(
            Role::FfnUpExps,
            "blk.{i}.ffn_up_exps",
            "model.layers.{i}.block_sparse_moe.experts.{e}.w3",
        ),
        req(
            Role::FfnDownExps,
            "blk.{i}.ffn_down_exps",
            "model.layers.{i}.block_sparse_moe.experts.{e}.w2",
        ),
    ],
};

/// Gemma 3 (text): Llama's block names plus QK-norm and the sandwich norms; the output is tied to
/// the embeddings. Hugging Face: `Gemma3ForCausalLM`'s names (the text model of a
/// `Gemma3ForConditionalGeneration` checkpoint has them under a prefix, see the loader).
pub(crate) static GEMMA3: NameTable = NameTable {
    family: "gemma3",
    hf_norm_plus_one: true,
    entries: &[
        req(Role::TokenEmbd, "token_embd", "model.embed_tokens"),
        req(Role::OutputNorm, "output_norm", "model.norm"),
        opt(Role::Output, Some("output"), Some("lm_head")),
        req(
            Role::AttnNorm,
            "blk.{i}.attn_norm",
            "model.layers.{i}.input_layernorm",
        ),
        req(
            Role::AttnQ,
            "blk.{i}.attn_q",
            "model.layers.{i}.self_attn.q_proj",
        ),
        req(
            Role::AttnK,
            "blk.{i}.attn_k",
            "model.layers.{i}.self_attn.k_proj",
        ),
        req(
            Role::AttnV,
            "blk.{i}.attn_v",
            "model.layers.{i}.self_attn.v_proj",
        ),
        opt(
            Role::AttnQNorm,
            Some("blk.{i}.attn_q_norm"),
            Some("model.layers.{i}.self_attn.q_norm"),
        ),
        opt(
            Role::AttnKNorm,
            Some("blk.{i}.attn_k_norm"),
            Some("model.layers.{i}.self_attn.k_norm"),
        ),
        req(
            Role::AttnOut,
            "blk.{i}.attn_output",
            "model.layers.{i}.self_attn.o_proj",
        ),
        opt(
            Role::PostAttnNorm,
            Some("blk.{i}.post_attention_norm"),
            Some("model.layers.{i}.post_attention_layernorm"),
        ),
        req(
            Role::FfnNorm,
            "blk.{i}.ffn_norm",
            "model.layers.{i}.pre_feedforward_layernorm",
        ),
        req(
            Role::FfnGate,
            "blk.{i}.ffn_gate",
            "model.layers.{i}.mlp.gate_proj",
        ),
        req(
            Role::FfnUp,
            "blk.{i}.ffn_up",
            "model.layers.{i}.mlp.up_proj",
        ),
        req(
            Role::FfnDown,
            "blk.{i}.ffn_down",
            "model.layers.{i}.mlp.down_proj",
        ),
        opt(
            Role::PostFfnNorm,
            Some("blk.{i}.post_ffw_norm"),
            Some("model.layers.{i}.post_feedforward_layernorm"),
        ),
    ],
};

/// BERT and (XLM-)RoBERTa.
pub(crate) static BERT: NameTable = NameTable {
    family: "bert",
    hf_norm_plus_one: false,
    entries: &[
        req(Role::TokenEmbd, "token_embd", "embeddings.word_embeddings"),
        req(
            Role::PosEmbd,
            "position_embd",
            "embeddings.position_embeddings",
        ),
        req(
            Role::TypeEmbd,
            "token_types",
            "embeddings.token_type_embeddings",
        ),
        req(Role::EmbdNorm, "token_embd_norm", "embeddings.LayerNorm"),
        req(
            Role::AttnQ,
            "blk.{i}.attn_q",
            "encoder.layer.{i}.attention.self.query",
        ),
        req(
            Role::AttnK,
            "blk.{i}.attn_k",
            "encoder.layer.{i}.attention.self.key",
        ),
        req(
            Role::AttnV,
            "blk.{i}.attn_v",
            "encoder.layer.{i}.attention.self.value",
        ),
        req(
            Role::AttnOut,
            "blk.{i}.attn_output",
            "encoder.layer.{i}.attention.output.dense",
        ),
        req(
            Role::AttnOutNorm,
            "blk.{i}.attn_output_norm",
            "encoder.layer.{i}.attention.output.LayerNorm",
        ),
        req(
            Role::FfnUp,
            "blk.{i}.ffn_up",
            "encoder.layer.{i}.intermediate.dense",
        ),
        req(
            Role::FfnDown,
            "blk.{i}.ffn_down",
            "encoder.layer.{i}.output.dense",
        ),
        req(
            Role::LayerOutNorm,
            "blk.{i}.layer_output_norm",
            "encoder.layer.{i}.output.LayerNorm",
        ),
    ],
};

/// ModernBERT: fused `Wqkv`, fused `Wi` (the activated half first, then the gate), pre-norms.
/// The first layer has no attention norm.
pub(crate) static MODERNBERT: NameTable = NameTable {
    family: "modernbert",
    hf_norm_plus_one: false,
    entries: &[
        req(Role::TokenEmbd, "token_embd", "embeddings.tok_embeddings"),
        req(Role::EmbdNorm, "token_embd_norm", "embeddings.norm"),
        opt(
            Role::AttnNorm,
            Some("blk.{i}.attn_norm"),
            Some("layers.{i}.attn_norm"),
        ),
        req(Role::AttnQkv, "blk.{i}.attn_qkv", "layers.{i}.attn.Wqkv"),
        req(Role::AttnOut, "blk.{i}.attn_output", "layers.{i}.attn.Wo"),
        req(Role::FfnNorm, "blk.{i}.ffn_norm", "layers.{i}.mlp_norm"),
        req(Role::FfnUp, "blk.{i}.ffn_up", "layers.{i}.mlp.Wi"),
        req(Role::FfnDown, "blk.{i}.ffn_down", "layers.{i}.mlp.Wo"),
        req(Role::OutputNorm, "output_norm", "final_norm"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_names_each_role_once_and_in_some_format() {
        for t in [&LLAMA, &MIXTRAL, &GEMMA3, &BERT, &MODERNBERT] {
            for (n, e) in t.entries.iter().enumerate() {
                assert!(
                    e.gguf.is_some() || e.hf.is_some(),
                    "{} {:?}",
                    t.family,
                    e.role
                );
                assert!(
                    t.entries[n + 1..].iter().all(|o| o.role != e.role),
                    "{} names {:?} twice",
                    t.family,
                    e.role
                );
            }
        }
    }
}
