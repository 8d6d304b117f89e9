//! One choice being generated: incremental detokenization, stop strings across token
//! boundaries, and its tokens' log-probabilities (generated, or of an echoed prompt) in the
//! two APIs' shapes.

use std::collections::BTreeMap;
use std::time::Instant;

use kiln_engine::{FinishReason, StopMatcher, TextStream, TextTokenizer, TokenLogprob};

use super::errors::{engine_failure, Failure};
use super::{DecoderEntry, ServerState};
use crate::engine::{Out, Ticket};
use crate::metrics::Metrics;
use crate::responses::{ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use crate::tools::{ToolDelta, ToolFormat, ToolStream};

/// One token with its log-probability, as reported.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct TokenInfo {
    pub(super) text: String,
    pub(super) bytes: Vec<u8>,
    /// `None` for the first prompt token of an echo (nothing predicts it).
    pub(super) logprob: Option<f64>,
    pub(super) top: Vec<(String, Vec<u8>, f64)>,
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
pub(super) struct Delta {
    /// Text (with tools: the content, outside the calls).
    pub(super) text: String,
    /// With tools: calls begun and their arguments.
    pub(super) calls: Vec<ToolDelta>,
    pub(super) tokens: Vec<TokenInfo>,
    pub(super) finish: Option<&'static str>,
}

impl Delta {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.calls.is_empty() && self.finish.is_none()
    }
}

/// How a choice's output is read for tool calls: the format, and the control tokens whose text
/// the parse must see (the detokenizer leaves them out).
#[derive(Clone, Debug)]
pub(super) struct ToolParse {
    pub(super) format: ToolFormat,
    pub(super) marks: Vec<(u32, String)>,
}

/// One choice being generated: detokenization, stop strings, and its log-probabilities.
pub(super) struct Choice<'t> {
    tok: &'t TextTokenizer,
    end_ids: &'t [u32],
    stream: Option<TextStream<'t>>,
    stop: StopMatcher,
    ticket: Option<Ticket>,
    /// Tokens generated so far.
    pub(super) generated: usize,
    pending: Vec<TokenInfo>,
    /// Set once the choice has ended.
    pub(super) finish: Option<&'static str>,
    last_token: Option<Instant>,
    /// With tools: the output's parse, and the marker tokens.
    tools: Option<(ToolStream, &'t [(u32, String)])>,
    /// Calls made so far.
    calls: usize,
}

fn finish_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        // A sequence that outgrew the whole KV pool ends as if at a length limit.
        FinishReason::Length | FinishReason::CacheFull => "length",
    }
}

