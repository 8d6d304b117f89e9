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
pub use decoder::{Decoder, DecoderLayer, NoTrace, Trace};
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
    weights::load_decoder(backend, file, config)
}
