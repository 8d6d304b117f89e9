//! `--backend vulkan` where it cannot run, and `auto` around Vulkan devices: each case a clear
//! message (never a panic), and `auto` falling back to the CPU with a note saying why. The
//! goldens on a Vulkan device live beside the CPU's (golden_gemma3.rs, golden_minilm.rs,
//! families.rs).

use std::process::Command;

mod common;

const PROMPT: &[&str] = &["run", "-p", "Hello", "-n", "1", "--temp", "0"];

/// `kiln ARGS` with extra environment: (success, stderr).
fn kiln(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("starting kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn with(extra: &[&str]) -> Vec<String> {
    PROMPT.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn refused(args: &[String], env: &[(&str, &str)], want: &[&str]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, err) = kiln(&args, env);
    assert!(!ok, "kiln {args:?} succeeded");
    assert!(!err.contains("panicked"), "kiln {args:?} panicked: {err}");
    for w in want {
        assert!(err.contains(w), "kiln {args:?}: {w:?} not in:\n{err}");
    }
}

#[test]
fn a_backend_that_is_not_one_is_refused_by_name() {
    refused(&with(&["--backend", "metal"]), &[], &["not a backend"]);
    refused(&with(&["--backend", "vulkan:x"]), &[], &["is a number"]);
}

/// No Vulkan driver at all (the loader pointed at none): naming Vulkan is an error that says
/// so; `auto` runs on the CPU and says why it did not plan a GPU.
#[test]
fn without_a_vulkan_driver_auto_runs_on_the_cpu_and_says_so() {
    let none = [
        ("VK_ICD_FILENAMES", "/nonexistent/icd.json"),
        ("VK_DRIVER_FILES", "/nonexistent/icd.json"),
    ];
    refused(&with(&["--backend", "vulkan"]), &none, &["Vulkan"]);
    let args: Vec<String> = with(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, err) = kiln(&args, &none);
    assert!(ok, "auto without Vulkan: {err}");
    assert!(err.contains("no GPU") && err.contains("plan: cpu"), "{err}");
}

#[test]
fn a_device_that_is_not_there_or_too_small_is_refused_with_the_numbers() {
    if !common::vulkan("a_device_that_is_not_there") {
        return;
    }
    refused(
        &with(&["--backend", "vulkan:99"]),
        &[],
        &["vulkan:99", "device"],
    );
    // 1 MiB of device memory: the model fits on no device; the message has the bytes.
    refused(
        &with(&["--backend", "vulkan", "--gpu-memory", "1"]),
        &[],
        &["fits on no device", "MiB"],
    );
    // A split model generates only.
    let score = [
        "score",
        "--jsonl",
        "--backend",
        "vulkan",
        "--gpu-layers",
        "2",
    ];
    let (ok, err) = kiln(&score, &[]);
    assert!(!ok && err.contains("only generates"), "{err}");
}

/// A machine whose only Vulkan device is a software one (lavapipe): `auto` does not plan it
/// (it is slower than the CPU backend) and says so; naming it runs on it.
#[test]
fn auto_never_picks_a_software_device() {
    if !common::vulkan("auto_never_picks_a_software_device") {
        return;
    }
    let devices = kiln_vulkan::list_devices().unwrap();
    let usable: Vec<_> = devices.iter().filter(|d| d.unusable.is_none()).collect();
    if usable
        .iter()
        .any(|d| d.kind != kiln_vulkan::DeviceKind::Cpu)
    {
        eprintln!("a hardware GPU is here: auto may rightly plan it");
        return;
    }
    let args = with(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, err) = kiln(&args, &[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("software device") && err.contains("plan: cpu"),
        "{err}"
    );
    let args = with(&["--backend", "vulkan"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, err) = kiln(&args, &[]);
    assert!(ok, "{err}");
    assert!(err.contains("plan: vulkan:"), "{err}");
}

/// `kiln serve --backend vulkan` (continuous batching, paged KV cache) on a decoder fixture: a
/// greedy request gives the same tokens alone and among 16 others decoded with it.
#[test]
fn serve_on_vulkan_gives_a_request_the_same_tokens_alone_and_batched() {
    if !common::vulkan("serve_on_vulkan") {
        return;
    }
    serve_on_vulkan("llama", 12);
}

/// The same on Gemma 3 (window 8 on five layers of six), whose windowed layers have a KV pool
/// of their own in `kiln serve`: requests run far past the window, alone and batched.
#[test]
fn serve_on_vulkan_with_a_window_pool_gives_the_same_tokens_alone_and_batched() {
    if !common::vulkan("serve_on_vulkan_windowed") {
        return;
    }
    serve_on_vulkan("gemma3", 40);
}

fn serve_on_vulkan(family: &str, max_tokens: usize) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family);
    let fixture = fixture.to_str().unwrap();
    let (mut child, addr) =
        common::serve(&["-m", fixture, "--backend", "vulkan", "--kv-memory", "64"]);
    let request = |prompt: &str| {
        serde_json::json!({
            "model": family, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 1,
        })
        .to_string()
    };
    let tokens = |body: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["choices"][0]["logprobs"]["tokens"].clone()
    };
    let alone = tokens(&common::post(
        &addr,
        "/v1/completions",
        &request("The keeper wrote"),
    ));
    let others: Vec<_> = (0..16)
        .map(|i| {
            let (addr, body) = (
                addr.to_string(),
                request(&format!("Another prompt, number {i}, about the sea")),
            );
            std::thread::spawn(move || common::post(&addr, "/v1/completions", &body))
        })
        .collect();
    let batched = tokens(&common::post(
        &addr,
        "/v1/completions",
        &request("The keeper wrote"),
    ));
    for o in others {
        o.join().unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(alone.as_array().is_some_and(|a| !a.is_empty()), "{alone}");
    assert_eq!(alone, batched, "the same request alone and among 16 others");
}