impl<'t> Choice<'t> {
    pub(super) fn new(
        d: &'t DecoderEntry,
        stop: &[String],
        ticket: Option<Ticket>,
        tools: Option<&'t ToolParse>,
    ) -> Self {
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
            tools: tools.map(|t| (ToolStream::new(t.format), t.marks.as_slice())),
            calls: 0,
        }
    }

    /// Splits text into content and calls (with tools); all content otherwise.
    fn split(&mut self, text: String, done: bool) -> (String, Vec<ToolDelta>) {
        let Some((parse, _)) = self.tools.as_mut() else {
            return (text, Vec::new());
        };
        let mut deltas = parse.push(&text);
        if done {
            deltas.extend(parse.finish().0);
        }
        let mut content = String::new();
        let mut calls = Vec::new();
        for d in deltas {
            match d {
                ToolDelta::Content(t) => content.push_str(&t),
                ToolDelta::Call { .. } => {
                    self.calls += 1;
                    calls.push(d);
                }
                ToolDelta::Arguments { .. } => calls.push(d),
            }
        }
        (content, calls)
    }

    /// Applies one engine event; `Err` when the model failed.
    pub(super) fn on(
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
                let mut piece = self
                    .stream
                    .as_mut()
                    .map_or(String::new(), |s| s.push(token));
                if let Some((_, marks)) = &self.tools {
                    if let Some((_, text)) = marks.iter().find(|(id, _)| *id == token) {
                        piece.push_str(text);
                    }
                }
                let r = self.stop.push(&piece);
                let (text, calls) = self.split(r.text, r.stopped);
                let mut delta = Delta {
                    text,
                    calls,
                    ..Delta::default()
                };
                if r.stopped {
                    self.finish = Some(self.finish_name("stop"));
                    delta.finish = self.finish;
                    // Ends the request in the engine (its blocks go back to the pool).
                    self.ticket = None;
                }
                if !delta.is_empty() {
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
                let (text, calls) = self.split(text, true);
                let finish = self.finish_name(finish);
                if let Some(t) = self.ticket.take() {
                    t.finished();
                }
                self.finish = Some(finish);
                Ok(Delta {
                    text,
                    calls,
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

impl Choice<'_> {
    /// `tool_calls` where a turn that called tools ended by itself, as OpenAI reports it.
    fn finish_name(&self, finish: &'static str) -> &'static str {
        if finish == "stop" && self.calls > 0 {
            "tool_calls"
        } else {
            finish
        }
    }
}

/// Chat `logprobs`: one entry per token.
pub(super) fn chat_logprobs(tokens: &[TokenInfo]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|t| ChatTokenLogprob {
                bytes: t.bytes.clone(),
                logprob: t.logprob,
                token: t.text.clone(),
                top_logprobs: t
                    .top
                    .iter()
                    .map(|(s, b, p)| TopLogprob {
                        bytes: b.clone(),
                        logprob: *p,
                        token: s.clone(),
                    })
                    .collect(),
            })
            .collect(),
        refusal: None,
    }
}

/// Completions `logprobs`: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset` (chars
/// from the start of the choice's text, `offset` for the first).
pub(super) fn completion_logprobs(tokens: &[TokenInfo], offset: usize) -> CompletionLogprobs {
    let mut at = offset;
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(at);
        at += t.text.chars().count();
    }
    CompletionLogprobs {
        text_offset,
        token_logprobs: tokens.iter().map(|t| t.logprob).collect(),
        tokens: tokens.iter().map(|t| t.text.clone()).collect(),
        top_logprobs: tokens
            .iter()
            .map(|t| {
                t.logprob?;
                let mut m = BTreeMap::new();
                for (s, _, p) in &t.top {
                    // Of equal texts (different ids) the first stays.
                    m.entry(s.clone()).or_insert(*p);
                }
                Some(m)
            })
            .collect(),
    }
}

/// Log-probabilities of a prompt's tokens (the first has none), for `echo`.
pub(super) async fn prompt_logprobs(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::sorted_json;
    use serde_json::json;

    fn info(text: &str, logprob: Option<f64>, top: &[(&str, f64)]) -> TokenInfo {
        TokenInfo {
            text: text.into(),
            bytes: text.as_bytes().to_vec(),
            logprob,
            top: top
                .iter()
                .map(|&(s, p)| (s.to_string(), s.as_bytes().to_vec(), p))
                .collect(),
        }
    }

    #[test]
    fn logprobs_in_both_apis_shapes() {
        // An echoed first token (no log-probability), then two scored ones; the second's
        // alternatives hold two tokens of one text (the first stays).
        let tokens = [
            info("the", None, &[]),
            info(" cat", Some(-0.5), &[(" cat", -0.5), (" a", -1.0)]),
            info("é", Some(-2.0), &[("x", -0.25), ("x", -0.75), ("é", -2.0)]),
        ];
        assert_eq!(
            serde_json::to_string(&completion_logprobs(&tokens, 4)).unwrap(),
            sorted_json(&json!({
                "tokens": ["the", " cat", "é"],
                "token_logprobs": [null, -0.5, -2.0],
                "top_logprobs": [null, {" cat": -0.5, " a": -1.0}, {"x": -0.25, "é": -2.0}],
                "text_offset": [4, 7, 11],
            }))
        );
        assert_eq!(
            serde_json::to_string(&chat_logprobs(&tokens[1..2])).unwrap(),
            sorted_json(&json!({"content": [{
                "token": " cat", "logprob": -0.5, "bytes": [32, 99, 97, 116],
                "top_logprobs": [
                    {"token": " cat", "logprob": -0.5, "bytes": [32, 99, 97, 116]},
                    {"token": " a", "logprob": -1.0, "bytes": [32, 97]},
                ],
            }], "refusal": null}))
        );
        let empty = completion_logprobs(&[], 9);
        assert_eq!(
            serde_json::to_string(&empty).unwrap(),
            r#"{"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[]}"#
        );
    }
}
