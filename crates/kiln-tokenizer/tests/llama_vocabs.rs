//! llama.cpp's own tokenizer test vocabularies (`models/ggml-vocab-*.gguf` with their `.inp`/`.out`
//! cases, as `tests/test-tokenizer-0` runs them: `add_special = false`, `parse_special = false`).
//! Every case must give llama.cpp's ids; decoding must round-trip where the ids hold no byte-level
//! loss, and streaming must equal whole decoding.

mod support;

use kiln_tokenizer::Tokenizer;
use support::{llama_vocab_dir, read_vocab_cases, tokenizer_from_file};

fn check_vocab(name: &str) {
    let path = llama_vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let t = tokenizer_from_file(&path);
    let cases = read_vocab_cases(&path);
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for c in &cases {
        let got = t.encode(&c.text, false, false);
        if got != c.ids {
            failures.push(format!(
                "{:?}\n  want {:?}\n  got  {:?}",
                c.text, c.ids, got
            ));
        }
        check_stream(&t, &got);
    }
    eprintln!(
        "ggml-vocab-{name}: {}/{} cases identical",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "ggml-vocab-{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn check_stream(t: &Tokenizer, ids: &[u32]) {
    let mut decoder = t.stream_decoder();
    let mut text: String = ids.iter().map(|&id| decoder.push(id)).collect();
    text.push_str(&decoder.finish());
    assert_eq!(text, t.decode(ids, false), "ids {ids:?}");
}

#[test]
fn llama_spm() {
    check_vocab("llama-spm");
}

#[test]
fn llama_bpe() {
    check_vocab("llama-bpe");
}

#[test]
fn qwen2() {
    check_vocab("qwen2");
}

#[test]
fn gpt2() {
    check_vocab("gpt-2");
}

#[test]
fn phi3_spm_with_rstrip() {
    // SentencePiece whose special tokens llama.cpp marks RSTRIP by model name.
    check_vocab("phi-3");
}

#[test]
fn mpt() {
    // GPT-2 pre-tokenizer under another name.
    check_vocab("mpt");
}

#[test]
fn round_trips() {
    // Byte-level BPE loses nothing, so every case decodes back to its text. SentencePiece with a
    // space prefix decodes back too: the prefix is the space the first token loses.
    for name in ["llama-bpe", "qwen2", "gpt-2", "mpt", "llama-spm", "phi-3"] {
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
}
