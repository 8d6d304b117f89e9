//! Running the `kiln` binary from the integration tests (each test file uses part of this).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

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

/// Starts `kiln serve ARGS --port 0`: the child (kill it when done) and the `host:port` it
/// listens on. Its stderr is forwarded to ours, prefixed `[serve]`.
pub fn serve(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting kiln serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => {
                let _ = child.kill();
                panic!("kiln serve ended before listening");
            }
        };
        eprintln!("[serve] {line}");
        if let Some(at) = line.find("listening on http://") {
            let rest = &line[at + "listening on http://".len()..];
            break rest.split(['/', ' ']).next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("[serve] {line}");
        }
    });
    (child, addr)
}

/// `method` (`GET` or `POST`) of `path` on `addr` (`host:port`) with a JSON `body` (POST): the
/// response body, which must come with status 200.
pub fn http(method: &str, addr: &str, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connecting to kiln serve");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    body.to_string()
}

/// A POST of `body` (JSON) to `path` on `addr`: the response body (status 200).
pub fn post(addr: &str, path: &str, body: &str) -> String {
    http("POST", addr, path, body)
}
