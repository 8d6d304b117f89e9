//! `kiln bench` on a decoder: llama-bench's tests on the real Gemma 3 270M file, the JSON and
//! table outputs with their roofline and peak RSS, and clean failures on bad arguments.
//!
//! The model tests use the cached GGUF (`$KILN_HOME` or `~/.cache/kiln`, as `kiln pull
//! gemma3-270m` leaves it) and are skipped, saying so, when it is not there.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

mod common;

fn model() -> Option<PathBuf> {
    let home = std::env::var_os("KILN_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln")))?;
    let path = home.join("models/gemma3-270m/gemma-3-270m-q4_k_m.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} is missing (kiln pull gemma3-270m)",
            path.display()
        );
        None
    }
}

fn kiln(args: &[&str]) -> Output {
    common::run(args, "", None)
}

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

#[test]
fn json_rows_are_the_requested_tests_with_their_roofline() {
    let Some(model) = model() else { return };
    let args = [
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "4",
        "-b",
        "1,2",
        "-r",
        "1",
        "--json",
        "-t",
        "2",
    ];
    let stdout = common::run_ok(&args, "");
    let rows: Vec<Value> = serde_json::from_str::<Value>(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON array ({e}): {stdout}"))
        .as_array()
        .expect("a JSON array")
        .clone();
    let tests: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().to_string(),
                r["batch"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tests,
        [("pp16".into(), 1), ("tg4".into(), 1), ("tg4".into(), 2)]
    );

    let model_bytes = positive(&rows[0]["model_bytes"], "model_bytes");
    for r in &rows {
        assert_eq!(r["threads"], 2, "{r}");
        assert_eq!(r["kv_type"], "f16", "the default KV cache: {r}");
        positive(&r["tps_mean"], "tps_mean");
        assert_eq!(r["tps_std"], 0.0, "one repetition has no spread: {r}");
        let samples = r["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 1, "{r}");
        positive(&samples[0], "sample");
        assert_eq!(r["model_bytes"].as_f64(), Some(model_bytes));
        positive(&r["model_params"], "model_params");
        // The weights are memory-mapped and touched, so they count in the peak.
        assert!(positive(&r["peak_rss_bytes"], "peak_rss_bytes") > model_bytes / 2.0);
    }
    assert!(
        rows[0].get("roofline").is_none(),
        "prompt tests have no roofline"
    );

    // Whether this process may reset its peak-RSS mark (kiln's bench child may too).
    let resets_peak = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let roof = |i: usize| rows[i]["roofline"].clone();
    for i in [1, 2] {
        let r = roof(i);
        for key in [
            "weight_bytes_per_step",
            "kv_bytes_per_step",
            "bytes_per_step",
            "bytes_per_token",
            "bandwidth_bytes_per_s",
            "bound_tps",
            "bandwidth_fraction",
        ] {
            positive(&r[key], key);
        }
        // Gemma's output projection is its embedding: a step reads every tensor of the file
        // once, norms included (the file holds nothing else but the tiny rope tables, if any).
        let w = r["weight_bytes_per_step"].as_f64().unwrap();
        assert!(
            (w - model_bytes).abs() < 0.01 * model_bytes,
            "weights per step {w} vs file tensors {model_bytes}"
        );
        let fraction = r["bandwidth_fraction"].as_f64().unwrap();
        assert!(fraction < 10.0, "a fraction, not a percentage: {fraction}");
        // A GGUF read into memory (no --mmap) sits in huge pages: the probe streams those.
        assert_eq!(r["bandwidth_probe_pages"], "huge");
        // Short probes beside the repetitions (where the peak mark can be reset around them):
        // one after the warm-up, one after the repetition; the share is of their average.
        let probes = r["beside_probes_bytes_per_s"].as_array().unwrap();
        if resets_peak {
            assert_eq!(probes.len(), 2, "{r}");
            let (p0, p1) = (
                positive(&probes[0], "beside probe"),
                positive(&probes[1], "beside probe"),
            );
            let bw = positive(&r["beside_bandwidth_bytes_per_s"], "beside bandwidth");
            let harmonic = 2.0 / (1.0 / p0 + 1.0 / p1);
            assert!((bw - harmonic).abs() < 1e-9 * bw, "{bw} vs {harmonic}");
            let batch = rows[i]["batch"].as_f64().unwrap();
            let tps = rows[i]["tps_mean"].as_f64().unwrap();
            let per_step = r["bytes_per_step"].as_f64().unwrap();
            let want = tps / batch * per_step / bw;
            let got = positive(&r["beside_fraction"], "beside fraction");
            assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
        } else {
            assert!(probes.is_empty() && r["beside_fraction"].is_null(), "{r}");
        }
    }
    // One bound per thread count: the better of the probes before and after the tests.
    assert_eq!(
        roof(1)["bandwidth_bytes_per_s"],
        roof(2)["bandwidth_bytes_per_s"]
    );
    // Two sequences read the weights once and two KV caches per step.
    let (b1, b2) = (roof(1), roof(2));
    assert_eq!(b1["weight_bytes_per_step"], b2["weight_bytes_per_step"]);
    let (kv1, kv2) = (
        b1["kv_bytes_per_step"].as_f64().unwrap(),
        b2["kv_bytes_per_step"].as_f64().unwrap(),
    );
    assert!((kv2 - 2.0 * kv1).abs() < 1e-6 * kv2, "{kv1} {kv2}");
    // Gemma 3 270M's f16 cache: 18 layers of 256 keys and 256 values, 2 bytes each, a position;
    // the 4 steps of tg4 attend to 1..=4 positions, 2.5 on average.
    assert_eq!(kv1, 18.0 * 512.0 * 2.0 * 2.5);
    let per_token = b2["bytes_per_token"].as_f64().unwrap();
    let per_step = b2["bytes_per_step"].as_f64().unwrap();
    assert!((per_token * 2.0 - per_step).abs() < 1e-6 * per_step);
}

#[test]
fn the_table_names_the_tests_the_roofline_and_the_peak() {
    let Some(model) = model() else { return };
    let stdout = common::run_ok(
        &[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "8",
            "-n",
            "2",
            "-r",
            "2",
            "-t",
            "1",
        ],
        "",
    );
    for needle in [
        "| model",
        "t/s",
        "pp8",
        "tg2",
        "gemma3",
        "Q4_K_M",
        "roofline",
        "peak RSS",
        "±",
        "beside the runs",
    ] {
        assert!(stdout.contains(needle), "no {needle:?} in:\n{stdout}");
    }
}

/// A prompt test prefills in passes of `--ubatch` tokens (512 by default, as the engine does; a
/// prompt that is not a multiple of it ends on a short pass), or in one pass with 0, and says
/// which in its JSON row (a decoder fixture, on the CPU).
#[test]
fn prompt_tests_prefill_in_passes_of_the_ubatch() {
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/decoders/llama");
    let row = |ubatch: Option<&str>| {
        let mut args = vec![
            "bench",
            "-m",
            fixture.to_str().unwrap(),
            "--backend",
            "cpu",
            "-p",
            "40",
            "-n",
            "0",
            "-r",
            "1",
            "--json",
        ];
        if let Some(u) = ubatch {
            args.extend(["--ubatch", u]);
        }
        let rows: Value = serde_json::from_str(&common::run_ok(&args, "")).unwrap();
        let row = rows.as_array().unwrap()[0].clone();
        assert_eq!(row["test"], "pp40", "{row}");
        positive(&row["tps_mean"], "tps_mean");
        row["n_ubatch"].as_u64().unwrap()
    };
    assert_eq!(row(Some("16")), 16);
    assert_eq!(row(Some("0")), 40, "0: the whole prompt in one pass");
    assert_eq!(row(None), 40, "the default 512 covers a 40-token prompt");
}

/// `kiln bench --backend vulkan` times the passes on a Vulkan device (a decoder fixture: lavapipe
/// in CI is slow): one row per test, named after the device, with no CPU roofline.
#[test]
fn bench_runs_on_a_vulkan_device() {
    if !common::vulkan("bench_runs_on_a_vulkan_device") {
        return;
    }
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/decoders/llama");
    let out = kiln(&[
        "bench",
        "-m",
        fixture.to_str().unwrap(),
        "--backend",
        "vulkan",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in rows {
        assert!(r["backend"].as_str().unwrap().starts_with("vulkan:"), "{r}");
        positive(&r["tps_mean"], "tps_mean");
    }
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "kiln panicked: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout on failure");
}

#[test]
fn bad_arguments_are_reported_without_a_panic() {
    assert_clean_failure(&kiln(&["bench", "-p", "abc"]), "'abc'");
    assert_clean_failure(&kiln(&["bench", "-n", "4,x"]), "'x'");
    assert_clean_failure(&kiln(&["bench", "-b", "0"]), "'0'");
    assert_clean_failure(&kiln(&["bench", "-b", "1,2000"]), "'2000'");
    assert_clean_failure(&kiln(&["bench", "-r", "0"]), "'0'");
    assert_clean_failure(&kiln(&["bench", "--kv-type", "q4"]), "not a KV cache type");
    assert_clean_failure(
        &kiln(&["bench", "-p", "0", "-n", "0"]),
        "nothing to measure",
    );
    // The embedding benchmark is still a subcommand, and its flags do not mix with these.
    assert_clean_failure(
        &kiln(&["bench", "embed", "-f", "/no/such/file.txt"]),
        "/no/such/file.txt",
    );
    assert_clean_failure(&kiln(&["bench", "-p", "8", "embed"]), "error");
}
