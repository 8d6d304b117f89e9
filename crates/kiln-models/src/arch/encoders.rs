//! `config.json` → [`EncoderConfig`] for the encoder families: BERT, (XLM-)RoBERTa, ModernBERT.

use kiln_core::config::{
    EncoderArch, EncoderAttention, EncoderConfig, EncoderPositions, FfnActivation, RopeConfig,
};
use serde_json::Value;

use crate::hf::HfConfig;
use crate::ModelError;

/// `model_type` values kiln runs as encoders.
pub const SUPPORTED_ENCODERS: &[&str] = &["bert", "xlm-roberta", "roberta", "modernbert"];

/// Reads the encoder configuration from a model folder's `config.json`.
pub fn encoder_config(c: &HfConfig) -> Result<EncoderConfig, ModelError> {
    match c.model_type()? {
        "bert" => bert(c, EncoderArch::Bert),
        "xlm-roberta" | "roberta" => bert(c, EncoderArch::XlmRoberta),
        "modernbert" => modernbert(c),
        other => Err(ModelError::UnsupportedArchitecture(format!(
            "{other} (config.json model_type; encoders: {})",
            SUPPORTED_ENCODERS.join(", ")
        ))),
    }
}

fn activation(c: &HfConfig, key: &str) -> Result<FfnActivation, ModelError> {
    match c.str_or(key, "gelu")? {
        "gelu" => Ok(FfnActivation::Gelu),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(FfnActivation::GeluTanh),
        "silu" | "swish" => Ok(FfnActivation::Silu),
        other => Err(ModelError::Config {
            file: "config.json".into(),
            key: key.into(),
            detail: format!("activation \"{other}\" is not supported (gelu, gelu_new, silu)"),
        }),
    }
}

fn heads(c: &HfConfig, d_model: usize, n_heads: usize) -> Result<usize, ModelError> {
    if !d_model.is_multiple_of(n_heads) {
        return Err(ModelError::Config {
            file: "config.json".into(),
            key: "num_attention_heads".into(),
            detail: format!("{n_heads} heads do not divide hidden_size {d_model}"),
        });
    }
    let _ = c;
    Ok(d_model / n_heads)
}

fn bert(c: &HfConfig, arch: EncoderArch) -> Result<EncoderConfig, ModelError> {
    let d_model = c.usize("hidden_size")?;
    let n_heads = c.usize("num_attention_heads")?;
    let n_layers = c.usize("num_hidden_layers")?;
    let pos_type = c.str_or("position_embedding_type", "absolute")?;
    if pos_type != "absolute" {
        return Err(ModelError::Config {
            file: "config.json".into(),
            key: "position_embedding_type".into(),
            detail: format!("\"{pos_type}\" is not supported (absolute)"),
        });
    }
    let table_len = c.usize_or("max_position_embeddings", 512)?;
    // RoBERTa numbers positions from pad_token_id + 1 (its padding row is never used by text).
    let offset = match arch {
        EncoderArch::XlmRoberta => c.u32_or("pad_token_id", 1)? as usize + 1,
        _ => 0,
    };
    let max_positions = table_len
        .checked_sub(offset)
        .filter(|&n| n > 0)
        .ok_or_else(|| ModelError::Config {
            file: "config.json".into(),
            key: "max_position_embeddings".into(),
            detail: format!("{table_len} leaves no positions after the offset {offset}"),
        })?;
    Ok(EncoderConfig {
        arch,
        vocab_size: c.usize("vocab_size")?,
        d_model,
        n_layers,
        n_heads,
        head_dim: heads(c, d_model, n_heads)?,
        ffn_dim: c.usize("intermediate_size")?,
        norm_eps: c.f32_or("layer_norm_eps", 1e-12)?,
        norm_bias: true,
        attention_bias: true,
        mlp_bias: true,
        post_norm: true,
        gated_ffn: false,
        activation: activation(c, "hidden_act")?,
        positions: EncoderPositions::Absolute { table_len, offset },
        type_vocab_size: c.usize_or("type_vocab_size", 2)?,
        layer_attention: vec![EncoderAttention::Global; n_layers],
        max_positions,
    })
}

