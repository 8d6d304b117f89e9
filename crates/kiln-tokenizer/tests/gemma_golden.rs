//! Gemma 3 270M (SentencePiece, 262,144 tokens) against llama.cpp's own tokenization
//! (`tests/golden/gemma3-270m/public/tokenize*.jsonl`): identical ids for every case, decode
//! round trips, and streaming decode equal to whole decode.

mod support;

use std::sync::OnceLock;
use std::time::Instant;

use kiln_tokenizer::Tokenizer;
use support::{gemma_model_path, golden_dir, read_jsonl_cases, tokenizer_from_file, Case};

fn gemma() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| tokenizer_from_file(&gemma_model_path()))
}

fn cases(file: &str) -> Vec<Case> {
    read_jsonl_cases(&golden_dir("gemma3-270m").join("public").join(file))
}

/// Compares every case; on failure lists each differing case with both id lists.
fn assert_all_equal(cases: &[Case], parse_special: bool) {
    let t = gemma();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let got = t.encode(&c.text, false, parse_special);
            (got != c.ids).then(|| format!("{:?}\n  want {:?}\n  got  {:?}", c.text, c.ids, got))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenize_matches_llama_cpp() {
    let cases = cases("tokenize.jsonl");
    assert_eq!(cases.len(), 167);
    assert_all_equal(&cases, false);
}

#[test]
fn tokenize_special_matches_llama_cpp() {
    let cases = cases("tokenize_special.jsonl");
    assert_eq!(cases.len(), 21);
    assert_all_equal(&cases, true);
}

#[test]
fn greedy_and_logits_prompts_match_llama_cpp() {
    // These prompts were tokenized by llama.cpp with BOS and special=true.
    let t = gemma();
    let dir = golden_dir("gemma3-270m").join("public");
    let greedy = std::fs::read_to_string(dir.join("greedy.jsonl")).unwrap();
    let logits = std::fs::read_to_string(dir.join("logits.jsonl")).unwrap();
    let mut n = 0;
    for (data, text_key, ids_key) in [(&greedy, "prompt", "prompt_ids"), (&logits, "text", "ids")] {
        for line in data.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = v[text_key].as_str().unwrap();
            let want: Vec<u32> = v[ids_key]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(t.encode(text, true, true), want, "{text:?}");
            n += 1;
        }
    }
    assert_eq!(n, 28);
}

#[test]
fn greedy_continuations_decode_as_llama_cpp() {
    let t = gemma();
    let data = std::fs::read_to_string(
        golden_dir("gemma3-270m")
            .join("public")
            .join("greedy.jsonl"),
    )
    .unwrap();
    for line in data.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let ids: Vec<u32> = v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(t.decode(&ids, false), v["text"].as_str().unwrap());
    }
}

#[test]
fn decode_round_trips() {
    let t = gemma();
    for c in cases("tokenize.jsonl") {
        // With parse_special = false no control token is produced, so the text comes back whole.
        assert_eq!(t.decode(&c.ids, false), c.text, "ids {:?}", c.ids);
    }
    for c in cases("tokenize_special.jsonl") {
        // Control tokens parsed from the text come back only when rendered.
        assert_eq!(t.decode(&c.ids, true), c.text, "ids {:?}", c.ids);
    }
}

fn streamed(t: &Tokenizer, ids: &[u32]) -> (Vec<String>, String) {
    let mut decoder = t.stream_decoder();
    let chunks: Vec<String> = ids.iter().map(|&id| decoder.push(id)).collect();
    let tail = decoder.finish();
    (chunks, tail)
}

#[test]
fn stream_decoder_equals_decode_and_never_splits_characters() {
    let t = gemma();
    let mut all = cases("tokenize.jsonl");
    all.extend(cases("tokenize_special.jsonl"));
    // Byte fallback spread over tokens: U+1F999 (🦙 is a token; this code point is not) and a
    // private-use code point, each as four <0xNN> tokens.
    let byte = |b: u8| t.token_id(&format!("<0x{b:02X}>")).unwrap();
    let mut spread = Vec::new();
    for c in ['\u{1F9FF}', '\u{F0000}', 'é'] {
        let mut buf = [0u8; 4];
        spread.extend(c.encode_utf8(&mut buf).bytes().map(byte));
    }
    let spread_text = t.decode(&spread, false);
    assert_eq!(spread_text, "\u{1F9FF}\u{F0000}é");
    all.push(Case {
        text: spread_text,
        ids: spread,
    });

    let mut held_back = 0;
    for c in &all {
        let (chunks, tail) = streamed(t, &c.ids);
        let whole = t.decode(&c.ids, false);
        assert_eq!(chunks.concat() + &tail, whole, "ids {:?}", c.ids);
        assert!(tail.is_empty(), "a complete text left {tail:?} behind");
        for chunk in &chunks {
            assert!(
                !chunk.contains('\u{FFFD}'),
                "chunk {chunk:?} of {:?}",
                c.text
            );
        }
        held_back += chunks.iter().filter(|c| c.is_empty()).count();
    }
    assert!(held_back > 0, "no case exercised holding back bytes");
}

#[test]
fn stream_decoder_flushes_incomplete_tail_as_replacement() {
    let t = gemma();
    let ids: Vec<u32> = [0xF0u8, 0x9F]
        .iter()
        .map(|b| t.token_id(&format!("<0x{b:02X}>")).unwrap())
        .collect();
    let (chunks, tail) = streamed(t, &ids);
    assert!(chunks.iter().all(String::is_empty));
    assert_eq!(tail, "\u{FFFD}");
    assert_eq!(t.decode(&ids, false), "\u{FFFD}");
}

#[test]
fn special_ids_and_end_of_generation() {
    let t = gemma();
    assert_eq!(t.vocab_size(), 262_144);
    assert_eq!(t.bos(), Some(2));
    assert_eq!(t.eos(), Some(1));
    assert!(t.add_bos());
    assert!(!t.add_eos());
    assert_eq!(t.token_id("<end_of_turn>"), Some(106));
    assert_eq!(t.token_id("<start_of_turn>"), Some(105));
    assert_eq!(t.eot(), Some(106));
    for id in [1, 106, 212] {
        assert!(t.is_end_of_generation(id), "{id}");
        assert!(t.is_control(id), "{id}");
    }
    for id in [2, 105, 107, 200] {
        assert!(!t.is_end_of_generation(id), "{id}");
    }
    assert_eq!(t.encode("Hi", true, false)[0], 2);
    assert_eq!(t.token_to_piece(106, false), b"");
    assert_eq!(t.token_to_piece(106, true), b"<end_of_turn>");
    assert_eq!(
        t.token_to_piece(t.token_id("<0x0A>").unwrap(), false),
        b"\n"
    );
}

#[test]
fn construction_time() {
    // Reported, not asserted: performance is judged by benchmarks, not unit tests.
    let file = kiln_formats::GgufFile::open(&gemma_model_path()).unwrap();
    let start = Instant::now();
    let t = Tokenizer::from_gguf(&file).unwrap();
    let build = start.elapsed();
    let cases = cases("tokenize.jsonl");
    let start = Instant::now();
    let n: usize = cases
        .iter()
        .map(|c| t.encode(&c.text, false, false).len())
        .sum();
    let encode = start.elapsed();
    eprintln!(
        "gemma3 tokenizer: from_gguf {:.1} ms; {} golden texts ({n} tokens) encoded in {:.2} ms",
        build.as_secs_f64() * 1e3,
        cases.len(),
        encode.as_secs_f64() * 1e3
    );
}
