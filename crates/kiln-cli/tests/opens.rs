//! Each command opens each file of its model once: `kiln` runs under `strace`, and every
//! `open`/`openat` of a path inside the model (a GGUF file, or a folder's config, tokenizer and
//! safetensors) is counted. The plan reads the model's costs from the same open file the weights
//! are then loaded from (a GGUF file read into memory is copied from the handle it was mapped
//! with), so a second open anywhere on the way from the arguments to the engine fails here.
//!
//! `strace` is a Debian package (`.ci/run` installs it and sets `KILN_REQUIRE_STRACE=1`, so the
//! test cannot skip in CI); elsewhere the test skips, saying so, when it is missing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(rel)
}

fn strace_available() -> bool {
    let found = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found && std::env::var_os("KILN_REQUIRE_STRACE").is_some() {
        panic!("strace is missing and KILN_REQUIRE_STRACE is set (apt-get install strace)");
    }
    found
}

/// `strace` of `kiln ARGS`, its opens written to `log`.
fn traced(args: &[&str], log: &Path) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-e", "trace=open,openat", "-o"])
        .arg(log)
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdin(Stdio::null());
    cmd
}

fn log_path(args: &[&str]) -> PathBuf {
    let name = format!("strace-{}.log", args.join("-").replace('/', "_"));
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(&name[..name.len().min(200)])
}

/// Runs `kiln ARGS` under strace and counts the successful opens of each path under `model`.
fn opens(args: &[&str], model: &Path) -> BTreeMap<String, usize> {
    let log = log_path(args);
    let out = traced(args, &log).output().expect("running strace");
    assert!(
        out.status.success(),
        "kiln {args:?} failed under strace:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    count_opens(&log, model)
}

/// The successful opens of each path under `model` in the strace log `log` (then removed).
fn count_opens(log: &Path, model: &Path) -> BTreeMap<String, usize> {
    let trace = std::fs::read_to_string(log).unwrap();
    let _ = std::fs::remove_file(log);
    let model = model.canonicalize().unwrap();
    let mut counts = BTreeMap::new();
    for line in trace.lines().filter(|l| !l.contains("= -1")) {
        let Some(path) = line.split('"').nth(1) else {
            continue;
        };
        let Ok(path) = Path::new(path).canonicalize() else {
            continue;
        };
        if path.starts_with(&model) {
            *counts.entry(path.display().to_string()).or_default() += 1;
        }
    }
    counts
}

/// `kiln ARGS` opened each of `files` (paths relative to `model`, or `model` itself for "")
/// exactly once, and nothing else inside it more than once.
fn assert_once(args: &[&str], model: &Path, files: &[&str]) {
    check_once(args, &opens(args, model), model, files);
}

fn check_once(args: &[&str], counts: &BTreeMap<String, usize>, model: &Path, files: &[&str]) {
    let model = model.canonicalize().unwrap();
    for file in files {
        let path = if file.is_empty() {
            model.clone()
        } else {
            model.join(file)
        };
        let n = counts
            .get(&path.display().to_string())
            .copied()
            .unwrap_or(0);
        assert_eq!(n, 1, "kiln {args:?} opened {} {n} times", path.display());
    }
    for (path, n) in counts {
        assert_eq!(*n, 1, "kiln {args:?} opened {path} {n} times");
    }
}

fn kiln_home_model(alias: &str) -> PathBuf {
    let home = std::env::var_os("KILN_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/kiln"),
        PathBuf::from,
    );
    home.join("models").join(alias)
}

