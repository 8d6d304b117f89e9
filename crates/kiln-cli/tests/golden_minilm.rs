//! Conformance of `kiln embed` on all-MiniLM-L6-v2 (safetensors, float32) against
//! sentence-transformers (`tests/golden/all-minilm-l6-v2/`): identical token ids, and
//! embeddings within the float32 tolerances the golden README derives (peers sit ~4e-7 apart;
//! a wrong GELU or LayerNorm eps moves them by ~5e-4).
//!
//! The tests drive the real binary, so they also check the JSON-lines surface users script
//! against. The model is fetched on first use, as `kiln embed` would.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod common;
use common::{ids, json_lines, run_ok};

fn golden_cases() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden/all-minilm-l6-v2/public/embeddings.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `kiln embed --jsonl --ids ARGS` over `texts`; the output lines.
fn embed(texts: &[&str], args: &[&str]) -> Vec<Value> {
    let mut input = String::new();
    for t in texts {
        input.push_str(&serde_json::json!({ "text": t }).to_string());
        input.push('\n');
    }
    let mut all = vec!["embed", "-m", "minilm", "--jsonl", "--ids"];
    all.extend_from_slice(args);
    json_lines(&run_ok(&all, &input))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The first `n` golden texts (all with `None`) embedded with `extra` arguments match
/// sentence-transformers: the same ids, and embeddings within the float32 bar.
fn check_golden_texts(n: Option<usize>, extra: &[&str]) {
    let mut cases = golden_cases();
    assert!(cases.len() >= 250, "{} golden cases", cases.len());
    cases.truncate(n.unwrap_or(cases.len()));
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let mut args = vec!["-b", "32"];
    args.extend_from_slice(extra);
    let out = embed(&texts, &args);
    assert_eq!(out.len(), cases.len());
    let (mut worst_cos, mut worst_diff) = (1.0f64, 0.0f64);
    let mut id_mismatches = Vec::new();
    for (i, (want, got)) in cases.iter().zip(&out).enumerate() {
        assert_eq!(got["text"], want["text"], "output order");
        if ids(&got["input_ids"]) != ids(&want["input_ids"]) {
            id_mismatches.push(i);
            continue;
        }
        let (g, w) = (floats(&got["embedding"]), floats(&want["embedding"]));
        assert_eq!(g.len(), 384);
        let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "case {i}: norm {norm}");
        worst_cos = worst_cos.min(cosine(&g, &w));
        worst_diff = worst_diff.max(max_abs_diff(&g, &w));
    }
    eprintln!(
        "minilm {extra:?}: {} cases, {} id mismatches, min cosine 1 - {:.2e}, max |Δ| {:.2e}",
        cases.len(),
        id_mismatches.len(),
        1.0 - worst_cos,
        worst_diff
    );
    assert!(
        id_mismatches.is_empty(),
        "ids differ for cases {id_mismatches:?}"
    );
    // The README's float32 bar (the issue asks for ≥ 0.99999; this is 10× tighter).
    assert!(
        worst_cos >= 1.0 - 1e-6,
        "min cosine 1 - {:e}",
        1.0 - worst_cos
    );
    assert!(worst_diff <= 1e-4, "max |Δ| {worst_diff:e}");
}

#[test]
fn every_golden_text_matches_sentence_transformers() {
    check_golden_texts(None, &[]);
}

/// The same on a Vulkan device: the first 48 texts (lavapipe in CI, a software device, takes
/// about four minutes for all 259).
#[test]
fn golden_texts_on_vulkan_match_sentence_transformers() {
    if common::vulkan("golden_texts_on_vulkan") {
        check_golden_texts(Some(48), &["--backend", "vulkan"]);
    }
}

#[test]
fn embeddings_do_not_depend_on_batch_size_or_neighbours() {
    let cases = golden_cases();
    // Mixed lengths: every fourth golden text (short queries to 256-token texts).
    let texts: Vec<&str> = cases
        .iter()
        .step_by(4)
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    let lens: Vec<usize> = cases
        .iter()
        .step_by(4)
        .map(|c| c["input_ids"].as_array().unwrap().len())
        .collect();
    assert!(
        lens.iter().min() < Some(&8) && lens.iter().max() >= Some(&200),
        "{lens:?}"
    );
    let alone = embed(&texts, &["-b", "1"]);
    for b in ["7", "32"] {
        let batched = embed(&texts, &["-b", b]);
        let mut worst = 0.0f64;
        for (a, m) in alone.iter().zip(&batched) {
            assert_eq!(a["input_ids"], m["input_ids"]);
            worst = worst.max(max_abs_diff(
                &floats(&a["embedding"]),
                &floats(&m["embedding"]),
            ));
        }
        eprintln!("batch {b} vs alone: max |Δ| {worst:.2e}");
        // Packing computes nothing across sequences; what remains is the GEMM's blocking,
        // which may regroup a sum by a rounding step (far below the 1e-4 golden bar).
        assert!(worst <= 1e-6, "batch {b}: max |Δ| {worst:e}");
    }
}

#[test]
fn truncation_follows_max_seq_length_or_errors_when_off() {
    let long = "word ".repeat(400);
    let out = embed(&[&long, "short"], &[]);
    assert_eq!(out[0]["input_ids"].as_array().unwrap().len(), 256);
    assert_eq!(out[0]["input_ids"][255], 102, "ends with [SEP]");
    let status = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["embed", "-m", "minilm", "--no-truncate", &long])
        .output()
        .unwrap();
    assert!(!status.status.success());
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("402 tokens") && err.contains("256"), "{err}");
}
