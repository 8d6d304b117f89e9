//! OpenAI request bodies: parsing and validation.
//!
//! [`parse_body`] turns raw bytes into a request type (invalid UTF-8, malformed JSON and wrong
//! types are 400s naming the problem); each request's `validate` checks every field against
//! OpenAI's documented ranges and kiln's limits and yields the engine's parameters. Fields
//! OpenAI defines that kiln does not implement are refused by name rather than silently
//! ignored; unknown fields are ignored, as clients send extras (`user`, ...).
//!
//! Invariant: a value returned by a `validate` is safe to hand to the engine (sampling
//! parameters pass `SamplingParams::validate`, counts are within the limits); every refusal is
//! an [`ApiError`] with the offending parameter in `param`.

use kiln_engine::SamplingParams;
use kiln_grammar::GrammarSpec;
use kiln_tokenizer::ChatMessage;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::responses::ErrorBody;
use crate::tools::{Tool, ToolChoice, ToolRequest};

/// The most tools one request may offer.
const MAX_TOOLS: usize = 128;

/// An OpenAI-style error: HTTP status and the `error` object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, `server_error`.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 for parameter `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// 400 for the body as a whole.
    pub fn bad_body(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 404 for a model the server does not serve.
    pub fn unknown_model(model: &str, served: &[&str]) -> ApiError {
        ApiError {
            status: 404,
            message: format!(
                "the model '{model}' does not exist; this server serves {}",
                served.join(", ")
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// The JSON body, `{"error": {"message", "type", "param", "code"}}`, as a value (the
    /// server sends [`ErrorBody`]).
    pub fn body(&self) -> Value {
        serde_json::to_value(ErrorBody::from(self)).expect("an error body serializes")
    }
}

/// Parses a request body: UTF-8, then JSON of type `T`.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ApiError::bad_body(format!(
            "the request body is not valid UTF-8 (at byte {})",
            e.valid_up_to()
        ))
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        match e.classify() {
            // A field of the wrong type or range: named, as OpenAI names it.
            serde_json::error::Category::Data if path != "." => {
                ApiError::invalid(&path, format!("'{path}': {e}"))
            }
            serde_json::error::Category::Data => {
                // `#[serde(flatten)]` hides the path: the shared generation fields are the
                // flattened ones, so look for the culprit among them.
                let mut de = serde_json::Deserializer::from_str(text);
                match serde_path_to_error::deserialize::<_, GenerationFields>(&mut de) {
                    Err(inner) if inner.path().to_string() != "." => {
                        let path = inner.path().to_string();
                        ApiError::invalid(&path, format!("'{path}': {}", inner.into_inner()))
                    }
                    _ => ApiError::bad_body(format!("the request body does not fit the API: {e}")),
                }
            }
            _ => ApiError::bad_body(format!("the request body is not valid JSON: {e}")),
        }
    })?;
    // Trailing characters after the value.
    de.end()
        .map_err(|e| ApiError::bad_body(format!("the request body is not valid JSON: {e}")))?;
    Ok(value)
}

/// A string or a list of strings (`stop`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

/// A prompt or an embedding input: text, texts, token ids, or lists of token ids.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum TextsOrIds {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// One input of a prompt or embedding request.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Text(String),
    Ids(Vec<u32>),
}

