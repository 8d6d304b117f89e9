//! `kiln serve` against the official `openai` Python client: starts the real server on Gemma 3
//! 270M (with the Gemma 3 chat template), the same GGUF as `base` (no template) and MiniLM, and
//! a second, tiny-queue server for the 429 check, then runs `tests/openai/test_kiln_serve.py`
//! (see its docstring for the checks) with the interpreter in `KILN_TEST_PYTHON` (default
//! `python3`).
//!
//! That interpreter needs the `openai` package. Without it the test prints why and passes, unless
//! `KILN_REQUIRE_OPENAI=1` (CI sets it, with a virtualenv of its own: see `.ci/run`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a server may take to load its models and listen.
const STARTUP: Duration = Duration::from_secs(120);
/// How long the Python suite may run.
const SUITE: Duration = Duration::from_secs(600);

/// A child process killed when dropped (also when the test panics).
struct Guard {
    name: &'static str,
    child: Child,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        eprintln!("[{}] stopped", self.name);
    }
}

/// A `kiln serve` being started: its guard and where its `listening on` address arrives.
struct Starting {
    guard: Guard,
    url: mpsc::Receiver<String>,
}

/// Starts `kiln serve ARGS --port 0`; its stderr lines are forwarded to ours, prefixed by `name`.
fn spawn_server(name: &'static str, args: &[&str]) -> Starting {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kiln serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("[{name}] {line}");
            if let Some(at) = line.find("listening on http://") {
                let rest = &line[at + "listening on ".len()..];
                let url = rest.split_whitespace().next().unwrap_or_default();
                let _ = tx.send(url.to_string());
            }
        }
    });
    Starting {
        guard: Guard { name, child },
        url: rx,
    }
}

/// Waits for the server's `listening on` line: its URL.
fn wait_listening(s: &Starting, started: Instant) -> String {
    let left = STARTUP.saturating_sub(started.elapsed());
    match s.url.recv_timeout(left) {
        Ok(url) => url,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("[{}] not listening after {STARTUP:?}", s.guard.name)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!(
                "[{}] exited before listening (its log is above)",
                s.guard.name
            )
        }
    }
}

/// Whether `python` can import `modules` (comma-separated); `Err` says why not.
fn has_modules(python: &str, modules: &str) -> Result<(), String> {
    match Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        // The traceback's last line says what is missing.
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim()
            .to_string()),
        Err(e) => Err(format!("cannot run {python}: {e}")),
    }
}

#[test]
fn openai_client_suite() {
    let python = std::env::var("KILN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    if !python_has(&python, "openai, httpx", "openai_client_suite") {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let template = root.join("tests/fixtures/gemma3-chat-template.jinja");
    let script = root.join("tests/openai/test_kiln_serve.py");
    let golden = root.join("../../tests/golden");
    assert!(
        golden.is_dir(),
        "{} is missing (the golden data is committed in tests/golden)",
        golden.display()
    );
    let template_arg = format!("gemma3-270m={}", template.display());

    // Both servers load at once; the second one only ever holds one running and one waiting
    // request, so most of a burst gets 429.
    let started = Instant::now();
    let main = spawn_server(
        "serve",
        &[
            "-m",
            "gemma3-270m",
            "-m",
            "minilm",
            "-m",
            "base=gemma3-270m",
            "--chat-template",
            &template_arg,
            // A pool the checks fill with cached prefixes before the soak, so that its VmRSS
            // baseline has every KV page resident (see check_soak); it still holds every
            // request of the suite at once (455 blocks of 16 positions in the f16 cache).
            "--kv-memory",
            "128",
            "--threads",
            "2",
        ],
    );
    let busy = spawn_server(
        "serve-busy",
        &[
            "-m",
            "gemma3-270m",
            "--max-running",
            "1",
            "--max-waiting",
            "1",
            "--kv-memory",
            "64",
            "--threads",
            "1",
        ],
    );
    let url = wait_listening(&main, started);
    let busy_url = wait_listening(&busy, started);
    eprintln!(
        "servers listening after {:.1} s: {url}, {busy_url}",
        started.elapsed().as_secs_f64()
    );

    run_suite(
        &python,
        &script,
        &[
            url.as_str(),
            &main.guard.child.id().to_string(),
            &golden.display().to_string(),
            "--busy-url",
            &busy_url,
        ],
        started,
    );
}

/// Runs `script ARGS` with `python` to its end (at most [`SUITE`]) and fails when it fails.
fn run_suite(python: &str, script: &Path, args: &[&str], started: Instant) {
    let name = script.file_name().unwrap().to_string_lossy().to_string();
    let suite_started = Instant::now();
    let mut suite = Guard {
        name: "python suite",
        child: Command::new(python)
            .arg(script)
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .spawn()
            .expect("starting the Python suite"),
    };
    let status = loop {
        if let Some(status) = suite.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            suite_started.elapsed() < SUITE,
            "{name} ran longer than {SUITE:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "{name} ran {:.1} s ({:.1} s with the servers' startup)",
        suite_started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "{name} failed ({status}); its FAIL lines and tracebacks are above"
    );
}

/// Whether `python` can import `modules`; without them the test says why and passes, unless
/// `KILN_REQUIRE_OPENAI=1` (CI), which fails it.
fn python_has(python: &str, modules: &str, test: &str) -> bool {
    let Err(why) = has_modules(python, modules) else {
        return true;
    };
    let msg = format!(
        "{python} cannot import {modules} ({why}); set KILN_TEST_PYTHON to an interpreter that \
         has them (pip install openai jsonschema)"
    );
    if std::env::var("KILN_REQUIRE_OPENAI").as_deref() == Ok("1") {
        panic!("KILN_REQUIRE_OPENAI=1: {msg}");
    }
    eprintln!("SKIPPED {test}: {msg}");
    false
}

/// Structured outputs and tool calls through the client (`tests/openai/test_structured.py`):
/// Gemma 3 270M with its chat template, in kiln's generic tool-call format.
#[test]
fn openai_structured_outputs_suite() {
    let python = std::env::var("KILN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    if !python_has(
        &python,
        "openai, jsonschema, pydantic",
        "openai_structured_outputs_suite",
    ) {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let template = root.join("tests/fixtures/gemma3-chat-template.jinja");
    let golden = root.join("../../tests/golden");
    let template_arg = format!("gemma3-270m={}", template.display());
    let started = Instant::now();
    let server = spawn_server(
        "serve-structured",
        &[
            "-m",
            "gemma3-270m",
            "--chat-template",
            &template_arg,
            "--kv-memory",
            "256",
            "--threads",
            "2",
        ],
    );
    let url = wait_listening(&server, started);
    run_suite(
        &python,
        &root.join("tests/openai/test_structured.py"),
        &[url.as_str(), &golden.display().to_string()],
        started,
    );
}