#[test]
fn run_opens_the_default_gguf_once() {
    if !strace_available() {
        eprintln!("SKIPPED: strace is not installed");
        return;
    }
    // The default model (fetched on first use), read into memory as by default.
    let args = [
        "run",
        "-p",
        "The capital of France is",
        "-n",
        "1",
        "--temp",
        "0",
    ];
    // Fetch it first (not under strace), so that the fetch's own reads are not counted.
    common_fetch(&args);
    let gguf = kiln_home_model("gemma3-270m").join("gemma-3-270m-q4_k_m.gguf");
    assert_once(&args, &gguf, &[""]);
    // Mapped instead: once as well.
    assert_once(
        &["run", "-p", "Hi", "-n", "1", "--temp", "0", "--mmap"],
        &gguf,
        &[""],
    );
}

/// Runs `kiln ARGS` once without strace (fetching an alias on first use).
fn common_fetch(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn decoder_commands_open_a_folder_s_files_once() {
    if !strace_available() {
        eprintln!("SKIPPED: strace is not installed");
        return;
    }
    let dir = fixture("llama");
    let d = dir.to_str().unwrap();
    let files = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    assert_once(
        &["run", "-m", d, "-p", "Hi", "-n", "1", "--temp", "0"],
        &dir,
        &files,
    );
    assert_once(&["tokenize", "-m", d, "Hi there"], &dir, &files);
    // The GGUF llama.cpp's converter made of the same folder.
    let gguf = dir.join("model-f32.gguf");
    let g = gguf.to_str().unwrap();
    assert_once(
        &["run", "-m", g, "-p", "Hi", "-n", "1", "--temp", "0"],
        &gguf,
        &[""],
    );
    assert_once(
        &[
            "bench", "-m", g, "-p", "8", "-n", "4", "-r", "1", "-t", "1,2",
        ],
        &gguf,
        &[""],
    );
    assert_once(&["score", "-m", g, "--jsonl"], &gguf, &[""]);
    assert_once(&["plan", "-m", g], &gguf, &[""]);
}

#[test]
fn embed_opens_the_folder_s_files_once() {
    if !strace_available() {
        eprintln!("SKIPPED: strace is not installed");
        return;
    }
    common_fetch(&["embed", "hello"]);
    let dir = kiln_home_model("minilm");
    assert_once(
        &["embed", "hello", "world"],
        &dir,
        &[
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "modules.json",
        ],
    );
}

#[test]
fn serve_opens_each_model_once() {
    if !strace_available() {
        eprintln!("SKIPPED: strace is not installed");
        return;
    }
    common_fetch(&["embed", "hello"]);
    let gguf = fixture("llama").join("model-f32.gguf");
    let encoder = kiln_home_model("minilm");
    let args = [
        "serve",
        "-m",
        gguf.to_str().unwrap(),
        "-m",
        "minilm",
        "--port",
        "0",
        "--kv-memory",
        "16",
    ];
    let log = log_path(&args);
    let mut strace = traced(&args, &log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running strace");
    // Wait for the server to listen (both models loaded), then stop it as a user would.
    let stderr = strace.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on http://") {
                let _ = tx.send(());
            }
        }
    });
    let started = Instant::now();
    let listening = rx.recv_timeout(Duration::from_secs(120));
    // kiln is strace's child: signal it (strace then exits with it).
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", strace.id()))
        .unwrap_or_default();
    for pid in children.split_whitespace() {
        let _ = Command::new("kill").args(["-TERM", pid]).status();
    }
    let status = strace.wait().unwrap();
    assert!(
        listening.is_ok(),
        "kiln serve did not listen within {:?}",
        started.elapsed()
    );
    assert!(status.success(), "kiln serve under strace: {status}");
    let counts = count_opens(&log, Path::new("/"));
    let under = |root: &Path| -> BTreeMap<String, usize> {
        let root = root.canonicalize().unwrap();
        counts
            .iter()
            .filter(|(p, _)| Path::new(p).starts_with(&root))
            .map(|(p, n)| (p.clone(), *n))
            .collect()
    };
    check_once(&args, &under(&gguf), &gguf, &[""]);
    check_once(
        &args,
        &under(&encoder),
        &encoder,
        &["config.json", "model.safetensors", "tokenizer.json"],
    );
}
