//! `kiln plan` and the plan every model command makes before loading: the JSON report on the
//! real models, the probe's cache under `$KILN_HOME/probe/`, refusals with the numbers (memory
//! caps), and the GPU flags refused by name on a machine without a hardware GPU.
//!
//! The probe runs with `KILN_HOME` set to a fresh folder (the models are passed by path), so
//! these tests neither read nor write the user's cached machine profile.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

mod common;

/// The path `kiln pull` gives for a model alias (fetched into the default home if missing).
fn pulled(alias: &str) -> String {
    common::run_ok(&["pull", alias], "").trim().to_string()
}

fn temp_home(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-plan-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn plan_json(args: &[&str], home: &std::path::Path) -> (Value, String) {
    let mut all = vec!["plan", "--json", "-t", "2"];
    all.extend_from_slice(args);
    let out = common::run(&all, "", Some(home));
    assert!(
        out.status.success(),
        "kiln {all:?} failed:\n{}",
        stderr(&out)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), stderr(&out))
}

#[test]
fn gemma_plans_on_the_cpu_with_its_costs_and_a_prediction() {
    let model = pulled("gemma3-270m");
    let home = temp_home("gemma");
    let (v, err) = plan_json(&["-m", &model, "--ctx", "2048", "--batch", "4"], &home);
    assert!(err.contains("measuring this machine"), "{err}");
    assert_eq!(v["chosen"], "cpu", "{v:#}");
    let cost = &v["model_cost"];
    // 18 layers of one KV head of 256 (keys and values, f16 by default); the 15 layers with a
    // window of 512 keep a ring of 512 - 1 + 512 (one prompt piece) rows, 1,024 in blocks of 32.
    assert_eq!(cost["kv_dtype"], "f16");
    assert_eq!(cost["kv_bytes_per_token"], 18 * 2 * 256 * 2);
    assert_eq!(cost["kv_bytes"], (3 * 2048 + 15 * 1024) * 2 * 256 * 2 * 4);
    assert_eq!(cost["tied_output"], true);
    let layers = cost["layer_bytes"].as_array().unwrap();
    assert_eq!(layers.len(), 18);
    let total = cost["total_bytes"].as_u64().unwrap();
    let parts: u64 = layers.iter().map(|b| b.as_u64().unwrap()).sum::<u64>()
        + cost["embedding_bytes"].as_u64().unwrap()
        + cost["head_bytes"].as_u64().unwrap();
    assert_eq!(parts, total);
    // The file's size is its tensors plus the header.
    let file = std::fs::metadata(&model).unwrap().len();
    assert!(total < file && file - total < 8 << 20, "{total} of {file}");
    let cpu = &v["candidates"][0];
    assert_eq!(cpu["placement"]["kind"], "cpu");
    assert_eq!(cpu["fits"], true);
    let p = &cpu["prediction"];
    assert!(p["decode_tps"].as_f64().unwrap() > 1.0, "{p}");
    assert!(
        p["prefill_tps"].as_f64().unwrap() > p["decode_tps"].as_f64().unwrap() / 4.0,
        "{p}"
    );
    // The probe is cached: a second plan measures nothing.
    let cached: Vec<_> = std::fs::read_dir(home.join("probe")).unwrap().collect();
    assert_eq!(cached.len(), 1);
    let (again, err) = plan_json(&["-m", &model, "--kv-type", "f32"], &home);
    assert!(!err.contains("measuring"), "{err}");
    assert_eq!(
        again["hardware"]["bandwidth_bytes_per_s"],
        v["hardware"]["bandwidth_bytes_per_s"]
    );
    // An f32 cache takes twice the bytes.
    assert_eq!(again["model_cost"]["kv_dtype"], "f32");
    assert_eq!(again["model_cost"]["kv_bytes_per_token"], 18 * 2 * 256 * 4);
    let out = common::run(&["plan", "-m", &model, "--kv-type", "q8"], "", Some(&home));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a KV cache type"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn minilm_plans_batches_and_sentences_per_second() {
    let model = pulled("minilm");
    let home = temp_home("minilm");
    let (v, _) = plan_json(&["-m", &model, "--ctx", "128", "--batch", "32"], &home);
    assert_eq!(v["chosen"], "cpu");
    let p = &v["candidates"][0]["prediction"];
    assert!(p["sentences_per_s"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["decode_tps"].is_null());
    let max_batch = p["max_batch"][0][1].as_u64().unwrap();
    assert!(max_batch > 32, "{p}");
    assert_eq!(v["model_cost"]["kv_bytes_per_token"], Value::Null);
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn a_memory_cap_too_small_refuses_before_loading_with_the_numbers() {
    let model = pulled("gemma3-270m");
    let home = temp_home("refuse");
    let t0 = std::time::Instant::now();
    let out = common::run(
        &[
            "run",
            "-m",
            &model,
            "-p",
            "hi",
            "-n",
            "4",
            "--cpu-memory",
            "100",
        ],
        "",
        Some(&home),
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("fits on no device"), "{err}");
    assert!(
        err.contains("100.0 MiB free") && err.contains("weights 235.2 MiB"),
        "{err}"
    );
    assert!(
        err.contains("not loaded") && !err.contains("panicked"),
        "{err}"
    );
    assert!(t0.elapsed().as_secs() < 30);
    // `kiln plan` prints the table, says none fits and fails.
    let out = common::run(
        &["plan", "-m", &model, "--cpu-memory", "100"],
        "",
        Some(&home),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("| cpu | no |") && text.contains("chosen: none"),
        "{text}"
    );
    // An embedding model the same way.
    let minilm = pulled("minilm");
    let out = common::run(
        &["embed", "-m", &minilm, "--cpu-memory", "20", "hi"],
        "",
        Some(&home),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("fits on no device"),
        "{}",
        stderr(&out)
    );
    // With room, the same command runs and logs its plan.
    let out = common::run(
        &[
            "run",
            "-m",
            &model,
            "-p",
            "hi",
            "-n",
            "2",
            "--cpu-memory",
            "2000",
        ],
        "",
        Some(&home),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("plan: cpu"), "{}", stderr(&out));
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn gpu_flags_are_refused_by_name_without_a_gpu() {
    let model = pulled("gemma3-270m");
    let home = temp_home("gpu");
    // A backend kiln does not have is a usage error that lists the ones it has.
    let out = common::run(
        &["run", "-m", &model, "-p", "hi", "--backend", "cuda"],
        "",
        Some(&home),
    );
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("not a backend"),
        "{err}"
    );
    // `--gpu-layers` under `auto` needs a hardware GPU (a software Vulkan device is never
    // planned by auto): without one, it is refused by name.
    let hardware_gpu = kiln_vulkan::list_devices().is_ok_and(|l| {
        l.iter()
            .any(|d| d.unusable.is_none() && d.kind != kiln_vulkan::DeviceKind::Cpu)
    });
    if !hardware_gpu {
        for args in [
            vec!["run", "-m", &model, "-p", "hi", "--gpu-layers", "4"],
            vec!["plan", "-m", &model, "--gpu-layers", "4"],
        ] {
            let out = common::run(&args, "", Some(&home));
            let err = stderr(&out);
            assert!(!out.status.success(), "{args:?}: {err}");
            assert!(
                err.contains("no GPU to put layers on") && !err.contains("panicked"),
                "{args:?}: {err}"
            );
        }
    }
    std::fs::remove_dir_all(&home).unwrap();
}
