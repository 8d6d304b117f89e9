//! Chat templates: every real template llama.cpp ships (`models/templates/*.jinja`, from the
//! llama-cpp-python 0.3.36 sdist) renders a plain conversation, and renders exactly as Python
//! jinja2 set up like transformers does: a selection against full expected texts
//! (`tests/fixtures/chat/*.json`), all the others against the sha256 of jinja2's renders
//! (`tests/fixtures/chat_digests.json`); both made by `scripts/gen_chat_template_fixtures.py`.
//!
//! The conversations compared with jinja2: `plain`, `system`, and with tools and tool turns
//! `tools` and `tools_empty` (rendered with the `tools` variable: two OpenAI function tools; an
//! assistant turn that only calls a tool, with `content` null / "", and `tool_calls` whose
//! `arguments` are objects; the tool's result with `tool_call_id` and `name`).
//!
//! The templates that reject a system message ([`REJECTS_SYSTEM`]) and those that fail to render
//! ([`FAILS`]) are listed exactly, so a change either way fails until the lists are updated. Where
//! jinja2 fails on a tools conversation with an error of its own (not the template's
//! `raise_exception`), kiln must fail too, except for the cases listed in [`JINJA2_ONLY_ERRORS`];
//! the renders known to differ from jinja2's are listed in [`KNOWN_DIFFERENCES`]. Tools and
//! messages reach the template with their keys in the given order (kiln-tokenizer's serde_json
//! keeps it), as Python dicts.

mod support;

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use kiln_tokenizer::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions, SpecialTokens};
use sha2::{Digest, Sha256};
use support::{chat_templates_dir, CHAT_TEMPLATES};

/// Templates that refuse a conversation starting with a system message, with the message they
/// raise.
const REJECTS_SYSTEM: &[(&str, &str)] = &[("google-gemma-2-2b-it", "System role not supported")];

/// Templates that cannot render a plain conversation, with a text the error must contain. Python
/// jinja2 fails on them in the same way.
const FAILS: &[(&str, &str)] = &[
    // Needs a `functions` variable (the tool list) that transformers does not pass either:
    // `system_prompt_suffix + "\n" + functions` with `functions` undefined.
    ("fireworks-ai-llama-3-firefunction-v2", "undefined"),
];

/// Tools-conversation cases where jinja2 fails with an error of its own (a TypeError, an
/// undefined value, its sandbox refusing a method) and kiln renders instead: (template, case,
/// why).
const JINJA2_ONLY_ERRORS: &[(&str, &str, &str)] = &[
    // `{% for item in content %}` with the tool-calling turn's null content: Python cannot
    // iterate None (TypeError); minijinja iterates none as an empty sequence.
    ("LFM2.5-8B-A1B", "tools-gen", FOR_IN_NONE),
    ("LFM2.5-8B-A1B", "tools-nogen", FOR_IN_NONE),
    // `tools | map(attribute='function') | tojson(indent=2)`: jinja2's `map` gives a generator,
    // which json.dumps refuses; minijinja's `map` gives a list, which kiln's `tojson` writes.
    ("llama-cpp-deepseek-r1", "tools-gen", MAP_TOJSON),
    ("llama-cpp-deepseek-r1", "tools-nogen", MAP_TOJSON),
    ("llama-cpp-deepseek-r1", "tools_empty-gen", MAP_TOJSON),
    ("llama-cpp-deepseek-r1", "tools_empty-nogen", MAP_TOJSON),
];
const FOR_IN_NONE: &str = "for over none: a TypeError in Python, empty in minijinja";
const MAP_TOJSON: &str = "tojson of map()'s result: a generator in jinja2, a list in minijinja";

