//! `POST /v1/chat/completions` and `POST /v1/completions`: the prompts tokenized, one scheduler
//! request per (prompt, choice), and the answer collected whole or streamed as SSE chunks.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_engine::Request;
use kiln_tokenizer::{ChatMessage, RenderOptions};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::choice::{
    chat_logprobs, completion_logprobs, prompt_logprobs, Choice, TokenInfo, ToolParse,
};
use super::errors::{body_bytes, context_exceeded, engine_failure, server_error, Failure};
use super::{response_id, unix_now, DecoderEntry, ServerState};
use crate::api::{
    parse_body, ApiError, ChatCompletionRequest, CompletionRequest, Input, ValidGeneration,
};
use crate::engine::{Out, Ticket};
use crate::responses::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatDelta, Chunk, CompletionChoice,
    CompletionChunkChoice, ErrorBody, FunctionCall, FunctionDelta, Generated, ToolCall,
    ToolCallDelta, Usage,
};
use crate::tools::{self, ToolDelta, ToolFormat};

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
    /// With tools: how the output is read for calls.
    tools: Option<ToolParse>,
    /// The request field a grammar came from (for a 400).
    grammar_param: &'static str,
}

pub(super) async fn chat_completions(
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
    let (messages, tools_var): (Vec<ChatMessage>, _) =
        tools::prompt(d.tool_format, v.messages, v.tools.as_ref());
    let text = template
        .render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                now: None,
                tools: tools_var,
            },
        )
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let mut gen = v.generation;
    let mut tool_parse = None;
    let mut grammar_param = "response_format";
    if let Some(t) = v.tools.as_ref().filter(|t| t.active()) {
        let controls = d.grammars.controls(d.tool_format.markers()).await?;
        gen.grammar = tools::grammar(d.tool_format, t, &|text| {
            controls.iter().find(|(c, _)| c == text).map(|(_, id)| *id)
        });
        grammar_param = "tools";
        tool_parse = Some(ToolParse {
            format: d.tool_format,
            marks: controls.into_iter().map(|(t, id)| (id, t)).collect(),
        });
    }
    // The template writes the special tokens (BOS included) itself, as transformers'
    // apply_chat_template expects.
    let ids = d
        .tokenizer
        .encode(&text, false, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let g = Generation {
        api: Api::Chat,
        prompts: vec![Prompt { ids, text }],
        gen,
        logprobs: v.logprobs.map(|k| k as usize),
        echo: false,
        arrived,
        tools: tool_parse,
        grammar_param,
    };
    generate(state.clone(), d, g).await
}

