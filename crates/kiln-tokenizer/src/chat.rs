//! Chat templates: turning a conversation into the prompt text a model was trained on, as Hugging
//! Face transformers' `apply_chat_template` does, with the Jinja engine `minijinja`.
//!
//! A template comes from a GGUF file (`tokenizer.chat_template`, [`ChatTemplate::from_gguf`]), from
//! a Hugging Face `tokenizer_config.json` (`chat_template`, or a `chat_template.jinja` file next to
//! it, [`ChatTemplate::from_tokenizer_config`]), or from text ([`ChatTemplate::new`]).
//!
//! The environment is set up as transformers sets up jinja2: `trim_blocks` and `lstrip_blocks` on,
//! `keep_trailing_newline` off, no auto-escaping, `break`/`continue` allowed, Python's string and
//! dict methods (`.strip()`, `.startswith()`, `.split()`, `.items()`, `.get()`, ...) through
//! `minijinja-contrib`'s `pycompat`, and transformers' helpers:
//! - `raise_exception(msg)` fails the render with [`ChatTemplateError::Raised`] carrying `msg`;
//! - the `tojson` filter is Python's `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)`, with those four arguments (positional or by keyword);
//!   dict keys keep their insertion order;
//! - `strftime_now(fmt)` formats [`RenderOptions::now`] (default: the current time, in UTC;
//!   transformers uses the local time) with the codes `%d %e %m %Y %y %b %B %H %I %M %S %p %A %a
//!   %j %%` (others are written as they are);
//! - transformers' `{% generation %}...{% endgeneration %}` block (which marks assistant text for
//!   training masks) renders its body.
//!
//! Variables: `messages` (a list of `{"role", "content"}` maps, with a message's other fields:
//! an assistant turn's `tool_calls` with `arguments` as objects, a tool result's
//! `tool_call_id` and `name`, as transformers passes them), `add_generation_prompt`,
//! `bos_token`, `eos_token`, `strftime_now`, and `tools` (OpenAI's list of `{"type":
//! "function", "function": {...}}`) when [`RenderOptions::tools`] gives it. Without tools,
//! `tools` and `documents` are left undefined (transformers passes `None`; templates test `tools
//! is defined` / `tools is not none` and treat both alike).
//!
//! Checked against Python jinja2 set up as transformers does (`tests/chat_templates.rs`): on the
//! test conversations, every template llama.cpp ships renders byte for byte as jinja2 renders it,
//! except one that needs a variable transformers does not pass (and fails in jinja2 too).
//!
//! Not supported in this step: message `content` as a list of parts (text/image), extra template
//! variables (such as Qwen 3's `enable_thinking`), and GGUF's named alternative templates
//! (`tokenizer.chat_template.<name>`).
//!
//! Invariants:
//! - a [`ChatTemplate`] is compiled once ([`ChatTemplate::new`]) and is immutable (`Send + Sync`);
//!   rendering takes `&self`.
//! - no template text and no input make this module panic or hang: syntax errors, errors the
//!   template raises and evaluation failures are typed [`ChatTemplateError`]s, and every render
//!   runs under a fuel budget ([`FUEL`], grown with the conversation's size) and minijinja's
//!   recursion limit, so a hostile template fails with [`ChatTemplateError::Render`] instead of
//!   running forever or exhausting memory.
//! - rendering is deterministic given [`RenderOptions::now`].

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// The base instruction budget of one render (minijinja's "fuel": about one unit per instruction,
/// and one per 64 bytes of every value created). A render gets this plus a share that grows with
/// the conversation's size. Hostile templates with small inputs fail within about a second and a
/// few hundred MB; real templates render a 400-turn, 400 kB conversation with well under it.
pub const FUEL: u64 = 5_000_000;

/// The fuel of a render of `messages`: [`FUEL`], plus a term quadratic in the conversation,
/// because templates that accumulate their output in a variable (`{% set ns.out = ns.out ~ ... %}`)
/// are charged the size of every intermediate string.
fn fuel_for(messages: &[ChatMessage]) -> u64 {
    let bytes: u64 = messages
        .iter()
        .map(|m| {
            let extra = if m.extra.is_empty() {
                0
            } else {
                serde_json::to_string(&m.extra).map_or(0, |s| s.len())
            };
            (m.role.len() + m.content.len() + extra) as u64
        })
        .sum();
    let pieces = 8 * messages.len() as u64 + 8;
    FUEL.saturating_add((bytes / 64 + 1).saturating_mul(pieces))
}

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, or whatever the template knows (`tool`, `developer`, ...).
    pub role: String,
    /// The message text.
    pub content: String,
    /// The message's other fields as the template sees them (`tool_calls`, `tool_call_id`,
    /// `name`, ...); one named `content` replaces the text (`null` for an assistant turn that
    /// only calls tools).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    /// A message with this role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            extra: serde_json::Map::new(),
        }
    }
}

