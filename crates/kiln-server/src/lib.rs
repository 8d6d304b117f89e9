//! kiln-server: the OpenAI-compatible HTTP server behind `kiln serve`.
//!
//! - [`api`]: request bodies parsed and validated into engine parameters, or refused with an
//!   OpenAI-style error object (`{"error": {"message", "type", "param", "code"}}`) and a status.
//!   Only validated requests reach the engine.
//! - [`engine`]: one OS thread per model; a decoder's thread runs the continuous-batching
//!   scheduler over its paged KV cache, an embedding model's thread batches queued requests.
//! - [`http`]: the axum routes, SSE streaming, admission (429 with `Retry-After`), and
//!   cancellation of a request whose client disconnects.
//! - [`responses`]: the bodies the server answers with (completions, chunks, embeddings,
//!   models, health, errors), as types that serialize to OpenAI's JSON.
//! - [`grammar`]: constrained decoding (`response_format`, tool calls): each decoder's token
//!   table, grammars compiled off the runtime with a time limit.
//! - [`metrics`]: `/metrics` in the Prometheus text format.
//!
//! The crate is generic over the backend; the CLI picks it.

pub mod api;
pub mod engine;
pub mod grammar;
pub mod http;
pub mod metrics;
pub mod responses;
pub mod tools;

pub use api::{
    parse_body, ApiError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
    GenerationLimits, Input, ValidChat, ValidCompletion, ValidEmbedding, ValidGeneration,
};
pub use engine::{DecoderEngine, DecoderStats, EmbedEngine};
pub use http::{router, serve, DecoderEntry, EmbedEntry, ServerState};
pub use metrics::Metrics;
