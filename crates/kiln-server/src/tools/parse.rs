//! Tool calls in a model's output: the text parsed into content and calls, whole or as it
//! streams.
//!
//! [`parse`] reads a whole or partial output. On a partial output it reports only what cannot
//! change: content up to a possible start of a call (a suffix that may still become the call
//! marker is held back), a call once its name is complete, and its arguments' text as far as it
//! has arrived (a JSON object's text grows; any other value is reported once complete).
//! [`ToolStream`] turns the successive partial parses into deltas; because every partial parse
//! is a prefix of the final one, the deltas reassemble to exactly the non-streamed result.
//!
//! Content between calls that is only whitespace is dropped (the separators of calls).

use super::ToolFormat;

/// A call the model made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments' JSON text as the model wrote it (complete once the call is).
    pub arguments: String,
}

/// An output split into content and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

/// The markers of each format.
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const PYTHON_TAG: &str = "<|python_tag|>";

/// Splits `text` (the whole output when `done`, else what has arrived) into content and calls.
pub fn parse(format: ToolFormat, text: &str, done: bool) -> Parsed {
    let mut out = Parsed::default();
    match format {
        ToolFormat::Hermes | ToolFormat::Generic => parse_tagged(text, done, &mut out),
        ToolFormat::Mistral => parse_mistral(text, done, &mut out),
        ToolFormat::Llama3 => parse_llama3(text, done, &mut out),
    }
    out
}

/// Adds an outside-of-calls segment: all of it when it has more than whitespace; nothing
/// otherwise (the separators around calls).
fn push_content(out: &mut Parsed, segment: &str) {
    if !segment.trim().is_empty() {
        out.content.push_str(segment);
    }
}

