//! Tool calling: the request's tools put into the prompt the model's own way, the calls it
//! makes constrained by a grammar, and its output parsed back into OpenAI's `tool_calls`.
//!
//! Formats ([`ToolFormat`]), recognized from the chat template (`kiln serve
//! --tool-call-format` overrides):
//! - **Hermes** (Qwen 2/2.5/3, Hermes): the template renders `tools`; calls are
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks.
//! - **Llama 3.x**: the template renders `tools`; a call is the whole output,
//!   `{"name": ..., "parameters": {...}}` (one call per turn, as the templates require).
//! - **Mistral**: the template renders `tools`; calls follow the `[TOOL_CALLS]` control token,
//!   as a JSON list of `{"name", "arguments"}` objects, or (templates with `[ARGS]`, v11 and
//!   later) as `name[ARGS]{...}` per call.
//! - **Generic**, for templates with none of these (Gemma 3, Phi-3, ...): kiln describes the
//!   tools in the system message and asks for Hermes-style `<tool_call>` blocks; earlier calls
//!   are written into the assistant turns that made them, and tool results become user turns
//!   (`<tool_response>...</tool_response>`), so any template that takes user and assistant
//!   turns works.
//!
//! Choices: `none` renders no tools and parses nothing; `required` and a named function
//! constrain the whole output to calls (of any tool, or of that one), one or, with
//! `parallel_tool_calls`, several; `auto` lets the model write text and constrains a call once
//! the model starts one (the grammar's free text cannot contain the call marker, and what
//! follows the marker must be a valid call of a listed tool).

mod parse;

pub use parse::{parse, Parsed, ParsedCall, ToolDelta, ToolStream};

/// The marker that closes a Hermes-style call.
const HERMES_CLOSE: &str = "</tool_call>";

use kiln_grammar::{bounded_whitespace, GrammarSpec};
use kiln_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

/// How a model writes tool calls (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    Generic,
}

impl ToolFormat {
    /// The format a chat template's text implies.
    pub fn detect(template: &str) -> ToolFormat {
        if template.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("<|python_tag|>")
            || (template.contains("ipython") && template.contains("parameters"))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// The format named on the command line: `hermes`, `llama3`, `mistral`, `generic`.
    pub fn from_name(name: &str) -> Result<ToolFormat, String> {
        match name {
            "hermes" | "qwen" => Ok(ToolFormat::Hermes),
            "llama3" => Ok(ToolFormat::Llama3),
            "mistral" => Ok(ToolFormat::Mistral),
            "generic" => Ok(ToolFormat::Generic),
            other => Err(format!(
                "unknown tool-call format '{other}' (hermes, llama3, mistral, generic)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Generic => "generic",
        }
    }

    /// Whether the chat template renders the tools itself.
    fn native(self) -> bool {
        self != ToolFormat::Generic
    }

    /// Several calls in one turn (Llama 3.x templates accept one).
    fn parallel(self) -> bool {
        self != ToolFormat::Llama3
    }

    /// Control tokens whose text the output's parse must see (the detokenizer drops control
    /// tokens from the text).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => &["<tool_call>", "</tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
        }
    }
}

/// One function a request offers.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    pub parameters: Value,
    /// The tool object as given (`{"type": "function", "function": {...}}`), for the template.
    pub raw: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A request's tools, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether the output is parsed for calls.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None && !self.tools.is_empty()
    }
}

/// The conversation and the `tools` variable the template renders, in `format`.
pub fn prompt(
    format: ToolFormat,
    messages: Vec<ChatMessage>,
    tools: Option<&ToolRequest>,
) -> (Vec<ChatMessage>, Option<Value>) {
    let active = tools.filter(|t| t.active());
    if format.native() {
        let var = active.map(|t| Value::Array(t.tools.iter().map(|t| t.raw.clone()).collect()));
        return (messages, var);
    }
    (generic_messages(messages, active), None)
}

