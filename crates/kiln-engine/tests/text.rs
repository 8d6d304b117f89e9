//! The tokenizer front of decoders from Hugging Face folders (`tokenizer.json` and friends),
//! on the decoder fixtures (`tests/fixtures/decoders`): ids equal transformers' (recorded in the fixtures),
//! end-of-generation ids come from the folder's files, and streaming reproduces `decode`.

use std::path::{Path, PathBuf};

use kiln_engine::TextTokenizer;
use serde_json::Value;

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family)
}

fn reference(family: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(family).join("reference.json")).unwrap())
        .unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn hf_folders_encode_as_transformers_and_stream_what_they_decode() {
    for family in ["llama", "mistral", "qwen2", "phi3", "mixtral"] {
        let t = TextTokenizer::from_hf_dir(&fixture(family)).unwrap();
        let r = reference(family);
        // Prompts as a user writes them: with the model's own special tokens (BOS).
        for case in r["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(
                t.encode(text, true, true).unwrap(),
                ids(&case["ids"]),
                "{family}: {text:?}"
            );
            // The greedy continuation streamed token by token is its decoded text.
            let greedy = ids(&case["greedy"]);
            let mut stream = t.stream();
            let mut text: String = greedy.iter().map(|&id| stream.push(id)).collect();
            text.push_str(&stream.finish());
            assert_eq!(text, t.decode(&greedy, false), "{family}: {greedy:?}");
        }
        let tok = &r["tokenizer"];
        for (s, want) in tok["strings"]
            .as_array()
            .unwrap()
            .iter()
            .zip(tok["ids"].as_array().unwrap())
        {
            let want = ids(want);
            let mut stream = t.stream();
            let mut text: String = want.iter().map(|&id| stream.push(id)).collect();
            text.push_str(&stream.finish());
            assert_eq!(text, t.decode(&want, false), "{family}: {s}");
        }
        // The end of generation: generation_config.json's eos_token_id.
        let gen: Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(family).join("generation_config.json")).unwrap(),
        )
        .unwrap();
        let eos = match &gen["eos_token_id"] {
            Value::Array(list) => ids(&Value::Array(list.clone())),
            v => vec![v.as_u64().unwrap() as u32],
        };
        for id in eos {
            assert!(t.is_end_of_generation(id), "{family}: {id}");
        }
        assert!(!t.is_end_of_generation(ids(&r["cases"][0]["ids"])[1]));
    }
    let missing = std::env::temp_dir().join(format!("kiln-no-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&missing).unwrap();
    let err = TextTokenizer::from_hf_dir(&missing)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}
