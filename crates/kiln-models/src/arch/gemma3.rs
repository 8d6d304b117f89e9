//! Gemma 3 (text): sandwich norms, QK-norm, `√d_model` embedding scale, GELU-tanh gated FFN,
//! sliding-window attention on five of every six layers with their own RoPE base, tied output.
//!
//! Facts the GGUF does not store, taken from the reference implementations (HF `Gemma3Config`,
//! llama.cpp `LLM_ARCH_GEMMA3`): the sliding-window pattern is 6 (layer `i` is global when
//! `(i + 1) % 6 == 0`), local layers use RoPE base 10,000, and queries are scaled by
//! `1/√query_pre_attn_scalar` where that scalar is `head_dim` except for the 27B model
//! (`d_model / n_heads`). The GGUF converter already adds Gemma's `+1` to every RMSNorm weight.
//!
//! From a Hugging Face folder every setting is read from `config.json` with transformers'
//! `Gemma3TextConfig` defaults (`layer_types` or the pattern, `query_pre_attn_scalar`, both rope
//! bases and the global layers' scaling), and the loader adds the `+1` to the norm weights
//! (`NameTable::hf_norm_plus_one`).

use kiln_core::config::{DecoderConfig, FfnActivation, LayerAttention, RopeConfig, RopeKind};
use kiln_formats::GgufFile;
use serde_json::Value;

use super::Meta;
use crate::hf::HfConfig;
use crate::ModelError;

/// Hugging Face `model_type`s of Gemma 3 text: `Gemma3ForCausalLM` (`gemma3_text`), and the text
/// model of `Gemma3ForConditionalGeneration` (`gemma3`, settings under `text_config`).
pub(crate) const HF_TYPES: &[&str] = &["gemma3_text", "gemma3"];

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
        rope_local: RopeConfig::plain(m.f32_or("rope.freq_base_swa", LOCAL_ROPE_BASE)?),
        rope_long: None,
        rope_dynamic: None,
        layer_attention: every_nth_global(n_layers, SLIDING_WINDOW_PATTERN, window),
        attention_scale: 1.0 / (query_pre_attn_scalar as f32).sqrt(),
        attn_logit_softcap: None,
        activation: FfnActivation::GeluTanh,
        embed_scale: Some((d_model as f32).sqrt()),
        moe: None,
    })
}

/// Layer `i` global when `(i + 1) % pattern == 0`, the others windowed (Gemma 3's 5:1 rule).
fn every_nth_global(n_layers: usize, pattern: usize, window: usize) -> Vec<LayerAttention> {
    (0..n_layers)
        .map(|i| {
            if (i + 1) % pattern == 0 {
                LayerAttention::Global
            } else {
                LayerAttention::Sliding { window }
            }
        })
        .collect()
}