/// Cases where kiln renders differently from jinja2 (a bug of kiln's to fix): (template, case,
/// why). A case listed here must differ, so a fix fails the test until it is removed.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[
    // `"Use the function '"|safe + t["name"] + ... + "\n"|safe + t | tojson()`: in Python a
    // `|safe` string is a Markup, and Markup + str HTML-escapes the str, so jinja2 writes the
    // tool's JSON with `&#34;` for each `"` (transformers' prompt has them); minijinja's `+`
    // concatenates plain text.
    (FUNCTIONARY_V31, "tools-gen", MARKUP_PLUS),
    (FUNCTIONARY_V31, "tools-nogen", MARKUP_PLUS),
    (FUNCTIONARY_V31, "tools_empty-gen", MARKUP_PLUS),
    (FUNCTIONARY_V31, "tools_empty-nogen", MARKUP_PLUS),
];
const MARKUP_PLUS: &str = "Markup + str escapes the str in jinja2, not in minijinja";
const FUNCTIONARY_V31: &str = "meetkai-functionary-medium-v3.1";

/// Whether kiln's render of a case is expected to differ from jinja2's (see
/// [`KNOWN_DIFFERENCES`]).
fn expected_to_differ(template: &str, case: &str, _expected: &Expected) -> bool {
    is_listed(KNOWN_DIFFERENCES, template, case)
}

fn is_listed(list: &[(&str, &str, &str)], template: &str, case: &str) -> bool {
    list.iter().any(|(t, c, _)| *t == template && *c == case)
}

/// A message of the fixtures: `role`, `content` (a string, or null for an assistant turn that
/// only calls tools, given to kiln as an empty text with a `content: null` field), and the other
/// fields (`tool_calls`, `tool_call_id`, `name`).
fn message(value: &serde_json::Value) -> ChatMessage {
    let mut fields = value.as_object().expect("a message is an object").clone();
    let role = fields
        .remove("role")
        .and_then(|r| r.as_str().map(str::to_string))
        .expect("a message has a role");
    let content = match fields.remove("content") {
        Some(serde_json::Value::String(text)) => text,
        Some(other) => {
            fields.insert("content".into(), other);
            String::new()
        }
        None => String::new(),
    };
    ChatMessage {
        role,
        content,
        extra: fields,
    }
}

fn messages(value: &serde_json::Value) -> Vec<ChatMessage> {
    value
        .as_array()
        .expect("messages are a list")
        .iter()
        .map(message)
        .collect()
}

