//! Tool-call grammars on real vocabularies (no model run): Gemma 3's (kiln's generic format),
//! llama.cpp's `qwen2` (Hermes), `llama-bpe` (Llama 3.x) and `llama-spm` (Mistral's list format,
//! its markers as text), for `auto`, `required` and a named tool, with and without parallel
//! calls: the outputs a choice allows are accepted token by token and end the grammar where
//! they end; the ones it forbids are refused. Outputs are fed as the longest-match tokenization
//! of their text (any tokenization of an allowed text must be allowed).

use std::path::Path;
use std::sync::OnceLock;

use kiln_grammar::{GrammarSpec, TokenTable};
use kiln_server::tools::{grammar, Tool, ToolChoice, ToolFormat, ToolRequest};
use kiln_testdata::{gemma_model_path, llama_vocab_dir};
use kiln_tokenizer::Tokenizer;
use serde_json::json;

struct Vocab {
    name: &'static str,
    format: ToolFormat,
    table: TokenTable,
    /// Markers that are control tokens, with their ids (none of these test vocabularies has
    /// a tool-call control token; one case lends Mistral's markers two of Gemma's).
    controls: Vec<(&'static str, u32)>,
}

fn vocabs() -> &'static [Vocab] {
    static ALL: OnceLock<Vec<Vocab>> = OnceLock::new();
    ALL.get_or_init(|| {
        let open = |path: &Path| {
            let file = kiln_formats::GgufFile::open(path).unwrap();
            Tokenizer::from_gguf(&file).unwrap()
        };
        let dir = llama_vocab_dir();
        let mut out = Vec::new();
        for (name, format, path) in [
            ("gemma3", ToolFormat::Generic, gemma_model_path()),
            (
                "qwen2",
                ToolFormat::Hermes,
                dir.join("ggml-vocab-qwen2.gguf"),
            ),
            (
                "llama-bpe",
                ToolFormat::Llama3,
                dir.join("ggml-vocab-llama-bpe.gguf"),
            ),
            (
                "llama-spm",
                ToolFormat::Mistral,
                dir.join("ggml-vocab-llama-spm.gguf"),
            ),
            ("gemma3-controls", ToolFormat::Mistral, gemma_model_path()),
        ] {
            let tokenizer = open(&path);
            let table = TokenTable::new(&tokenizer, tokenizer.vocab_size()).unwrap();
            let mut controls: Vec<(&'static str, u32)> = format
                .markers()
                .iter()
                .filter_map(|&m| match tokenizer.encode(m, false, true)[..] {
                    [id] if tokenizer.is_control(id) => Some((m, id)),
                    _ => None,
                })
                .collect();
            if name == "gemma3-controls" {
                // Two control tokens that neither begin nor end anything.
                let mut spare = (0..tokenizer.vocab_size() as u32).filter(|&i| {
                    tokenizer.is_control(i)
                        && !tokenizer.is_end_of_generation(i)
                        && Some(i) != tokenizer.bos()
                });
                controls = vec![
                    ("[TOOL_CALLS]", spare.next().unwrap()),
                    ("[ARGS]", spare.next().unwrap()),
                ];
            }
            out.push(Vocab {
                name,
                format,
                table,
                controls,
            });
        }
        out
    })
}

fn tools(choice: ToolChoice, parallel: bool) -> ToolRequest {
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
        "maximum": 14}}, "required": ["zone"], "additionalProperties": false});
    let tool = |name: &str, parameters: serde_json::Value| Tool {
        name: name.into(),
        description: None,
        parameters: parameters.clone(),
        raw: json!({"type": "function", "function": {"name": name, "parameters": parameters}}),
    };
    ToolRequest {
        tools: vec![tool("get_weather", weather), tool("get_time", time)],
        choice,
        parallel,
    }
}

/// The id of `text` when it is a control token of `v`'s vocabulary.
fn control(v: &Vocab, text: &str) -> Option<u32> {
    v.controls
        .iter()
        .find(|(m, _)| *m == text)
        .map(|(_, id)| *id)
}

/// Whether the grammar takes `text` whole and may end after it.
fn accepts(v: &Vocab, spec: &GrammarSpec, text: &str) -> bool {
    let mut c = v.table.start(spec).unwrap();
    // A control marker is one token; the text around it goes through the table.
    let mut ids = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let marker = v
            .format
            .markers()
            .iter()
            .filter_map(|m| Some((rest.find(m)?, *m, control(v, m)?)))
            .min_by_key(|(at, _, _)| *at);
        match marker {
            Some((at, m, id)) => {
                ids.extend(v.table.greedy_tokenize(&rest.as_bytes()[..at]));
                ids.push(id);
                rest = &rest[at + m.len()..];
            }
            None => {
                ids.extend(v.table.greedy_tokenize(rest.as_bytes()));
                rest = "";
            }
        }
    }
    for id in ids {
        let Ok(mask) = c.allowed() else { return false };
        if !mask.allows(id) {
            return false;
        }
        if c.commit(id).is_err() {
            return false;
        }
    }
    c.is_done() || c.is_accepting()
}

