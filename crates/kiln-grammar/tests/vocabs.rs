//! Token tables on real vocabularies — Gemma 3's (262,144 tokens, SentencePiece with byte
//! fallback) and llama.cpp's test vocabularies `llama-bpe` (byte-level BPE), `qwen2` and
//! `llama-spm` — with no model run: every token's bytes are what kiln detokenizes, a catch-all
//! grammar accepts a thousand tokenized texts token by token, and JSON schemas accept and reject
//! what they must.

use std::path::Path;
use std::sync::OnceLock;

use kiln_grammar::{GrammarError, GrammarSpec, TokenTable};
use kiln_testdata::{gemma_model_path, golden_dir, llama_vocab_dir, read_vocab_cases};
use kiln_tokenizer::Tokenizer;
use serde_json::json;

fn tokenizer(path: &Path) -> Tokenizer {
    let file = kiln_formats::GgufFile::open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Tokenizer::from_gguf(&file).unwrap()
}

/// `(name, tokenizer, table)` of each vocabulary, built once; Gemma's table is padded by 64
/// entries past its vocabulary, as an embedding padded for the hardware would be.
fn vocabs() -> &'static [(String, Tokenizer, TokenTable)] {
    static ALL: OnceLock<Vec<(String, Tokenizer, TokenTable)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut out = Vec::new();
        let gemma = tokenizer(&gemma_model_path());
        let width = gemma.vocab_size() + 64;
        let table = TokenTable::new(&gemma, width).unwrap();
        out.push(("gemma3".to_string(), gemma, table));
        let dir = llama_vocab_dir();
        for name in ["llama-bpe", "qwen2", "llama-spm"] {
            let t = tokenizer(&dir.join(format!("ggml-vocab-{name}.gguf")));
            let table = TokenTable::new(&t, t.vocab_size()).unwrap();
            out.push((name.to_string(), t, table));
        }
        out
    })
}

/// A thousand texts: llama.cpp's tokenizer cases and Gemma's golden ones, and pieces of the GPL
/// text of the perplexity golden (varied lengths, from a few characters to a few lines).
fn texts() -> Vec<String> {
    let mut texts: Vec<String> =
        read_vocab_cases(&llama_vocab_dir().join("ggml-vocab-llama-bpe.gguf"))
            .into_iter()
            .map(|c| c.text)
            .collect();
    for file in ["tokenize.jsonl", "tokenize_special.jsonl"] {
        let path = golden_dir("gemma3-270m").join("public").join(file);
        texts.extend(
            kiln_testdata::read_jsonl_cases(&path)
                .into_iter()
                .map(|c| c.text),
        );
    }
    let gpl =
        std::fs::read_to_string(golden_dir("gemma3-270m").join("public/ppl_text.txt")).unwrap();
    let chars: Vec<char> = gpl.chars().collect();
    let mut at = 0usize;
    let mut len = 3usize;
    while texts.len() < 1000 {
        let end = (at + len).min(chars.len());
        texts.push(chars[at..end].iter().collect());
        at = (at + 7919) % chars.len().saturating_sub(400).max(1);
        len = len * 7 % 397 + 1;
    }
    texts.truncate(1000);
    texts
}

/// `text`'s tokens as a model would generate them mid-sequence: kiln's tokenization where its
/// pieces make exactly the text, else (a SentencePiece vocabulary that prefixes a space) the
/// table's longest-match one.
fn tokens(table: &TokenTable, t: &Tokenizer, text: &str) -> Vec<u32> {
    let ids = t.encode(text, false, false);
    let joined: Vec<u8> = ids
        .iter()
        .flat_map(|&id| table.token_bytes(id).to_vec())
        .collect();
    if joined == text.as_bytes() {
        ids
    } else {
        table.greedy_tokenize(text.as_bytes())
    }
}

