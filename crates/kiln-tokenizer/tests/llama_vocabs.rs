//! llama.cpp's own tokenizer test vocabularies (`models/ggml-vocab-*.gguf` with their `.inp`/`.out`
//! cases, as `tests/test-tokenizer-0` runs them: `add_special = false`, `parse_special = false`).
//!
//! Every vocabulary file either builds and gives llama.cpp's ids for 100% of its cases, or is
//! refused with a typed error; the refused set must equal [`REFUSED`] exactly, so a regression and
//! a newly supported vocabulary both fail until the list is updated. Streaming decoding must equal
//! whole decoding on every case, and decoding must round-trip where the ids lose nothing.

mod support;

use std::path::Path;

use kiln_tokenizer::{Tokenizer, TokenizerError};
use support::{llama_vocab_dir, read_vocab_cases, tokenizer_from_file, VOCABS};

/// The vocabulary files kiln refuses, and a word the error must contain (none since the Unigram
/// `t5` kind; nomic-bert-moe, which llama.cpp ships without cases, is checked against
/// SentencePiece in `unigram_matches_sentencepiece`).
const REFUSED: &[(&str, &str)] = &[];

/// Byte-level BPE and SentencePiece-style BPE lose nothing: every case decodes back to its text.
/// So does SentencePiece with a space prefix (the prefix is the space the first token loses).
/// WordPiece lowercases, strips accents and drops white space, so it is not here.
const ROUND_TRIP: &[&str] = &[
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

fn meta(file: &kiln_formats::GgufFile, key: &str) -> String {
    file.get(key)
        .and_then(|v| v.as_str())
        .unwrap_or("-")
        .to_string()
}

fn open(path: &Path) -> (kiln_formats::GgufFile, Result<Tokenizer, TokenizerError>) {
    let file = kiln_formats::GgufFile::open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let tokenizer = Tokenizer::from_gguf(&file);
    (file, tokenizer)
}

fn check_stream(t: &Tokenizer, ids: &[u32]) {
    let mut decoder = t.stream_decoder();
    let mut text: String = ids.iter().map(|&id| decoder.push(id)).collect();
    text.push_str(&decoder.finish());
    assert_eq!(text, t.decode(ids, false), "ids {ids:?}");
}

#[test]
fn every_llama_cpp_vocab_passes_or_is_refused() {
    let dir = llama_vocab_dir();
    let mut table = vec![format!(
        "{:<16} {:<8} {:<16} result",
        "vocab", "model", "pre"
    )];
    let mut refused = Vec::new();
    let mut failures = Vec::new();
    for (name, has_cases) in VOCABS {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let (file, tokenizer) = open(&path);
        let (model, pre) = (
            meta(&file, "tokenizer.ggml.model"),
            meta(&file, "tokenizer.ggml.pre"),
        );
        let result = match tokenizer {
            Err(e) => {
                refused.push((name, e.to_string()));
                format!("refused: {e}")
            }
            Ok(_) if !has_cases => "builds (no cases)".to_string(),
            Ok(t) => {
                let cases = read_vocab_cases(&path);
                assert!(!cases.is_empty(), "{name}: no cases");
                let mut passed = 0;
                for c in &cases {
                    let got = t.encode(&c.text, false, false);
                    if got == c.ids {
                        passed += 1;
                    } else {
                        failures.push(format!(
                            "{name}: {:?}\n  want {:?}\n  got  {:?}",
                            c.text, c.ids, got
                        ));
                    }
                    check_stream(&t, &got);
                }
                format!("{passed}/{} cases identical", cases.len())
            }
        };
        table.push(format!("{name:<16} {model:<8} {pre:<16} {result}"));
    }
    eprintln!("{}", table.join("\n"));

    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let refused_names: Vec<&str> = refused.iter().map(|(n, _)| *n).collect();
    let expected: Vec<&str> = REFUSED.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        refused_names, expected,
        "the refused set changed: {refused:?}"
    );
    for ((name, error), (_, word)) in refused.iter().zip(REFUSED) {
        assert!(error.contains(word), "{name}: {error}");
    }
}

#[test]
fn round_trips() {
    for name in ROUND_TRIP {
        let path = llama_vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
        let t = tokenizer_from_file(&path);
        for c in read_vocab_cases(&path) {
            assert_eq!(
                t.decode(&c.ids, false),
                c.text,
                "ggml-vocab-{name}: {:?}",
                c.ids
            );
        }
    }
}

