//! What kiln makes of a model file without loading it: the architecture, and either a summary
//! of the configuration it would run or the reason it refuses.
//!
//! Invariant: a file [`check_gguf`] / [`check_hf_dir`] accepts has a configuration kiln builds and
//! only tensors of types kiln computes with; the check reads metadata and tensor headers only.

use std::path::Path;

use kiln_core::config::DecoderConfig;
use kiln_formats::GgufFile;

use crate::gptq::GptqConfig;
use crate::{arch, hf, ModelError};

/// What kiln makes of a model file without loading it: its architecture, and either the
/// configuration it would run or the reason it refuses.
#[derive(Debug)]
pub struct Support {
    /// `general.architecture` of a GGUF, `model_type` of a Hugging Face folder.
    pub architecture: String,
    /// "decoder" or "encoder" (for a refused model: the kind kiln looked for).
    pub kind: &'static str,
    pub verdict: Result<String, ModelError>,
}

fn decoder_summary(c: &DecoderConfig) -> String {
    let windows = c.windowed_layers();
    let mut s = format!(
        "{} layers, d_model {}, {} heads ({} KV) of {}, vocabulary {}, context {}",
        c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.context_length
    );
    if windows > 0 {
        s += &format!(", {windows} sliding-window layers");
    }
    match &c.moe {
        Some(m) => {
            s += &format!(
                ", {} experts (top {}{}) of FFN {}",
                m.n_experts,
                m.top_k,
                if m.normalize_top_k {
                    ", renormalised"
                } else {
                    ""
                },
                m.expert_ffn_dim
            );
            if let Some(shared) = m.shared_ffn_dim {
                s += &format!(", a shared expert of FFN {shared}");
            }
            if !m.dense_layers.is_empty() {
                s += &format!(
                    ", {} dense layers of FFN {}",
                    m.dense_layers.len(),
                    c.ffn_dim
                );
            }
        }
        None => s += &format!(", FFN {}", c.ffn_dim),
    }
    if c.rope_long.is_some() {
        s += ", long-rope";
    } else if c.rope_global.freq_factors.is_some() {
        s += ", scaled rope";
    }
    s
}

/// Whether kiln can run the decoder in `file`: its metadata makes a configuration and every
/// tensor has a type kiln computes with.
pub fn check_gguf(file: &GgufFile) -> Support {
    let architecture = file.architecture().unwrap_or("(none)").to_string();
    let verdict = (|| {
        let config = arch::decoder_config(&architecture, file)?;
        if let Some(t) = file.tensors().iter().find(|t| !t.ty.is_supported()) {
            return Err(ModelError::UnsupportedType {
                name: t.name.clone(),
                ty: t.ty,
            });
        }
        Ok(decoder_summary(&config))
    })();
    Support {
        architecture,
        kind: "decoder",
        verdict,
    }
}

/// Whether kiln can run the Hugging Face folder `dir`, as a decoder or as an encoder (by its
/// `config.json`), and with which safetensors dtypes.
pub fn check_hf_dir(dir: &Path) -> Support {
    let hf = match hf::HfConfig::read(&dir.join("config.json")) {
        Ok(hf) => hf,
        Err(e) => {
            return Support {
                architecture: "(unknown)".into(),
                kind: "decoder",
                verdict: Err(e),
            }
        }
    };
    let architecture = hf.model_type().unwrap_or("(none)").to_string();
    let is_encoder = arch::SUPPORTED_ENCODERS.contains(&architecture.as_str());
    let verdict = (|| {
        let summary = if is_encoder {
            let c = arch::encoder_config(&hf)?;
            format!(
                "{} layers, d_model {}, {} heads, vocabulary {}, {} positions",
                c.n_layers, c.d_model, c.n_heads, c.vocab_size, c.max_positions
            )
        } else {
            decoder_summary(&arch::hf_decoder_config(&hf)?.0)
        };
        let st = kiln_formats::SafetensorsModel::open(dir).map_err(|e| ModelError::File {
            file: dir.display().to_string(),
            detail: e.to_string(),
        })?;
        let gptq = GptqConfig::read(&hf)?;
        // Integer tensors are buffers (BERT's `position_ids`), not weights.
        let is_float = |t: &&kiln_formats::SafeTensor| {
            use kiln_formats::safetensors::Dtype;
            matches!(t.dtype, Dtype::F64 | Dtype::F8_E4M3 | Dtype::F8_E5M2)
                || t.ggml_type().is_some()
        };
        if let Some(t) = st
            .tensors()
            .into_iter()
            .filter(is_float)
            .find(|t| t.ggml_type().is_none())
        {
            return Err(ModelError::UnsupportedDtype {
                name: t.name.clone(),
                dtype: format!("{:?}", t.dtype),
            });
        }
        let quant = if gptq.is_some() { ", GPTQ 4-bit" } else { "" };
        Ok(format!("{summary}; {} tensors{quant}", st.len()))
    })();
    Support {
        architecture,
        kind: if is_encoder { "encoder" } else { "decoder" },
        verdict,
    }
}