/// ModernBERT. Older configs give `global_attn_every_n_layers` and `global_rope_theta` /
/// `local_rope_theta`; newer transformers write `layer_types` and `rope_parameters` per layer
/// type. Both are read.
fn modernbert(c: &HfConfig) -> Result<EncoderConfig, ModelError> {
    let d_model = c.usize("hidden_size")?;
    let n_heads = c.usize("num_attention_heads")?;
    let n_layers = c.usize("num_hidden_layers")?;
    let window = c.usize_or("local_attention", 128)?;
    let local = EncoderAttention::Local { radius: window / 2 };
    let cfg_err = |key: &str, detail: String| ModelError::Config {
        file: "config.json".into(),
        key: key.into(),
        detail,
    };
    let layer_attention = match c.raw("layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != n_layers {
                return Err(cfg_err(
                    "layer_types",
                    format!("{} entries for {n_layers} layers", types.len()),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(EncoderAttention::Global),
                    Some("sliding_attention") => Ok(local),
                    _ => Err(cfg_err("layer_types", format!("unknown layer type {t}"))),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        _ => {
            let every = c.usize_or("global_attn_every_n_layers", 3)?;
            (0..n_layers)
                .map(|i| {
                    if i % every == 0 {
                        EncoderAttention::Global
                    } else {
                        local
                    }
                })
                .collect()
        }
    };
    let theta = |layer_type: &str, legacy: &str, default: f32| -> Result<f32, ModelError> {
        if let Some(v) = c
            .raw("rope_parameters")
            .and_then(|r| r.get(layer_type))
            .and_then(|p| p.get("rope_theta"))
        {
            return v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(|x| x as f32)
                .ok_or_else(|| cfg_err("rope_parameters", format!("bad rope_theta {v}")));
        }
        c.f32_or(legacy, default)
    };
    let global = theta("full_attention", "global_rope_theta", 160_000.0)?;
    let local_theta = theta("sliding_attention", "local_rope_theta", global)?;
    Ok(EncoderConfig {
        arch: EncoderArch::ModernBert,
        vocab_size: c.usize("vocab_size")?,
        d_model,
        n_layers,
        n_heads,
        head_dim: heads(c, d_model, n_heads)?,
        ffn_dim: c.usize("intermediate_size")?,
        norm_eps: c.f32_or("norm_eps", 1e-5)?,
        norm_bias: c.bool_or("norm_bias", false)?,
        attention_bias: c.bool_or("attention_bias", false)?,
        mlp_bias: c.bool_or("mlp_bias", false)?,
        post_norm: false,
        gated_ffn: true,
        activation: activation(c, "hidden_activation")?,
        positions: EncoderPositions::Rope {
            global: RopeConfig::plain(global),
            local: RopeConfig::plain(local_theta),
        },
        type_vocab_size: 0,
        layer_attention,
        max_positions: c.usize_or("max_position_embeddings", 8192)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minilm_style_bert_config() {
        let c = HfConfig::parse(
            "config.json",
            r#"{"model_type": "bert", "hidden_size": 384, "num_attention_heads": 12,
                "num_hidden_layers": 6, "intermediate_size": 1536, "vocab_size": 30522,
                "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
                "type_vocab_size": 2}"#,
        )
        .unwrap();
        let e = encoder_config(&c).unwrap();
        assert_eq!((e.head_dim, e.max_positions, e.post_norm), (32, 512, true));
        assert_eq!(e.activation, FfnActivation::Gelu);
    }

    #[test]
    fn roberta_positions_start_after_the_padding_id() {
        let c = HfConfig::parse(
            "config.json",
            r#"{"model_type": "xlm-roberta", "hidden_size": 32, "num_attention_heads": 4,
                "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 100,
                "max_position_embeddings": 130, "pad_token_id": 1}"#,
        )
        .unwrap();
        let e = encoder_config(&c).unwrap();
        assert_eq!(
            e.positions,
            EncoderPositions::Absolute {
                table_len: 130,
                offset: 2
            }
        );
        assert_eq!(e.max_positions, 128);
    }

    #[test]
    fn modernbert_old_and_new_layer_descriptions_agree() {
        let base = r#""model_type": "modernbert", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 4, "intermediate_size": 96, "vocab_size": 300, "local_attention": 8"#;
        let old = HfConfig::parse(
            "config.json",
            &format!(r#"{{{base}, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0}}"#),
        )
        .unwrap();
        let new = HfConfig::parse(
            "config.json",
            &format!(
                r#"{{{base}, "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                "rope_parameters": {{"full_attention": {{"rope_theta": 160000.0, "rope_type": "default"}},
                                    "sliding_attention": {{"rope_theta": 10000.0, "rope_type": "default"}}}}}}"#
            ),
        )
        .unwrap();
        let (a, b) = (encoder_config(&old).unwrap(), encoder_config(&new).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.layer_attention[1], EncoderAttention::Local { radius: 4 });
        assert_eq!(a.layer_attention[3], EncoderAttention::Global);
        assert!(!a.norm_bias && a.gated_ffn && !a.post_norm);
    }

    #[test]
    fn unsupported_settings_are_named() {
        let c = HfConfig::parse(
            "config.json",
            r#"{"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4,
                "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 10}"#,
        )
        .unwrap();
        assert!(encoder_config(&c)
            .unwrap_err()
            .to_string()
            .contains("num_attention_heads"));
        let c = HfConfig::parse("config.json", r#"{"model_type": "t5"}"#).unwrap();
        assert!(encoder_config(&c).unwrap_err().to_string().contains("t5"));
    }
}
