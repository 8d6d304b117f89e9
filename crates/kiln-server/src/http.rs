//! The HTTP layer: axum routes over the model threads.
//!
//! `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`, `GET /v1/models`,
//! `GET /health`, `GET /metrics`. Bodies are read as bytes and parsed by [`crate::api`], so
//! every malformed body gets an OpenAI error object; unknown paths get one too (404). Every
//! body the server answers with is a type of [`crate::responses`].
//!
//! This module holds the shared state, the routes and the small handlers; `generate` the chat
//! and completions handlers (whole answers and SSE streams), `choice` the detokenization, stop
//! strings and log-probabilities of one choice, `embeddings` the embeddings handler, and `errors`
//! the error responses.
//!
//! A generation request becomes one scheduler request per (prompt, choice); all of them report
//! on one channel, tagged with the choice's index. Their tokens are turned into text here
//! (incremental detokenization, then stop strings across token boundaries), so the model thread
//! only ever handles ids. Dropping the handler (a non-streaming client that disconnects) or the
//! SSE stream (a streaming one) drops the requests' tickets, which cancels them and frees their
//! KV blocks.

mod choice;
mod embeddings;
mod errors;
mod generate;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_engine::TextTokenizer;
use kiln_tokenizer::ChatTemplate;

use crate::api::{ApiError, GenerationLimits};
use crate::engine::{DecoderEngine, EmbedEngine};
use crate::grammar::Grammars;
use crate::metrics::Metrics;
use crate::responses::{Health, ModelList};
use crate::tools::ToolFormat;

pub use errors::Failure;

/// Largest request body (bytes).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// A decoder the server serves.
pub struct DecoderEntry {
    pub name: String,
    pub engine: DecoderEngine,
    pub tokenizer: Arc<TextTokenizer>,
    /// `None`: chat requests are refused (the model has no template and none was given).
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Positions one sequence may hold (prompt plus generated tokens).
    pub context: usize,
    /// Tokens that end a generation (end of turn, end of text).
    pub end_ids: Vec<u32>,
    /// Its token table and compiled grammars (constrained decoding).
    pub grammars: Arc<Grammars>,
    /// How it writes tool calls (from its chat template, or `--tool-call-format`).
    pub tool_format: ToolFormat,
}

impl DecoderEntry {
    /// A decoder served as `name` on `engine`; `logits_width` is the width of its output rows
    /// (the vocabulary, or more where the embedding is padded). Starts building its token
    /// table in the background.
    pub fn new(
        name: String,
        engine: DecoderEngine,
        tokenizer: TextTokenizer,
        chat_template: Option<ChatTemplate>,
        context: usize,
        logits_width: usize,
    ) -> DecoderEntry {
        let tokenizer = Arc::new(tokenizer);
        let end_ids = (0..tokenizer.vocab_size() as u32)
            .filter(|&i| tokenizer.is_end_of_generation(i))
            .collect();
        let tool_format = chat_template
            .as_ref()
            .map_or(ToolFormat::Generic, |t| ToolFormat::detect(t.source()));
        DecoderEntry {
            name,
            engine,
            tool_format,
            grammars: Grammars::spawn(tokenizer.clone(), logits_width),
            tokenizer,
            chat_template: chat_template.map(Arc::new),
            context,
            end_ids,
        }
    }
}

/// An embedding model the server serves.
pub struct EmbedEntry {
    pub name: String,
    pub engine: EmbedEngine,
}

/// What the handlers share.
pub struct ServerState {
    pub decoders: Vec<DecoderEntry>,
    pub embedders: Vec<EmbedEntry>,
    pub limits: GenerationLimits,
    /// Most inputs in one embedding request.
    pub max_embed_inputs: usize,
    /// Most (prompt, choice) sequences one completion request may start.
    pub max_choices: usize,
    /// The `Retry-After` of a 429 (seconds).
    pub retry_after_secs: u64,
    pub metrics: Metrics,
    /// Unix time the server started (the models' `created`).
    pub started: u64,
}

impl ServerState {
    pub fn new(decoders: Vec<DecoderEntry>, embedders: Vec<EmbedEntry>) -> ServerState {
        ServerState {
            decoders,
            embedders,
            limits: GenerationLimits {
                max_n: 16,
                default_max_tokens: 256,
            },
            max_embed_inputs: 2048,
            max_choices: 128,
            retry_after_secs: 1,
            metrics: Metrics::default(),
            started: unix_now(),
        }
    }

    fn names(&self) -> Vec<&str> {
        self.decoders
            .iter()
            .map(|d| d.name.as_str())
            .chain(self.embedders.iter().map(|e| e.name.as_str()))
            .collect()
    }

    fn decoder(&self, model: &str) -> Result<&DecoderEntry, Failure> {
        if let Some(d) = self.decoders.iter().find(|d| d.name == model) {
            return Ok(d);
        }
        if self.embedders.iter().any(|e| e.name == model) {
            return Err(ApiError::invalid(
                "model",
                format!("'{model}' is an embedding model; use /v1/embeddings"),
            )
            .into());
        }
        Err(ApiError::unknown_model(model, &self.names()).into())
    }

    fn embedder(&self, model: &str) -> Result<&EmbedEntry, Failure> {
        if let Some(e) = self.embedders.iter().find(|e| e.name == model) {
            return Ok(e);
        }
        if self.decoders.iter().any(|d| d.name == model) {
            return Err(ApiError::invalid(
                "model",
                format!("'{model}' is a text-generation model, not an embedding model"),
            )
            .into());
        }
        Err(ApiError::unknown_model(model, &self.names()).into())
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response id: `prefix` and 24 random hex digits.
fn response_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let a = h.finish();
    h.write_u8(1);
    format!("{prefix}-{a:016x}{:08x}", h.finish() as u32)
}

/// The routes, with request counting and the body limit.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/health",
    "/metrics",
];

async fn count_requests(
    State(state): State<Arc<ServerState>>,
    req: HttpRequest,
    next: Next,
) -> Response {
    let path = req.uri().path();
    let endpoint = ENDPOINTS
        .iter()
        .find(|e| **e == path)
        .copied()
        .unwrap_or("other");
    let resp = next.run(req).await;
    state.metrics.request(endpoint, resp.status().as_u16());
    resp
}

async fn not_found(req: HttpRequest) -> Failure {
    ApiError {
        status: 404,
        message: format!("no route for {} {}", req.method(), req.uri().path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    }
    .into()
}

async fn models(State(state): State<Arc<ServerState>>) -> Response {
    Json(ModelList::new(state.names(), state.started)).into_response()
}

async fn health(State(state): State<Arc<ServerState>>) -> Response {
    let dead: Vec<&str> = state
        .decoders
        .iter()
        .filter(|d| {
            !d.engine
                .stats
                .alive
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .map(|d| d.name.as_str())
        .chain(
            state
                .embedders
                .iter()
                .filter(|e| !e.engine.alive.load(std::sync::atomic::Ordering::Relaxed))
                .map(|e| e.name.as_str()),
        )
        .collect();
    if dead.is_empty() {
        Json(Health::Ok).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health::Error {
                stopped_models: dead,
            }),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<Arc<ServerState>>) -> Response {
    let stats: Vec<(&str, &crate::engine::DecoderStats)> = state
        .decoders
        .iter()
        .map(|d| (d.name.as_str(), &*d.engine.stats))
        .collect();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(&stats),
    )
        .into_response()
}

/// Serves `state` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