impl TextsOrIds {
    fn inputs(&self) -> Vec<Input> {
        match self {
            TextsOrIds::Text(t) => vec![Input::Text(t.clone())],
            TextsOrIds::Texts(ts) => ts.iter().cloned().map(Input::Text).collect(),
            TextsOrIds::Ids(ids) => vec![Input::Ids(ids.clone())],
            TextsOrIds::IdLists(l) => l.iter().cloned().map(Input::Ids).collect(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The generation fields chat and completions share (OpenAI's, then kiln's extensions).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenerationFields {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    pub n: Option<u64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// kiln extensions, as llama.cpp's and vLLM's servers accept them.
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Token id (as a string) → bias added to its logit, −100..=100.
    pub logit_bias: Option<Value>,
    /// `text`, `json_object`, `json_schema` (and kiln's `regex` and `lark`).
    pub response_format: Option<Value>,
    /// OpenAI fields kiln does not implement: refused by name (see [`NOT_IMPLEMENTED`]).
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub audio: Option<Value>,
    pub modalities: Option<Value>,
    pub prediction: Option<Value>,
    pub web_search_options: Option<Value>,
    pub reasoning_effort: Option<Value>,
    pub verbosity: Option<Value>,
    pub store: Option<Value>,
}

/// The OpenAI request fields kiln does not implement, and the values that ask for nothing it
/// lacks (`modalities: ["text"]`, `store: false`, `best_of: 1`); any other value is refused by
/// name. Fields that only label a request (`user`, `metadata`, `service_tier`,
/// `prompt_cache_key`, `safety_identifier`) change nothing in an answer and are accepted.
pub const NOT_IMPLEMENTED: &[(&str, &str)] = &[
    ("functions", "the deprecated 'functions'; use 'tools'"),
    (
        "function_call",
        "the deprecated 'function_call'; use 'tool_choice'",
    ),
    ("audio", "audio output"),
    ("modalities", "output modalities other than text"),
    ("prediction", "predicted outputs"),
    ("web_search_options", "web search"),
    ("reasoning_effort", "reasoning effort"),
    ("verbosity", "verbosity"),
    ("store", "stored completions"),
    ("suffix", "suffixes (insertion)"),
    ("best_of", "best_of above 1"),
    (
        "tools",
        "tools on /v1/completions (use /v1/chat/completions)",
    ),
    (
        "tool_choice",
        "tool_choice on /v1/completions (use /v1/chat/completions)",
    ),
    (
        "parallel_tool_calls",
        "parallel_tool_calls on /v1/completions (use /v1/chat/completions)",
    ),
];

/// Refuses `name` when `value` asks for something kiln does not implement.
fn refuse_unimplemented(name: &str, value: Option<&Value>) -> Result<(), ApiError> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let harmless = match name {
        "modalities" => v == &serde_json::json!(["text"]),
        "store" => v == &Value::Bool(false),
        "best_of" => v.as_u64() == Some(1),
        _ => false,
    };
    if harmless {
        return Ok(());
    }
    let what = NOT_IMPLEMENTED
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(name, |(_, w)| w);
    Err(ApiError::invalid(
        name,
        format!("'{name}' is not supported by kiln ({what})"),
    ))
}

/// What the server's configuration allows.
#[derive(Clone, Debug)]
pub struct GenerationLimits {
    /// Most choices per request (`n`).
    pub max_n: u64,
    /// The default `max_tokens` when a request gives none.
    pub default_max_tokens: u64,
}

/// A generation request's engine parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidGeneration {
    /// At most; the context length caps it further once the prompt is known. 0 only for a
    /// completion with `echo` (score the prompt, generate nothing).
    pub max_tokens: u64,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub n: u64,
    pub stream: bool,
    pub include_usage: bool,
    /// What the output must match (`response_format`), if anything.
    pub grammar: Option<GrammarSpec>,
}

/// The most tokens one request may bias.
const MAX_LOGIT_BIAS: usize = 1024;

/// `response_format`: `None` for free text, else the grammar the output must match.
///
/// - `{"type": "text"}`: free text.
/// - `{"type": "json_object"}`: any JSON object.
/// - `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`: a
///   value valid against `schema` (any JSON value when absent). With `strict: true` the schema
///   must also be in OpenAI's strict subset: every object lists all its properties in
///   `required` and sets `additionalProperties: false`.
/// - kiln's extensions: `{"type": "regex", "regex": "..."}` (the whole output matches) and
///   `{"type": "lark", "lark": "..."}` (a grammar in llguidance's Lark dialect).
fn response_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(o) = v.as_object() else {
        return Err(ApiError::invalid(P, "must be an object with a 'type'"));
    };
    let text_field = |name: &str| -> Result<String, ApiError> {
        match o.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(ApiError::invalid(
                &format!("{P}.{name}"),
                format!("a non-empty string is required with type '{name}'"),
            )),
        }
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("regex") => Ok(Some(GrammarSpec::Regex(text_field("regex")?))),
        Some("lark") => Ok(Some(GrammarSpec::Lark(text_field("lark")?))),
        Some("json_schema") => json_schema_format(o.get("json_schema")).map(Some),
        Some(other) => Err(ApiError::invalid(
            &format!("{P}.type"),
            format!(
                "'{other}' is not a response format; use 'text', 'json_object', 'json_schema' \
                 (or kiln's 'regex', 'lark')"
            ),
        )),
        None => Err(ApiError::invalid(
            &format!("{P}.type"),
            "a string 'type' is required",
        )),
    }
}