/// How much of `text`'s end may still become `marker` (its longest suffix that is a proper
/// prefix of the marker).
fn held_back(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// Hermes/Qwen and kiln's generic format: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
/// blocks among text.
fn parse_tagged(text: &str, done: bool, out: &mut Parsed) {
    let mut rest = text;
    loop {
        let Some(at) = rest.find(HERMES_OPEN) else {
            let keep = if done {
                0
            } else {
                held_back(rest, HERMES_OPEN)
            };
            push_content(out, &rest[..rest.len() - keep]);
            return;
        };
        push_content(out, &rest[..at]);
        let body = &rest[at + HERMES_OPEN.len()..];
        let start = body.len() - body.trim_start().len();
        let scan = scan_call(&body[start..], done);
        if let Some(call) = scan.call {
            out.calls.push(call);
        }
        let Some(end) = scan.end else {
            return; // the call is still arriving (or was cut off)
        };
        let after = &body[start + end..];
        let t = after.trim_start();
        rest = match t.strip_prefix(HERMES_CLOSE) {
            Some(r) => r,
            // The closing marker still arriving, or cut off at the end.
            None if HERMES_CLOSE.starts_with(t) => return,
            None => after,
        };
    }
}

/// Mistral: `[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]` (v3), or
/// `[TOOL_CALLS]name[ARGS]{...}` repeated (v11 and later; `[CALL_ID]id` may precede `[ARGS]`).
fn parse_mistral(text: &str, done: bool, out: &mut Parsed) {
    let Some(at) = text.find(MISTRAL_CALLS) else {
        let keep = if done {
            0
        } else {
            held_back(text, MISTRAL_CALLS)
        };
        push_content(out, &text[..text.len() - keep]);
        return;
    };
    push_content(out, &text[..at]);
    let mut rest = &text[at + MISTRAL_CALLS.len()..];
    loop {
        let t = rest.trim_start();
        if let Some(list) = t.strip_prefix('[') {
            // A JSON list of call objects.
            let mut items = list;
            loop {
                let s = items.trim_start();
                if !s.starts_with('{') {
                    return;
                }
                let scan = scan_call(s, done);
                if let Some(call) = scan.call {
                    out.calls.push(call);
                }
                let Some(end) = scan.end else { return };
                items = s[end..].trim_start();
                match items.strip_prefix(',') {
                    Some(r) => items = r,
                    None => return,
                }
            }
        }
        // name[ARGS]{...}
        let Some(args_at) = t.find(MISTRAL_ARGS) else {
            return; // the name is still arriving
        };
        let name = t[..args_at]
            .split(MISTRAL_CALL_ID)
            .next()
            .unwrap_or("")
            .trim();
        let args = t[args_at + MISTRAL_ARGS.len()..].trim_start();
        let (value, complete_at) = scan_value(args, done);
        if name.is_empty() {
            return;
        }
        out.calls.push(ParsedCall {
            name: name.to_string(),
            arguments: value.to_string(),
        });
        let Some(end) = complete_at else { return };
        match args[end..].trim_start().strip_prefix(MISTRAL_CALLS) {
            Some(r) => rest = r,
            None => return,
        }
    }
}

/// Llama 3.x: the whole output is `{"name": ..., "parameters": ...}` (optionally after
/// `<|python_tag|>`), calls separated by `;`; anything else is content.
fn parse_llama3(text: &str, done: bool, out: &mut Parsed) {
    let t = text.trim_start();
    let body = match t.strip_prefix(PYTHON_TAG) {
        Some(b) => b.trim_start(),
        None if t.starts_with('{') => t,
        None if !done && (t.is_empty() || PYTHON_TAG.starts_with(t)) => return,
        None => {
            out.content.push_str(text);
            return;
        }
    };
    parse_llama3_calls(body, done, out);
    // Text that only looked like a call (a JSON object that is not one) is content.
    if done && out.calls.is_empty() {
        out.content.push_str(text);
    }
}

fn parse_llama3_calls(body: &str, done: bool, out: &mut Parsed) {
    let mut rest = body;
    loop {
        if !rest.starts_with('{') {
            return;
        }
        let scan = scan_call(rest, done);
        if let Some(call) = scan.call {
            out.calls.push(call);
        }
        let Some(end) = scan.end else { return };
        let after = rest[end..].trim_start();
        match after.strip_prefix(';') {
            Some(r) => rest = r.trim_start(),
            None => return,
        }
    }
}

/// A call object scanned from the start of a text.
struct CallScan {
    /// Once its name is complete.
    call: Option<ParsedCall>,
    /// Where the object ends (past its `}`), once it has.
    end: Option<usize>,
}

/// Scans the JSON object at the start of `s` (`{"name": ..., "arguments": ...}`; the arguments
/// may be called `parameters`).
fn scan_call(s: &str, done: bool) -> CallScan {
    let mut name = None;
    let mut args: Option<(String, bool)> = None;
    let end = scan_object(s, |key, value, complete| match key {
        "name" if complete => name = serde_json::from_str::<String>(value.trim()).ok(),
        "arguments" | "parameters" => {
            let v = value.trim_start();
            if complete || v.starts_with('{') || v.starts_with('[') {
                args = Some((v.to_string(), complete));
            }
        }
        _ => {}
    });
    let call = name.map(|name| ParsedCall {
        name,
        arguments: match args {
            Some((a, true)) => a,
            // Still arriving: only an object's or list's text grows in place.
            Some((a, false)) if !done => a,
            Some((a, false)) => a,
            None => String::new(),
        },
    });
    CallScan { call, end }
}

/// Walks the JSON object at the start of `s`, calling `on(key, value_text, complete)` for each
/// member as far as it has arrived (the last one possibly incomplete); returns the end of the
/// object (past `}`) once it is complete.
fn scan_object(s: &str, mut on: impl FnMut(&str, &str, bool)) -> Option<usize> {
    let b = s.as_bytes();
    if b.first() != Some(&b'{') {
        return None;
    }
    let mut i = 1;
    loop {
        // The key.
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        match b.get(i) {
            Some(b'}') => return Some(i + 1),
            Some(b'"') => {}
            _ => return None,
        }
        let key_end = string_end(b, i)?;
        let key: String = serde_json::from_str(&s[i..key_end]).ok()?;
        i = key_end;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) != Some(&b':') {
            return None;
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let (_, end) = scan_value(&s[i..], false);
        match end {
            None => {
                on(&key, &s[i..], false);
                return None;
            }
            Some(n) => {
                on(&key, &s[i..i + n], true);
                i += n;
            }
        }
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The end (past the closing quote) of the JSON string starting at `b[at]`.
fn string_end(b: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The JSON value at the start of `s`: its text so far and, once complete, its length. An
/// object's or list's end is its closing bracket; a scalar's is the first character that
/// cannot continue it (so a number is complete only once something follows it, or at the end
/// of a `done` text).
fn scan_value(s: &str, done: bool) -> (&str, Option<usize>) {
    let b = s.as_bytes();
    match b.first() {
        None => (s, None),
        Some(b'{') | Some(b'[') => {
            let mut depth = 0usize;
            let mut i = 0;
            while i < b.len() {
                match b[i] {
                    b'"' => match string_end(b, i) {
                        Some(e) => {
                            i = e;
                            continue;
                        }
                        None => return (s, None),
                    },
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return (&s[..i + 1], Some(i + 1));
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            (s, None)
        }
        Some(b'"') => match string_end(b, 0) {
            Some(e) => (&s[..e], Some(e)),
            None => (s, None),
        },
        Some(_) => {
            let n = b
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']') || c.is_ascii_whitespace());
            match n {
                Some(n) => (&s[..n], Some(n)),
                None if done => (s, Some(s.len())),
                None => (s, None),
            }
        }
    }
}

/// What a streamed output adds, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolDelta {
    Content(String),
    /// Call `index` begins (its id is the caller's).
    Call {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments.
    Arguments {
        index: usize,
        text: String,
    },
}

/// A streamed output's parse: push text as it arrives, take the deltas.
pub struct ToolStream {
    format: ToolFormat,
    text: String,
    content_sent: usize,
    /// Per call: the length of its arguments sent.
    sent: Vec<usize>,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            format,
            text: String::new(),
            content_sent: 0,
            sent: Vec::new(),
        }
    }

    /// Takes `text`; the deltas it completes.
    pub fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        self.text.push_str(text);
        let p = parse(self.format, &self.text, false);
        self.deltas(&p)
    }

    /// The output has ended: the last deltas, and the whole result (what a non-streamed
    /// response reports).
    pub fn finish(&mut self) -> (Vec<ToolDelta>, Parsed) {
        let p = parse(self.format, &self.text, true);
        (self.deltas(&p), p)
    }

    fn deltas(&mut self, p: &Parsed) -> Vec<ToolDelta> {
        let mut out = Vec::new();
        // Both only grow (see the module docs); a parse that would shrink is not reported.
        if p.content.len() > self.content_sent && p.content.is_char_boundary(self.content_sent) {
            out.push(ToolDelta::Content(
                p.content[self.content_sent..].to_string(),
            ));
            self.content_sent = p.content.len();
        }
        for (index, call) in p.calls.iter().enumerate() {
            if index == self.sent.len() {
                self.sent.push(0);
                out.push(ToolDelta::Call {
                    index,
                    name: call.name.clone(),
                });
            }
            let sent = self.sent[index];
            if call.arguments.len() > sent && call.arguments.is_char_boundary(sent) {
                out.push(ToolDelta::Arguments {
                    index,
                    text: call.arguments[sent..].to_string(),
                });
                self.sent[index] = call.arguments.len();
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Every output of every format, streamed in pieces of 1 to 10 characters, reassembles to
    /// exactly the non-streamed parse.
    fn streams_as_whole(format: ToolFormat, text: &str, want: &Parsed) {
        assert_eq!(&parse(format, text, true), want, "{format:?} {text:?}");
        for step in 1..=10 {
            let chars: Vec<char> = text.chars().collect();
            let mut s = ToolStream::new(format);
            let mut deltas = Vec::new();
            for piece in chars.chunks(step) {
                deltas.extend(s.push(&piece.iter().collect::<String>()));
            }
            let (last, whole) = s.finish();
            deltas.extend(last);
            assert_eq!(&whole, want);
            let mut got = Parsed::default();
            for d in deltas {
                match d {
                    ToolDelta::Content(t) => got.content.push_str(&t),
                    ToolDelta::Call { index, name } => {
                        assert_eq!(index, got.calls.len(), "calls begin in order, once");
                        got.calls.push(call(&name, ""));
                    }
                    ToolDelta::Arguments { index, text } => {
                        got.calls[index].arguments.push_str(&text)
                    }
                }
            }
            assert_eq!(&got, want, "{format:?} in steps of {step}: {text:?}");
        }
    }

    #[test]
    fn hermes_and_generic_calls_among_text() {
        for format in [ToolFormat::Hermes, ToolFormat::Generic] {
            streams_as_whole(
                format,
                "I'll look it up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"x\": \"}\"}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>",
                &Parsed {
                    content: "I'll look it up.\n".into(),
                    calls: vec![
                        call("get_weather", r#"{"city": "Paris", "n": [1, {"x": "}"}]}"#),
                        call("time", "{}"),
                    ],
                },
            );
            // No call: all text, even what looks like the start of a marker.
            streams_as_whole(
                format,
                "a < b and <tool_ is not a call <tool",
                &Parsed {
                    content: "a < b and <tool_ is not a call <tool".into(),
                    calls: vec![],
                },
            );
            // Arguments before the name; escapes; cut off inside the arguments.
            streams_as_whole(
                format,
                "<tool_call>{\"arguments\": {\"q\": \"\\\"}\\\\\"}, \"name\": \"s\"}</tool_call>",
                &Parsed {
                    content: String::new(),
                    calls: vec![call("s", r#"{"q": "\"}\\"}"#)],
                },
            );
            streams_as_whole(
                format,
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"unfinish",
                &Parsed {
                    content: String::new(),
                    calls: vec![call("f", r#"{"a": "unfinish"#)],
                },
            );
        }
    }

    #[test]
    fn mistral_lists_and_named_calls() {
        streams_as_whole(
            ToolFormat::Mistral,
            "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}, \"id\": \"abc123xyz\"}]",
            &Parsed {
                content: String::new(),
                calls: vec![call("a", r#"{"x": 1}"#), call("b", "{}")],
            },
        );
        streams_as_whole(
            ToolFormat::Mistral,
            "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]time[CALL_ID]abc123xyz[ARGS]{}",
            &Parsed {
                content: "Sure.".into(),
                calls: vec![call("get_weather", r#"{"city": "Oslo"}"#), call("time", "{}")],
            },
        );
        streams_as_whole(
            ToolFormat::Mistral,
            "No tools [TOOL here.",
            &Parsed {
                content: "No tools [TOOL here.".into(),
                calls: vec![],
            },
        );
    }

    #[test]
    fn llama3_json_calls_or_text() {
        streams_as_whole(
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
            &Parsed {
                content: String::new(),
                calls: vec![call("get_weather", r#"{"city": "Rome"}"#)],
            },
        );
        streams_as_whole(
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": true}}",
            &Parsed {
                content: String::new(),
                calls: vec![call("a", "{}"), call("b", r#"{"k": true}"#)],
            },
        );
        streams_as_whole(
            ToolFormat::Llama3,
            "The weather is fine {really}.",
            &Parsed {
                content: "The weather is fine {really}.".into(),
                calls: vec![],
            },
        );
    }
}
