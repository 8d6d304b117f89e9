//! `kiln run` on the decoder fixtures (`tests/fixtures/decoders`), from a Hugging Face folder
//! and from the GGUF llama.cpp's converter made of it: the prompt tokenizes to transformers' ids and greedy
//! decoding reproduces transformers' continuation.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn run_reproduces_transformers_greedy_from_folders_and_ggufs() {
    check_families(&[]);
}

/// The same on a Vulkan device.
#[test]
fn run_on_vulkan_reproduces_transformers_greedy_from_folders_and_ggufs() {
    if common::vulkan("run_on_vulkan_reproduces_transformers_greedy") {
        check_families(&["--backend", "vulkan"]);
    }
}

/// Each family fixture, from its folder and its GGUF, run with `extra` arguments: transformers'
/// prompt ids and greedy continuation, and `kiln tokenize`'s ids.
fn check_families(extra: &[&str]) {
    for family in [
        "llama",
        "qwen2",
        "qwen2-yarn",
        "phi3",
        "mixtral",
        "qwen2moe",
        "qwen2moe-mixed",
        "gemma3-mm",
        "llama-dynamic",
        "llama-gptq-g32",
    ] {
        let dir = fixture(family);
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let mut targets = vec![("safetensors", dir.clone())];
        if let Some(g) = r["gguf"].as_str() {
            targets.push(("gguf", dir.join(g)));
        }
        let case = &r["cases"][0];
        for (format, target) in targets {
            let applies = case["applies_to"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a.as_str() == Some(format));
            if !applies {
                continue;
            }
            let mut args = vec![
                "run",
                "-m",
                target.to_str().unwrap(),
                "-p",
                case["text"].as_str().unwrap(),
                "-n",
                "8",
                "--temp",
                "0",
                "--ignore-eos",
                "--json",
            ];
            args.extend_from_slice(extra);
            let out = common::run(&args, "", None);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{family} {format} {extra:?}: {stderr}"
            );
            let line: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                ids(&line["prompt_ids"]),
                ids(&case["ids"]),
                "{family} {format}"
            );
            assert_eq!(
                ids(&line["ids"]),
                ids(&case["greedy"]),
                "{family} {format} {extra:?}"
            );

            // `kiln tokenize` gives the same prompt ids.
            let text = case["text"].as_str().unwrap();
            let out = common::run(
                &[
                    "tokenize",
                    "-m",
                    target.to_str().unwrap(),
                    "--add-special",
                    "--special",
                    text,
                ],
                "",
                None,
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                ids(&line["ids"]),
                ids(&case["ids"]),
                "tokenize {family} {format}"
            );
        }
    }
}