/// `response_format.json_schema`: `name` (required), `schema`, `strict`, `description`.
fn json_schema_format(v: Option<&Value>) -> Result<GrammarSpec, ApiError> {
    const J: &str = "response_format.json_schema";
    let Some(js) = v.and_then(Value::as_object) else {
        return Err(ApiError::invalid(
            J,
            "an object with 'name' and 'schema' is required with type 'json_schema'",
        ));
    };
    if !js
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(valid_name)
    {
        return Err(ApiError::invalid(
            &format!("{J}.name"),
            "must be 1 to 64 letters, digits, '_' or '-'",
        ));
    }
    let strict = match js.get("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                &format!("{J}.strict"),
                "must be a boolean",
            ))
        }
    };
    let schema = match js.get("schema") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                &format!("{J}.schema"),
                "must be a JSON schema (an object)",
            ))
        }
    };
    if strict {
        if let Err(e) = strict_subset(&schema, "#") {
            return Err(ApiError::invalid(
                &format!("{J}.schema"),
                format!("not a strict schema: {e} (set 'strict': false to use it as it is)"),
            ));
        }
    }
    Ok(GrammarSpec::JsonSchema(schema))
}

/// Checks OpenAI's structured-output rules for `strict` schemas: each object schema sets
/// `additionalProperties: false` and lists every property in `required`. `at` is the JSON
/// pointer of `schema`, for the message.
fn strict_subset(schema: &Value, at: &str) -> Result<(), String> {
    let Some(o) = schema.as_object() else {
        return Ok(());
    };
    let is_object = o.get("type").is_some_and(|t| {
        t == "object"
            || t.as_array()
                .is_some_and(|a| a.iter().any(|t| t == "object"))
    }) || o.contains_key("properties");
    if is_object {
        if o.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(format!("{at}: 'additionalProperties' must be false"));
        }
        let required: Vec<&str> = o
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = o.get("properties").and_then(Value::as_object) {
            if let Some(missing) = props.keys().find(|k| !required.contains(&k.as_str())) {
                return Err(format!(
                    "{at}: property '{missing}' must be listed in 'required' (make it \
                     nullable to leave it optional)"
                ));
            }
        }
    }
    for (key, sub) in o {
        match (key.as_str(), sub) {
            ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(m)) => {
                for (name, s) in m {
                    strict_subset(s, &format!("{at}/{key}/{name}"))?;
                }
            }
            ("anyOf" | "allOf" | "oneOf" | "prefixItems", Value::Array(a)) => {
                for (i, s) in a.iter().enumerate() {
                    strict_subset(s, &format!("{at}/{key}/{i}"))?;
                }
            }
            ("items" | "additionalProperties" | "not" | "contains", Value::Object(_)) => {
                strict_subset(sub, &format!("{at}/{key}"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request.
fn tool_request(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolRequest>, ApiError> {
    let tools = match tools.filter(|v| !v.is_null()) {
        None => {
            if choice.is_some_and(|c| !c.is_null() && c != "none") {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "only allowed when 'tools' are given",
                ));
            }
            return Ok(None);
        }
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid("tools", "must be a list of tools")),
    };
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!("at most {MAX_TOOLS} tools per request"),
        ));
    }
    let mut out: Vec<Tool> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = |field: &str| format!("tools[{i}]{field}");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                &at(".type"),
                "only tools of type 'function' are supported",
            ));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid(&at(".function"), "an object is required"));
        };
        let name = match f.get("name").and_then(Value::as_str) {
            Some(n) if valid_name(n) => n.to_string(),
            _ => {
                return Err(ApiError::invalid(
                    &at(".function.name"),
                    "must be 1 to 64 letters, digits, '_' or '-'",
                ))
            }
        };
        if out.iter().any(|x| x.name == name) {
            return Err(ApiError::invalid(
                &at(".function.name"),
                format!("two tools are named '{name}'"),
            ));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => {
                return Err(ApiError::invalid(
                    &at(".function.description"),
                    "must be a string",
                ))
            }
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    &at(".function.parameters"),
                    "must be a JSON schema (an object)",
                ))
            }
        };
        if f.get("strict") == Some(&Value::Bool(true)) {
            if let Err(e) = strict_subset(&parameters, "#") {
                return Err(ApiError::invalid(
                    &at(".function.parameters"),
                    format!("not a strict schema: {e}"),
                ));
            }
        }
        out.push(Tool {
            name,
            description,
            parameters,
            raw: t.clone(),
        });
    }
    let choice = match choice.filter(|v| !v.is_null()) {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("'{other}' is not 'none', 'auto', 'required' or a function"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) if out.iter().any(|t| t.name == n) => {
                    ToolChoice::Named(n.to_string())
                }
                (Some("function"), Some(n)) => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("no tool is named '{n}'"),
                    ))
                }
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "must be a string or a function",
            ))
        }
    };
    if out.is_empty() && matches!(choice, ToolChoice::Required) {
        return Err(ApiError::invalid(
            "tool_choice",
            "'required' needs at least one tool",
        ));
    }
    Ok(Some(ToolRequest {
        tools: out,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// A function or schema name: 1 to 64 letters, digits, `_` or `-`.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// An assistant message's `tool_calls` as the template takes them: OpenAI's list with each
/// call's `arguments` parsed from its JSON text into an object (as transformers expects; text
/// that is not a JSON object stays text).
fn template_tool_calls(v: &Value, at: &str) -> Result<Value, ApiError> {
    let Some(calls) = v.as_array() else {
        return Err(ApiError::invalid(at, "must be a list of tool calls"));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let f = c.get("function").and_then(Value::as_object);
        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
        let (Some(f), Some(name)) = (f, name) else {
            return Err(ApiError::invalid(
                &here,
                "a call needs 'function' with a 'name' and 'arguments'",
            ));
        };
        let arguments = match f.get("arguments") {
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v,
                _ => Value::String(s.clone()),
            },
            Some(v @ Value::Object(_)) => v.clone(),
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{here}.function.arguments"),
                    "must be a JSON string",
                ))
            }
        };
        let mut call = serde_json::Map::new();
        if let Some(id) = c.get("id") {
            call.insert("id".into(), id.clone());
        }
        call.insert("type".into(), Value::String("function".into()));
        call.insert(
            "function".into(),
            serde_json::json!({"name": name, "arguments": arguments}),
        );
        out.push(Value::Object(call));
    }
    Ok(Value::Array(out))
}

