//! Running the `kiln` binary from the integration tests (each test file uses part of this).
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// Runs `kiln ARGS` with `stdin`, and `KILN_HOME` set to `home` when given. Stdin is written
/// from its own thread, so a large input cannot deadlock against a full stdout pipe.
pub fn run(args: &[&str], stdin: &str, home: Option<&Path>) -> Output {
    run_env(args, stdin, home, &[])
}

/// [`run`] with these environment variables set for kiln.
pub fn run_env(args: &[&str], stdin: &str, home: Option<&Path>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.envs(env.iter().copied());
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(home) = home {
        cmd.env("KILN_HOME", home);
    }
    let mut child = cmd.spawn().expect("starting kiln");
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_string();
    let writer = std::thread::spawn(move || pipe.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    // kiln may exit (on bad input) before reading all of stdin: a broken pipe is fine then.
    let _ = writer.join().unwrap();
    out
}

/// `kiln ARGS` that must succeed: its stdout (panics with its stderr otherwise).
pub fn run_ok(args: &[&str], stdin: &str) -> String {
    run_ok_env(args, stdin, &[])
}

/// [`run_ok`] with these environment variables set for kiln.
pub fn run_ok_env(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> String {
    let out = run_env(args, stdin, None, env);
    assert!(
        out.status.success(),
        "kiln {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Each line of `stdout` parsed as JSON.
pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Whether a usable Vulkan device is here for the tests that run kiln on one (`--backend
/// vulkan`). Without one they say so and pass, unless `KILN_REQUIRE_VULKAN=1` (CI), under which
/// this panics.
pub fn vulkan(test: &str) -> bool {
    let why = match kiln_vulkan::list_devices() {
        Ok(list) if list.iter().any(|d| d.unusable.is_none()) => return true,
        Ok(list) if list.is_empty() => "the Vulkan loader lists no device".to_string(),
        Ok(list) => format!(
            "no usable Vulkan device: {}",
            list.iter()
                .map(|d| format!("{} {}", d.name, d.unusable.as_deref().unwrap_or("")))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        Err(e) => e.to_string(),
    };
    kiln_vulkan::testing::unavailable(test, &why);
    false
}
