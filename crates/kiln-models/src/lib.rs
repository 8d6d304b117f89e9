//! kiln-models: model architectures, generic over `B: Backend`.
//!
//! A model is built in three steps that never touch a device API directly:
//! 1. the family's loader (`arch::*`) reads the file's metadata into a typed
//!    [`kiln_core::config::DecoderConfig`];
//! 2. [`weights`] looks up every tensor by its role in the name table, checks its type and shape,
//!    and hands it to the backend (`upload_weight`: zero-copy on the CPU);
//! 3. [`Decoder::forward`] composes backend primitives.
//!
//! A [`SplitDecoder`] runs the same layers over two backends (the first layers on one, the rest
//! on another; see [`split`]). [`CausalLm`] is what generation needs from either, bound to its
//! backends.
//!
//! Encoders (BERT, XLM-RoBERTa, ModernBERT) come from Hugging Face folders the same way:
//! [`hf::HfConfig`] → [`arch::encoder_config`] → [`load_encoder`] (safetensors, zero-copy) →
//! [`Encoder::forward`] over a packed batch; [`pooling`] turns token states into sentence
//! embeddings as the folder's sentence-transformers files say ([`hf::SentenceConfig`]).

pub mod arch;
mod cache;
mod decoder;
mod encoder;
mod error;
pub mod hf;
mod lm;
pub mod pooling;
pub mod split;
mod weights;

pub use cache::{KvCache, PagedKvCache, PagedSeq, SplitKvCache, SplitPagedKvCache};
pub use decoder::{route, Decoder, DecoderLayer, Ffn, MoeFfn, NoTrace, Route, Trace};
pub use encoder::{load_encoder, Encoder, EncoderLayer, Norm};
pub use error::ModelError;
pub use lm::{CausalLm, DecoderOn, SplitDecoderOn};
pub use split::{
    load_gguf_decoder_split, load_hf_decoder_split, load_hf_decoder_split_from, SplitDecoder,
};

use kiln_backend::Backend;
use kiln_core::config::DecoderConfig;
use kiln_formats::GgufFile;

/// Load a decoder model from a parsed GGUF file onto `backend`.
pub fn load_gguf_decoder<B: Backend>(
    backend: &B,
    file: &GgufFile,
) -> Result<Decoder<B>, ModelError> {
    let config = gguf_decoder_config(file)?;
    weights::load_decoder(backend, &weights::GgufSource(file), config)
}

/// The decoder configuration of a GGUF file's metadata.
fn gguf_decoder_config(file: &GgufFile) -> Result<DecoderConfig, ModelError> {
    let arch = file.architecture().ok_or_else(|| ModelError::Metadata {
        key: "general.architecture".into(),
        detail: "missing".into(),
    })?;
    arch::decoder_config(arch, file)
}

/// Load a decoder model from a Hugging Face folder (`config.json` and `model.safetensors` or a
/// sharded `model.safetensors.index.json`) onto `backend`. F32, F16 and BF16 weights are used as
/// they are (zero-copy on the CPU).
pub fn load_hf_decoder<B: Backend>(
    backend: &B,
    dir: &std::path::Path,
) -> Result<Decoder<B>, ModelError> {
    let (hf, st) = open_hf_dir(dir)?;
    load_hf_decoder_from(backend, &hf, &st)
}

/// [`load_hf_decoder`] from an already parsed configuration and checkpoint.
pub fn load_hf_decoder_from<B: Backend>(
    backend: &B,
    hf: &hf::HfConfig,
    st: &kiln_formats::SafetensorsModel,
) -> Result<Decoder<B>, ModelError> {
    let (config, source) = hf_decoder_source(hf, st)?;
    weights::load_decoder(backend, &source, config)
}

/// The `config.json` and the checkpoint of a Hugging Face folder.
fn open_hf_dir(
    dir: &std::path::Path,
) -> Result<(hf::HfConfig, kiln_formats::SafetensorsModel), ModelError> {
    let hf = hf::HfConfig::read(&dir.join("config.json"))?;
    let st = kiln_formats::SafetensorsModel::open(dir).map_err(|e| ModelError::File {
        file: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok((hf, st))
}

/// The decoder configuration of a Hugging Face checkpoint and its tensors under GGUF names.
fn hf_decoder_source<'a>(
    hf: &hf::HfConfig,
    st: &'a kiln_formats::SafetensorsModel,
) -> Result<(DecoderConfig, weights::HfSource<'a>), ModelError> {
    let (config, names) = arch::hf_decoder_config(hf)?;
    if !hf.bool_or("tie_word_embeddings", false)? && st.tensor("lm_head.weight").is_none() {
        return Err(ModelError::MissingTensor(
            "lm_head.weight (config.json says the output is not tied to the embeddings)".into(),
        ));
    }
    let gptq = weights::GptqConfig::read(hf)?;
    Ok((config, weights::HfSource { st, names, gptq }))
}

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

fn decoder_summary(c: &kiln_core::config::DecoderConfig) -> String {
    let windows = c
        .layer_attention
        .iter()
        .filter(|a| matches!(a, kiln_core::config::LayerAttention::Sliding { .. }))
        .count();
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
            )
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
pub fn check_hf_dir(dir: &std::path::Path) -> Support {
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
        let gptq = weights::GptqConfig::read(&hf)?;
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