/// `logit_bias` as OpenAI defines it: an object from token ids (as strings) to biases in
/// −100..=100, sorted by id. Whether the ids are in the model's vocabulary is checked once the
/// model is known.
fn logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Some(map) = v.as_object() else {
        return Err(ApiError::invalid(
            "logit_bias",
            "must be an object from token ids to biases",
        ));
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} tokens may be biased"),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let Ok(id) = key.parse::<u32>() else {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("'{key}' is not a token id"),
            ));
        };
        match bias.as_f64() {
            Some(b) if within(b, -100.0, 100.0) => out.push((id, b as f32)),
            _ => {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("the bias of token {id} must be a number between -100 and 100"),
                ))
            }
        }
    }
    out.sort_by_key(|&(id, _)| id);
    Ok(out)
}

/// Whether `x` lies in `[lo, hi]` (and is a number).
fn within(x: f64, lo: f64, hi: f64) -> bool {
    x >= lo && x <= hi
}

/// A seed for a request that gave none: OpenAI samples differently on every such request.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS once per process and varies per instance.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

impl GenerationFields {
    /// `allow_zero_tokens`: `max_tokens: 0` is valid (a completion that echoes and scores its
    /// prompt).
    fn validate(
        &self,
        limits: &GenerationLimits,
        allow_zero_tokens: bool,
    ) -> Result<ValidGeneration, ApiError> {
        for (name, given) in [
            ("functions", &self.functions),
            ("function_call", &self.function_call),
            ("audio", &self.audio),
            ("modalities", &self.modalities),
            ("prediction", &self.prediction),
            ("web_search_options", &self.web_search_options),
            ("reasoning_effort", &self.reasoning_effort),
            ("verbosity", &self.verbosity),
            ("store", &self.store),
        ] {
            refuse_unimplemented(name, given.as_ref())?;
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) => limits.default_max_tokens,
        };
        if max_tokens == 0 && !allow_zero_tokens {
            let param = if self.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::invalid(param, "must be at least 1"));
        }
        let mut sampling = SamplingParams {
            // OpenAI's defaults: temperature 1, top_p 1, no other filter.
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 0,
            seed: fresh_seed(),
            logit_bias: logit_bias(self.logit_bias.as_ref())?,
        };
        if let Some(t) = self.temperature {
            if !within(t, 0.0, 2.0) {
                return Err(ApiError::invalid("temperature", "must be between 0 and 2"));
            }
            sampling.temperature = t as f32;
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid("top_p", "must be in (0, 1]"));
            }
            sampling.top_p = p as f32;
        }
        for (name, value, slot) in [
            (
                "presence_penalty",
                self.presence_penalty,
                &mut sampling.presence_penalty,
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                &mut sampling.frequency_penalty,
            ),
        ] {
            if let Some(v) = value {
                if !within(v, -2.0, 2.0) {
                    return Err(ApiError::invalid(name, "must be between -2 and 2"));
                }
                *slot = v as f32;
            }
        }
        if let Some(seed) = self.seed {
            // Negative seeds are valid in OpenAI's API: keep their bits.
            sampling.seed = seed as u64;
        }
        if let Some(k) = self.top_k {
            // -1 and 0 both mean "off" in the servers that accept top_k.
            if k < -1 {
                return Err(ApiError::invalid(
                    "top_k",
                    "must be -1, 0 (off) or positive",
                ));
            }
            sampling.top_k = k.max(0) as usize;
        }
        if let Some(m) = self.min_p {
            if !within(m, 0.0, 1.0) {
                return Err(ApiError::invalid("min_p", "must be between 0 and 1"));
            }
            sampling.min_p = m as f32;
        }
        if let Some(r) = self.repetition_penalty {
            if !(r > 0.0 && r.is_finite() && r <= 10.0) {
                return Err(ApiError::invalid(
                    "repetition_penalty",
                    "must be in (0, 10]",
                ));
            }
            sampling.repetition_penalty = r as f32;
        }
        sampling
            .validate()
            .map_err(|e| ApiError::bad_body(e.to_string()))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StringOrList::One(s)) => vec![s.clone()],
            Some(StringOrList::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid("stop", "at most 4 stop sequences"));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "stop sequences must not be empty",
            ));
        }
        let n = self.n.unwrap_or(1);
        if n == 0 || n > limits.max_n {
            return Err(ApiError::invalid(
                "n",
                format!("must be between 1 and {}", limits.max_n),
            ));
        }
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::invalid(
                "stream_options",
                "only allowed when 'stream' is true",
            ));
        }
        Ok(ValidGeneration {
            max_tokens,
            sampling,
            stop,
            n,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            grammar: response_format(self.response_format.as_ref())?,
        })
    }
}

