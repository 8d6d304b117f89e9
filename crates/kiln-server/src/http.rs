//! The HTTP layer: axum routes over the model threads.
//!
//! `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`, `GET /v1/models`,
//! `GET /health`, `GET /metrics`. Bodies are read as bytes and parsed by [`crate::api`], so
//! every malformed body gets an OpenAI error object; unknown paths get one too (404).
//!
//! A generation request becomes one scheduler request per (prompt, choice); all of them report
//! on one channel, tagged with the choice's index. Their tokens are turned into text here
//! (incremental detokenization, then stop strings across token boundaries), so the model thread
//! only ever handles ids. Dropping the handler (a non-streaming client that disconnects) or the
//! SSE stream (a streaming one) drops the requests' [`Ticket`]s, which cancels them and frees
//! their KV blocks.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use kiln_engine::{
    FinishReason, Request, StopMatcher, SubmitError, TextStream, TextTokenizer, TokenLogprob,
};
use kiln_tokenizer::{ChatMessage, ChatTemplate, RenderOptions};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{
    parse_body, ApiError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
    GenerationLimits, Input, ValidGeneration,
};
use crate::engine::{DecoderEngine, EmbedEngine, EmbedInput, EngineCallError, Out, Ticket};
use crate::metrics::Metrics;

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

