//! Long context on the real Gemma 3 270M: perplexity of a 36,858-token text (nine licenses as
//! Debian ships them, `tests/fixtures/long-context/licenses.txt`) in chunks of 8,192 and of 16,384
//! tokens, against llama.cpp's on the same file (`ppl.json`, made by
//! `scripts/gen_long_context_reference` with the command it records). The last scored token of
//! the 16k run sees 16,383 before it: far past the 512-position window of five layers in six, so
//! the windowed layers, the global layers' rope at long range and the cache at 16k are all in the
//! figure. The model is fetched on first use, as in `golden_gemma3.rs`.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::run_ok;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/long-context")
        .join(name)
}

/// kiln's perplexity at context `n_ctx` within 1% of llama.cpp's, chunk for chunk, over the
/// first `chunks` chunks (all of them when `None`).
fn check(n_ctx: u64, chunks: Option<u64>) {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("ppl.json")).unwrap()).unwrap();
    let want = reference["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["n_ctx"] == n_ctx)
        .unwrap_or_else(|| panic!("no llama.cpp run at -c {n_ctx} in ppl.json"));
    let text = fixture("licenses.txt");
    let (c, n) = (n_ctx.to_string(), chunks.unwrap_or(0).to_string());
    let mut args = vec![
        "perplexity",
        "-m",
        "gemma3-270m",
        "-f",
        text.to_str().unwrap(),
        "-c",
        &c,
        "--json",
    ];
    if chunks.is_some() {
        args.extend(["--chunks", &n]);
    }
    let got: Value = serde_json::from_str(run_ok(&args, "").trim()).unwrap();
    let want_chunks = chunks.map_or(want["chunks"].clone(), Value::from);
    assert_eq!(got["chunks"], want_chunks, "-c {n_ctx}");
    let running = got["running"].as_array().unwrap();
    let want_running = want["running_ppl_after_each_chunk"].as_array().unwrap();
    for (i, (g, w)) in running.iter().zip(want_running).enumerate() {
        let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
        eprintln!(
            "-c {n_ctx}, after chunk {}: kiln {g:.4}, llama.cpp {w:.4} ({:+.2}%)",
            i + 1,
            (g / w - 1.0) * 100.0
        );
        assert!(
            (g / w - 1.0).abs() <= 0.01,
            "-c {n_ctx} chunk {i}: {g} vs {w}"
        );
    }
}

/// The first two of the four 8k chunks (the other two take as long again and add no new
/// position range).
#[test]
fn perplexity_at_8k_matches_llama_cpp_within_one_percent() {
    check(8192, Some(2));
}

#[test]
fn perplexity_at_16k_matches_llama_cpp_within_one_percent() {
    check(16384, None);
}