/// The special-token texts a template sees as `bos_token` and `eos_token` (empty when the model
/// has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence, e.g. `<|begin_of_text|>`.
    pub bos: String,
    /// End of sequence, e.g. `<|eot_id|>`.
    pub eos: String,
}

impl SpecialTokens {
    /// The texts of the tokens `tokenizer.ggml.bos_token_id` / `eos_token_id` name in
    /// `tokenizer.ggml.tokens` (empty when a key is absent or out of range: the tokenizer kinds'
    /// default ids are not applied).
    pub fn from_gguf(file: &kiln_formats::GgufFile) -> Result<SpecialTokens, ChatTemplateError> {
        let token = |id_key: &str| -> Result<String, ChatTemplateError> {
            crate::gguf::token_text(file, id_key)
                .map(Option::unwrap_or_default)
                .map_err(|e| ChatTemplateError::source(id_key, e.to_string()))
        };
        Ok(SpecialTokens {
            bos: token(crate::vocab::keys::BOS_ID)?,
            eos: token(crate::vocab::keys::EOS_ID)?,
        })
    }
}

/// Options of one render.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// End the prompt with the header of an assistant turn, for generation.
    pub add_generation_prompt: bool,
    /// The time `strftime_now` formats (in UTC); `None`: the current time.
    pub now: Option<SystemTime>,
    /// The `tools` variable (a list of OpenAI tool objects); `None` leaves it undefined.
    pub tools: Option<serde_json::Value>,
}

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template text is not valid Jinja (as minijinja reads it).
    #[error("chat template syntax error{}: {message}", at_line(*.line))]
    Syntax {
        /// 1-based line of the template, where known.
        line: Option<usize>,
        /// minijinja's description.
        message: String,
    },
    /// The template called `raise_exception(message)`: it refuses the conversation.
    #[error("the chat template refused the conversation: {0}")]
    Raised(String),
    /// Evaluating the template failed (an undefined value used, a wrong type, an unknown filter
    /// or method, the fuel budget spent, ...).
    #[error("chat template render error{}: {message}", at_line(*.line))]
    Render {
        /// 1-based line of the template, where known.
        line: Option<usize>,
        /// minijinja's description, with its causes.
        message: String,
    },
    /// The template's source (a GGUF key, a `tokenizer_config.json`) could not be read or has the
    /// wrong shape.
    #[error("{source_name}: {reason}")]
    Source {
        /// The file or metadata key.
        source_name: String,
        /// What is wrong.
        reason: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

impl ChatTemplateError {
    fn source(source_name: impl Into<String>, reason: impl Into<String>) -> Self {
        ChatTemplateError::Source {
            source_name: source_name.into(),
            reason: reason.into(),
        }
    }
}

/// The error `raise_exception` returns, found again in the render error's causes.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = match message.as_str() {
        Some(s) => s.to_string(),
        None => message.to_string(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// Converts a minijinja error met while rendering.
fn render_error(err: Error) -> ChatTemplateError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = cause {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return ChatTemplateError::Raised(raised.0.clone());
        }
        cause = e.source();
    }
    let line = err.line();
    let mut message = describe(&err);
    let mut cause = std::error::Error::source(&err);
    while let Some(e) = cause {
        let _ = write!(message, ": {e}");
        cause = e.source();
    }
    ChatTemplateError::Render { line, message }
}

