//! Chat templates: every real template llama.cpp ships (`models/templates/*.jinja`, from the
//! llama-cpp-python 0.3.36 sdist) renders a plain conversation, and renders exactly as Python
//! jinja2 set up like transformers does: a selection against full expected texts
//! (`tests/fixtures/chat/*.json`), all the others against the sha256 of jinja2's renders
//! (`tests/fixtures/chat_digests.json`); both made by `scripts/gen_chat_template_fixtures.py`.
//!
//! The templates that reject a system message ([`REJECTS_SYSTEM`]) and those that fail to render
//! ([`FAILS`]) are listed exactly, so a change either way fails until the lists are updated.

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
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in &paths {
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let file = fixture["template"].as_str().unwrap();
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
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            let opts = RenderOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                now: Some(now),
                tools: None,
            };
            let label = format!("{file} {}", case["name"].as_str().unwrap());
            let got = template.render(&messages, &opts);
            match (case.get("expected"), case.get("raises")) {
                (Some(expected), None) => match got {
                    Ok(text) if text == expected.as_str().unwrap() => {}
                    Ok(text) => failures.push(format!(
                        "{label}: got\n{text:?}\nexpected\n{:?}",
                        expected.as_str().unwrap()
                    )),
                    Err(e) => failures.push(format!("{label}: {e}")),
                },
                (None, Some(raises)) => {
                    let expected = ChatTemplateError::Raised(raises.as_str().unwrap().into());
                    if got.as_ref() != Err(&expected) {
                        failures.push(format!("{label}: got {got:?}, expected {expected:?}"));
                    }
                }
                _ => panic!("{label}: a case has `expected` or `raises`"),
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    println!("{checked} renders equal jinja2's");
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
        serde_json::from_value(digests["conversations"][name].clone()).unwrap()
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
    let mut checked = 0;
    let mut failures = Vec::new();
    for (file, entry) in templates {
        let source = std::fs::read(dir.join(file)).unwrap();
        assert_eq!(
            sha256_hex(&source),
            entry["sha256"].as_str().unwrap(),
            "{file}: the template is not the one the digests were made from"
        );
        let template = ChatTemplate::new(std::str::from_utf8(&source).unwrap(), tokens.clone())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        if let Some(why) = entry.get("jinja2_fails") {
            let stem = file.trim_end_matches(".jinja");
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
                tools: None,
            };
            let got = template.render(&conversation(conv), &opts);
            let ok = match (expected.get("sha256"), expected.get("raises"), &got) {
                (Some(sha), None, Ok(text)) => sha256_hex(text.as_bytes()) == sha.as_str().unwrap(),
                (None, Some(msg), Err(ChatTemplateError::Raised(got))) => {
                    got == msg.as_str().unwrap()
                }
                _ => false,
            };
            if !ok {
                failures.push(format!(
                    "{file} {case}: got {got:?}, jinja2 gave {expected}"
                ));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "{checked} renders of {} templates equal jinja2's digests",
        templates.len()
    );
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