/// kiln's generic format: the tools described in the system message, calls written into the
/// assistant turns, results as user turns (merged with the user turns around them).
fn generic_messages(messages: Vec<ChatMessage>, tools: Option<&ToolRequest>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    // Whether the last message out was made from a tool result (and may take more).
    let mut merge = false;
    for mut m in messages {
        match m.role.as_str() {
            "assistant" => {
                if let Some(Value::Array(calls)) = m.extra.remove("tool_calls") {
                    let mut text = m.content.trim_end().to_string();
                    for c in &calls {
                        let f = &c["function"];
                        let call = json!({"name": f["name"], "arguments": f["arguments"]});
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
                    }
                    m.content = text;
                }
                m.extra.remove("content");
                merge = false;
                out.push(m);
            }
            "tool" => {
                let text = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match out.last_mut() {
                    Some(last) if merge || last.role == "user" => {
                        last.content.push('\n');
                        last.content.push_str(&text);
                    }
                    _ => out.push(ChatMessage::new("user", text)),
                }
                merge = true;
            }
            "user" if merge => {
                if let Some(last) = out.last_mut() {
                    last.content.push('\n');
                    last.content.push_str(&m.content);
                }
                merge = false;
            }
            _ => {
                merge = false;
                out.push(m);
            }
        }
    }
    if let Some(t) = tools {
        let preamble = generic_preamble(t);
        match out.first_mut() {
            Some(first) if first.role == "system" || first.role == "developer" => {
                first.content = format!("{}\n\n{preamble}", first.content.trim_end());
            }
            _ => out.insert(0, ChatMessage::new("system", preamble)),
        }
    }
    out
}

/// The system text that tells a model without a tool format how to call tools.
fn generic_preamble(t: &ToolRequest) -> String {
    let list: Vec<Value> = t
        .tools
        .iter()
        .map(|tool| {
            let mut o = Map::new();
            o.insert("name".into(), Value::String(tool.name.clone()));
            if let Some(d) = &tool.description {
                o.insert("description".into(), Value::String(d.clone()));
            }
            o.insert("parameters".into(), tool.parameters.clone());
            Value::Object(o)
        })
        .collect();
    let mut text = String::from("You can call these tools (the parameters are JSON schemas):\n");
    for tool in list {
        text.push_str(&tool.to_string());
        text.push('\n');
    }
    text.push_str(
        "To call a tool, write <tool_call>, then on a new line a JSON object with the tool's \
         \"name\" and its \"arguments\", then on a new line </tool_call>. For example:\n\
         <tool_call>\n{\"name\": \"tool_name\", \"arguments\": {\"parameter\": \"value\"}}\n\
         </tool_call>",
    );
    match &t.choice {
        ToolChoice::Required => text.push_str("\nYou must call a tool."),
        ToolChoice::Named(name) => text.push_str(&format!("\nYou must call the tool {name}.")),
        _ => {}
    }
    if !t.parallel {
        text.push_str("\nCall at most one tool.");
    }
    text
}