/// An error's kind and detail, without minijinja's "(in template:line)" suffix.
fn describe(err: &Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

/// A compiled chat template with its special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    tokens: SpecialTokens,
    /// The template text as given.
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` (Jinja, as transformers reads it).
    pub fn new(source: &str, tokens: SpecialTokens) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| ChatTemplateError::Render {
                line: None,
                message: describe(&e),
            })?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson_filter);
        // jinja2: `none is iterable` is false (minijinja says true).
        env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
        let original = source.to_string();
        let source = rewrite_generation_tags(source).into_owned();
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| ChatTemplateError::Syntax {
                line: e.line(),
                message: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            tokens,
            source: original,
        })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`; `None` when absent), with the texts
    /// of the tokens `tokenizer.ggml.bos_token_id` / `eos_token_id` name in
    /// `tokenizer.ggml.tokens` (empty when a key is absent or out of range: the tokenizer kinds'
    /// default ids are not applied).
    pub fn from_gguf(
        file: &kiln_formats::GgufFile,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        const KEY: &str = "tokenizer.chat_template";
        let Some(value) = file.get(KEY) else {
            return Ok(None);
        };
        let source = value.as_str().ok_or_else(|| {
            ChatTemplateError::source(
                KEY,
                format!("expected a string, found {}", value.meta_type()),
            )
        })?;
        ChatTemplate::new(source, SpecialTokens::from_gguf(file)?).map(Some)
    }

    /// The template of a Hugging Face model directory's `tokenizer_config.json` at `path`: a
    /// `chat_template.jinja` file next to it when there is one (as transformers prefers it), else
    /// its `chat_template` (a string, or a list of `{"name", "template"}` of which the one named
    /// `default` is taken); `None` when there is no template. `bos_token` / `eos_token` are strings
    /// or `{"content": ...}` objects (absent or null: empty).
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ChatTemplateError::source(&name, e.to_string()))?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ChatTemplateError::source(&name, e.to_string()))?;
        let sibling = path.with_file_name("chat_template.jinja");
        let jinja = if sibling.is_file() {
            Some(std::fs::read_to_string(&sibling).map_err(|e| {
                ChatTemplateError::source(sibling.display().to_string(), e.to_string())
            })?)
        } else {
            None
        };
        ChatTemplate::from_tokenizer_config_value(&name, &config, jinja.as_deref())
    }

    /// [`ChatTemplate::from_tokenizer_config`] of a `tokenizer_config.json` already parsed
    /// (`name` names it in errors), with the text of the `chat_template.jinja` beside it when
    /// there is one (which then takes precedence).
    pub fn from_tokenizer_config_value(
        name: &str,
        config: &serde_json::Value,
        jinja: Option<&str>,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let token = |key: &str| -> Result<String, ChatTemplateError> {
            match config.get(key) {
                None | Some(serde_json::Value::Null) => Ok(String::new()),
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(obj @ serde_json::Value::Object(_)) => match obj.get("content") {
                    Some(serde_json::Value::String(s)) => Ok(s.clone()),
                    _ => Err(ChatTemplateError::source(
                        name,
                        format!("`{key}` has no string `content`"),
                    )),
                },
                Some(_) => Err(ChatTemplateError::source(
                    name,
                    format!("`{key}` is neither a string nor an object"),
                )),
            }
        };
        let tokens = SpecialTokens {
            bos: token("bos_token")?,
            eos: token("eos_token")?,
        };
        if let Some(source) = jinja {
            return ChatTemplate::new(source, tokens).map(Some);
        }
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(serde_json::Value::Array(list)) => {
                let default = list.iter().find(|entry| {
                    entry.get("name").and_then(serde_json::Value::as_str) == Some("default")
                });
                let Some(default) = default else {
                    return Err(ChatTemplateError::source(
                        name,
                        "`chat_template` lists named templates but none named `default`",
                    ));
                };
                default
                    .get("template")
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| {
                        ChatTemplateError::source(
                            name,
                            "the `default` chat template has no string `template`",
                        )
                    })?
            }
            Some(_) => {
                return Err(ChatTemplateError::source(
                    name,
                    "`chat_template` is neither a string nor a list",
                ))
            }
        };
        ChatTemplate::new(source, tokens).map(Some)
    }

    /// The template's text, as given (tool-call formats are recognized from it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special tokens the template sees.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    /// Renders `messages` into the prompt text.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        let now = unix_seconds(opts.now.unwrap_or_else(SystemTime::now));
        let tools_bytes = opts
            .tools
            .as_ref()
            .map_or(0, |t| t.to_string().len() as u64);
        let fuel = fuel_for(messages).saturating_add(tools_bytes.saturating_mul(4));
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut pairs = vec![
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ];
                for (k, v) in &m.extra {
                    let v = json_to_value(v);
                    match pairs.iter_mut().find(|(name, _)| name == k) {
                        Some(slot) => slot.1 = v,
                        None => pairs.push((k.as_str(), v)),
                    }
                }
                Value::from_pairs(pairs)
            })
            .collect();
        let mut vars = vec![
            ("messages", Value::from(messages)),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token", Value::from(self.tokens.bos.as_str())),
            ("eos_token", Value::from(self.tokens.eos.as_str())),
            (
                "strftime_now",
                Value::from_function(move |fmt: &str| strftime(fmt, now)),
            ),
        ];
        if let Some(tools) = &opts.tools {
            vars.push(("tools", json_to_value(tools)));
        }
        let ctx = Value::from_pairs(vars);
        // A clone shares the compiled template (an `Arc`); only the fuel differs.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let template = env.get_template(TEMPLATE_NAME).map_err(render_error)?;
        template.render(ctx).map_err(render_error)
    }
}

