//! OpenAI response bodies: what the server answers with, as types.
//!
//! Every body the HTTP layer sends is one of these, serialized with `serde_json`. The fields of
//! each struct are declared in alphabetical order: that is the order the server has always sent
//! them in (its bodies were built as `serde_json::Value`s, whose maps sort their keys), so the
//! bytes on the wire do not change. Keep new fields in that order.
//!
//! Absent and `null` are different on the wire, and both occur: a plain `Option<T>` is `null`
//! when `None`; an `Option<T>` with `skip_serializing_if` is left out when `None`; and an
//! `Option<Option<T>>` with `skip_serializing_if` is left out (`None`), `null` (`Some(None)`)
//! or the value.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use crate::api::ApiError;

/// `{"error": {"code", "message", "param", "type"}}`, of every refusal and failure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorObject<'a>,
}

/// The `error` object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorObject<'a> {
    pub code: Option<&'a str>,
    pub message: &'a str,
    pub param: Option<&'a str>,
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, `server_error`.
    #[serde(rename = "type")]
    pub kind: &'a str,
}

impl<'a> From<&'a ApiError> for ErrorBody<'a> {
    fn from(e: &'a ApiError) -> Self {
        ErrorBody {
            error: ErrorObject {
                code: e.code,
                message: &e.message,
                param: e.param.as_deref(),
                kind: e.kind,
            },
        }
    }
}

/// `GET /v1/models`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelList<'a> {
    pub data: Vec<ModelObject<'a>>,
    /// `list`.
    pub object: &'static str,
}

/// One served model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelObject<'a> {
    /// Unix time the server started.
    pub created: u64,
    pub id: &'a str,
    /// `model`.
    pub object: &'static str,
    /// `kiln`.
    pub owned_by: &'static str,
}

impl<'a> ModelList<'a> {
    pub fn new(names: impl IntoIterator<Item = &'a str>, created: u64) -> Self {
        ModelList {
            data: names
                .into_iter()
                .map(|id| ModelObject {
                    created,
                    id,
                    object: "model",
                    owned_by: "kiln",
                })
                .collect(),
            object: "list",
        }
    }
}

/// `GET /health`: `{"status": "ok"}`, or `{"status": "error", "stopped_models": [...]}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Health<'a> {
    Ok,
    Error { stopped_models: Vec<&'a str> },
}

/// `POST /v1/embeddings`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EmbeddingList {
    pub data: Vec<EmbeddingObject>,
    pub model: String,
    /// `list`.
    pub object: &'static str,
    pub usage: EmbeddingUsage,
}

/// One input's vector.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EmbeddingObject {
    pub embedding: EmbeddingVector,
    pub index: usize,
    /// `embedding`.
    pub object: &'static str,
}

/// A vector: JSON numbers, or base64 of little-endian f32.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// Written as f64 numbers (the f32 widened; non-finite ones as `null`), as kiln always has.
    Float(#[serde(serialize_with = "widened")] Vec<f32>),
    Base64(String),
}

fn widened<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|&x| f64::from(x)))
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// A generation's token counts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Usage {
    pub completion_tokens: usize,
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            completion_tokens,
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// A whole generation (not streamed): a [`ChatCompletion`] or a [`Completion`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Generated<C> {
    pub choices: Vec<C>,
    pub created: u64,
    pub id: String,
    pub model: String,
    /// `chat.completion` or `text_completion`.
    pub object: &'static str,
    pub usage: Usage,
}

/// `POST /v1/chat/completions` answered whole.
pub type ChatCompletion = Generated<ChatChoice>;
/// `POST /v1/completions` answered whole.
pub type Completion = Generated<CompletionChoice>;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatChoice {
    pub finish_reason: &'static str,
    pub index: usize,
    /// `null` unless log-probabilities were asked for.
    pub logprobs: Option<ChatLogprobs>,
    pub message: AssistantMessage,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AssistantMessage {
    /// `null` when the turn only calls tools.
    pub content: Option<String>,
    /// `assistant`.
    pub role: &'static str,
    /// The calls the model made (absent when none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One call of a tool: `{"function": {"arguments", "name"}, "id", "type": "function"}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolCall {
    pub function: FunctionCall,
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The function a call names and its arguments (JSON text).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionCall {
    pub arguments: String,
    pub name: String,
}

/// A streamed piece of a call: its opening (`id`, `type`, the name, empty arguments), then
/// argument text.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub function: FunctionDelta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub index: usize,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionDelta {
    pub arguments: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionChoice {
    pub finish_reason: &'static str,
    pub index: usize,
    /// `null` unless log-probabilities were asked for.
    pub logprobs: Option<CompletionLogprobs>,
    pub text: String,
}

/// Chat `logprobs`: one entry per token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
    /// Always `null`.
    pub refusal: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's UTF-8 bytes, as numbers.
    pub bytes: Vec<u8>,
    pub logprob: Option<f64>,
    pub token: String,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub token: String,
}

/// Completions `logprobs`: parallel lists, one entry per token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    /// Characters from the start of the choice's text.
    pub text_offset: Vec<usize>,
    /// `null` for an echoed prompt's first token.
    pub token_logprobs: Vec<Option<f64>>,
    pub tokens: Vec<String>,
    /// Token text to log-probability (by text, the first of equal texts); `null` where the
    /// token's log-probability is.
    pub top_logprobs: Vec<Option<BTreeMap<String, f64>>>,
}