/// Message content: a string, or a list of parts of which kiln reads the text ones.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct MessageIn {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls.
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<MessageIn>,
    #[serde(flatten)]
    pub generation: GenerationFields,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u64>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
}

/// A validated chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidChat {
    /// The conversation as the template sees it (tool calls and results included).
    pub messages: Vec<ChatMessage>,
    /// The tools offered, when any.
    pub tools: Option<ToolRequest>,
    pub generation: ValidGeneration,
    /// Top alternatives per token when logprobs were asked for.
    pub logprobs: Option<u64>,
}

impl ChatCompletionRequest {
    pub fn validate(&self, limits: &GenerationLimits) -> Result<ValidChat, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "must not be empty"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(
                m.role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("unknown role '{}'", m.role),
                ));
            }
            let text = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    &format!("messages[{i}].content[{j}]"),
                                    format!(
                                        "content parts of type '{}' are not supported (text only)",
                                        p.kind
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            let mut msg = ChatMessage::new(m.role.clone(), text);
            if let Some(calls) = m.tool_calls.as_ref().filter(|v| !v.is_null()) {
                if m.role != "assistant" {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].tool_calls"),
                        "only assistant messages make tool calls",
                    ));
                }
                let calls = template_tool_calls(calls, &format!("messages[{i}].tool_calls"))?;
                msg.extra.insert("tool_calls".into(), calls);
                if m.content.is_none() {
                    msg.extra.insert("content".into(), Value::Null);
                }
            }
            if m.role == "tool" {
                match &m.tool_call_id {
                    Some(id) => {
                        msg.extra
                            .insert("tool_call_id".into(), Value::String(id.clone()));
                    }
                    None => {
                        return Err(ApiError::invalid(
                            &format!("messages[{i}].tool_call_id"),
                            "a tool message must say which call it answers",
                        ))
                    }
                }
            }
            if let Some(name) = &m.name {
                msg.extra.insert("name".into(), Value::String(name.clone()));
            }
            messages.push(msg);
        }
        let generation = self.generation.validate(limits, false)?;
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "only allowed when 'logprobs' is true",
                ))
            }
            (true, Some(k)) if k > 20 => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "must be between 0 and 20",
                ))
            }
            (true, k) => Some(k.unwrap_or(0)),
            (false, None) => None,
        };
        let tools = tool_request(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        if tools.as_ref().is_some_and(ToolRequest::active) && generation.grammar.is_some() {
            return Err(ApiError::invalid(
                "response_format",
                "a response format cannot be combined with tools (unless tool_choice is 'none')",
            ));
        }
        Ok(ValidChat {
            messages,
            tools,
            generation,
            logprobs,
        })
    }
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: TextsOrIds,
    #[serde(flatten)]
    pub generation: GenerationFields,
    pub logprobs: Option<u64>,
    #[serde(default)]
    pub echo: bool,
    /// Refused by name (see [`NOT_IMPLEMENTED`]).
    pub suffix: Option<Value>,
    pub best_of: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
}