/// A JSON value as the template sees it (what Python's `json.loads` would give: objects keep
/// their key order, integers stay integers).
fn json_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_to_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(
            o.iter()
                .map(|(k, v)| (k.as_str(), json_to_value(v)))
                .collect::<Vec<_>>(),
        ),
    }
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (its AssistantTracker
/// extension, which renders the body) to `{% if true %}` / `{% endif %}`, keeping the whitespace
/// control markers and the line numbers.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match parse_generation_tag(tag) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// `tag` starts with `{%`: when it is a generation tag, its length and its replacement.
fn parse_generation_tag(tag: &str) -> Option<(usize, String)> {
    let mut pos = 2;
    let open_marker = match tag[pos..].chars().next() {
        Some(c @ ('-' | '+')) => {
            pos += 1;
            Some(c)
        }
        _ => None,
    };
    pos += tag[pos..].len() - tag[pos..].trim_start().len();
    let (word, replacement) = if tag[pos..].starts_with("endgeneration") {
        ("endgeneration", "endif")
    } else if tag[pos..].starts_with("generation") {
        ("generation", "if true")
    } else {
        return None;
    };
    pos += word.len();
    let after_word = tag[pos..].trim_start();
    pos = tag.len() - after_word.len();
    let close_marker = match after_word.chars().next() {
        Some(c @ ('-' | '+')) => {
            pos += 1;
            Some(c)
        }
        _ => None,
    };
    if !tag[pos..].starts_with("%}") {
        return None;
    }
    pos += 2;
    let mut text = String::from("{%");
    text.extend(open_marker);
    text.push(' ');
    text.push_str(replacement);
    text.push(' ');
    text.extend(close_marker);
    text.push_str("%}");
    Some((pos, text))
}

// ---- tojson: Python's json.dumps ----

/// The `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` (transformers' signature: these four, positional or by keyword).
fn tojson_filter(value: &Value, args: Rest<ValueOrKwargs>) -> Result<String, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    let mut params: [Option<Value>; 4] = Default::default();
    let mut positional = 0;
    for arg in args.into_values() {
        if arg.is_kwargs() {
            for key in arg.try_iter()? {
                let name = key.as_str().unwrap_or_default();
                let Some(i) = NAMES.iter().position(|n| *n == name) else {
                    return Err(Error::new(
                        ErrorKind::TooManyArguments,
                        format!("tojson() got an unexpected keyword argument '{name}'"),
                    ));
                };
                params[i] = Some(arg.get_item(&key)?);
            }
        } else {
            if positional == NAMES.len() {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    "tojson() takes at most 4 arguments besides the value",
                ));
            }
            params[positional] = Some(arg);
            positional += 1;
        }
    }
    let [ensure_ascii, indent, separators, sort_keys] = params;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(if let Some(s) = v.as_str() {
            s.to_string()
        } else if v.is_integer() {
            " ".repeat(i64::try_from(v)?.clamp(0, 64) as usize)
        } else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an integer or a string",
            ));
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => (a.to_string(), b.to_string()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let json = PyJson {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    json.write(&mut out, value, 0)?;
    Ok(out)
}

/// `json.dumps` settings.
struct PyJson {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: object of type {} is not JSON serializable",
            value.kind()
        ),
    )
}

