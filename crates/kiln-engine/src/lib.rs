//! kiln-engine: what runs a loaded model for a user — sampling, generation, teacher-forced
//! scoring, perplexity, and sentence embeddings; and the block manager of the paged KV cache
//! ([`blocks`]: block tables, prefix caching, LRU eviction) and the continuous-batching
//! [`Scheduler`] over it that the server runs.

pub mod blocks;
mod constraint;
mod embed;
mod error;
mod generate;
mod model_file;
mod perplexity;
pub mod plan;
mod rng;
mod runner;
mod sampler;
mod scheduler;
mod score;
mod stop;
mod text;

pub use blocks::{
    BlockId, BlockPool, BlockTable, OutOfBlocks, PoolSizeError, PrefixHit, PrefixStats, WindowTable,
};
pub use constraint::{Constraint, TokenConstraint};
pub use embed::{Embedding, EmbeddingModel};
pub use error::EngineError;
pub use generate::{generate, GenerateOptions, Generation, StopReason};
pub use model_file::{ModelFile, ModelKind};
pub use perplexity::{perplexity, Perplexity};
pub use rng::Rng;
pub use runner::{
    decoder_on, embedding_on, split_decoder_on, Batcher, DecoderRunner, DecoderUse, EmbeddingRunner,
};
pub use sampler::{argmax, Sampler, SamplingParams};
pub use scheduler::{
    Event, FinishReason, Request, RequestId, Scheduler, SchedulerConfig, SubmitError, TokenLogprob,
};
pub use score::{log_softmax, score, PositionScore};
pub use stop::{Released, StopMatcher};
pub use text::{HfText, TextStream, TextTokenizer};

/// Prompt tokens evaluated per forward call (as llama.cpp's default `n_batch`/`n_ubatch` of 512).
pub const PREFILL_CHUNK: usize = 512;