/// A validated completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidCompletion {
    /// One choice (times `n`) per prompt.
    pub prompts: Vec<Input>,
    pub generation: ValidGeneration,
    pub logprobs: Option<u64>,
    pub echo: bool,
}

impl CompletionRequest {
    pub fn validate(&self, limits: &GenerationLimits) -> Result<ValidCompletion, ApiError> {
        for (name, given) in [
            ("suffix", &self.suffix),
            ("best_of", &self.best_of),
            ("tools", &self.tools),
            ("tool_choice", &self.tool_choice),
            ("parallel_tool_calls", &self.parallel_tool_calls),
        ] {
            refuse_unimplemented(name, given.as_ref())?;
        }
        let prompts = self.prompt.inputs();
        if prompts.is_empty() {
            return Err(ApiError::invalid("prompt", "must not be empty"));
        }
        if prompts
            .iter()
            .any(|p| matches!(p, Input::Ids(ids) if ids.is_empty()))
        {
            return Err(ApiError::invalid(
                "prompt",
                "a token list must not be empty",
            ));
        }
        // `echo` with `max_tokens: 0` scores a prompt without generating.
        let generation = self.generation.validate(limits, self.echo)?;
        if let Some(k) = self.logprobs {
            if k > 5 {
                return Err(ApiError::invalid("logprobs", "must be between 0 and 5"));
            }
        }
        Ok(ValidCompletion {
            prompts,
            generation,
            logprobs: self.logprobs,
            echo: self.echo,
        })
    }
}

/// `POST /v1/embeddings`.
#[derive(Clone, Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: TextsOrIds,
    pub encoding_format: Option<String>,
    pub dimensions: Option<u64>,
}

/// A validated embedding request.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidEmbedding {
    pub inputs: Vec<Input>,
    /// Vectors as base64 of little-endian f32 (else JSON floats).
    pub base64: bool,
    /// Keep the first this many values of each vector, renormalized (at least 1; checked
    /// against the model's width once the model is known).
    pub dimensions: Option<usize>,
}