impl PyJson {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        if depth > 200 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: value nested too deeply",
            ));
        }
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&python_number(value)?),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1)?;
                }
                self.newline(out, depth);
                out.push(']');
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    let key = match key.kind() {
                        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                        ValueKind::Number => python_number(&key)?,
                        ValueKind::Bool => {
                            (if key.is_true() { "true" } else { "false" }).to_string()
                        }
                        ValueKind::None => "null".to_string(),
                        _ => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!(
                                    "tojson: keys must be str, int, float, bool or None, not {}",
                                    key.kind()
                                ),
                            ))
                        }
                    };
                    entries.push((key, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.string(out, key);
                    out.push_str(&self.key_sep);
                    self.write(out, item, depth + 1)?;
                }
                self.newline(out, depth);
                out.push('}');
            }
            _ => return Err(not_serializable(value)),
        }
        Ok(())
    }

    /// A JSON string as Python writes it: `"`, `\` and control characters escaped (`\n`, `\r`,
    /// `\t`, `\b`, `\f` by name, the others as `\u00XX`); with `ensure_ascii`, also every non-ASCII
    /// character (as `\uXXXX`, UTF-16 surrogate pairs above U+FFFF).
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A number as Python's `json.dumps` writes it: integers in full, floats as `repr` does
/// (shortest round-trip digits, `1.0`, `1e-05`, `1e+16`), non-finite as `NaN` / `Infinity`.
fn python_number(value: &Value) -> Result<String, Error> {
    if value.is_integer() {
        return Ok(value.to_string());
    }
    let f = f64::try_from(value.clone())?;
    Ok(python_float_repr(f))
}

fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde[-]x".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    // Python's repr: positional when -4 <= exponent < 16, scientific otherwise.
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let text = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if exp + 1 >= n {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{text}")
    } else {
        let mantissa = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

// ---- strftime_now ----

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            // Floor: 0.5 s before the epoch is second -1.
            -secs - i64::from(d.subsec_nanos() > 0)
        }
    }
}