/// The decoder configuration of a Gemma 3 `config.json` (`gemma3_text`, or `gemma3` with the
/// text model's settings under `text_config`), with `Gemma3TextConfig`'s defaults where a key is
/// absent.
pub(crate) fn hf_config(outer: &HfConfig) -> Result<DecoderConfig, ModelError> {
    let nested;
    let c = if outer.model_type()? == "gemma3" {
        nested = outer.nested("text_config")?;
        &nested
    } else {
        outer
    };
    if c.bool_or("use_bidirectional_attention", false)? {
        return Err(c.error(
            "use_bidirectional_attention",
            "bidirectional Gemma 3 (EmbeddingGemma) is not supported",
        ));
    }
    let act = c.str_or("hidden_activation", "gelu_pytorch_tanh")?;
    if act != "gelu_pytorch_tanh" {
        return Err(c.error(
            "hidden_activation",
            format!("activation \"{act}\" is not supported (Gemma 3 uses gelu_pytorch_tanh)"),
        ));
    }
    if matches!(c.raw("final_logit_softcapping"), Some(Value::Number(_))) {
        return Err(c.error(
            "final_logit_softcapping",
            "a soft cap on the final logits is not supported",
        ));
    }
    let attn_logit_softcap = match c.raw("attn_logit_softcapping") {
        Some(Value::Number(_)) => Some(c.f32("attn_logit_softcapping")?),
        _ => None,
    };
    let d_model = c.usize("hidden_size")?;
    let n_layers = c.usize("num_hidden_layers")?;
    let n_heads = c.usize("num_attention_heads")?;
    let n_kv_heads = c.usize("num_key_value_heads")?;
    let head_dim = c.usize_or("head_dim", 256)?;
    if n_heads % n_kv_heads != 0 {
        return Err(c.error(
            "num_key_value_heads",
            format!("{n_kv_heads} KV heads do not divide {n_heads} query heads"),
        ));
    }
    let window = c.usize_or("sliding_window", 4096)?;
    let layer_attention = match super::llama::hf_layer_types(c, n_layers, Some(window))? {
        Some(types) => types,
        None => {
            // transformers: `sliding_window_pattern` (saved as `_sliding_window_pattern` too).
            let pattern = match c.raw("sliding_window_pattern") {
                Some(_) => c.usize("sliding_window_pattern")?,
                None => c.usize_or("_sliding_window_pattern", SLIDING_WINDOW_PATTERN)?,
            };
            every_nth_global(n_layers, pattern, window)
        }
    };
    let context_length = c.usize_or("max_position_embeddings", 131_072)?;
    let (rope_global, rope_local) = hf_ropes(c, head_dim, context_length)?;
    Ok(DecoderConfig {
        arch: "gemma3".into(),
        vocab_size: c.usize("vocab_size")?,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        head_dim_v: head_dim,
        ffn_dim: c.usize("intermediate_size")?,
        norm_eps: c.f32_or("rms_norm_eps", 1e-6)?,
        context_length,
        rope_kind: RopeKind::Neox,
        rope_dim: head_dim,
        rope_global,
        rope_local,
        rope_long: None,
        rope_dynamic: None,
        layer_attention,
        attention_scale: 1.0 / c.f32_or("query_pre_attn_scalar", 256.0)?.sqrt(),
        attn_logit_softcap,
        activation: FfnActivation::GeluTanh,
        embed_scale: Some((d_model as f32).sqrt()),
        moe: None,
    })
}

/// The global and the local layers' ropes: transformers 5's `rope_parameters` per layer type
/// (`full_attention`, `sliding_attention`), or the older `rope_theta` + `rope_scaling` (global
/// layers only) and `rope_local_base_freq`.
fn hf_ropes(
    c: &HfConfig,
    rope_dim: usize,
    context_length: usize,
) -> Result<(RopeConfig, RopeConfig), ModelError> {
    let per_type = match c.raw("rope_parameters") {
        Some(Value::Object(o)) if o.contains_key("full_attention") => Some(o),
        _ => None,
    };
    fn object(v: Option<&Value>) -> Option<&serde_json::Map<String, Value>> {
        match v {
            Some(Value::Object(o)) => Some(o),
            _ => None,
        }
    }
    let one = |kind: &str,
               legacy_scaling: Option<&serde_json::Map<String, Value>>,
               legacy_base: &str,
               default_base: f64| {
        let (key, params) = match per_type {
            Some(p) => ("rope_parameters", object(p.get(kind))),
            None => ("rope_scaling", legacy_scaling),
        };
        let base = match params
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            Some(b) => b as f32,
            None => c.f32_or(legacy_base, default_base as f32)?,
        };
        // Gemma 3 keeps `max_position_embeddings` as its context whatever the scaling.
        let (rope, long, _) =
            super::llama::rope_from_params(c, key, params, base, rope_dim, context_length)?;
        if long.is_some() {
            return Err(c.error(key, "long-rope scaling is not supported for Gemma 3"));
        }
        Ok(rope)
    };
    let global = one(
        "full_attention",
        object(c.raw("rope_scaling")),
        "rope_theta",
        1_000_000.0,
    )?;
    let local = one(
        "sliding_attention",
        None,
        "rope_local_base_freq",
        f64::from(LOCAL_ROPE_BASE),
    )?;
    Ok((global, local))
}