/// One call written in `format` (`v11`: Mistral's `name[ARGS]{...}` form).
fn call(format: ToolFormat, v11: bool, name: &str, args: &str) -> String {
    match format {
        ToolFormat::Mistral if v11 => format!("[TOOL_CALLS]{name}[ARGS]{args}"),
        ToolFormat::Hermes | ToolFormat::Generic => {
            format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
        }
        ToolFormat::Llama3 => format!("{{\"name\": \"{name}\", \"parameters\": {args}}}"),
        ToolFormat::Mistral => format!("{{\"name\": \"{name}\", \"arguments\": {args}}}"),
    }
}

/// Several calls in one output.
fn calls(format: ToolFormat, v11: bool, list: &[String]) -> String {
    match format {
        ToolFormat::Mistral if v11 => list.concat(),
        ToolFormat::Hermes | ToolFormat::Generic => list.join("\n"),
        ToolFormat::Llama3 => list.join("; "),
        ToolFormat::Mistral => format!("[TOOL_CALLS][{}]", list.join(", ")),
    }
}

#[test]
fn tool_grammars_allow_exactly_the_calls_a_choice_permits() {
    for v in vocabs() {
        let f = v.format;
        let v11 = control(v, "[ARGS]").is_some();
        let ctl = |t: &str| control(v, t);
        let call = |f, name: &str, args: &str| call(f, v11, name, args);
        let calls = |f, list: &[String]| calls(f, v11, list);
        let one = |name: &str, args: &str| calls(f, &[call(f, name, args)]);
        let paris = one("get_weather", r#"{"city": "Paris"}"#);
        let oslo_f = one("get_weather", r#"{"city": "Oslo", "unit": "fahrenheit"}"#);
        let time = one("get_time", r#"{"zone": -3}"#);
        let two = calls(
            f,
            &[
                call(f, "get_weather", r#"{"city": "Rome"}"#),
                call(f, "get_time", r#"{"zone": 2}"#),
            ],
        );
        let bad = [
            one("get_weather", r#"{"town": "Paris"}"#), // unknown argument
            one("get_weather", r#"{}"#),                // missing the required one
            one("get_time", r#"{"zone": 15}"#),         // out of bounds
            one("send_mail", r#"{"to": "x"}"#),         // no such tool
            one("get_weather", r#"{"city": "Paris", "unit": "kelvin"}"#),
        ];
        let text = "The weather in Paris is mild today.";
        let label = |c: &str| format!("{} ({:?}): {c}", v.name, f);

        let required = grammar(f, &tools(ToolChoice::Required, true), &ctl).unwrap();
        for ok in [&paris, &oslo_f, &time] {
            assert!(accepts(v, &required, ok), "{}", label(ok));
        }
        if f != ToolFormat::Llama3 {
            assert!(accepts(v, &required, &two), "{}", label(&two));
        }
        for no in bad.iter().chain([&text.to_string()]) {
            assert!(!accepts(v, &required, no), "required took {}", label(no));
        }

        let single = grammar(f, &tools(ToolChoice::Required, false), &ctl).unwrap();
        assert!(accepts(v, &single, &paris), "{}", label(&paris));
        assert!(!accepts(v, &single, &two), "one call only: {}", label(&two));

        let named = grammar(f, &tools(ToolChoice::Named("get_time".into()), true), &ctl).unwrap();
        assert!(accepts(v, &named, &time), "{}", label(&time));
        assert!(!accepts(v, &named, &paris), "named took {}", label(&paris));

        let auto = grammar(f, &tools(ToolChoice::Auto, true), &ctl).unwrap();
        for ok in [text.to_string(), paris.clone(), time.clone()] {
            assert!(accepts(v, &auto, &ok), "auto: {}", label(&ok));
        }
        if matches!(f, ToolFormat::Hermes | ToolFormat::Generic) {
            let mixed = format!("Let me check.\n{paris}");
            assert!(accepts(v, &auto, &mixed), "auto: {}", label(&mixed));
        }
        for no in &bad {
            assert!(!accepts(v, &auto, no), "auto took {}", label(no));
        }

        assert!(grammar(f, &tools(ToolChoice::None, true), &ctl).is_none());
    }
}