/// The proleptic Gregorian (year, month 1-12, day 1-31) of a day count since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats the UTC time `unix` (seconds since the epoch) as C's `strftime` does in the C locale,
/// for the codes templates use (see the module docs); other codes are written unchanged.
fn strftime(fmt: &str, unix: i64) -> String {
    // Clamp to years 0..=9999 so every field stays in range.
    let unix = unix.clamp(-62_167_219_200, 253_402_300_799);
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUMULATIVE[(month - 1) as usize] + day + u32::from(month > 2 && is_leap(year));
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(code) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match code {
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:>2}"),
            'm' => write!(out, "{month:02}"),
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year % 100),
            'b' => write!(out, "{}", &month_name[..3]),
            'B' => write!(out, "{month_name}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{:02}", (hour + 11) % 12 + 1),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'A' => write!(out, "{weekday_name}"),
            'a' => write!(out, "{}", &weekday_name[..3]),
            'j' => write!(out, "{yday:03}"),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn chat_template_is_send_sync() {
        assert_send_sync::<ChatTemplate>();
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_273), (2025, 7, 4));
        assert_eq!(civil_from_days(-719_468), (0, 3, 1));
    }

    #[test]
    fn strftime_codes() {
        // 2025-07-04 13:05:09 UTC, a Friday, day 185.
        let t = 1_751_634_309;
        assert_eq!(
            strftime("%d %m %Y %y %b %B %H %M %S %A %a %j %% %e %I%p %Q", t),
            "04 07 2025 25 Jul July 13 05 09 Friday Fri 185 %  4 01PM %Q"
        );
        // Leap day and the day after, in a leap year; midnight; a trailing lone `%`.
        assert_eq!(
            strftime("%j %d %b %H:%M:%S %I%p", 951_782_400),
            "060 29 Feb 00:00:00 12AM"
        );
        assert_eq!(strftime("%j %Y-%m-%d%", 951_868_800), "061 2000-03-01%");
        assert_eq!(strftime("%Y-%m-%d %A", 0), "1970-01-01 Thursday");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A", -1),
            "1969-12-31 23:59:59 Wednesday"
        );
        // Far out of range: clamped, no panic.
        assert_eq!(strftime("%Y", i64::MAX), "9999");
        assert_eq!(strftime("%Y", i64::MIN), "0");
        assert_eq!(
            unix_seconds(UNIX_EPOCH - std::time::Duration::from_millis(500)),
            -1
        );
    }

    #[test]
    fn float_repr_as_python() {
        for (f, text) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            (2.5e-300, "2.5e-300"),
        ] {
            assert_eq!(python_float_repr(f), text, "{f}");
        }
    }

    #[test]
    fn generation_tags_are_rewritten() {
        let src =
            "a{%- generation %}b{% endgeneration -%}c{%+generation+%}{%endgeneration%}{% if x %}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{%- if true %}b{% endif -%}c{%+ if true +%}{% endif %}{% if x %}"
        );
        assert_eq!(
            rewrite_generation_tags("{% set generation = 1 %}{%"),
            "{% set generation = 1 %}{%"
        );
    }

    fn tokens() -> SpecialTokens {
        SpecialTokens {
            bos: "<s>".into(),
            eos: "</s>".into(),
        }
    }

    fn render_str(source: &str, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
        let opts = RenderOptions {
            add_generation_prompt: true,
            now: Some(UNIX_EPOCH + std::time::Duration::from_secs(1_751_634_309)),
            tools: None,
        };
        ChatTemplate::new(source, tokens())?.render(messages, &opts)
    }

    fn hi() -> Vec<ChatMessage> {
        vec![ChatMessage::new("user", "hi")]
    }

    #[test]
    fn variables_and_whitespace_as_transformers() {
        // trim_blocks + lstrip_blocks; no trailing newline kept.
        let src = concat!(
            "{{ bos_token }}\n  {% for m in messages %}\n[{{ m.role }}] {{ m['content'] }}\n",
            "  {% endfor %}\n{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}\n",
        );
        assert_eq!(
            render_str(
                src,
                &[
                    ChatMessage::new("user", "a"),
                    ChatMessage::new("assistant", "b")
                ]
            )
            .unwrap(),
            "<s>\n[user] a\n[assistant] b\n[assistant]</s>"
        );
        // tools/documents undefined; loop controls; Python methods.
        let src = "{{ tools is defined }} {{ documents is defined }} {{ tools is not none }}|\
            {% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}\
            {{ m.content.strip().upper() }}{% endfor %}|\
            {{ '  x y '.split() | join(',') }}|{{ 'abc'.startswith('ab') }}|\
            {% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}";
        assert_eq!(
            render_str(
                src,
                &[
                    ChatMessage::new("user", "  one "),
                    ChatMessage::new("user", "two")
                ]
            )
            .unwrap(),
            "False False True|ONE|x,y|True|b=1;a=2;"
        );
    }

    #[test]
    fn raise_exception_is_typed() {
        let src = "{% if messages[0]['role'] == 'system' %}\
            {{ raise_exception('System role not supported') }}{% endif %}ok";
        assert_eq!(
            render_str(src, &[ChatMessage::new("system", "x")]),
            Err(ChatTemplateError::Raised(
                "System role not supported".into()
            ))
        );
        assert_eq!(render_str(src, &hi()).unwrap(), "ok");
        // Raised inside a macro and a filter chain, with a computed message.
        let src = "{% macro f(r) %}{{ raise_exception('bad role: ' + r) }}{% endmacro %}\
            {% for m in messages %}{{ f(m.role) | trim }}{% endfor %}";
        assert_eq!(
            render_str(src, &hi()),
            Err(ChatTemplateError::Raised("bad role: user".into()))
        );
    }

    #[test]
    fn syntax_errors_are_typed_with_a_line() {
        let err = ChatTemplate::new("line one\n{% if x %}\n{{ y }\n", tokens()).unwrap_err();
        match err {
            ChatTemplateError::Syntax { line, message } => {
                assert_eq!(line, Some(3), "{message}");
                assert!(!message.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ChatTemplate::new("{% for %}", tokens()),
            Err(ChatTemplateError::Syntax { line: Some(1), .. })
        ));
        assert!(matches!(
            ChatTemplate::new("{% if x %}never closed", tokens()),
            Err(ChatTemplateError::Syntax { .. })
        ));
    }

    #[test]
    fn render_errors_are_typed() {
        let err = render_str("a\n{{ messages[0].content.nope() }}", &hi()).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Render { line: Some(2), .. }),
            "{err:?}"
        );
        let err = render_str("{{ 'a' + undefined_thing.x }}", &hi()).unwrap_err();
        assert!(matches!(err, ChatTemplateError::Render { .. }), "{err:?}");
        let err = render_str("{{ messages | unknown_filter }}", &hi()).unwrap_err();
        assert!(
            matches!(
                err,
                ChatTemplateError::Syntax { .. } | ChatTemplateError::Render { .. }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn hostile_templates_fail_instead_of_hanging() {
        for src in [
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}\
             {% endfor %}",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "{% set ns = namespace(s='x') %}{% for i in range(100) %}\
             {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
            "{{ 'x' * 100000000000 }}",
            "{{ range(1000000000) | list | length }}",
        ] {
            let started = std::time::Instant::now();
            let result = render_str(src, &hi());
            assert!(
                matches!(result, Err(ChatTemplateError::Render { .. })),
                "{src}: {result:?}"
            );
            assert!(
                started.elapsed().as_secs() < 30,
                "{src}: took {:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn tojson_as_python() {
        let messages = [ChatMessage::new(
            "user",
            "café \"quoted\" \\ ☕ 𝄞\n\t\u{1}\u{7f}",
        )];
        assert_eq!(
            render_str("{{ messages[0].content | tojson }}", &messages).unwrap(),
            "\"café \\\"quoted\\\" \\\\ ☕ 𝄞\\n\\t\\u0001\u{7f}\""
        );
        assert_eq!(
            render_str(
                "{{ messages[0].content | tojson(ensure_ascii=True) }}",
                &messages
            )
            .unwrap(),
            "\"caf\\u00e9 \\\"quoted\\\" \\\\ \\u2615 \\ud834\\udd1e\\n\\t\\u0001\u{7f}\""
        );
        // Maps keep their order; Python's separators; numbers as Python writes them.
        assert_eq!(
            render_str("{{ messages | tojson }}", &hi()).unwrap(),
            r#"[{"role": "user", "content": "hi"}]"#
        );
        assert_eq!(
            render_str(
                "{{ {'z': [1, 2.5, 1.0, none, true], 'a': {}, 'b': []} | tojson }}",
                &hi()
            )
            .unwrap(),
            r#"{"z": [1, 2.5, 1.0, null, true], "a": {}, "b": []}"#
        );
        assert_eq!(
            render_str(
                "{{ {'z': [1, {'k': 'v'}], 'a': {}} | tojson(indent=2) }}",
                &hi()
            )
            .unwrap(),
            "{\n  \"z\": [\n    1,\n    {\n      \"k\": \"v\"\n    }\n  ],\n  \"a\": {}\n}"
        );
        assert_eq!(
            render_str(
                "{{ {'z': 1, 'a': [1, 2]} | tojson(sort_keys=true, separators=(',', ':')) }}",
                &hi()
            )
            .unwrap(),
            r#"{"a":[1,2],"z":1}"#
        );
        // Positional arguments follow transformers' signature: ensure_ascii, indent, ...
        assert_eq!(
            render_str("{{ ['é'] | tojson(false, '\t') }}", &hi()).unwrap(),
            "[\n\t\"é\"\n]"
        );
        assert!(matches!(
            render_str("{{ undefined_thing | tojson }}", &hi()),
            Err(ChatTemplateError::Render { .. })
        ));
        assert!(matches!(
            render_str("{{ 1 | tojson(bogus=1) }}", &hi()),
            Err(ChatTemplateError::Render { .. })
        ));
    }

    #[test]
    fn strftime_now_uses_the_fixed_date() {
        assert_eq!(
            render_str(
                "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %d, %Y %H:%M:%S %a %j') }}",
                &hi()
            )
            .unwrap(),
            "04 Jul 2025|July 04, 2025 13:05:09 Fri 185"
        );
        // Default: the current time.
        let year = ChatTemplate::new("{{ strftime_now('%Y') }}", tokens())
            .unwrap()
            .render(&hi(), &RenderOptions::default())
            .unwrap();
        assert!(year.parse::<i32>().unwrap() >= 2025, "{year}");
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("kiln-chat-{name}-{}-{nonce}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn from_config(name: &str, config: &str) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let dir = temp_dir(name);
        let path = dir.join("tokenizer_config.json");
        std::fs::write(&path, config).unwrap();
        let result = ChatTemplate::from_tokenizer_config(&path);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    #[test]
    fn from_tokenizer_config_variants() {
        let src = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}";
        let render =
            |t: Option<ChatTemplate>| t.unwrap().render(&hi(), &RenderOptions::default()).unwrap();
        // A string, tokens as strings.
        let config =
            serde_json::json!({"chat_template": src, "bos_token": "<s>", "eos_token": "</s>"});
        assert_eq!(
            render(from_config("string", &config.to_string()).unwrap()),
            "<s>hi</s>"
        );
        // A list with a default, tokens as objects / null.
        let config = serde_json::json!({
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": src},
            ],
            "bos_token": {"content": "<|begin|>", "lstrip": false, "__type": "AddedToken"},
            "eos_token": null,
        });
        assert_eq!(
            render(from_config("list", &config.to_string()).unwrap()),
            "<|begin|>hi"
        );
        // No template.
        assert!(from_config("none", r#"{"bos_token": "<s>"}"#)
            .unwrap()
            .is_none());
        // A list without a default, a wrong type, a bad file: typed errors.
        for (name, config) in [
            (
                "nodefault",
                r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
            ),
            ("number", r#"{"chat_template": 3}"#),
            ("badtoken", r#"{"chat_template": "x", "bos_token": 5}"#),
            ("notjson", "{"),
        ] {
            assert!(
                matches!(
                    from_config(name, config),
                    Err(ChatTemplateError::Source { .. })
                ),
                "{name}"
            );
        }
        assert!(matches!(
            from_config("syntax", r#"{"chat_template": "{% if %}"}"#),
            Err(ChatTemplateError::Syntax { .. })
        ));
        assert!(matches!(
            ChatTemplate::from_tokenizer_config(Path::new("/nonexistent/tokenizer_config.json")),
            Err(ChatTemplateError::Source { .. })
        ));
        // A chat_template.jinja next to the config wins.
        let dir = temp_dir("sibling");
        let path = dir.join("tokenizer_config.json");
        std::fs::write(&path, r#"{"chat_template": "config", "eos_token": "</s>"}"#).unwrap();
        std::fs::write(dir.join("chat_template.jinja"), "file{{ eos_token }}\n").unwrap();
        let result = ChatTemplate::from_tokenizer_config(&path);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(render(result.unwrap()), "file</s>");
    }

    fn gguf(template: Option<&str>, bos: Option<u32>) -> kiln_formats::GgufFile {
        use kiln_formats::{GgufWriter, MetaArray, MetaType, MetaValue};
        let mut w = GgufWriter::new();
        w.add_meta("tokenizer.ggml.model", "llama".into()).unwrap();
        let tokens = ["<unk>", "<s>", "</s>", "a"]
            .iter()
            .map(|t| MetaValue::from(*t))
            .collect();
        w.add_meta(
            "tokenizer.ggml.tokens",
            MetaArray::new(MetaType::String, tokens).into(),
        )
        .unwrap();
        if let Some(bos) = bos {
            w.add_meta("tokenizer.ggml.bos_token_id", MetaValue::U32(bos))
                .unwrap();
        }
        w.add_meta("tokenizer.ggml.eos_token_id", MetaValue::I32(2))
            .unwrap();
        if let Some(template) = template {
            w.add_meta("tokenizer.chat_template", template.into())
                .unwrap();
        }
        kiln_formats::GgufFile::from_bytes(kiln_core::SharedBytes::from_vec(w.to_bytes())).unwrap()
    }

    #[test]
    fn from_gguf_with_and_without_the_key() {
        let src = "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}";
        let t = ChatTemplate::from_gguf(&gguf(Some(src), Some(1)))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.render(&hi(), &RenderOptions::default()).unwrap(),
            "<s>|hi|</s>"
        );
        assert_eq!(t.special_tokens(), &tokens());
        // BOS absent or out of range: empty.
        for bos in [None, Some(99)] {
            let t = ChatTemplate::from_gguf(&gguf(Some(src), bos))
                .unwrap()
                .unwrap();
            assert_eq!(
                t.render(&hi(), &RenderOptions::default()).unwrap(),
                "|hi|</s>"
            );
        }
        assert!(ChatTemplate::from_gguf(&gguf(None, Some(1)))
            .unwrap()
            .is_none());
        // The key with the wrong type.
        let mut w = kiln_formats::GgufWriter::new();
        w.add_meta("tokenizer.chat_template", kiln_formats::MetaValue::U32(1))
            .unwrap();
        let file =
            kiln_formats::GgufFile::from_bytes(kiln_core::SharedBytes::from_vec(w.to_bytes()))
                .unwrap();
        assert!(matches!(
            ChatTemplate::from_gguf(&file),
            Err(ChatTemplateError::Source { .. })
        ));
    }

    #[test]
    fn chat_message_serde() {
        let m: ChatMessage = serde_json::from_str(r#"{"role": "user", "content": "hi"}"#).unwrap();
        assert_eq!(m, ChatMessage::new("user", "hi"));
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"role":"user","content":"hi"}"#
        );
    }
}