/// What jinja2 made of a case.
enum Expected<'a> {
    /// This text.
    Text(&'a str),
    /// A text with this sha256.
    Sha256(&'a str),
    /// The template's `raise_exception` with this message.
    Raises(&'a str),
    /// Another error (tools conversations only).
    Jinja2Error(&'a str),
}

impl<'a> Expected<'a> {
    fn of(case: &'a serde_json::Value) -> Expected<'a> {
        let field = |name| case.get(name).and_then(serde_json::Value::as_str);
        match (
            field("expected"),
            field("sha256"),
            field("raises"),
            field("jinja2_error"),
        ) {
            (Some(text), None, None, None) => Expected::Text(text),
            (None, Some(sha), None, None) => Expected::Sha256(sha),
            (None, None, Some(msg), None) => Expected::Raises(msg),
            (None, None, None, Some(err)) => Expected::Jinja2Error(err),
            _ => panic!("a case has one of expected, sha256, raises, jinja2_error: {case}"),
        }
    }
}

/// How kiln's render of a case compares with jinja2's.
enum Outcome {
    Same,
    /// jinja2 failed with an error of its own; kiln rendered.
    Jinja2OnlyError(String),
    /// Anything else: what differs.
    Differs(String),
}

fn compare(got: &Result<String, ChatTemplateError>, expected: &Expected) -> Outcome {
    match (expected, got) {
        (Expected::Text(text), Ok(got)) if got == text => Outcome::Same,
        (Expected::Text(text), Ok(got)) => {
            Outcome::Differs(format!("got\n{got:?}\nexpected\n{text:?}"))
        }
        (Expected::Sha256(sha), Ok(got)) if sha256_hex(got.as_bytes()) == *sha => Outcome::Same,
        (Expected::Raises(msg), Err(ChatTemplateError::Raised(got))) if got == msg => Outcome::Same,
        (Expected::Jinja2Error(_), Err(_)) => Outcome::Same,
        (Expected::Jinja2Error(err), Ok(got)) => {
            Outcome::Jinja2OnlyError(format!("jinja2 fails ({err}), kiln renders {got:?}"))
        }
        _ => {
            let jinja2 = match expected {
                Expected::Sha256(sha) => format!("a text with sha256 {sha}"),
                Expected::Raises(msg) => format!("raise_exception({msg:?})"),
                _ => "a text".to_string(),
            };
            Outcome::Differs(format!("got {got:?}, jinja2 gave {jinja2}"))
        }
    }
}

/// Collects the outcomes of the cases of a test and checks them against the lists.
#[derive(Default)]
struct Tally {
    checked: usize,
    same: usize,
    /// Renders that differ from jinja2's as expected.
    known_differences: usize,
    /// Renders where only jinja2 fails, as listed.
    jinja2_only_errors: usize,
    /// (template, case) of every case seen.
    seen: Vec<(String, String)>,
    /// Unexpected outcomes.
    failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, template: &str, case: &str, expected: &Expected, outcome: Outcome) {
        self.checked += 1;
        self.seen.push((template.to_string(), case.to_string()));
        let differs = expected_to_differ(template, case, expected);
        let jinja2_only = is_listed(JINJA2_ONLY_ERRORS, template, case);
        match outcome {
            Outcome::Same if differs || jinja2_only => self.failures.push(format!(
                "{template} {case}: renders as jinja2 does, but is expected not to (listed in \
                 KNOWN_DIFFERENCES or JINJA2_ONLY_ERRORS): update the lists"
            )),
            Outcome::Same => self.same += 1,
            Outcome::Jinja2OnlyError(_) if jinja2_only => self.jinja2_only_errors += 1,
            Outcome::Differs(_) if differs && !jinja2_only => {
                self.known_differences += 1;
                println!("{template} {case}: differs from jinja2's render, as expected");
            }
            Outcome::Jinja2OnlyError(what) | Outcome::Differs(what) => {
                self.failures.push(format!("{template} {case}: {what}"))
            }
        }
    }

    /// Checks that every listed case of `templates` was seen, then that nothing failed.
    fn finish(mut self, templates: &[String], what: &str) {
        for (t, c, _) in KNOWN_DIFFERENCES.iter().chain(JINJA2_ONLY_ERRORS) {
            let listed = (t.to_string(), c.to_string());
            if templates.contains(&listed.0) && !self.seen.contains(&listed) {
                self.failures
                    .push(format!("{t} {c}: listed, but there is no such case"));
            }
        }
        assert!(self.failures.is_empty(), "{}", self.failures.join("\n\n"));
        println!(
            "{what}: {} of {} renders equal jinja2's; {} differ as listed; {} render where \
             jinja2 fails, as listed",
            self.same, self.checked, self.known_differences, self.jinja2_only_errors
        );
    }
}

fn plain() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new(
            "user",
            "Hello! What's 2+2? Say \"four\" — s'il vous plaît, café ☕.",
        ),
        ChatMessage::new("assistant", "  It is 4.\nAnything else?  "),
        ChatMessage::new(
            "user",
            "Now:\n\t<b>tabs</b> & {{ braces }} and \\backslashes\\",
        ),
    ]
}

fn with_system() -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::new(
        "system",
        "You are terse. Answer in one line.",
    )];
    messages.extend(plain());
    messages
}

fn options(add_generation_prompt: bool) -> RenderOptions {
    RenderOptions {
        add_generation_prompt,
        now: Some(UNIX_EPOCH + Duration::from_secs(1_751_634_309)),
        tools: None,
    }
}