/// Whether `spec` takes the tokens of `text` one by one (each allowed when it comes) and may
/// end after them. At every step the cheap test (`Constraint::accepts`) agrees with the mask on
/// the token that comes and on a spread of others (the end-of-generation tokens among them).
fn accepts(table: &TokenTable, t: &Tokenizer, spec: &GrammarSpec, text: &str) -> bool {
    let mut c = table.start(spec).unwrap();
    let ends: Vec<u32> = (0..t.vocab_size() as u32)
        .filter(|&i| t.is_end_of_generation(i))
        .collect();
    let step = (table.width() / 97).max(1);
    for id in tokens(table, t, text) {
        let Ok(mask) = c.allowed() else {
            return false;
        };
        let probes = (0..table.width() as u32)
            .step_by(step)
            .chain(ends.iter().copied());
        for probe in probes.chain([id]) {
            assert_eq!(
                c.accepts(probe),
                mask.allows(probe),
                "token {probe} in {text:?}"
            );
        }
        if !mask.allows(id) {
            return false;
        }
        c.commit(id).unwrap();
    }
    c.is_accepting()
}

#[test]
fn token_bytes_are_what_kiln_detokenizes() {
    for (name, t, table) in vocabs() {
        assert!(table.width() >= t.vocab_size());
        let mut special = 0;
        for id in 0..table.width() as u32 {
            let bytes = table.token_bytes(id);
            if id as usize >= t.vocab_size() {
                assert!(bytes.is_empty(), "{name}: padding entry {id} has bytes");
            } else if t.is_control(id) {
                special += 1;
                assert!(
                    table.is_special(id),
                    "{name}: control token {id} not special"
                );
                assert_eq!(&bytes[1..], t.token_text(id).unwrap().as_bytes());
            } else {
                let piece = t.token_to_piece(id, false);
                assert_eq!(bytes, &piece[..], "{name}: token {id}");
                // The byte 0xFF (toktrie's mark of a special token) is never in UTF-8 text: a
                // byte-fallback token of it reads as special and is never generated.
                assert_eq!(
                    table.is_special(id),
                    piece.first() == Some(&0xFF),
                    "{name}: token {id} {piece:?}"
                );
            }
        }
        // The pieces of a tokenized text put together are its detokenization (SentencePiece
        // vocabularies that prefix a space drop it from the first piece when decoding).
        let mut checked = 0;
        for text in texts().iter().take(300) {
            let ids = t.encode(text, false, false);
            let joined: Vec<u8> = ids
                .iter()
                .flat_map(|&id| table.token_bytes(id).to_vec())
                .collect();
            let decoded = t.decode(&ids, false);
            let dropped = joined.strip_prefix(b" ").unwrap_or(&joined);
            assert!(
                joined == decoded.as_bytes() || dropped == decoded.as_bytes(),
                "{name}: {text:?}: pieces {:?} vs decoded {decoded:?}",
                String::from_utf8_lossy(&joined)
            );
            checked += 1;
        }
        eprintln!(
            "{name}: {} entries, {special} special, {checked} texts rejoined",
            table.width()
        );
    }
}

#[test]
fn a_catch_all_grammar_accepts_a_thousand_tokenized_texts() {
    let texts = texts();
    assert_eq!(texts.len(), 1000);
    let spec = GrammarSpec::Regex("(?s:.*)".into());
    for (name, t, table) in vocabs() {
        let refused: Vec<&String> = texts
            .iter()
            .filter(|x| !accepts(table, t, &spec, x))
            .collect();
        assert!(
            refused.is_empty(),
            "{name}: {} of 1000 texts refused, first {:?}",
            refused.len(),
            refused.first()
        );
    }
}

/// Each schema with strings it must accept and strings it must refuse.
fn schema_cases() -> Vec<(serde_json::Value, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        (
            json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}, "required": ["name", "age"], "additionalProperties": false}),
            vec![r#"{"name": "Ada", "age": 36}"#, r#"{"name":"","age":0}"#],
            vec![
                r#"{"name": "Ada"}"#,
                r#"{"name": "Ada", "age": -1}"#,
                r#"{"name": "Ada", "age": 3.5}"#,
                r#"{"name": 1, "age": 2}"#,
                r#"{"name": "Ada", "age": 36, "x": 1}"#,
                r#"[]"#,
            ],
        ),
        (
            json!({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}),
            vec![r#"["red"]"#, r#"["red", "blue", "green"]"#],
            vec![
                r#"[]"#,
                r#"["red", "red", "red", "red"]"#,
                r#"["pink"]"#,
                r#""red""#,
            ],
        ),
        (
            json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": false}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false}),
            vec![r#"{"from": {"x": 1, "y": 2.5}, "to": {"x": -3e2, "y": 0}}"#],
            vec![
                r#"{"from": {"x": 1}, "to": {"x": 1, "y": 2}}"#,
                r#"{"from": {"x": "1", "y": 2}, "to": {"x": 1, "y": 2}}"#,
            ],
        ),
        (
            json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}}, "required": ["ok"], "additionalProperties": false}),
            vec![
                r#"{"ok": true}"#,
                r#"{"ok": false, "note": null}"#,
                r#"{"ok": true, "note": "fine"}"#,
            ],
            vec![
                r#"{"ok": "yes"}"#,
                r#"{"note": "x"}"#,
                r#"{"ok": true, "note": 3}"#,
            ],
        ),
        (
            json!({"type": "number", "minimum": 1, "maximum": 10}),
            vec!["1", "7.25", "10"],
            vec!["0", "10.5", "-3", "\"5\""],
        ),
    ]
}