/// An error response: the OpenAI error object, with `Retry-After` on a 429.
pub struct Failure {
    error: ApiError,
    retry_after: Option<u64>,
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure {
            error,
            retry_after: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self.error.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

fn server_error(message: impl Into<String>) -> Failure {
    ApiError {
        status: 500,
        message: message.into(),
        kind: "server_error",
        param: None,
        code: None,
    }
    .into()
}

fn engine_failure(e: EngineCallError, state: &ServerState, prompt_param: &str) -> Failure {
    match e {
        EngineCallError::Refused(SubmitError::QueueFull(n)) => Failure {
            error: ApiError {
                status: 429,
                message: format!(
                    "the server is busy ({n} requests waiting); retry after {} s",
                    state.retry_after_secs
                ),
                kind: "rate_limit_error",
                param: None,
                code: Some("queue_full"),
            },
            retry_after: Some(state.retry_after_secs),
        },
        EngineCallError::Refused(SubmitError::PromptTooLong { prompt, context }) => {
            context_exceeded(prompt_param, prompt, context)
        }
        EngineCallError::Refused(
            e @ (SubmitError::PromptTooLarge { .. }
            | SubmitError::EmptyPrompt
            | SubmitError::BadToken { .. }),
        ) => ApiError::invalid(prompt_param, e.to_string()).into(),
        EngineCallError::Refused(e @ (SubmitError::NoTokens | SubmitError::Sampling(_))) => {
            ApiError::bad_body(e.to_string()).into()
        }
        EngineCallError::Input(m) => ApiError::invalid(prompt_param, m).into(),
        EngineCallError::Stopped | EngineCallError::Failed(_) => server_error(e.to_string()),
    }
}

fn context_exceeded(param: &str, prompt: usize, context: usize) -> Failure {
    let mut e = ApiError::invalid(
        param,
        format!(
            "the prompt has {prompt} tokens; this model's context holds {context} tokens, \
             including at least one generated token"
        ),
    );
    e.code = Some("context_length_exceeded");
    e.into()
}

/// The body bytes, or the OpenAI error for a body axum could not read (too large, broken).
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Failure> {
    body.map_err(|e| {
        let mut err = ApiError::bad_body(e.body_text());
        err.status = e.status().as_u16();
        err.into()
    })
}

/// The routes, with request counting and the body limit.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
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

async fn models(State(state): State<Arc<ServerState>>) -> Json<Value> {
    let data: Vec<Value> = state
        .names()
        .into_iter()
        .map(|name| {
            json!({"id": name, "object": "model", "created": state.started, "owned_by": "kiln"})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
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
        Json(json!({"status": "ok"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "stopped_models": dead})),
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

async fn embeddings(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    let req: EmbeddingRequest = parse_body(&body_bytes(body)?)?;
    let e = state.embedder(&req.model)?;
    let v = req.validate(state.max_embed_inputs)?;
    let input = if v.inputs.iter().all(|i| matches!(i, Input::Text(_))) {
        EmbedInput::Texts(
            v.inputs
                .into_iter()
                .filter_map(|i| match i {
                    Input::Text(t) => Some(t),
                    Input::Ids(_) => None,
                })
                .collect(),
        )
    } else {
        EmbedInput::Ids(
            v.inputs
                .into_iter()
                .filter_map(|i| match i {
                    Input::Ids(ids) => Some(ids),
                    Input::Text(_) => None,
                })
                .collect(),
        )
    };
    let out = e
        .engine
        .embed(input)
        .await
        .map_err(|err| engine_failure(err, &state, "input"))?;
    let tokens: usize = out.iter().map(|(_, n)| n).sum();
    let data: Vec<Value> = out
        .into_iter()
        .enumerate()
        .map(|(i, (vector, _))| {
            let embedding = if v.base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": e.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// Which API a generation answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

/// One prompt of a generation request.
struct Prompt {
    ids: Vec<u32>,
    /// Its text (for `echo`).
    text: String,
}

/// A validated generation request with its prompts tokenized.
struct Generation {
    api: Api,
    prompts: Vec<Prompt>,
    gen: ValidGeneration,
    /// Top alternatives per token when log-probabilities are asked for.
    logprobs: Option<usize>,
    echo: bool,
    arrived: Instant,
}

async fn chat_completions(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    let arrived = Instant::now();
    let req: ChatCompletionRequest = parse_body(&body_bytes(body)?)?;
    let d = state.decoder(&req.model)?;
    let v = req.validate(&state.limits)?;
    let Some(template) = &d.chat_template else {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the model '{}' has no chat template (a base model); use /v1/completions, or \
                 start kiln serve with --chat-template FILE",
                d.name
            ),
        )
        .into());
    };
    let messages: Vec<ChatMessage> = v
        .messages
        .iter()
        .map(|(role, content)| ChatMessage::new(role, content))
        .collect();
    let text = template
        .render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                now: None,
            },
        )
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    // The template writes the special tokens (BOS included) itself, as transformers'
    // apply_chat_template expects.
    let ids = d
        .tokenizer
        .encode(&text, false, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let g = Generation {
        api: Api::Chat,
        prompts: vec![Prompt { ids, text }],
        gen: v.generation,
        logprobs: v.logprobs.map(|k| k as usize),
        echo: false,
        arrived,
    };
    generate(state.clone(), d, g).await
}

async fn completions(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    let arrived = Instant::now();
    let req: CompletionRequest = parse_body(&body_bytes(body)?)?;
    let d = state.decoder(&req.model)?;
    let v = req.validate(&state.limits)?;
    let mut prompts = Vec::with_capacity(v.prompts.len());
    for (i, p) in v.prompts.iter().enumerate() {
        prompts.push(match p {
            Input::Text(t) => Prompt {
                ids: d
                    .tokenizer
                    .encode(t, true, true)
                    .map_err(|e| ApiError::invalid(&format!("prompt[{i}]"), e.to_string()))?,
                text: t.clone(),
            },
            Input::Ids(ids) => Prompt {
                text: if v.echo {
                    d.tokenizer.decode(ids, true)
                } else {
                    String::new()
                },
                ids: ids.clone(),
            },
        });
    }
    let g = Generation {
        api: Api::Completion,
        prompts,
        gen: v.generation,
        logprobs: v.logprobs.map(|k| k as usize),
        echo: v.echo,
        arrived,
    };
    generate(state.clone(), d, g).await
}

/// One token with its log-probability, as reported.
#[derive(Clone)]
struct TokenInfo {
    text: String,
    bytes: Vec<u8>,
    /// `None` for the first prompt token of an echo (nothing predicts it).
    logprob: Option<f64>,
    top: Vec<(String, Vec<u8>, f64)>,
}

fn token_info(tok: &TextTokenizer, id: u32, lp: Option<&TokenLogprob>) -> TokenInfo {
    let piece = |id: u32| {
        let bytes = tok.piece_bytes(id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    };
    let (text, bytes) = piece(id);
    TokenInfo {
        text,
        bytes,
        logprob: lp.map(|l| l.logprob),
        top: lp
            .map(|l| {
                l.top
                    .iter()
                    .map(|&(t, p)| {
                        let (s, b) = piece(t);
                        (s, b, p)
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// What one event added to a choice.
#[derive(Default)]
struct Delta {
    text: String,
    tokens: Vec<TokenInfo>,
    finish: Option<&'static str>,
}

/// One choice being generated: detokenization, stop strings, and its log-probabilities.
struct Choice<'t> {
    tok: &'t TextTokenizer,
    end_ids: &'t [u32],
    stream: Option<TextStream<'t>>,
    stop: StopMatcher,
    ticket: Option<Ticket>,
    generated: usize,
    pending: Vec<TokenInfo>,
    finish: Option<&'static str>,
    last_token: Option<Instant>,
}

fn finish_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        // A sequence that outgrew the whole KV pool ends as if at a length limit.
        FinishReason::Length | FinishReason::CacheFull => "length",
    }
}

impl<'t> Choice<'t> {
    fn new(d: &'t DecoderEntry, stop: &[String], ticket: Option<Ticket>) -> Self {
        Choice {
            tok: &d.tokenizer,
            end_ids: &d.end_ids,
            stream: Some(d.tokenizer.stream()),
            stop: StopMatcher::new(stop),
            finish: if ticket.is_none() {
                Some("length")
            } else {
                None
            },
            ticket,
            generated: 0,
            pending: Vec::new(),
            last_token: None,
        }
    }

    /// Applies one engine event; `Err` when the model failed.
    fn on(
        &mut self,
        out: Out,
        metrics: &Metrics,
        model: &str,
        arrived: Instant,
    ) -> Result<Delta, String> {
        if self.finish.is_some() {
            return Ok(Delta::default());
        }
        match out {
            Out::Token { token, logprob } => {
                self.generated += 1;
                let now = Instant::now();
                match self.last_token {
                    None => metrics.time_to_first_token(model, (now - arrived).as_secs_f64()),
                    Some(t) => metrics.time_per_output_token(model, (now - t).as_secs_f64()),
                }
                self.last_token = Some(now);
                if self.end_ids.contains(&token) {
                    // The end of the turn: no text; `Finished` follows.
                    return Ok(Delta::default());
                }
                if let Some(lp) = &logprob {
                    self.pending.push(token_info(self.tok, token, Some(lp)));
                }
                let piece = self
                    .stream
                    .as_mut()
                    .map_or(String::new(), |s| s.push(token));
                let r = self.stop.push(&piece);
                let mut delta = Delta {
                    text: r.text,
                    ..Delta::default()
                };
                if r.stopped {
                    self.finish = Some("stop");
                    delta.finish = self.finish;
                    // Ends the request in the engine (its blocks go back to the pool).
                    self.ticket = None;
                }
                if !delta.text.is_empty() || delta.finish.is_some() {
                    delta.tokens = std::mem::take(&mut self.pending);
                }
                Ok(delta)
            }
            Out::Finished(reason) => {
                let rest = self.stream.take().map_or(String::new(), TextStream::finish);
                let r = self.stop.push(&rest);
                let mut text = r.text;
                let finish = if r.stopped {
                    "stop"
                } else {
                    text.push_str(&self.stop.finish());
                    finish_name(reason)
                };
                if let Some(t) = self.ticket.take() {
                    t.finished();
                }
                self.finish = Some(finish);
                Ok(Delta {
                    text,
                    tokens: std::mem::take(&mut self.pending),
                    finish: Some(finish),
                })
            }
            Out::Failed(m) => {
                self.finish = Some("error");
                Err(m)
            }
        }
    }
}

/// Chat `logprobs.content` entries.
fn chat_logprobs(tokens: &[TokenInfo]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            json!({
                "token": t.text,
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": t.top.iter().map(|(s, b, p)| json!({
                    "token": s, "logprob": p, "bytes": b,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions `logprobs`: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset` (chars
/// from the start of the choice's text, `offset` for the first).
fn completion_logprobs(tokens: &[TokenInfo], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(at);
        at += t.text.chars().count();
    }
    json!({
        "tokens": tokens.iter().map(|t| &t.text).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| {
            if t.logprob.is_none() {
                return Value::Null;
            }
            let mut m = serde_json::Map::new();
            for (s, _, p) in &t.top {
                m.entry(s.clone()).or_insert(json!(p));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Log-probabilities of a prompt's tokens (the first has none), for `echo`.
async fn prompt_logprobs(
    d: &DecoderEntry,
    ids: &[u32],
    top: usize,
    state: &ServerState,
) -> Result<Vec<TokenInfo>, Failure> {
    let scores = d
        .engine
        .score(ids.to_vec(), top)
        .await
        .map_err(|e| engine_failure(e, state, "prompt"))?;
    let mut out = Vec::with_capacity(ids.len());
    out.push(token_info(&d.tokenizer, ids[0], None));
    for (i, s) in scores.iter().enumerate() {
        let lp = TokenLogprob {
            logprob: s.logprob_next,
            top: s.top.clone(),
        };
        out.push(token_info(&d.tokenizer, ids[i + 1], Some(&lp)));
    }
    Ok(out)
}

/// Submits every (prompt, choice) of `g` and answers: a JSON body, or an SSE stream.
async fn generate(
    state: Arc<ServerState>,
    d: &DecoderEntry,
    g: Generation,
) -> Result<Response, Failure> {
    let prompt_param = match g.api {
        Api::Chat => "messages",
        Api::Completion => "prompt",
    };
    let n = g.gen.n as usize;
    if g.prompts.len() * n > state.max_choices {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "{} prompts × n = {n} is more than the {} sequences one request may start",
                g.prompts.len(),
                state.max_choices
            ),
        )
        .into());
    }
    let generating = g.gen.max_tokens > 0;
    if g.prompts.iter().any(|p| p.ids.is_empty()) {
        return Err(ApiError::invalid(
            prompt_param,
            "the prompt is empty (it tokenizes to no tokens)",
        )
        .into());
    }
    for p in &g.prompts {
        // Scoring alone (echo, max_tokens 0) may fill the whole context.
        if p.ids.len() >= d.context + usize::from(!generating) {
            return Err(context_exceeded(prompt_param, p.ids.len(), d.context));
        }
    }
    // Echoed prompts' log-probabilities, computed before generation starts.
    let mut echoed: Vec<Option<Vec<TokenInfo>>> = Vec::new();
    for p in &g.prompts {
        echoed.push(match (g.echo, g.logprobs) {
            (true, Some(top)) => Some(prompt_logprobs(d, &p.ids, top, &state).await?),
            _ => None,
        });
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let mut tickets = Vec::with_capacity(g.prompts.len() * n);
    for (pi, p) in g.prompts.iter().enumerate() {
        for j in 0..n {
            if !generating {
                tickets.push(None);
                continue;
            }
            let mut sampling = g.gen.sampling.clone();
            // Choices of one request must differ: each gets its own random stream.
            sampling.seed = sampling.seed.wrapping_add(j as u64);
            let req = Request {
                prompt: p.ids.clone(),
                max_tokens: (g.gen.max_tokens as usize).min(d.context - p.ids.len()),
                sampling,
                stop_ids: d.end_ids.clone(),
                logprobs: g.logprobs,
            };
            let ticket = d
                .engine
                .submit(pi * n + j, req, tx.clone())
                .await
                .map_err(|e| engine_failure(e, &state, prompt_param))?;
            tickets.push(Some(ticket));
        }
    }
    drop(tx);
    let prompt_tokens: usize = g.prompts.iter().map(|p| p.ids.len()).sum();
    let ctx = Ctx {
        id: response_id(match g.api {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        }),
        created: unix_now(),
        model: d.name.clone(),
        api: g.api,
        prompt_tokens,
        n,
        arrived: g.arrived,
    };
    if g.gen.stream {
        let (sse_tx, sse_rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
        let state2 = state.clone();
        tokio::spawn(async move {
            let Some(d) = state2.decoders.iter().find(|x| x.name == ctx.model) else {
                return;
            };
            stream_choices(&state2, d, &ctx, &g, tickets, echoed, rx, sse_tx).await;
        });
        let sse = Sse::new(ReceiverStream::new(sse_rx)).keep_alive(KeepAlive::default());
        return Ok(sse.into_response());
    }
    collect_choices(&state, d, &ctx, &g, tickets, echoed, rx).await
}

/// What every response of one request repeats.
struct Ctx {
    id: String,
    created: u64,
    model: String,
    api: Api,
    prompt_tokens: usize,
    n: usize,
    arrived: Instant,
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

#[allow(clippy::too_many_arguments)]
async fn collect_choices(
    state: &ServerState,
    d: &DecoderEntry,
    ctx: &Ctx,
    g: &Generation,
    tickets: Vec<Option<Ticket>>,
    echoed: Vec<Option<Vec<TokenInfo>>>,
    mut rx: mpsc::UnboundedReceiver<(usize, Out)>,
) -> Result<Response, Failure> {
    let mut choices: Vec<Choice> = tickets
        .into_iter()
        .map(|t| Choice::new(d, &g.gen.stop, t))
        .collect();
    let mut texts = vec![String::new(); choices.len()];
    let mut tokens: Vec<Vec<TokenInfo>> = (0..choices.len()).map(|_| Vec::new()).collect();
    let mut failed = None;
    while choices.iter().any(|c| c.finish.is_none()) {
        let Some((tag, out)) = rx.recv().await else {
            failed = Some("the model's engine thread stopped".to_string());
            break;
        };
        match choices[tag].on(out, &state.metrics, &d.name, ctx.arrived) {
            Ok(delta) => {
                texts[tag].push_str(&delta.text);
                tokens[tag].extend(delta.tokens);
            }
            Err(m) => {
                failed = Some(m);
                break;
            }
        }
    }
    let generated: usize = choices.iter().map(|c| c.generated).sum();
    state
        .metrics
        .tokens(&ctx.model, ctx.prompt_tokens, generated);
    if let Some(m) = failed {
        return Err(server_error(m));
    }
    let mut out = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        let p = i / ctx.n;
        let finish = c.finish.unwrap_or("stop");
        out.push(match ctx.api {
            Api::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": texts[i]},
                "logprobs": g.logprobs.map(|_| chat_logprobs(&tokens[i])),
                "finish_reason": finish,
            }),
            Api::Completion => {
                let (prefix, mut lp) = if g.echo {
                    let prompt_lp = echoed[p].clone();
                    (g.prompts[p].text.clone(), prompt_lp.unwrap_or_default())
                } else {
                    (String::new(), Vec::new())
                };
                lp.extend(tokens[i].iter().cloned());
                json!({
                    "index": i,
                    "text": prefix + &texts[i],
                    "logprobs": g.logprobs.map(|_| completion_logprobs(&lp, 0)),
                    "finish_reason": finish,
                })
            }
        });
    }
    let object = match ctx.api {
        Api::Chat => "chat.completion",
        Api::Completion => "text_completion",
    };
    Ok(Json(json!({
        "id": ctx.id,
        "object": object,
        "created": ctx.created,
        "model": ctx.model,
        "choices": out,
        "usage": usage(ctx.prompt_tokens, generated),
    }))
    .into_response())
}

/// One SSE chunk of choice `index`.
fn chunk(ctx: &Ctx, index: usize, body: Value, finish: Option<&str>, include_usage: bool) -> Value {
    let mut choice = body;
    choice["index"] = json!(index);
    choice["finish_reason"] = json!(finish);
    let mut v = json!({
        "id": ctx.id,
        "object": match ctx.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        },
        "created": ctx.created,
        "model": ctx.model,
        "choices": [choice],
    });
    if include_usage {
        v["usage"] = Value::Null;
    }
    v
}

#[allow(clippy::too_many_arguments)]
async fn stream_choices(
    state: &ServerState,
    d: &DecoderEntry,
    ctx: &Ctx,
    g: &Generation,
    tickets: Vec<Option<Ticket>>,
    echoed: Vec<Option<Vec<TokenInfo>>>,
    mut rx: mpsc::UnboundedReceiver<(usize, Out)>,
    sse: mpsc::Sender<Result<SseEvent, Infallible>>,
) {
    let include_usage = g.gen.include_usage;
    let send = |v: Value| {
        let sse = sse.clone();
        async move {
            sse.send(Ok(SseEvent::default().data(v.to_string())))
                .await
                .is_ok()
        }
    };
    let mut choices: Vec<Choice> = tickets
        .into_iter()
        .map(|t| Choice::new(d, &g.gen.stop, t))
        .collect();
    // Opening chunks: the role (chat), the echoed prompt (completions).
    let mut chars: BTreeMap<usize, usize> = BTreeMap::new();
    for i in 0..choices.len() {
        let p = i / ctx.n;
        let body = match ctx.api {
            Api::Chat => {
                let mut b = json!({"delta": {"role": "assistant", "content": ""}});
                if g.logprobs.is_some() {
                    b["logprobs"] = Value::Null;
                }
                b
            }
            Api::Completion if g.echo => {
                let text = &g.prompts[p].text;
                chars.insert(i, text.chars().count());
                json!({
                    "text": text,
                    "logprobs": echoed[p].as_ref().map(|e| completion_logprobs(e, 0)),
                })
            }
            Api::Completion => continue,
        };
        if !send(chunk(ctx, i, body, None, include_usage)).await {
            return;
        }
    }
    // Choices that generate nothing (echo with max_tokens 0) end at once.
    for (i, c) in choices.iter().enumerate() {
        if let Some(f) = c.finish {
            let body = match ctx.api {
                Api::Chat => json!({"delta": {}}),
                Api::Completion => json!({"text": ""}),
            };
            if !send(chunk(ctx, i, body, Some(f), include_usage)).await {
                return;
            }
        }
    }
    let mut error = None;
    while choices.iter().any(|c| c.finish.is_none()) {
        let (tag, out) = tokio::select! {
            // The client went away: dropping `choices` cancels the requests.
            _ = sse.closed() => break,
            ev = rx.recv() => match ev {
                Some(ev) => ev,
                None => {
                    error = Some("the model's engine thread stopped".to_string());
                    break;
                }
            },
        };
        let delta = match choices[tag].on(out, &state.metrics, &d.name, ctx.arrived) {
            Ok(delta) => delta,
            Err(m) => {
                error = Some(m);
                break;
            }
        };
        if delta.text.is_empty() && delta.finish.is_none() && delta.tokens.is_empty() {
            continue;
        }
        let body = match ctx.api {
            Api::Chat => {
                let content = if delta.text.is_empty() && delta.finish.is_some() {
                    json!({})
                } else {
                    json!({"content": delta.text})
                };
                let mut b = json!({"delta": content});
                if g.logprobs.is_some() {
                    b["logprobs"] = chat_logprobs(&delta.tokens);
                }
                b
            }
            Api::Completion => {
                let at = chars.entry(tag).or_insert(0);
                let lp = g.logprobs.map(|_| completion_logprobs(&delta.tokens, *at));
                *at += delta.text.chars().count();
                json!({"text": delta.text, "logprobs": lp})
            }
        };
        if !send(chunk(ctx, tag, body, delta.finish, include_usage)).await {
            break;
        }
    }
    let generated: usize = choices.iter().map(|c| c.generated).sum();
    state
        .metrics
        .tokens(&ctx.model, ctx.prompt_tokens, generated);
    drop(choices);
    if let Some(m) = error {
        let e = server_error(m).error.body();
        let _ = send(e).await;
        return;
    }
    if include_usage {
        let v = json!({
            "id": ctx.id,
            "object": match ctx.api {
                Api::Chat => "chat.completion.chunk",
                Api::Completion => "text_completion",
            },
            "created": ctx.created,
            "model": ctx.model,
            "choices": [],
            "usage": usage(ctx.prompt_tokens, generated),
        });
        if !send(v).await {
            return;
        }
    }
    let _ = sse.send(Ok(SseEvent::default().data("[DONE]"))).await;
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
