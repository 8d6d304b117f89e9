//! kiln-models: model architectures, generic over `B: Backend`.
//!
//! A model is built in three steps that never touch a device API directly:
//! 1. the family's loader (`arch::*`) reads the file's metadata into a typed
//!    [`kiln_core::config::DecoderConfig`];
//! 2. [`weights`] looks up every tensor by its role in the name table, checks its type and shape,
//!    and hands it to the backend (`upload_weight`: zero-copy on the CPU);
//! 3. [`Decoder::forward`] composes backend primitives.
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
pub mod pooling;
mod weights;

pub use cache::KvCache;
pub use decoder::{route, Decoder, DecoderLayer, Ffn, MoeFfn, NoTrace, Route, Trace};
pub use encoder::{load_encoder, Encoder, EncoderLayer, Norm};
pub use error::ModelError;

use kiln_backend::Backend;
use kiln_formats::GgufFile;

/// Load a decoder model from a parsed GGUF file onto `backend`.
pub fn load_gguf_decoder<B: Backend>(
    backend: &B,
    file: &GgufFile,
) -> Result<Decoder<B>, ModelError> {
    let arch = file.architecture().ok_or_else(|| ModelError::Metadata {
        key: "general.architecture".into(),
        detail: "missing".into(),
    })?;
    let config = arch::decoder_config(arch, file)?;
    weights::load_decoder(backend, &weights::GgufSource(file), config)
}

/// Load a decoder model from a Hugging Face folder (`config.json` and `model.safetensors` or a
/// sharded `model.safetensors.index.json`) onto `backend`. F32, F16 and BF16 weights are used as
/// they are (zero-copy on the CPU).
pub fn load_hf_decoder<B: Backend>(
    backend: &B,
    dir: &std::path::Path,
) -> Result<Decoder<B>, ModelError> {
    let hf = hf::HfConfig::read(&dir.join("config.json"))?;
    let st = kiln_formats::SafetensorsModel::open(dir).map_err(|e| ModelError::File {
        file: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    load_hf_decoder_from(backend, &hf, &st)
}

/// [`load_hf_decoder`] from an already parsed configuration and checkpoint.
pub fn load_hf_decoder_from<B: Backend>(
    backend: &B,
    hf: &hf::HfConfig,
    st: &kiln_formats::SafetensorsModel,
) -> Result<Decoder<B>, ModelError> {
    let (config, names) = arch::hf_decoder_config(hf)?;
    if !hf.bool_or("tie_word_embeddings", false)? && st.tensor("lm_head.weight").is_none() {
        return Err(ModelError::MissingTensor(
            "lm_head.weight (config.json says the output is not tied to the embeddings)".into(),
        ));
    }
    weights::load_decoder(backend, &weights::HfSource { st, names }, config)
}