/// One SSE event of a streamed generation: a [`ChatCompletionChunk`] or a [`CompletionChunk`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chunk<C> {
    /// One choice, or none in the closing usage chunk.
    pub choices: Vec<C>,
    pub created: u64,
    pub id: String,
    pub model: String,
    /// `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Absent unless `stream_options.include_usage`; then `null` but in the closing chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// A streamed chat completion's event.
pub type ChatCompletionChunk = Chunk<ChatChunkChoice>;
/// A streamed completion's event.
pub type CompletionChunk = Chunk<CompletionChunkChoice>;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatChunkChoice {
    pub delta: ChatDelta,
    pub finish_reason: Option<&'static str>,
    pub index: usize,
    /// Absent unless log-probabilities were asked for; then `null` in the opening (role)
    /// chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Option<ChatLogprobs>>,
}

/// What a chat chunk adds: the role (opening chunk), text, or nothing (`{}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionChunkChoice {
    pub finish_reason: Option<&'static str>,
    pub index: usize,
    /// `null` unless log-probabilities were asked for; absent in the chunk that ends a choice
    /// that generates nothing (echo with `max_tokens: 0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Option<CompletionLogprobs>>,
    pub text: String,
}

/// `v` as JSON text with every object's keys in sorted order, as serde_json writes a `Value`
/// without its `preserve_order` feature (which llguidance turns on for the whole build): the
/// order the server's responses have always had.
#[cfg(test)]
pub(crate) fn sorted_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), sorted_json(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(sorted_json).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    //! Each type against the JSON the server sent before it had types (built with `json!`),
    //! compared as text: keys, their order, numbers' spelling, `null` against absent.

    use super::*;
    use serde_json::{json, Value};

    fn same(typed: &impl Serialize, old: Value) {
        assert_eq!(serde_json::to_string(typed).unwrap(), sorted_json(&old));
    }

    fn api_error(param: Option<&str>, code: Option<&'static str>) -> ApiError {
        ApiError {
            status: 400,
            message: "must be between 0 and 2".into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code,
        }
    }

    #[test]
    fn error_bodies() {
        let e = api_error(Some("temperature"), None);
        same(
            &ErrorBody::from(&e),
            json!({"error": {"message": "must be between 0 and 2", "type": "invalid_request_error",
                             "param": "temperature", "code": null}}),
        );
        let e = api_error(None, Some("queue_full"));
        same(
            &ErrorBody::from(&e),
            json!({"error": {"message": "must be between 0 and 2", "type": "invalid_request_error",
                             "param": null, "code": "queue_full"}}),
        );
    }

    #[test]
    fn models_and_health() {
        same(
            &ModelList::new(["tiny", "embed"], 1_700_000_000),
            json!({"object": "list", "data": [
                {"id": "tiny", "object": "model", "created": 1_700_000_000u64, "owned_by": "kiln"},
                {"id": "embed", "object": "model", "created": 1_700_000_000u64, "owned_by": "kiln"},
            ]}),
        );
        same(
            &ModelList::new([], 5),
            json!({"object": "list", "data": []}),
        );
        same(&Health::Ok, json!({"status": "ok"}));
        same(
            &Health::Error {
                stopped_models: vec!["tiny", "embed"],
            },
            json!({"status": "error", "stopped_models": ["tiny", "embed"]}),
        );
    }

    #[test]
    fn embeddings_as_floats_and_base64() {
        let vector = vec![0.1f32, -2.5, 1e-8, f32::NAN];
        let list = EmbeddingList {
            data: vec![
                EmbeddingObject {
                    embedding: EmbeddingVector::Float(vector.clone()),
                    index: 0,
                    object: "embedding",
                },
                EmbeddingObject {
                    embedding: EmbeddingVector::Base64("AAAA".into()),
                    index: 1,
                    object: "embedding",
                },
            ],
            model: "embed".into(),
            object: "list",
            usage: EmbeddingUsage {
                prompt_tokens: 7,
                total_tokens: 7,
            },
        };
        same(
            &list,
            json!({
                "object": "list",
                "data": [
                    {"object": "embedding", "index": 0, "embedding": json!(vector)},
                    {"object": "embedding", "index": 1, "embedding": Value::String("AAAA".into())},
                ],
                "model": "embed",
                "usage": {"prompt_tokens": 7, "total_tokens": 7},
            }),
        );
        // f32 widened to f64, NaN as null: not the f32's shortest spelling.
        assert!(serde_json::to_string(&list)
            .unwrap()
            .contains("[0.10000000149011612,-2.5,9.99999993922529e-9,null]"));
    }

    fn usage(prompt: usize, completion: usize) -> Value {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    fn chat_logprobs() -> (ChatLogprobs, Value) {
        let typed = ChatLogprobs {
            content: vec![ChatTokenLogprob {
                bytes: vec![32, 116, 111],
                logprob: Some(-0.25),
                token: " to".into(),
                top_logprobs: vec![
                    TopLogprob {
                        bytes: vec![32, 116, 111],
                        logprob: -0.25,
                        token: " to".into(),
                    },
                    TopLogprob {
                        bytes: vec![140],
                        logprob: f64::NEG_INFINITY,
                        token: "\u{fffd}".into(),
                    },
                ],
            }],
            refusal: None,
        };
        let old = json!({"content": [{
            "token": " to", "logprob": Some(-0.25), "bytes": [32, 116, 111],
            "top_logprobs": [
                json!({"token": " to", "logprob": -0.25, "bytes": [32, 116, 111]}),
                json!({"token": "\u{fffd}", "logprob": f64::NEG_INFINITY, "bytes": [140]}),
            ],
        }], "refusal": null});
        (typed, old)
    }

    fn completion_logprobs() -> (CompletionLogprobs, Value) {
        let typed = CompletionLogprobs {
            text_offset: vec![0, 3],
            token_logprobs: vec![None, Some(-1.5)],
            tokens: vec!["the".into(), " cat".into()],
            top_logprobs: vec![
                None,
                Some(BTreeMap::from([(" cat".into(), -1.5), (" a".into(), -2.0)])),
            ],
        };
        let old = json!({
            "tokens": ["the", " cat"],
            "token_logprobs": [null, -1.5],
            "top_logprobs": [null, {" cat": -1.5, " a": -2.0}],
            "text_offset": [0, 3],
        });
        (typed, old)
    }

    #[test]
    fn whole_chat_completions() {
        let (lp, old_lp) = chat_logprobs();
        let typed = ChatCompletion {
            choices: vec![
                ChatChoice {
                    finish_reason: "length",
                    index: 0,
                    logprobs: Some(lp),
                    message: AssistantMessage {
                        content: Some("Hi".into()),
                        role: "assistant",
                        tool_calls: None,
                    },
                },
                ChatChoice {
                    finish_reason: "stop",
                    index: 1,
                    logprobs: None,
                    message: AssistantMessage {
                        content: Some(String::new()),
                        role: "assistant",
                        tool_calls: None,
                    },
                },
            ],
            created: 1_700_000_000,
            id: "chatcmpl-0123".into(),
            model: "tiny".into(),
            object: "chat.completion",
            usage: Usage::new(23, 4),
        };
        same(
            &typed,
            json!({
                "id": "chatcmpl-0123",
                "object": "chat.completion",
                "created": 1_700_000_000u64,
                "model": "tiny",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "Hi"},
                     "logprobs": old_lp, "finish_reason": "length"},
                    {"index": 1, "message": {"role": "assistant", "content": ""},
                     "logprobs": null, "finish_reason": "stop"},
                ],
                "usage": usage(23, 4),
            }),
        );
    }

    #[test]
    fn whole_completions() {
        let (lp, old_lp) = completion_logprobs();
        let typed = Completion {
            choices: vec![
                CompletionChoice {
                    finish_reason: "length",
                    index: 0,
                    logprobs: Some(lp),
                    text: "the cat".into(),
                },
                CompletionChoice {
                    finish_reason: "stop",
                    index: 1,
                    logprobs: None,
                    text: "x".into(),
                },
            ],
            created: 3,
            id: "cmpl-0123".into(),
            model: "tiny".into(),
            object: "text_completion",
            usage: Usage::new(2, 0),
        };
        same(
            &typed,
            json!({
                "id": "cmpl-0123",
                "object": "text_completion",
                "created": 3,
                "model": "tiny",
                "choices": [
                    {"index": 0, "text": "the cat", "logprobs": old_lp, "finish_reason": "length"},
                    {"index": 1, "text": "x", "logprobs": null, "finish_reason": "stop"},
                ],
                "usage": usage(2, 0),
            }),
        );
    }

    /// The old `chunk`: the choice's body, then its index and finish reason, then the chunk.
    fn old_chunk(
        object: &str,
        index: usize,
        body: Value,
        finish: Option<&str>,
        usage: bool,
    ) -> Value {
        let mut choice = body;
        choice["index"] = json!(index);
        choice["finish_reason"] = json!(finish);
        let mut v = json!({
            "id": "chatcmpl-9", "object": object, "created": 11, "model": "tiny",
            "choices": [choice],
        });
        if usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn chunk<C>(object: &'static str, choice: C, usage: Option<Option<Usage>>) -> Chunk<C> {
        Chunk {
            choices: vec![choice],
            created: 11,
            id: "chatcmpl-9".into(),
            model: "tiny".into(),
            object,
            usage,
        }
    }

    #[test]
    fn chat_chunks() {
        const OBJ: &str = "chat.completion.chunk";
        for (logprobs, usage) in [(false, false), (true, false), (false, true), (true, true)] {
            let u = usage.then_some(None);
            // The opening chunk: the role.
            let mut old = json!({"delta": {"role": "assistant", "content": ""}});
            if logprobs {
                old["logprobs"] = Value::Null;
            }
            let typed = ChatChunkChoice {
                delta: ChatDelta {
                    content: Some(String::new()),
                    role: Some("assistant"),
                    tool_calls: None,
                },
                finish_reason: None,
                index: 2,
                logprobs: logprobs.then_some(None),
            };
            same(&chunk(OBJ, typed, u), old_chunk(OBJ, 2, old, None, usage));
            // Text, and the end without text.
            for (text, finish) in [("Hi", None), ("", Some("stop")), ("!", Some("length"))] {
                let (lp, old_lp) = chat_logprobs();
                let content = if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                let mut old = json!({"delta": content});
                if logprobs {
                    old["logprobs"] = old_lp;
                }
                let typed = ChatChunkChoice {
                    delta: ChatDelta {
                        content: (!(text.is_empty() && finish.is_some())).then(|| text.to_string()),
                        role: None,
                        tool_calls: None,
                    },
                    finish_reason: finish,
                    index: 0,
                    logprobs: logprobs.then_some(Some(lp)),
                };
                same(&chunk(OBJ, typed, u), old_chunk(OBJ, 0, old, finish, usage));
            }
        }
        // The closing chunk of a choice that generates nothing.
        let typed = ChatChunkChoice {
            delta: ChatDelta::default(),
            finish_reason: Some("length"),
            index: 0,
            logprobs: None,
        };
        same(
            &chunk(OBJ, typed, None),
            old_chunk(OBJ, 0, json!({"delta": {}}), Some("length"), false),
        );
    }

    #[test]
    fn completion_chunks() {
        const OBJ: &str = "text_completion";
        for (logprobs, usage) in [(false, false), (true, true)] {
            let u = usage.then_some(None);
            let (lp, old_lp) = completion_logprobs();
            let old = json!({"text": "the cat", "logprobs": logprobs.then_some(old_lp)});
            let typed = CompletionChunkChoice {
                finish_reason: Some("stop"),
                index: 1,
                logprobs: Some(logprobs.then_some(lp)),
                text: "the cat".into(),
            };
            same(
                &chunk(OBJ, typed, u),
                old_chunk(OBJ, 1, old, Some("stop"), usage),
            );
        }
        // The closing chunk of a choice that generates nothing: no `logprobs` at all.
        let typed = CompletionChunkChoice {
            finish_reason: Some("length"),
            index: 0,
            logprobs: None,
            text: String::new(),
        };
        same(
            &chunk(OBJ, typed, Some(None)),
            old_chunk(OBJ, 0, json!({"text": ""}), Some("length"), true),
        );
    }

    #[test]
    fn the_closing_usage_chunk() {
        for object in ["chat.completion.chunk", "text_completion"] {
            let typed: CompletionChunk = Chunk {
                choices: Vec::new(),
                created: 11,
                id: "cmpl-9".into(),
                model: "tiny".into(),
                object,
                usage: Some(Some(Usage::new(5, 3))),
            };
            same(
                &typed,
                json!({
                    "id": "cmpl-9",
                    "object": object,
                    "created": 11,
                    "model": "tiny",
                    "choices": [],
                    "usage": usage(5, 3),
                }),
            );
        }
    }
}
