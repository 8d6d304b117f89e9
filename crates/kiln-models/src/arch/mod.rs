//! Per-family metadata readers: GGUF metadata or `config.json` → [`DecoderConfig`] /
//! [`kiln_core::config::EncoderConfig`], and which name table a family's tensors go by.

mod encoders;
mod gemma3;
mod llama;
mod yarn;

pub use encoders::{encoder_config, SUPPORTED_ENCODERS};

use kiln_core::config::{DecoderConfig, EncoderArch};
use kiln_formats::GgufFile;

use crate::hf::HfConfig;
use crate::names::{self, NameTable};
use crate::ModelError;

/// GGUF architectures (`general.architecture`) kiln can run as decoders.
pub const SUPPORTED: &[&str] = &[
    "gemma3", "llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3",
];

/// Hugging Face `model_type`s kiln can run as decoders from safetensors (`gemma3` is the text
/// model of a `Gemma3ForConditionalGeneration` checkpoint).
pub const SUPPORTED_HF_DECODERS: &[&str] = &[
    "gemma3_text",
    "gemma3",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "phi3",
];

/// Read the decoder configuration of architecture `arch` from a GGUF file.
pub fn decoder_config(arch: &str, file: &GgufFile) -> Result<DecoderConfig, ModelError> {
    match arch {
        "gemma3" => gemma3::config(file),
        a if llama::GGUF_ARCHES.contains(&a) => llama::gguf_config(a, file),
        other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
    }
}

/// The tensor names of the GGUF decoder architecture `arch` (one of [`SUPPORTED`]).
pub(crate) fn gguf_names(arch: &str) -> &'static NameTable {
    match arch {
        "gemma3" => &names::GEMMA3,
        _ => &names::LLAMA,
    }
}

/// The tensor names of an encoder family.
pub(crate) fn encoder_names(arch: EncoderArch) -> &'static NameTable {
    match arch {
        EncoderArch::Bert | EncoderArch::XlmRoberta => &names::BERT,
        EncoderArch::ModernBert => &names::MODERNBERT,
    }
}

/// The decoder configuration of a Hugging Face `config.json`, and its tensor names.
pub(crate) fn hf_decoder_config(
    c: &HfConfig,
) -> Result<(DecoderConfig, &'static NameTable), ModelError> {
    let model_type = c.model_type()?;
    if !SUPPORTED_HF_DECODERS.contains(&model_type) {
        return Err(ModelError::UnsupportedHfModel(model_type.to_string()));
    }
    if gemma3::HF_TYPES.contains(&model_type) {
        return Ok((gemma3::hf_config(c)?, &names::GEMMA3));
    }
    llama::hf_config(c)
}

/// Whether a checkpoint's output matrix is its token embedding table (`tie_word_embeddings`,
/// whose default is the family's: true for Gemma 3, at the top or in `text_config`).
pub fn hf_tied(c: &HfConfig) -> Result<bool, ModelError> {
    let model_type = c.model_type()?;
    if !gemma3::HF_TYPES.contains(&model_type) {
        return c.bool_or("tie_word_embeddings", false);
    }
    if c.has("tie_word_embeddings") || model_type != "gemma3" {
        return c.bool_or("tie_word_embeddings", true);
    }
    c.nested("text_config")?
        .bool_or("tie_word_embeddings", true)
}

/// Where a checkpoint's decoder weights are: under `language_model.` for the text model of a
/// multimodal Gemma 3 (as its published checkpoints and transformers 5 save them), at the top
/// otherwise.
pub fn hf_weight_prefix(c: &HfConfig) -> Result<&'static str, ModelError> {
    Ok(if c.model_type()? == "gemma3" {
        "language_model."
    } else {
        ""
    })
}

/// Vocabulary size: the rows of `token_embd.weight` (the metadata has no reliable key for it).
pub(crate) fn gguf_vocab_size(file: &GgufFile) -> Result<usize, ModelError> {
    let rows = file
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    usize::try_from(rows).map_err(|_| ModelError::Metadata {
        key: "token_embd.weight".into(),
        detail: "vocabulary too large".into(),
    })
}

/// Typed access to `<arch>.<key>` metadata with errors that name the key.
pub(crate) struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl<'a> Meta<'a> {
    pub(crate) fn new(file: &'a GgufFile, arch: &'a str) -> Self {
        Meta { file, arch }
    }

    fn key(&self, key: &str) -> String {
        format!("{}.{}", self.arch, key)
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.count(key, 1)
    }

    /// `<arch>.key` as a count of at least `min` and at most 2³².
    fn count(&self, key: &str, min: usize) -> Result<usize, ModelError> {
        let k = self.key(key);
        let v = self.file.get_u64(&k).map_err(|e| ModelError::Metadata {
            key: k.clone(),
            detail: e.to_string(),
        })?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v >= min && v <= 1 << 32)
            .ok_or(ModelError::Metadata {
                key: k,
                detail: format!("value {v} is out of range"),
            })
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        if self.file.get(&self.key(key)).is_none() {
            return Ok(default);
        }
        self.usize(key)
    }

    /// A count that may be absent or 0 (absent reads as 0).
    pub(crate) fn usize_or_zero(&self, key: &str) -> Result<usize, ModelError> {
        if self.file.get(&self.key(key)).is_none() {
            return Ok(0);
        }
        self.count(key, 0)
    }

    pub(crate) fn f32(&self, key: &str) -> Result<f32, ModelError> {
        let k = self.key(key);
        let v = self.file.get_f64(&k).map_err(|e| ModelError::Metadata {
            key: k.clone(),
            detail: e.to_string(),
        })?;
        if !v.is_finite() {
            return Err(ModelError::Metadata {
                key: k,
                detail: format!("value {v} is not finite"),
            });
        }
        Ok(v as f32)
    }

    /// Whether `<arch>.key` is there at all.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.file.get(&self.key(key)).is_some()
    }

    pub(crate) fn f32_or(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        if self.file.get(&self.key(key)).is_none() {
            return Ok(default);
        }
        self.f32(key)
    }
}

/// The configuration of a Hugging Face decoder alone (what the planner reads before loading;
/// loading also needs the family's name map).
pub fn hf_decoder_shape(c: &HfConfig) -> Result<DecoderConfig, ModelError> {
    hf_decoder_config(c).map(|(config, _)| config)
}
