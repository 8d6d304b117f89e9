//! kiln-server: the OpenAI-compatible HTTP API.
//!
//! This step holds the API's request types and their validation ([`api`]): every request body
//! is parsed and checked here into engine-level parameters, or refused with an OpenAI-style
//! error object (`{"error": {"message", "type", "param", "code"}}`) and an HTTP status. The
//! HTTP layer (axum), the per-model scheduler loop and the metrics come next; they will take
//! only validated requests, so that no body a client sends can reach the engine unchecked.

pub mod api;

pub use api::{
    parse_body, ApiError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
    GenerationLimits, Input, ValidChat, ValidCompletion, ValidEmbedding, ValidGeneration,
};