pub(super) async fn completions(
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
        tools: None,
        grammar_param: "response_format",
    };
    generate(state.clone(), d, g).await
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
    let vocab = d.tokenizer.vocab_size();
    if let Some(&(id, _)) = g
        .gen
        .sampling
        .logit_bias
        .iter()
        .find(|&&(id, _)| id as usize >= vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("token id {id} is outside the vocabulary ({vocab} tokens)"),
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
            // Each choice steps its own copy of the grammar (compiled once, cached).
            let constraint = match &g.gen.grammar {
                Some(spec) => Some(d.grammars.start(spec, g.grammar_param).await?),
                None => None,
            };
            let req = Request {
                prompt: p.ids.clone(),
                max_tokens: (g.gen.max_tokens as usize).min(d.context - p.ids.len()),
                sampling,
                stop_ids: d.end_ids.clone(),
                logprobs: g.logprobs,
                constraint,
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

impl Ctx {
    /// The whole answer, of `choices`.
    fn generated<C>(&self, choices: Vec<C>, completion_tokens: usize) -> Generated<C> {
        Generated {
            choices,
            created: self.created,
            id: self.id.clone(),
            model: self.model.clone(),
            object: match self.api {
                Api::Chat => "chat.completion",
                Api::Completion => "text_completion",
            },
            usage: Usage::new(self.prompt_tokens, completion_tokens),
        }
    }

    /// One SSE chunk: `usage` absent, `null`, or the closing chunk's counts.
    fn chunk<C>(&self, choices: Vec<C>, usage: Option<Option<Usage>>) -> Chunk<C> {
        Chunk {
            choices,
            created: self.created,
            id: self.id.clone(),
            model: self.model.clone(),
            object: match self.api {
                Api::Chat => "chat.completion.chunk",
                Api::Completion => "text_completion",
            },
            usage,
        }
    }
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
        .map(|t| Choice::new(d, &g.gen.stop, t, g.tools.as_ref()))
        .collect();
    let mut texts = vec![String::new(); choices.len()];
    let mut calls: Vec<Vec<ToolCall>> = vec![Vec::new(); choices.len()];
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
                for c in delta.calls {
                    match c {
                        ToolDelta::Call { name, .. } => calls[tag].push(ToolCall {
                            function: FunctionCall {
                                arguments: String::new(),
                                name,
                            },
                            id: tool_call_id(g.tools.as_ref().map(|t| t.format)),
                            kind: "function",
                        }),
                        ToolDelta::Arguments { index, text } => {
                            if let Some(call) = calls[tag].get_mut(index) {
                                call.function.arguments.push_str(&text);
                            }
                        }
                        ToolDelta::Content(t) => texts[tag].push_str(&t),
                    }
                }
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
    let finishes = choices.iter().map(|c| c.finish.unwrap_or("stop"));
    let resp = match ctx.api {
        Api::Chat => {
            let out = finishes
                .zip(texts.into_iter().zip(calls))
                .enumerate()
                .map(|(i, (finish, (content, calls)))| ChatChoice {
                    finish_reason: finish,
                    index: i,
                    logprobs: g.logprobs.map(|_| chat_logprobs(&tokens[i])),
                    message: AssistantMessage {
                        // A turn that only calls tools has no content (`null`).
                        content: (calls.is_empty() || !content.is_empty()).then_some(content),
                        role: "assistant",
                        tool_calls: (!calls.is_empty()).then_some(calls),
                    },
                })
                .collect();
            Json(ctx.generated(out, generated)).into_response()
        }
        Api::Completion => {
            let out = finishes
                .zip(texts)
                .enumerate()
                .map(|(i, (finish, text))| {
                    let p = i / ctx.n;
                    let (prefix, mut lp) = if g.echo {
                        let prompt_lp = echoed[p].clone();
                        (g.prompts[p].text.clone(), prompt_lp.unwrap_or_default())
                    } else {
                        (String::new(), Vec::new())
                    };
                    lp.extend(tokens[i].iter().cloned());
                    CompletionChoice {
                        finish_reason: finish,
                        index: i,
                        logprobs: g.logprobs.map(|_| completion_logprobs(&lp, 0)),
                        text: prefix + &text,
                    }
                })
                .collect();
            Json(ctx.generated(out, generated)).into_response()
        }
    };
    Ok(resp)
}

/// A chunk of either API.
enum StreamChoice {
    Chat(ChatChunkChoice),
    Completion(CompletionChunkChoice),
}

/// The data of one SSE event.
fn event_data(v: &impl Serialize) -> String {
    serde_json::to_string(v).expect("a response body serializes")
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
    // Every choice's chunk carries `usage`: `null` until the closing chunk.
    let usage = g.gen.include_usage.then_some(None);
    let send = |data: String| {
        let sse = sse.clone();
        async move { sse.send(Ok(SseEvent::default().data(data))).await.is_ok() }
    };
    let send_choice = |c: StreamChoice| {
        send(match c {
            StreamChoice::Chat(c) => event_data(&ctx.chunk(vec![c], usage)),
            StreamChoice::Completion(c) => event_data(&ctx.chunk(vec![c], usage)),
        })
    };
    let mut choices: Vec<Choice> = tickets
        .into_iter()
        .map(|t| Choice::new(d, &g.gen.stop, t, g.tools.as_ref()))
        .collect();
    // Opening chunks: the role (chat), the echoed prompt (completions).
    let mut chars: BTreeMap<usize, usize> = BTreeMap::new();
    for i in 0..choices.len() {
        let p = i / ctx.n;
        let choice = match ctx.api {
            Api::Chat => StreamChoice::Chat(ChatChunkChoice {
                delta: ChatDelta {
                    content: Some(String::new()),
                    role: Some("assistant"),
                    tool_calls: None,
                },
                finish_reason: None,
                index: i,
                logprobs: g.logprobs.map(|_| None),
            }),
            Api::Completion if g.echo => {
                let text = &g.prompts[p].text;
                chars.insert(i, text.chars().count());
                StreamChoice::Completion(CompletionChunkChoice {
                    finish_reason: None,
                    index: i,
                    logprobs: Some(echoed[p].as_ref().map(|e| completion_logprobs(e, 0))),
                    text: text.clone(),
                })
            }
            Api::Completion => continue,
        };
        if !send_choice(choice).await {
            return;
        }
    }
    // Choices that generate nothing (echo with max_tokens 0) end at once.
    for (i, c) in choices.iter().enumerate() {
        if let Some(f) = c.finish {
            let choice = match ctx.api {
                Api::Chat => StreamChoice::Chat(ChatChunkChoice {
                    delta: ChatDelta::default(),
                    finish_reason: Some(f),
                    index: i,
                    logprobs: None,
                }),
                Api::Completion => StreamChoice::Completion(CompletionChunkChoice {
                    finish_reason: Some(f),
                    index: i,
                    logprobs: None,
                    text: String::new(),
                }),
            };
            if !send_choice(choice).await {
                return;
            }
        }
    }
    // Each choice's calls' ids, as they begin.
    let mut call_ids: Vec<Vec<String>> = vec![Vec::new(); choices.len()];
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
        if delta.text.is_empty()
            && delta.calls.is_empty()
            && delta.finish.is_none()
            && delta.tokens.is_empty()
        {
            continue;
        }
        let tool_calls = (!delta.calls.is_empty()).then(|| {
            call_deltas(
                delta.calls,
                &mut call_ids[tag],
                g.tools.as_ref().map(|t| t.format),
            )
        });
        let choice = match ctx.api {
            Api::Chat => StreamChoice::Chat(ChatChunkChoice {
                delta: ChatDelta {
                    // The closing chunk without text has an empty delta (`{}`); a chunk of
                    // calls has no content.
                    content: (!(delta.text.is_empty()
                        && (delta.finish.is_some() || tool_calls.is_some())))
                    .then(|| delta.text.clone()),
                    role: None,
                    tool_calls,
                },
                finish_reason: delta.finish,
                index: tag,
                logprobs: g.logprobs.map(|_| Some(chat_logprobs(&delta.tokens))),
            }),
            Api::Completion => {
                let at = chars.entry(tag).or_insert(0);
                let lp = g.logprobs.map(|_| completion_logprobs(&delta.tokens, *at));
                *at += delta.text.chars().count();
                StreamChoice::Completion(CompletionChunkChoice {
                    finish_reason: delta.finish,
                    index: tag,
                    logprobs: Some(lp),
                    text: delta.text,
                })
            }
        };
        if !send_choice(choice).await {
            break;
        }
    }
    let generated: usize = choices.iter().map(|c| c.generated).sum();
    state
        .metrics
        .tokens(&ctx.model, ctx.prompt_tokens, generated);
    drop(choices);
    if let Some(m) = error {
        let _ = send(event_data(&ErrorBody::from(&server_error(m).error))).await;
        return;
    }
    if usage.is_some() {
        let closing = ctx.chunk::<CompletionChunkChoice>(
            Vec::new(),
            Some(Some(Usage::new(ctx.prompt_tokens, generated))),
        );
        if !send(event_data(&closing)).await {
            return;
        }
    }
    let _ = sse.send(Ok(SseEvent::default().data("[DONE]"))).await;
}

/// A new tool call's id: `call_` and 24 letters and digits; for Mistral's format 9 letters and
/// digits (its templates refuse other ids when the call comes back in the conversation).
fn tool_call_id(format: Option<ToolFormat>) -> String {
    use std::hash::{BuildHasher, Hasher};
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(unix_now());
    let mut rng = kiln_engine::Rng::new(h.finish());
    let n = if format == Some(ToolFormat::Mistral) {
        9
    } else {
        24
    };
    let random: String = (0..n)
        .map(|_| {
            ALPHABET[(rng.next_f64() * ALPHABET.len() as f64) as usize % ALPHABET.len()] as char
        })
        .collect();
    if n == 9 {
        random
    } else {
        format!("call_{random}")
    }
}

/// A chunk's `tool_calls`: a call's opening (id, type, name, no arguments yet) and argument
/// text, one entry per call (a call's opening and its first arguments together).
fn call_deltas(
    deltas: Vec<ToolDelta>,
    ids: &mut Vec<String>,
    format: Option<ToolFormat>,
) -> Vec<ToolCallDelta> {
    let mut out: Vec<ToolCallDelta> = Vec::new();
    for d in deltas {
        match d {
            ToolDelta::Call { index, name } => {
                let id = tool_call_id(format);
                ids.push(id.clone());
                out.push(ToolCallDelta {
                    function: FunctionDelta {
                        arguments: String::new(),
                        name: Some(name),
                    },
                    id: Some(id),
                    index,
                    kind: Some("function"),
                });
            }
            ToolDelta::Arguments { index, text } => match out.last_mut() {
                Some(last) if last.index == index => last.function.arguments.push_str(&text),
                _ => out.push(ToolCallDelta {
                    function: FunctionDelta {
                        arguments: text,
                        name: None,
                    },
                    id: None,
                    index,
                    kind: None,
                }),
            },
            ToolDelta::Content(_) => {}
        }
    }
    out
}
