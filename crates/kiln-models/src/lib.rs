//! kiln-models: model architectures, generic over `B: Backend`.
//!
//! A model is built in three steps that never touch a device API directly:
//! 1. the family's reader (`arch::*`) reads the file's metadata into a typed
//!    [`kiln_core::config::DecoderConfig`] and picks the family's name table (`names`);
//! 2. the one weight loader (`weights`, assembled into a model by `load`) looks up every tensor
//!    by its role in that table, checks its type and shape, and hands it to the backend
//!    (`upload_weight`: zero-copy on the CPU);
//! 3. [`Decoder::forward`] composes backend primitives.
//!
//! A [`SplitDecoder`] runs the same layers over two backends (the first layers on one, the rest
//! on another; see [`split`]). [`CausalLm`] is what generation needs from either, bound to its
//! backends.
//!
//! Encoders (BERT, XLM-RoBERTa, ModernBERT) come from Hugging Face folders the same way:
//! [`hf::HfConfig`] → [`arch::encoder_config`] → [`load_encoder`] (the same loader) →
//! [`Encoder::forward`] over a packed batch; [`pooling`] turns token states into sentence
//! embeddings as the folder's sentence-transformers files say ([`hf::SentenceConfig`]).
//!
//! Modules depend on each other one way: `load` → (`decoder`, `encoder`, `split`, `weights`,
//! `arch`) → (`names`, `gptq`, `hf`) → `pooling`, `error`.

pub mod arch;
mod cache;
mod decoder;
mod encoder;
mod error;
mod gptq;
pub mod hf;
mod lm;
mod load;
mod names;
pub mod pooling;
pub mod split;
mod support;
mod weights;

pub use cache::{
    kv_row_bytes, ring_rows, KvCache, PagedKvCache, PagedLayout, PagedSeq, SplitKvCache,
    SplitPagedKvCache, WindowedLayers, RING_BLOCK,
};
pub use decoder::{route, Decoder, DecoderLayer, Ffn, MoeFfn, NoTrace, Route, Trace};
pub use encoder::{Encoder, EncoderLayer, Norm};
pub use error::ModelError;
pub use lm::{CausalLm, DecoderOn, SplitDecoderOn};
pub use load::{
    load_encoder, load_gguf_decoder, load_gguf_decoder_split, load_hf_decoder,
    load_hf_decoder_from, load_hf_decoder_split, load_hf_decoder_split_from,
};
pub use split::SplitDecoder;
pub use support::{check_gguf, check_hf_dir, Support};
