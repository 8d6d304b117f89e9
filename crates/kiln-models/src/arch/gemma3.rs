//! Gemma 3 (text): sandwich norms, QK-norm, `√d_model` embedding scale, GELU-tanh gated FFN,
//! sliding-window attention on five of every six layers with their own RoPE base, tied output.
//!
//! Facts the GGUF does not store, taken from the reference implementations (HF `Gemma3Config`,
//! llama.cpp `LLM_ARCH_GEMMA3`): the sliding-window pattern is 6 (layer `i` is global when
//! `(i + 1) % 6 == 0`), local layers use RoPE base 10,000, and queries are scaled by
//! `1/√query_pre_attn_scalar` where that scalar is `head_dim` except for the 27B model
//! (`d_model / n_heads`). The GGUF converter already adds Gemma's `+1` to every RMSNorm weight.

use kiln_core::config::{DecoderConfig, FfnActivation, LayerAttention, RopeConfig, RopeKind};
use kiln_formats::GgufFile;

use super::Meta;
use crate::ModelError;

const SLIDING_WINDOW_PATTERN: usize = 6;
const LOCAL_ROPE_BASE: f32 = 10_000.0;
const LAYERS_OF_27B: usize = 62;

pub(crate) fn config(file: &GgufFile) -> Result<DecoderConfig, ModelError> {
    let m = Meta::new(file, "gemma3");
    let d_model = m.usize("embedding_length")?;
    let n_layers = m.usize("block_count")?;
    let n_heads = m.usize("attention.head_count")?;
    let n_kv_heads = m.usize("attention.head_count_kv")?;
    let head_dim = m.usize_or("attention.key_length", d_model / n_heads)?;
    let head_dim_v = m.usize_or("attention.value_length", head_dim)?;
    let window = m.usize("attention.sliding_window")?;
    if n_heads % n_kv_heads != 0 {
        return Err(ModelError::Metadata {
            key: "gemma3.attention.head_count_kv".into(),
            detail: format!("{n_kv_heads} KV heads do not divide {n_heads} query heads"),
        });
    }
    let scaling = m.f32_or("rope.scaling.factor", 1.0)?;
    let query_pre_attn_scalar = if n_layers == LAYERS_OF_27B {
        d_model / n_heads
    } else {
        head_dim
    };
    Ok(DecoderConfig {
        arch: "gemma3".into(),
        vocab_size: super::gguf_vocab_size(file)?,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        head_dim_v,
        ffn_dim: m.usize("feed_forward_length")?,
        norm_eps: m.f32("attention.layer_norm_rms_epsilon")?,
        context_length: m.usize("context_length")?,
        rope_kind: RopeKind::Neox,
        rope_dim: m.usize_or("rope.dimension_count", head_dim)?,
        rope_global: RopeConfig {
            freq_scale: 1.0 / scaling,
            ..RopeConfig::plain(m.f32_or("rope.freq_base", 1_000_000.0)?)
        },
        rope_local: RopeConfig::plain(LOCAL_ROPE_BASE),
        rope_long: None,
        layer_attention: (0..n_layers)
            .map(|i| {
                if (i + 1) % SLIDING_WINDOW_PATTERN == 0 {
                    LayerAttention::Global
                } else {
                    LayerAttention::Sliding { window }
                }
            })
            .collect(),
        attention_scale: 1.0 / (query_pre_attn_scalar as f32).sqrt(),
        attn_logit_softcap: None,
        activation: FfnActivation::GeluTanh,
        embed_scale: Some((d_model as f32).sqrt()),
        moe: None,
    })
}
