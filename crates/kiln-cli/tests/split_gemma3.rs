//! A split model on the real Gemma 3 270M (GGUF Q4_K_M): the first half of its layers on one CPU
//! backend, the rest on another, generates through the engine's `generate` exactly the greedy
//! tokens of the whole model on a single backend, for every golden prompt
//! (`tests/golden/gemma3-270m/public/greedy.jsonl`: short and chat prompts, and prompts of
//! 355, 736 and 927 tokens that cross the 512-token sliding window and the 512-token prefill
//! chunks), 8 tokens each.
//!
//! No tolerance: the CPU backend's results do not depend on its thread count and the hidden state
//! crosses between the backends as exact f32 copies, so the logits are the same bits (the model
//! tests in `kiln-models/tests/split.rs` check that on every intermediate); equal tokens are the
//! end-to-end consequence.
//!
//! Cost: the three long prompts' prefill (2,018 tokens, twice) is most of it; 8 tokens per
//! prompt rather than the golden 32 keep the decode steps (twice 20 × 8) to a few seconds more.
//!
//! The model is fetched on first use, as `kiln run` does (`kiln pull gemma3-270m`; CI pulls it
//! before the tests), so this test never skips.

use std::path::PathBuf;

use kiln_cpu::CpuBackend;
use kiln_engine::{generate, GenerateOptions, SamplingParams};
use kiln_formats::GgufFile;
use kiln_hub::Hub;
use kiln_models::{load_gguf_decoder, load_gguf_decoder_split, CausalLm};
use serde_json::Value;

const TOKENS: usize = 8;

fn golden_prompts() -> Vec<Vec<u32>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden/gemma3-270m/public/greedy.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let case: Value = serde_json::from_str(l).unwrap();
            case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

fn greedy(model: &impl CausalLm, prompt: &[u32]) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
    };
    generate(model, prompt, &opts, |_| false, |_| true)
        .unwrap()
        .ids
}

#[test]
fn split_gemma3_generates_the_tokens_of_the_whole_model() {
    let path = Hub::from_env()
        .resolve("gemma3-270m")
        .unwrap_or_else(|e| panic!("fetching gemma3-270m: {e}"));
    let file = GgufFile::open(&path).unwrap();
    let single = CpuBackend::new(2).unwrap();
    let (front, back) = (CpuBackend::new(1).unwrap(), CpuBackend::new(2).unwrap());
    let model = load_gguf_decoder(&single, &file).unwrap();
    let n = model.config.n_layers / 2;
    let split = load_gguf_decoder_split(&front, &back, &file, n).unwrap();
    assert_eq!(
        (split.front.len(), split.back.len()),
        (n, model.config.n_layers - n)
    );

    let prompts = golden_prompts();
    assert_eq!(prompts.len(), 20, "the golden greedy prompts");
    for (i, prompt) in prompts.iter().enumerate() {
        let want = greedy(&model.on(&single), prompt);
        let got = greedy(&split.on(&front, &back), prompt);
        assert_eq!(want.len(), TOKENS);
        assert_eq!(
            got,
            want,
            "prompt {i} ({} tokens), split after layer {n} of {}",
            prompt.len(),
            model.config.n_layers
        );
    }
}
