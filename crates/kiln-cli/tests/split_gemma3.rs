//! A split model on the real Gemma 3 270M (GGUF Q4_K_M), placed by the CLI's own path
//! (`kiln_cli::backends::place_decoder`): the first half of its layers on one CPU backend (standing
//! in for a GPU), the rest on another, generates through the engine's `generate` exactly the greedy
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

use kiln_cli::backends::{place_decoder, DeviceOptions, Devices};
use kiln_cpu::CpuOptions;
use kiln_engine::plan::Placement;
use kiln_engine::{DecoderRunner, DecoderUse, GenerateOptions, ModelFile, SamplingParams};
use kiln_formats::LoadMode;
use kiln_hub::Hub;
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

fn greedy(model: &dyn DecoderRunner, prompt: &[u32]) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
    };
    model
        .generate(prompt, &opts, &|_| false, &mut |_| true)
        .unwrap()
        .ids
}

#[test]
fn split_gemma3_generates_the_tokens_of_the_whole_model() {
    let path = Hub::from_env()
        .resolve("gemma3-270m")
        .unwrap_or_else(|e| panic!("fetching gemma3-270m: {e}"));
    // One file, placed twice by the CLI's own path: whole on the CPU, then split with a second
    // CPU backend standing in for the GPU of the plan.
    let mut file = ModelFile::open(&path, LoadMode::Map).unwrap();
    let devices = Devices {
        cpu: CpuOptions::threads(2),
        gpus: vec![(0, DeviceOptions::Cpu(CpuOptions::threads(1)))],
    };
    let single = place_decoder(&mut file, &Placement::Cpu, &devices, DecoderUse::Generate).unwrap();
    let n = single.config().n_layers / 2;
    let plan = Placement::Split {
        gpu: 0,
        gpu_layers: n,
    };
    let split = place_decoder(&mut file, &plan, &devices, DecoderUse::Generate).unwrap();
    assert!(
        split
            .placement()
            .starts_with(&format!("split: layers 0..{n} on cpu")),
        "{}",
        split.placement()
    );
    // What a split cannot do yet is refused before anything is loaded.
    for usage in [DecoderUse::Score, DecoderUse::Serve] {
        let e = place_decoder(&mut file, &plan, &devices, usage)
            .err()
            .unwrap();
        assert!(e.to_string().contains("only generates"), "{e}");
    }
    // A plan naming a GPU that is not there.
    let e = place_decoder(
        &mut file,
        &plan,
        &Devices::cpu(CpuOptions::threads(1)),
        DecoderUse::Generate,
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("no GPU backend was opened"), "{e}");

    let prompts = golden_prompts();
    assert_eq!(prompts.len(), 20, "the golden greedy prompts");
    let n_layers = single.config().n_layers;
    for (i, prompt) in prompts.iter().enumerate() {
        let want = greedy(single.as_ref(), prompt);
        let got = greedy(split.as_ref(), prompt);
        assert_eq!(want.len(), TOKENS);
        assert_eq!(
            got,
            want,
            "prompt {i} ({} tokens), split after layer {n} of {n_layers}",
            prompt.len(),
        );
    }
}