/// The grammar a request's output must follow, if any. `control` gives the id of a marker
/// that is a control token of the model's vocabulary (such tokens are written `<[id]>` in the
/// grammar; plain text otherwise).
pub fn grammar(
    format: ToolFormat,
    t: &ToolRequest,
    control: &dyn Fn(&str) -> Option<u32>,
) -> Option<GrammarSpec> {
    let tools: Vec<&Tool> = match &t.choice {
        ToolChoice::None => return None,
        _ if t.tools.is_empty() => return None,
        ToolChoice::Named(name) => t.tools.iter().filter(|x| &x.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => t.tools.iter().collect(),
    };
    let parallel = t.parallel && format.parallel() && !matches!(t.choice, ToolChoice::Named(_));
    let lit = |text: &str| match control(text) {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::to_string(text).unwrap_or_default(),
    };
    let args_key = if format == ToolFormat::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    let call_schema = |names: &[&Tool]| -> Value {
        let options: Vec<Value> = names
            .iter()
            .map(|tool| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": tool.name},
                        args_key: tool.parameters,
                    },
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        bounded_whitespace(&if options.len() == 1 {
            options.into_iter().next().unwrap_or_default()
        } else {
            json!({ "anyOf": options })
        })
    };
    let mut g = String::new();
    let (calls, trigger) = match format {
        ToolFormat::Hermes | ToolFormat::Generic => {
            g.push_str(&format!("call_json: %json {}\n", call_schema(&tools)));
            g.push_str(&format!(
                "call: {} \"\\n\"? call_json \"\\n\"? {}\n",
                lit("<tool_call>"),
                lit("</tool_call>")
            ));
            let calls = if parallel {
                "call (\"\\n\"? call)*"
            } else {
                "call"
            };
            (calls.to_string(), "<tool_call>")
        }
        ToolFormat::Llama3 => {
            g.push_str(&format!("call: %json {}\n", call_schema(&tools)));
            let calls = if parallel {
                "call (\"; \" call)*"
            } else {
                "call"
            };
            (calls.to_string(), "{")
        }
        ToolFormat::Mistral => {
            let open = lit("[TOOL_CALLS]");
            match control("[ARGS]") {
                // name[ARGS]{...} per call.
                Some(args) => {
                    let alternatives: Vec<String> = tools
                        .iter()
                        .map(|tool| {
                            let schema = bounded_whitespace(&tool.parameters);
                            format!(
                                "{open} {} <[{args}]> %json {schema}",
                                serde_json::to_string(&tool.name).unwrap_or_default()
                            )
                        })
                        .collect();
                    for (i, a) in alternatives.iter().enumerate() {
                        g.push_str(&format!("call{i}: {a}\n"));
                    }
                    let one: Vec<String> = (0..alternatives.len())
                        .map(|i| format!("call{i}"))
                        .collect();
                    g.push_str(&format!("call: {}\n", one.join(" | ")));
                    let calls = if parallel { "call+" } else { "call" };
                    (calls.to_string(), "[TOOL_CALLS]")
                }
                None => {
                    g.push_str(&format!("call_json: %json {}\n", call_schema(&tools)));
                    let list = if parallel {
                        "\"[\" call_json (\", \" call_json)* \"]\""
                    } else {
                        "\"[\" call_json \"]\""
                    };
                    (format!("{open} \" \"? {list}"), "[TOOL_CALLS]")
                }
            }
        }
    };
    g.push_str(&format!("calls: {calls}\n"));
    if t.choice == ToolChoice::Auto {
        // Text alone, or text up to the first marker and calls from there. A text marker ends
        // a lazy lexeme (the text before it); a control token cannot be part of text at all.
        match (format, control(trigger)) {
            (ToolFormat::Llama3, _) => {
                g.push_str("TEXT: /[^{\\s](?s:.*)/\n");
                g.push_str("start: calls | TEXT\n");
            }
            (ToolFormat::Mistral, None) => {
                // Calls only at the start; text may not contain the marker.
                let m = regex_escape(trigger);
                g.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:.*){m}(?s:.*)/\n"));
                g.push_str("start: calls | TEXT\n");
            }
            (_, Some(_)) => {
                g.push_str("TEXT: /(?s:.+)/\n");
                g.push_str("start: TEXT? calls | TEXT\n");
            }
            (_, None) => {
                let m = regex_escape(trigger);
                g.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:.*){m}(?s:.*)/\n"));
                g.push_str(&format!("before[lazy]: /(?s:.*){m}/\n"));
                let rest = calls.replacen("call", "call_after", 1);
                g.push_str(&format!(
                    "call_after: \"\\n\"? call_json \"\\n\"? {}\n",
                    lit(HERMES_CLOSE)
                ));
                g.push_str(&format!("start: before {rest} | TEXT\n"));
            }
        }
    } else {
        g.push_str("start: calls\n");
    }
    Some(GrammarSpec::Lark(g))
}

/// `text` as a regex matching itself.
fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_recognized_from_real_templates() {
        for (src, want) in [
            (
                "{% for t in tools %}<tool_call>{% endfor %}",
                ToolFormat::Hermes,
            ),
            ("{{ '[TOOL_CALLS]' }}", ToolFormat::Mistral),
            ("{{- '<|python_tag|>' }}", ToolFormat::Llama3),
            ("{{ bos_token }}<start_of_turn>", ToolFormat::Generic),
        ] {
            assert_eq!(ToolFormat::detect(src), want, "{src}");
        }
        assert_eq!(ToolFormat::from_name("qwen"), Ok(ToolFormat::Hermes));
        assert!(ToolFormat::from_name("xml").is_err());
    }
}