impl EmbeddingRequest {
    /// `max_inputs`: most inputs in one request.
    pub fn validate(&self, max_inputs: usize) -> Result<ValidEmbedding, ApiError> {
        let inputs = self.input.inputs();
        if inputs.is_empty() {
            return Err(ApiError::invalid("input", "must not be empty"));
        }
        if inputs.len() > max_inputs {
            return Err(ApiError::invalid(
                "input",
                format!("at most {max_inputs} inputs per request"),
            ));
        }
        if inputs.iter().any(|i| match i {
            Input::Text(t) => t.is_empty(),
            Input::Ids(ids) => ids.is_empty(),
        }) {
            return Err(ApiError::invalid("input", "inputs must not be empty"));
        }
        let base64 = match self.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("must be 'float' or 'base64', not '{other}'"),
                ))
            }
        };
        let dimensions = match self.dimensions {
            None => None,
            Some(0) => return Err(ApiError::invalid("dimensions", "must be at least 1")),
            Some(d) => Some(usize::try_from(d).unwrap_or(usize::MAX)),
        };
        Ok(ValidEmbedding {
            inputs,
            base64,
            dimensions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> GenerationLimits {
        GenerationLimits {
            max_n: 8,
            default_max_tokens: 16,
        }
    }

    fn chat(body: &str) -> Result<ValidChat, ApiError> {
        parse_body::<ChatCompletionRequest>(body.as_bytes())?.validate(&limits())
    }

    fn completion(body: &str) -> Result<ValidCompletion, ApiError> {
        parse_body::<CompletionRequest>(body.as_bytes())?.validate(&limits())
    }

    fn param(r: Result<impl std::fmt::Debug, ApiError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.status, 400);
        e.param.unwrap_or_default()
    }

    #[test]
    fn a_full_chat_request_becomes_engine_parameters() {
        let v = chat(
            r#"{"model": "m", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}],
              "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.5, "top_p": 0.9,
              "seed": -3, "stop": "\n", "n": 2, "presence_penalty": 1.5, "frequency_penalty": -1,
              "stream": true, "stream_options": {"include_usage": true},
              "logprobs": true, "top_logprobs": 3, "top_k": 20, "min_p": 0.1,
              "repetition_penalty": 1.1, "user": "ignored"}"#,
        )
        .unwrap();
        assert_eq!(
            v.messages,
            vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi!")
            ]
        );
        let g = &v.generation;
        assert_eq!(g.max_tokens, 7, "max_completion_tokens wins");
        assert_eq!((g.n, g.stream, g.include_usage), (2, true, true));
        assert_eq!(g.stop, vec!["\n".to_string()]);
        assert_eq!(g.sampling.temperature, 0.5);
        assert_eq!(g.sampling.top_k, 20);
        assert_eq!(g.sampling.seed, (-3i64) as u64);
        assert_eq!(g.sampling.frequency_penalty, -1.0);
        assert_eq!(v.logprobs, Some(3));
    }

    #[test]
    fn defaults_are_openais() {
        let v = chat(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#).unwrap();
        let g = v.generation;
        assert_eq!((g.max_tokens, g.n, g.stream), (16, 1, false));
        assert_eq!((g.sampling.temperature, g.sampling.top_p), (1.0, 1.0));
        assert_eq!((g.sampling.top_k, g.sampling.min_p), (0, 0.0));
        assert_eq!(v.logprobs, None);
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        let base = |extra: &str| {
            format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "x"}}]{extra}}}"#)
        };
        for (extra, name) in [
            (r#", "temperature": 2.5"#, "temperature"),
            (r#", "temperature": -0.1"#, "temperature"),
            (r#", "top_p": 0"#, "top_p"),
            (r#", "n": 0"#, "n"),
            (r#", "n": 9"#, "n"),
            (r#", "max_tokens": 0"#, "max_tokens"),
            (r#", "max_completion_tokens": 0"#, "max_completion_tokens"),
            (r#", "presence_penalty": 3"#, "presence_penalty"),
            (r#", "frequency_penalty": -2.5"#, "frequency_penalty"),
            (r#", "stop": ["a", "b", "c", "d", "e"]"#, "stop"),
            (r#", "stop": [""]"#, "stop"),
            (r#", "top_k": -2"#, "top_k"),
            (r#", "min_p": 1.5"#, "min_p"),
            (r#", "repetition_penalty": 0"#, "repetition_penalty"),
            (
                r#", "stream_options": {"include_usage": true}"#,
                "stream_options",
            ),
            (r#", "top_logprobs": 2"#, "top_logprobs"),
            (r#", "logprobs": true, "top_logprobs": 21"#, "top_logprobs"),
            (r#", "logit_bias": {"1": 101}"#, "logit_bias"),
            (r#", "logit_bias": {"x": 1}"#, "logit_bias"),
            (r#", "logit_bias": {"-1": 1}"#, "logit_bias"),
            (r#", "logit_bias": [1]"#, "logit_bias"),
            (r#", "logit_bias": {"1": "5"}"#, "logit_bias"),
            (r#", "tools": {}"#, "tools"),
            (r#", "tools": [{"type": "retrieval"}]"#, "tools[0].type"),
            (
                r#", "tools": [{"type": "function", "function": {"name": "a b"}}]"#,
                "tools[0].function.name",
            ),
            (
                r#", "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]"#,
                "tools[0].function.parameters",
            ),
            (r#", "tool_choice": "required""#, "tool_choice"),
            (
                r#", "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}"#,
                "tool_choice",
            ),
            (
                r#", "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes""#,
                "tool_choice",
            ),
            (
                r#", "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}"#,
                "response_format",
            ),
            (r#", "functions": []"#, "functions"),
            (r#", "function_call": "auto""#, "function_call"),
            (r#", "modalities": ["text", "audio"]"#, "modalities"),
            (r#", "audio": {"voice": "x"}"#, "audio"),
            (r#", "store": true"#, "store"),
            (
                r#", "prediction": {"type": "content", "content": "x"}"#,
                "prediction",
            ),
            (r#", "reasoning_effort": "high""#, "reasoning_effort"),
        ] {
            assert_eq!(param(chat(&base(extra))), name, "{extra}");
        }
        assert_eq!(param(chat(r#"{"model": "m", "messages": []}"#)), "messages");
        // Harmless values of fields kiln does not implement pass.
        chat(&base(
            r#", "modalities": ["text"], "store": false, "metadata": {"a": "b"}"#,
        ))
        .unwrap();
        assert_eq!(
            param(chat(
                r#"{"model": "m", "messages": [{"role": "tool", "content": "x"}]}"#
            )),
            "messages[0].tool_call_id"
        );
        assert_eq!(
            param(chat(
                r#"{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}"#
            )),
            "messages[0].tool_calls[0]"
        );
        for (extra, name) in [
            (r#", "suffix": "x""#, "suffix"),
            (r#", "best_of": 2"#, "best_of"),
            (r#", "tools": []"#, "tools"),
            (r#", "tool_choice": "none""#, "tool_choice"),
        ] {
            assert_eq!(
                param(completion(&format!(
                    r#"{{"model": "m", "prompt": "x"{extra}}}"#
                ))),
                name,
                "{extra}"
            );
        }
        completion(r#"{"model": "m", "prompt": "x", "best_of": 1}"#).unwrap();
        assert_eq!(
            param(chat(
                r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#
            )),
            "messages[0].role"
        );
        assert_eq!(
            param(chat(
                r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#
            )),
            "messages[0].content[0]"
        );
    }

    #[test]
    fn bad_bodies_are_400s_that_say_why() {
        let e = parse_body::<ChatCompletionRequest>(b"{\"model\": \"m\", \xff}").unwrap_err();
        assert!(e.message.contains("UTF-8"), "{e:?}");
        let e = parse_body::<ChatCompletionRequest>(b"{\"model\": ").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{e:?}");
        // A field of the wrong type is named, as OpenAI names it.
        let e =
            parse_body::<ChatCompletionRequest>(br#"{"model": 3, "messages": []}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"), "{e:?}");
        assert!(e.message.contains("expected a string"), "{e:?}");
        let e = parse_body::<ChatCompletionRequest>(
            br#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"), "{e:?}");
        // Flattened fields too (the generation parameters).
        let e = parse_body::<ChatCompletionRequest>(
            br#"{"model": "m", "messages": [], "temperature": "hot"}"#,
        )
        .unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("temperature"), "{e:?}");
        let body = e.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let e = parse_body::<ChatCompletionRequest>(br#"{"model": "m", "messages": []} x"#)
            .unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{e:?}");
    }

    #[test]
    fn completion_prompts_take_every_documented_shape() {
        for (prompt, want) in [
            (r#""hi""#, vec![Input::Text("hi".into())]),
            (
                r#"["a", "b"]"#,
                vec![Input::Text("a".into()), Input::Text("b".into())],
            ),
            (r#"[1, 2, 3]"#, vec![Input::Ids(vec![1, 2, 3])]),
            (
                r#"[[1], [2, 3]]"#,
                vec![Input::Ids(vec![1]), Input::Ids(vec![2, 3])],
            ),
        ] {
            let v = completion(&format!(
                r#"{{"model": "m", "prompt": {prompt}, "echo": true, "logprobs": 2}}"#
            ))
            .unwrap();
            assert_eq!(v.prompts, want);
            assert_eq!((v.echo, v.logprobs), (true, Some(2)));
        }
        assert_eq!(
            param(completion(r#"{"model": "m", "prompt": []}"#)),
            "prompt"
        );
        assert_eq!(
            param(completion(r#"{"model": "m", "prompt": [[]]}"#)),
            "prompt"
        );
        assert_eq!(
            param(completion(
                r#"{"model": "m", "prompt": "x", "logprobs": 6}"#
            )),
            "logprobs"
        );
        let e = completion(r#"{"model": "m", "prompt": [-1]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"), "{e:?}");
    }

    #[test]
    fn embedding_requests_validate_inputs_and_format() {
        let emb = |body: &str| parse_body::<EmbeddingRequest>(body.as_bytes())?.validate(4);
        let v = emb(r#"{"model": "e", "input": ["a", "b"], "encoding_format": "base64"}"#).unwrap();
        assert_eq!(v.inputs.len(), 2);
        assert!(v.base64);
        assert!(!emb(r#"{"model": "e", "input": [5, 6]}"#).unwrap().base64);
        assert_eq!(param(emb(r#"{"model": "e", "input": []}"#)), "input");
        assert_eq!(param(emb(r#"{"model": "e", "input": ""}"#)), "input");
        assert_eq!(
            param(emb(r#"{"model": "e", "input": ["a", "b", "c", "d", "e"]}"#)),
            "input"
        );
        assert_eq!(
            param(emb(
                r#"{"model": "e", "input": "a", "encoding_format": "hex"}"#
            )),
            "encoding_format"
        );
        assert_eq!(
            param(emb(r#"{"model": "e", "input": "a", "dimensions": 0}"#)),
            "dimensions"
        );
        assert_eq!(
            emb(r#"{"model": "e", "input": "a", "dimensions": 8}"#)
                .unwrap()
                .dimensions,
            Some(8)
        );
    }

    #[test]
    fn unknown_models_are_404s_listing_the_served_ones() {
        let e = ApiError::unknown_model("gpt-9", &["gemma3-270m", "minilm"]);
        assert_eq!(e.status, 404);
        let body = e.body();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["param"], "model");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gemma3-270m, minilm"));
    }
}