#[test]
fn special_flags_follow_llama_cpp_defaults() {
    let dir = llama_vocab_dir();
    // llama-bpe (Llama 3): add_bos by pre-tokenizer, <|eot_id|> and <|end_of_text|> end
    // generation.
    let t = tokenizer_from_file(&dir.join("ggml-vocab-llama-bpe.gguf"));
    assert!(t.add_bos());
    assert_eq!(t.encode("a", true, false)[0], 128000);
    let eot = t.token_id("<|eot_id|>").unwrap();
    assert!(t.is_end_of_generation(eot) && t.is_control(eot));
    assert!(t.is_end_of_generation(128001));
    assert_eq!(t.encode("<|eot_id|>", false, true), [eot]);
    assert_ne!(t.encode("<|eot_id|>", false, false), [eot]);
    // qwen2: no BOS added, <|im_end|> and <|endoftext|> end generation.
    let t = tokenizer_from_file(&dir.join("ggml-vocab-qwen2.gguf"));
    assert!(!t.add_bos());
    assert_eq!(t.encode("a", true, false).len(), 1);
    for text in ["<|im_end|>", "<|endoftext|>"] {
        assert!(t.is_end_of_generation(t.token_id(text).unwrap()), "{text}");
    }
    // llama-spm: BOS added, a space prefix, </s> ends generation.
    let t = tokenizer_from_file(&dir.join("ggml-vocab-llama-spm.gguf"));
    assert_eq!(t.encode("Hello", true, false), [1, 15043]);
    assert!(t.is_end_of_generation(2));
    // command-r: add_bos from the metadata.
    let t = tokenizer_from_file(&dir.join("ggml-vocab-command-r.gguf"));
    assert_eq!(t.encode("a", true, false)[0], 5);
    // gemma-4: llama.cpp always adds its BOS; `\n\n` is one token.
    let t = tokenizer_from_file(&dir.join("ggml-vocab-gemma-4.gguf"));
    assert!(t.add_bos());
    assert_eq!(t.encode("\n\n", true, false), [2, 108]);
}

#[test]
fn wordpiece_adds_cls_and_sep() {
    let t = tokenizer_from_file(&llama_vocab_dir().join("ggml-vocab-bert-bge.gguf"));
    assert!(t.add_bos() && t.add_sep() && !t.add_eos());
    // [CLS] hello world [SEP]
    assert_eq!(t.encode("Hello world", true, false), [101, 7592, 2088, 102]);
    assert_eq!(t.encode("", true, false), [101, 102]);
    // Control tokens are matched only with parse_special.
    assert_eq!(t.encode("[MASK]", false, true), [103]);
    assert_ne!(t.encode("[MASK]", false, false), [103]);
    // Pieces decode with their `▁` as a space; [UNK] (a control-like token) only when rendered.
    assert_eq!(t.decode(&[7592, 2088], false), " hello world");
    assert_eq!(t.decode(&[2023, 2003, 100, 1012], false), " this is .");
    assert_eq!(t.decode(&[100], true), "[UNK]");
}

/// The Unigram (`t5`) vocabulary llama.cpp ships without test cases, XLM-RoBERTa's (250,048
/// pieces and a precompiled charsmap, in `ggml-vocab-nomic-bert-moe.gguf`), against
/// SentencePiece itself on the same model rebuilt from the GGUF's fields: every string of
/// llama.cpp's tokenizer suite plus normalization cases (`scripts/gen_ugm_fixture.py`, committed
/// as `tests/fixtures/tokenizers/nomic-bert-moe-ugm.json`). With specials, EOS closes the text
/// (llama.cpp's UGM default; XLM-R's `</s>` is 2), and BOS opens it because the file asks.
#[test]
fn unigram_matches_sentencepiece() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizers/nomic-bert-moe-ugm.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let file = reference["vocab_file"].as_str().unwrap();
    let t = tokenizer_from_file(&llama_vocab_dir().join(file));
    let mut failures = Vec::new();
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() > 50);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = t.encode(text, false, false);
        if got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
        check_stream(&t, &got);
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // <s> Hello </s>: the file's add_bos and llama.cpp's add_eos.
    let ids = t.encode("Hello", true, false);
    assert_eq!((ids[0], *ids.last().unwrap()), (0, 2), "{ids:?}");
    // Decoding drops the prefixed space from the first piece (as llama.cpp: the first token's).
    assert_eq!(t.decode(&ids[1..ids.len() - 1], false), "Hello");
}