/// Renders `messages` both ways; `Ok` when both renders contain every message's (trimmed) text.
fn render_both(template: &ChatTemplate, messages: &[ChatMessage]) -> Result<(), String> {
    for add_generation_prompt in [false, true] {
        let text = template
            .render(messages, &options(add_generation_prompt))
            .map_err(|e| match e {
                ChatTemplateError::Raised(msg) => format!("raised: {msg}"),
                other => other.to_string(),
            })?;
        for m in messages {
            if !text.contains(m.content.trim()) {
                return Err(format!(
                    "add_generation_prompt={add_generation_prompt}: the {} message is missing \
                     from {text:?}",
                    m.role
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_llama_cpp_template_renders_a_conversation() {
    let dir = chat_templates_dir();
    let tokens = SpecialTokens {
        bos: "<BOS>".into(),
        eos: "<EOS>".into(),
    };
    let mut table = Vec::new();
    let mut failures = Vec::new();
    let mut rejects_system = Vec::new();
    let mut fails = Vec::new();
    for name in CHAT_TEMPLATES {
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let template = match ChatTemplate::new(&source, tokens.clone()) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        let plain_result = render_both(&template, &plain());
        let system_result = render_both(&template, &with_system());
        table.push(format!(
            "{name:<48} plain: {:<6} system: {}",
            if plain_result.is_ok() { "ok" } else { "FAILS" },
            match &system_result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            }
        ));
        match (plain_result, system_result) {
            (Ok(()), Ok(())) => {}
            (Ok(()), Err(e)) => match e.strip_prefix("raised: ") {
                Some(msg) => rejects_system.push((name, msg.to_string())),
                None => failures.push(format!("{name}: with a system message: {e}")),
            },
            (Err(e), _) => fails.push((name, e)),
        }
    }
    println!("{}", table.join("\n"));

    let expected_rejects: Vec<(&str, String)> = REJECTS_SYSTEM
        .iter()
        .map(|&(n, m)| (n, m.to_string()))
        .collect();
    if rejects_system != expected_rejects {
        failures.push(format!(
            "templates rejecting a system message: {rejects_system:?}, \
             expected {expected_rejects:?}"
        ));
    }
    let fail_names: Vec<&str> = fails.iter().map(|(n, _)| *n).collect();
    let expected_fail_names: Vec<&str> = FAILS.iter().map(|(n, _)| *n).collect();
    if fail_names != expected_fail_names {
        failures.push(format!(
            "templates failing a plain conversation: {fails:?}, expected {FAILS:?}"
        ));
    } else {
        for ((name, err), (_, word)) in fails.iter().zip(FAILS) {
            if !err.contains(word) {
                failures.push(format!("{name}: error {err:?} does not mention {word:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Renders equal to Python jinja2's, byte for byte.
#[test]
fn renders_equal_jinja2() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
    let dir = chat_templates_dir();
    let mut paths: Vec<_> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 7,
        "fixtures missing in {}",
        fixtures.display()
    );
    let mut tally = Tally::default();
    let mut stems = Vec::new();
    let mut tools_cases = 0;
    for path in &paths {
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let file = fixture["template"].as_str().unwrap();
        let stem = file.trim_end_matches(".jinja");
        stems.push(stem.to_string());
        let source = std::fs::read(dir.join(file)).unwrap();
        let sha = format!("{:x}", Sha256::digest(&source));
        assert_eq!(
            sha,
            fixture["sha256"].as_str().unwrap(),
            "{file}: the template is not the one the fixture was made from"
        );
        let tokens = SpecialTokens {
            bos: fixture["bos_token"].as_str().unwrap().to_string(),
            eos: fixture["eos_token"].as_str().unwrap().to_string(),
        };
        let template = ChatTemplate::new(std::str::from_utf8(&source).unwrap(), tokens)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let now = UNIX_EPOCH + Duration::from_secs(fixture["now_unix"].as_u64().unwrap());
        for case in fixture["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let opts = RenderOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                now: Some(now),
                tools: case.get("tools").cloned(),
            };
            tools_cases += usize::from(opts.tools.is_some());
            let expected = Expected::of(case);
            assert!(
                !matches!(expected, Expected::Sha256(_))
                    && (opts.tools.is_some() || !matches!(expected, Expected::Jinja2Error(_))),
                "{file} {name}: not a full fixture's case"
            );
            let got = template.render(&messages(&case["messages"]), &opts);
            tally.add(stem, name, &expected, compare(&got, &expected));
        }
    }
    assert!(tools_cases > 0, "no case with tools in the full fixtures");
    tally.finish(&stems, "full fixtures");
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Every template without a full fixture renders as jinja2 does (compared by sha256), and fails
/// where jinja2 fails.
#[test]
fn every_other_template_renders_equal_jinja2_digests() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_digests.json");
    let digests: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let conversation = |name: &str| -> Vec<ChatMessage> {
        let value = &digests["conversations"][name];
        assert!(value.is_array(), "no conversation {name} in the digests");
        messages(value)
    };
    // The tools conversations are rendered with the tools list.
    let tools = |conv: &str| -> Option<serde_json::Value> {
        conv.starts_with("tools").then(|| {
            assert!(digests["tools"].is_array(), "no tools in the digests");
            digests["tools"].clone()
        })
    };
    let tokens = SpecialTokens {
        bos: digests["bos_token"].as_str().unwrap().to_string(),
        eos: digests["eos_token"].as_str().unwrap().to_string(),
    };
    let now = UNIX_EPOCH + Duration::from_secs(digests["now_unix"].as_u64().unwrap());
    let templates = digests["templates"].as_object().unwrap();
    let full_fixtures =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat"))
            .unwrap()
            .count();
    // Between them, the full fixtures and the digests cover every template.
    assert_eq!(templates.len() + full_fixtures, CHAT_TEMPLATES.len());
    let dir = chat_templates_dir();
    let mut tally = Tally::default();
    let mut stems = Vec::new();
    let mut tools_cases = 0;
    for (file, entry) in templates {
        let stem = file.trim_end_matches(".jinja");
        stems.push(stem.to_string());
        let source = std::fs::read(dir.join(file)).unwrap();
        assert_eq!(
            sha256_hex(&source),
            entry["sha256"].as_str().unwrap(),
            "{file}: the template is not the one the digests were made from"
        );
        let template = ChatTemplate::new(std::str::from_utf8(&source).unwrap(), tokens.clone())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        if let Some(why) = entry.get("jinja2_fails") {
            assert!(
                FAILS.iter().any(|(name, _)| *name == stem),
                "{file}: jinja2 fails ({why}) but it is not in FAILS"
            );
            continue;
        }
        for (case, expected) in entry["cases"].as_object().unwrap() {
            let (conv, gen) = case.rsplit_once('-').unwrap();
            let opts = RenderOptions {
                add_generation_prompt: gen == "gen",
                now: Some(now),
                tools: tools(conv),
            };
            tools_cases += usize::from(opts.tools.is_some());
            let expected_outcome = Expected::of(expected);
            assert!(
                !matches!(expected_outcome, Expected::Text(_))
                    && (opts.tools.is_some()
                        || !matches!(expected_outcome, Expected::Jinja2Error(_))),
                "{file} {case}: not a digest"
            );
            let got = template.render(&conversation(conv), &opts);
            tally.add(
                stem,
                case,
                &expected_outcome,
                compare(&got, &expected_outcome),
            );
        }
    }
    assert!(tools_cases > 0, "no case with tools in the digests");
    tally.finish(&stems, &format!("digests of {} templates", templates.len()));
}

/// A long conversation (400 turns, 400 kB of text) renders with every template within the fuel
/// budget that stops hostile templates.
#[test]
fn long_conversations_fit_the_fuel_budget() {
    let dir = chat_templates_dir();
    let messages: Vec<ChatMessage> = (0..400)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let text = format!("turn {i}: ") + &"lorem ipsum dolor sit amet, ".repeat(36);
            ChatMessage::new(role, text)
        })
        .collect();
    let mut failures = Vec::new();
    for name in CHAT_TEMPLATES {
        if FAILS.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, SpecialTokens::default()).unwrap();
        let started = std::time::Instant::now();
        match template.render(&messages, &options(true)) {
            Ok(text) => {
                if !text.contains(messages[399].content.trim()) {
                    failures.push(format!("{name}: the last message is missing"));
                }
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
        println!("{name:<48} {:?}", started.elapsed());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