#[test]
fn json_schemas_accept_and_refuse_what_they_must() {
    let cases = schema_cases();
    for (name, t, table) in vocabs() {
        let mut wrong = Vec::new();
        let mut total = 0;
        for (schema, good, bad) in &cases {
            let spec = GrammarSpec::JsonSchema(schema.clone());
            for s in good {
                total += 1;
                if !accepts(table, t, &spec, s) {
                    wrong.push(format!("refused {s} for {schema}"));
                }
            }
            for s in bad {
                total += 1;
                if accepts(table, t, &spec, s) {
                    wrong.push(format!("accepted {s} for {schema}"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "{name}: {} of {total} wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
}

#[test]
fn any_json_object_and_a_regex() {
    let (_, t, table) = &vocabs()[0];
    let obj = GrammarSpec::JsonObject;
    assert!(accepts(table, t, &obj, r#"{"a": [1, 2, {"b": null}]}"#));
    assert!(!accepts(table, t, &obj, "[1, 2]"));
    let re = GrammarSpec::Regex(r"\d{3}-\d{4}".into());
    assert!(accepts(table, t, &re, "555-1234"));
    assert!(!accepts(table, t, &re, "555-12345"));
    assert!(!accepts(table, t, &re, "55-1234"));
}

#[test]
fn the_end_of_generation_is_allowed_only_where_the_grammar_may_end() {
    let (_, t, table) = &vocabs()[0];
    let end = t.eos().unwrap();
    let mut c = table.start(&GrammarSpec::Regex("ab+".into())).unwrap();
    assert!(!c.allowed().unwrap().allows(end), "end before anything");
    for id in t.encode("ab", false, false) {
        c.commit(id).unwrap();
    }
    let mask = c.allowed().unwrap();
    assert!(mask.allows(end), "end after a whole match");
    assert!(!c.is_done(), "more b's may follow");
    c.commit(end).unwrap();
    assert!(c.is_done());
    // A grammar that nothing more can extend is done at once, and allows only the end.
    let mut c = table.start(&GrammarSpec::Regex("ab".into())).unwrap();
    for id in t.encode("ab", false, false) {
        c.commit(id).unwrap();
    }
    assert!(c.is_done());
    let mask = c.allowed().unwrap();
    let ends = (0..t.vocab_size() as u32)
        .filter(|&id| t.is_end_of_generation(id))
        .count();
    assert!(mask.allows(end), "the end is allowed");
    assert_eq!(
        mask.count(),
        ends,
        "only the end-of-generation tokens are allowed"
    );
    assert!(
        c.commit(t.encode("b", false, false)[0]).is_err(),
        "nothing after the end"
    );
    c.commit(end).unwrap();
}

#[test]
fn bad_grammars_are_errors_that_say_what() {
    let (_, _, table) = &vocabs()[0];
    for (spec, kind) in [
        (GrammarSpec::Regex("(unclosed".into()), "regex"),
        (
            GrammarSpec::Lark("start: undefined_rule".into()),
            "Lark grammar",
        ),
        (
            GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
            "JSON schema",
        ),
    ] {
        match table.start(&spec) {
            Err(GrammarError::Compile { kind: k, detail }) => {
                assert_eq!(k, kind);
                assert!(!detail.is_empty());
            }
            Err(e) => panic!("{spec:?}: not a compile error: {e}"),
            Ok(_) => panic!("{spec:?} compiled"),
        }
    }
}
