//! The HTTP server in-process, on the tiny random-weight Llama and ModernBERT fixtures, driven
//! with raw HTTP/1.1 (so that malformed bodies, invalid UTF-8 and dropped connections can be
//! sent): responses against the engine run directly, batch invariance, streaming, stop strings,
//! log-probabilities, errors, admission (429) and cancellation.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kiln_cpu::CpuBackend;
use kiln_engine::{generate, GenerateOptions, SamplingParams, SchedulerConfig, TextTokenizer};
use kiln_formats::GgufFile;
use kiln_tokenizer::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};

mod common;
use common::{
    decoder_entry, decoder_with_template, embed_entry, llama_path, serve, HERMES_TEMPLATE,
};

struct Server {
    addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
}

fn sched(max_running: usize, max_waiting: usize) -> SchedulerConfig {
    SchedulerConfig {
        n_blocks: 256,
        window_blocks: None,
        block_size: 16,
        max_step_tokens: 256,
        max_running,
        max_waiting,
    }
}

/// The fixture decoder as `tiny` (with the GGUF's chat template), a copy without a template as
/// `base`, and the ModernBERT fixture as `embed`.
fn start(cfg: SchedulerConfig) -> Server {
    let tools_template = ChatTemplate::new(HERMES_TEMPLATE, Default::default()).unwrap();
    let decoders = vec![
        decoder_entry("tiny", true, cfg.clone()),
        decoder_entry("base", false, cfg.clone()),
        decoder_with_template("tools", Some(tools_template), cfg),
    ];
    let (addr, rt) = serve(decoders, vec![embed_entry()]);
    Server { addr, _rt: rt }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body.
    fn events(&self) -> Vec<String> {
        String::from_utf8(self.body.clone())
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

/// Undoes `Transfer-Encoding: chunked`.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap().trim(), 16)
            .unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Reply {
    let mut s = send(addr, method, path, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked")
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, body.to_string().as_bytes())
}

/// Greedy generation on the contiguous-cache path, the reference for the server's output.
fn reference(prompt_text: &str, max_tokens: usize) -> String {
    reference_with(prompt_text, max_tokens, SamplingParams::greedy()).1
}

/// Generation with `sampling` on the contiguous-cache path: the ids (end tokens included) and
/// the text.
fn reference_with(
    prompt_text: &str,
    max_tokens: usize,
    sampling: SamplingParams,
) -> (Vec<u32>, String) {
    let file = GgufFile::open(&llama_path()).unwrap();
    let b = CpuBackend::new(1).unwrap();
    let model = kiln_models::load_gguf_decoder(&b, &file).unwrap();
    let tok = TextTokenizer::Gguf(Box::new(Tokenizer::from_gguf(&file).unwrap()));
    let ids = tok.encode(prompt_text, true, true).unwrap();
    let g = generate(
        &model.on(&b),
        &ids,
        &GenerateOptions {
            max_tokens,
            sampling,
            ignore_eos: false,
        },
        |id| tok.is_end_of_generation(id),
        |_| true,
    )
    .unwrap();
    let text_ids: Vec<u32> = g
        .ids
        .iter()
        .copied()
        .filter(|&i| !tok.is_end_of_generation(i))
        .collect();
    (g.ids.clone(), tok.decode(&text_ids, false))
}

fn texts(n: usize) -> Vec<String> {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "off", "far",
    ];
    (0..n)
        .map(|i| {
            (0..3 + i % 9)
                .map(|j| words[(i * 7 + j * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn completion(addr: SocketAddr, prompt: &str, max_tokens: usize) -> Value {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn completions_match_the_engine_and_concurrent_requests_match_lone_ones() {
    let server = start(sched(64, 256));
    let prompts = texts(32);
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let v = completion(server.addr, p, 24);
            v["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    for (p, got) in prompts.iter().zip(&alone).take(4) {
        assert_eq!(got, &reference(p, 24), "prompt {p:?}");
    }
    let addr = server.addr;
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let v = completion(addr, p, 24);
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    let v = completion(server.addr, &prompts[0], 24);
    let usage = &v["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );
    assert_eq!(v["object"], "text_completion");
}

#[test]
fn streams_carry_the_same_text_usage_and_done() {
    let server = start(sched(64, 256));
    let prompt = "the cat sat on the mat";
    let whole = completion(server.addr, prompt, 30);
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": prompt, "max_tokens": 30, "temperature": 0,
                   "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": prompt}],
                   "max_tokens": 30, "temperature": 0,
                   "stream": true, "stream_options": {"include_usage": true}}),
        ),
    ] {
        let r = post(server.addr, path, &body);
        assert_eq!(r.status, 200);
        assert!(r
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        let events = r.events();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let usage = &chunks.last().unwrap()["usage"];
        assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
        assert_eq!(chunks.last().unwrap()["choices"], json!([]));
        let mut text = String::new();
        let mut finish = None;
        for c in &chunks[..chunks.len() - 1] {
            assert!(c["usage"].is_null());
            let choice = &c["choices"][0];
            let piece = if path == "/v1/completions" {
                &choice["text"]
            } else {
                &choice["delta"]["content"]
            };
            text.push_str(piece.as_str().unwrap_or(""));
            if !choice["finish_reason"].is_null() {
                finish = Some(choice["finish_reason"].as_str().unwrap().to_string());
            }
        }
        assert!(finish.is_some());
        if path == "/v1/completions" {
            assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
            assert_eq!(usage, &whole["usage"]);
        } else {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        }
    }
}

#[test]
fn stop_strings_end_the_text_across_token_boundaries() {
    let server = start(sched(64, 256));
    let prompt = "then ran off far";
    let full = completion(server.addr, prompt, 40)["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 8, "the fixture generates text: {full:?}");
    // A stop string made of the middle of the output (it spans pieces of several tokens).
    let start = chars.len() / 3;
    let stop: String = chars[start..start + 3].iter().collect();
    let expected: String = full[..full.find(&stop).unwrap()].to_string();
    for stream in [false, true] {
        let r = post(
            server.addr,
            "/v1/completions",
            &json!({"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0,
                    "stop": [stop], "stream": stream}),
        );
        assert_eq!(r.status, 200);
        let (text, finish) = if stream {
            let mut text = String::new();
            let mut finish = String::new();
            for e in r.events().iter().filter(|e| *e != "[DONE]") {
                let c: Value = serde_json::from_str(e).unwrap();
                text.push_str(c["choices"][0]["text"].as_str().unwrap());
                if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
                    finish = f.to_string();
                }
            }
            (text, finish)
        } else {
            let v = r.json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(text, expected, "stream {stream}");
        assert_eq!(finish, "stop");
    }
}

#[test]
fn logprobs_echo_scoring_and_n_choices() {
    let server = start(sched(64, 256));
    // Greedy tokens are the most likely ones.
    let r = post(
        server.addr,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat"},
                {"role": "user", "content": "on the mat"}],
                "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let content = r.json()["choices"][0]["logprobs"]["content"].clone();
    let content = content.as_array().unwrap();
    assert!(!content.is_empty());
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["logprob"], t["logprob"]);
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
    }
    // Echo with max_tokens 0 scores the prompt: the first token has no log-probability, and
    // the sum over a prompt equals what scoring prompt + continuation reports for that part.
    let r = post(
        server.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "the cat sat on", "max_tokens": 0, "echo": true,
                "logprobs": 1}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], "the cat sat on");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let lp = &v["choices"][0]["logprobs"];
    let scored = lp["token_logprobs"].as_array().unwrap();
    assert!(scored[0].is_null() && lp["top_logprobs"][0].is_null());
    let r2 = post(
        server.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "the cat sat on a mat", "max_tokens": 0,
                "echo": true, "logprobs": 0}),
    );
    let longer = r2.json()["choices"][0]["logprobs"]["token_logprobs"].clone();
    for (a, b) in scored.iter().zip(longer.as_array().unwrap()).skip(1) {
        // The same positions computed in a forward pass of another length: equal up to f32
        // rounding.
        assert!(
            (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-4,
            "{a} vs {b}"
        );
    }
    // Echo while generating: the text starts with the prompt.
    let v = post(
        server.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "the cat", "max_tokens": 5, "echo": true,
                "temperature": 0}),
    )
    .json();
    assert!(v["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("the cat"));
    // n choices with a seed: reproducible, and indexed.
    let body = json!({"model": "tiny", "prompt": ["a cat", "the mat"], "max_tokens": 12,
                      "temperature": 1.5, "n": 3, "seed": 7});
    let a = post(server.addr, "/v1/completions", &body).json();
    let b = post(server.addr, "/v1/completions", &body).json();
    assert_eq!(a["choices"], b["choices"]);
    let idx: Vec<u64> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1, 2, 3, 4, 5]);
    let texts: std::collections::BTreeSet<&str> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert!(texts.len() > 1, "choices differ: {texts:?}");
}

fn error_of(r: &Reply) -> (u16, Value) {
    let v = r.json();
    let e = v["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    (r.status, e)
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let prompt = "the cat sat on";
    let (ids, _) = reference_with(prompt, 6, SamplingParams::greedy());
    let first = ids[0];
    let biased = |bias: Value| {
        let r = post(
            a,
            "/v1/completions",
            &json!({"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                    "logit_bias": bias}),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    // -100 on the greedy first token: the engine's greedy run with that bias, which differs.
    let banned = SamplingParams {
        logit_bias: vec![(first, -100.0)],
        ..SamplingParams::greedy()
    };
    let (ban_ids, ban_text) = reference_with(prompt, 6, banned);
    assert_ne!(ban_ids[0], first);
    assert_eq!(biased(json!({ first.to_string(): -100 })), ban_text);
    // +100 on one token: every step takes it.
    let forced_id = ban_ids[0];
    let forced = SamplingParams {
        logit_bias: vec![(forced_id, 100.0)],
        ..SamplingParams::greedy()
    };
    let (forced_ids, forced_text) = reference_with(prompt, 6, forced);
    assert!(forced_ids.iter().all(|&i| i == forced_id), "{forced_ids:?}");
    assert_eq!(biased(json!({ forced_id.to_string(): 100 })), forced_text);
    // Ids outside the vocabulary and biases out of range are 400s naming the field.
    for bias in [
        json!({"99999999": 1}),
        json!({"1": -100.5}),
        json!({"a": 1}),
    ] {
        let r = post(
            a,
            "/v1/completions",
            &json!({"model": "tiny", "prompt": prompt, "logit_bias": bias}),
        );
        let (status, err) = error_of(&r);
        assert_eq!(status, 400, "{bias}");
        assert_eq!(err["param"], "logit_bias", "{bias}: {err}");
    }
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        (
            "/v1/completions",
            b"{\"model\": \"tiny\", \"prompt\":".to_vec(),
            400,
            None,
        ),
        (
            "/v1/completions",
            b"{\"model\": \"tiny\", \"prompt\": \"\xff\xfe\"}".to_vec(),
            400,
            None,
        ),
        (
            "/v1/completions",
            br#"{"model": "tiny", "prompt": 12}"#.to_vec(),
            400,
            None,
        ),
        (
            "/v1/completions",
            br#"{"model": "nope", "prompt": "x"}"#.to_vec(),
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            br#"{"model": "tiny", "prompt": "x", "max_tokens": -1}"#.to_vec(),
            400,
            None,
        ),
        (
            "/v1/completions",
            br#"{"model": "tiny", "prompt": "x", "temperature": 5}"#.to_vec(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            br#"{"model": "tiny", "prompt": "x", "n": 1000}"#.to_vec(),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            br#"{"model": "tiny", "prompt": [[1, 2, 99999]]}"#.to_vec(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            br#"{"model": "embed", "prompt": "x"}"#.to_vec(),
            400,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            br#"{"model": "base", "messages": [{"role": "user", "content": "hi"}]}"#.to_vec(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            br#"{"model": "tiny", "messages": []}"#.to_vec(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            br#"{"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}"#.to_vec(),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/embeddings",
            br#"{"model": "embed", "input": ""}"#.to_vec(),
            400,
            Some("input"),
        ),
        (
            "/v1/embeddings",
            br#"{"model": "embed", "input": [[5, 999999]]}"#.to_vec(),
            400,
            Some("input"),
        ),
        (
            "/v1/embeddings",
            br#"{"model": "tiny", "input": "x"}"#.to_vec(),
            400,
            Some("model"),
        ),
        ("/v1/nothing", b"{}".to_vec(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let r = request(a, "POST", path, &body);
        let (got, e) = error_of(&r);
        assert_eq!(
            got,
            status,
            "{path} {}: {e}",
            String::from_utf8_lossy(&body)
        );
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{e}");
        }
    }
    // A prompt longer than the context (256 tokens): 400 naming both lengths.
    let long = "cat ".repeat(400);
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": long}),
    );
    let (status, e) = error_of(&r);
    assert_eq!(status, 400);
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("256"), "{msg}");
    // An empty text prompt is BOS alone (the fixture's tokenizer adds it), also when scored.
    let v = post(
        a,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "", "echo": true, "logprobs": 1, "max_tokens": 0}),
    )
    .json();
    assert_eq!(v["usage"]["prompt_tokens"], 1, "{v}");
    assert_eq!(v["choices"][0]["logprobs"]["token_logprobs"], json!([null]));
    // Still serving.
    assert_eq!(request(a, "GET", "/health", b"").status, 200);
    completion(a, "the cat", 3);
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let r = request(addr, "GET", "/metrics", b"");
    let text = String::from_utf8(r.body).unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l.contains("model=\"tiny\""))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_blocks() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let body = json!({"model": "tiny", "prompt": "the cat sat", "max_tokens": 200,
                      "temperature": 0.9, "stream": true});
    for _ in 0..8 {
        let mut s = send(a, "POST", "/v1/completions", body.to_string().as_bytes());
        let mut buf = [0u8; 512];
        // Read until the first event has arrived, then hang up.
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("data: ") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
        drop(s);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let used = metric(a, "kiln_kv_blocks_used");
        let running = metric(a, "kiln_running_sequences");
        if used == 0.0 && running == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks still used: {used}, running {running}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(a, "kiln_kv_blocks_free"), 256.0);
    completion(a, "the cat", 3);
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let server = start(sched(1, 1));
    let a = server.addr;
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                s.spawn(move || {
                    post(
                        a,
                        "/v1/completions",
                        &json!({"model": "tiny", "prompt": format!("the cat {i}"),
                                "max_tokens": 200, "temperature": 1.0}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut refused = 0;
    for r in &replies {
        match r.status {
            200 => {}
            429 => {
                refused += 1;
                assert_eq!(r.header("retry-after"), Some("1"));
                assert_eq!(r.json()["error"]["type"], "rate_limit_error");
            }
            s => panic!("status {s}: {}", String::from_utf8_lossy(&r.body)),
        }
    }
    assert!(refused > 0, "16 concurrent requests into a queue of 1");
    assert!(refused < 16);
}

#[test]
fn embeddings_floats_base64_ids_and_batch_invariance() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let inputs = texts(32);
    let alone: Vec<Vec<f64>> = inputs
        .iter()
        .map(|t| {
            let r = post(a, "/v1/embeddings", &json!({"model": "embed", "input": t}));
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let v = r.json();
            v["data"][0]["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    let together: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = inputs
            .iter()
            .map(|t| {
                s.spawn(move || {
                    let v =
                        post(a, "/v1/embeddings", &json!({"model": "embed", "input": t})).json();
                    v["data"][0]["embedding"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let worst = together
        .iter()
        .flatten()
        .zip(alone.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert_eq!(
        together, alone,
        "concurrent embeddings equal lone ones (max diff {worst:e})"
    );
    // `dimensions`: the first values, renormalized; more than the model has is a 400.
    let short = post(
        a,
        "/v1/embeddings",
        &json!({"model": "embed", "input": inputs[0], "dimensions": 8}),
    )
    .json();
    let short: Vec<f64> = short["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(short.len(), 8);
    let norm = alone[0][..8].iter().map(|x| x * x).sum::<f64>().sqrt();
    for (s, full) in short.iter().zip(&alone[0]) {
        assert!((s - full / norm).abs() < 1e-6, "{s} vs {}", full / norm);
    }
    let width = alone[0].len();
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"model": "embed", "input": "x", "dimensions": width + 1}),
    );
    let (status, err) = error_of(&r);
    assert_eq!(
        (status, err["param"].as_str()),
        (400, Some("dimensions")),
        "{err}"
    );
    // A list in one request, and base64.
    let v = post(
        a,
        "/v1/embeddings",
        &json!({"model": "embed", "input": inputs[..3], "encoding_format": "base64"}),
    )
    .json();
    for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["index"], i);
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(d["embedding"].as_str().unwrap())
            .unwrap();
        let floats: Vec<f64> = bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect();
        // Packed with two other inputs: equal to the lone vectors up to f32 rounding.
        for (x, y) in floats.iter().zip(&alone[i]) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    // Token ids.
    let v = post(
        a,
        "/v1/embeddings",
        &json!({"model": "embed", "input": [[5, 6, 7], [8, 9]]}),
    );
    assert_eq!(v.status, 200);
    assert_eq!(v.json()["usage"]["prompt_tokens"], 5);
}

#[test]
fn models_health_and_metrics() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let v = request(a, "GET", "/v1/models", b"").json();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["tiny", "base", "tools", "embed"]);
    assert_eq!(request(a, "GET", "/health", b"").json()["status"], "ok");
    completion(a, "the cat", 5);
    let m = request(a, "GET", "/metrics", b"");
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    let text = String::from_utf8(m.body).unwrap();
    for needle in [
        "kiln_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1",
        "kiln_time_to_first_token_seconds_count{model=\"tiny\"} 1",
        "kiln_time_per_output_token_seconds_count{model=\"tiny\"} 4",
        "kiln_generation_tokens_total{model=\"tiny\"} 5",
        "kiln_kv_blocks_free{model=\"tiny\"} 256",
        "kiln_running_sequences{model=\"tiny\"} 0",
        "kiln_prefix_cache_hit_rate{model=\"tiny\"}",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
}

#[test]
fn a_shared_prompt_prefix_hits_the_cache() {
    let server = start(sched(64, 256));
    let a = server.addr;
    // 80 tokens of shared prefix as ids (5 full blocks of 16), then different tails.
    let prefix: Vec<u32> = (0..80).map(|i| 1 + (i * 37 % 390)).collect();
    let with_tail = |t: u32| {
        let mut p = prefix.clone();
        p.extend([t, t + 1, t + 2]);
        json!({"model": "tiny", "prompt": [p], "max_tokens": 4, "temperature": 0})
    };
    let hits = |a| metric(a, "kiln_prefix_cache_hit_blocks_total");
    assert_eq!(hits(a), 0.0);
    assert_eq!(post(a, "/v1/completions", &with_tail(5)).status, 200);
    assert_eq!(hits(a), 0.0, "nothing cached before the first request");
    assert_eq!(post(a, "/v1/completions", &with_tail(9)).status, 200);
    assert_eq!(hits(a), 5.0, "the second request finds the 5 shared blocks");
    let rate = metric(a, "kiln_prefix_cache_hit_rate");
    assert!(rate > 0.0 && rate <= 1.0, "{rate}");
}

/// A tiny JSON-schema check for the fixtures' schemas (types, required keys, enums, bounds,
/// no extra keys), so that these tests need no validator crate.
fn conforms(v: &Value, schema: &Value) -> bool {
    if let Some(options) = schema["enum"].as_array() {
        return options.contains(v);
    }
    match schema["type"].as_str() {
        Some("object") => {
            let Some(o) = v.as_object() else { return false };
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let required = schema["required"].as_array().cloned().unwrap_or_default();
            required.iter().all(|k| o.contains_key(k.as_str().unwrap()))
                && o.iter()
                    .all(|(k, x)| props.get(k).is_some_and(|s| conforms(x, s)))
        }
        Some("array") => v.as_array().is_some_and(|a| {
            a.len() as u64 <= schema["maxItems"].as_u64().unwrap_or(u64::MAX)
                && a.iter().all(|x| conforms(x, &schema["items"]))
        }),
        Some("string") => v.as_str().is_some_and(|s| {
            s.chars().count() as u64 <= schema["maxLength"].as_u64().unwrap_or(u64::MAX)
        }),
        Some("integer") => v.as_i64().is_some_and(|i| {
            i >= schema["minimum"].as_i64().unwrap_or(i64::MIN)
                && i <= schema["maximum"].as_i64().unwrap_or(i64::MAX)
        }),
        Some("boolean") => v.is_boolean(),
        _ => true,
    }
}

#[test]
fn response_format_constrains_chat_and_completions_to_json_and_regexes() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog", null]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["name", "age", "pet", "tags"],
        "additionalProperties": false,
    });
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "person", "schema": schema, "strict": true}});
    let mut stopped = 0;
    for (path, seed) in [("/v1/chat/completions", 1), ("/v1/completions", 2)] {
        let mut body = json!({"model": "tiny", "max_tokens": 600, "temperature": 1,
            "seed": seed, "n": 4, "response_format": format});
        if path.contains("chat") {
            body["messages"] = json!([{"role": "user", "content": "Who are you?"}]);
        } else {
            body["prompt"] = json!("A person:");
        }
        let r = post(a, path, &body);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        let mut whole = Vec::new();
        for c in v["choices"].as_array().unwrap() {
            let text = c["message"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .unwrap()
                .to_string();
            if c["finish_reason"] == "stop" {
                stopped += 1;
                let parsed: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
                assert!(
                    conforms(&parsed, &schema),
                    "{path}: {parsed} breaks the schema"
                );
            } else {
                assert_eq!(c["finish_reason"], "length", "{c}");
            }
            whole.push(text);
        }
        // Streamed, the same seeds give the same texts.
        body["stream"] = json!(true);
        let r = post(a, path, &body);
        let mut streamed = vec![String::new(); 4];
        for e in r.events() {
            if e == "[DONE]" {
                break;
            }
            let c: Value = serde_json::from_str(&e).unwrap();
            let c = &c["choices"][0];
            let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
            streamed[c["index"].as_u64().unwrap() as usize].push_str(piece.unwrap_or(""));
        }
        assert_eq!(streamed, whole, "{path}: streamed");
    }
    assert!(
        stopped >= 6,
        "only {stopped} of 8 outputs ended by the grammar"
    );
    // Any JSON object; a regex (kiln's extension), matched whole.
    for (format, check) in [
        (
            json!({"type": "json_object"}),
            Box::new(|t: &str| serde_json::from_str::<Value>(t).is_ok_and(|v| v.is_object()))
                as Box<dyn Fn(&str) -> bool>,
        ),
        (
            json!({"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"}),
            Box::new(|t: &str| {
                t.len() == 6
                    && t[..3].bytes().all(|b| b.is_ascii_digit())
                    && &t[3..4] == "-"
                    && t[4..].bytes().all(|b| b.is_ascii_lowercase())
            }),
        ),
    ] {
        for seed in 0..3 {
            let r = post(
                a,
                "/v1/completions",
                &json!({"model": "tiny", "prompt": "x", "max_tokens": 200, "seed": seed,
                        "response_format": format}),
            );
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let c = &r.json()["choices"][0];
            let text = c["text"].as_str().unwrap();
            if c["finish_reason"] == "stop" {
                assert!(check(text), "{format}: {text:?}");
            }
        }
    }
}

#[test]
fn bad_response_formats_are_400s_naming_the_field() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let js = |schema: Value, strict: bool| {
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                       "strict": strict}})
    };
    for (format, param) in [
        (json!("json"), "response_format"),
        (json!({"type": "yaml"}), "response_format.type"),
        (json!({}), "response_format.type"),
        (
            json!({"type": "json_schema"}),
            "response_format.json_schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            "response_format.json_schema.name",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "a b"}}),
            "response_format.json_schema.name",
        ),
        (js(json!([1]), false), "response_format.json_schema.schema"),
        (
            js(
                json!({"type": "object", "properties": {"a": {"type": "string"}}}),
                true,
            ),
            "response_format.json_schema.schema",
        ),
        (
            js(
                json!({"type": "object", "properties": {"a": {"type": "string"}},
                       "additionalProperties": false}),
                true,
            ),
            "response_format.json_schema.schema",
        ),
        (js(json!({"type": "frobnicate"}), false), "response_format"),
        (
            js(json!({"$ref": "#/$defs/missing"}), false),
            "response_format",
        ),
        (
            json!({"type": "regex", "regex": "(unclosed"}),
            "response_format",
        ),
        (json!({"type": "regex"}), "response_format.regex"),
        (
            json!({"type": "lark", "lark": "start: undefined_rule"}),
            "response_format",
        ),
    ] {
        let r = post(
            a,
            "/v1/chat/completions",
            &json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                    "response_format": format}),
        );
        let (status, err) = error_of(&r);
        assert_eq!(
            (status, err["param"].as_str()),
            (400, Some(param)),
            "{format}: {err}"
        );
    }
    // The server still serves, constrained and not.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "x", "max_tokens": 3,
                "response_format": {"type": "text"}}),
    );
    assert_eq!(r.status, 200);
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {
                "zone": {"type": "integer", "minimum": -12, "maximum": 14}},
                "required": ["zone"], "additionalProperties": false}}},
    ])
}

/// A chat request's answer, streamed and reassembled as OpenAI's clients do, checking vLLM's
/// invariants on the way: the role once, each call's id (at least 9 characters) and name once,
/// then its arguments; one finish_reason. Returns (content, calls as (id, name, arguments),
/// finish_reason).
fn streamed_chat(a: SocketAddr, body: &Value) -> (String, Vec<(String, String, String)>, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = post(a, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (mut content, mut calls, mut finish, mut roles) = (String::new(), Vec::new(), None, 0);
    for e in r.events() {
        if e == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&e).unwrap();
        let c = &c["choices"][0];
        let d = &c["delta"];
        roles += usize::from(d.get("role").is_some());
        content.push_str(d["content"].as_str().unwrap_or(""));
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().unwrap() as usize;
            if let Some(id) = t["id"].as_str() {
                assert_eq!(i, calls.len(), "a call opens once, in order: {e}");
                assert!(id.len() >= 9, "{id}");
                assert_eq!(t["type"], "function");
                let name = t["function"]["name"]
                    .as_str()
                    .expect("the name with the id");
                calls.push((id.to_string(), name.to_string(), String::new()));
            } else {
                assert!(t["function"].get("name").is_none(), "the name once: {e}");
            }
            calls[i]
                .2
                .push_str(t["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            assert!(finish.is_none(), "one finish_reason");
            finish = Some(f.to_string());
        }
    }
    assert_eq!(roles, 1, "the role once");
    (content, calls, finish.expect("a finish_reason"))
}

#[test]
fn tool_choices_constrain_and_report_calls_whole_and_streamed() {
    let server = start(sched(64, 256));
    let a = server.addr;
    let tools = weather_tools();
    let schemas: Vec<(String, Value)> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["function"]["name"].as_str().unwrap().to_string(),
                t["function"]["parameters"].clone(),
            )
        })
        .collect();
    let messages = json!([
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc123xyz",
            "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_abc123xyz", "content": "9:00"},
        {"role": "user", "content": "Oslo?"},
    ]);
    let mut called = 0;
    for (choice, parallel) in [
        (json!("required"), false),
        (json!("required"), true),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            true,
        ),
    ] {
        for seed in 0..3 {
            let body = json!({"model": "tools", "messages": messages, "tools": tools,
                "tool_choice": choice, "parallel_tool_calls": parallel, "temperature": 1,
                "seed": seed, "max_tokens": 400});
            let r = post(a, "/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let v = r.json();
            let c = &v["choices"][0];
            let finish = c["finish_reason"].as_str().unwrap().to_string();
            let list = c["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut whole = Vec::new();
            for t in &list {
                let name = t["function"]["name"].as_str().unwrap();
                let args = t["function"]["arguments"].as_str().unwrap();
                whole.push((name.to_string(), args.to_string()));
            }
            if finish == "tool_calls" {
                called += 1;
                assert!(c["message"]["content"].is_null(), "{c}");
                if !parallel {
                    assert_eq!(list.len(), 1, "{c}");
                }
                for (name, args) in &whole {
                    if choice.is_object() {
                        assert_eq!(name, "get_time");
                    }
                    let schema = &schemas.iter().find(|(n, _)| n == name).expect("a tool").1;
                    let parsed: Value = serde_json::from_str(args)
                        .unwrap_or_else(|e| panic!("arguments not JSON ({e}): {args}"));
                    assert!(conforms(&parsed, schema), "{name}: {parsed}");
                }
            } else {
                assert_eq!(finish, "length", "{c}");
            }
            // Streamed: the same calls, in deltas.
            let (content, calls, s_finish) = streamed_chat(a, &body);
            assert_eq!(s_finish, finish);
            assert_eq!(content, "");
            let streamed: Vec<(String, String)> =
                calls.into_iter().map(|(_, n, args)| (n, args)).collect();
            assert_eq!(streamed, whole, "{choice} seed {seed}");
        }
    }
    assert!(
        called >= 6,
        "only {called} of 9 answers ended with their calls"
    );
    // `none`: no call, text content.
    let body = json!({"model": "tools", "messages": messages, "tools": tools,
        "tool_choice": "none", "max_tokens": 8, "temperature": 0});
    let v = post(a, "/v1/chat/completions", &body).json();
    let c = &v["choices"][0];
    assert!(c["message"].get("tool_calls").is_none(), "{c}");
    assert!(c["message"]["content"].is_string(), "{c}");
    assert_ne!(c["finish_reason"], "tool_calls");
    // `auto`: text or calls; whichever, streamed equals whole.
    for seed in 0..3 {
        let body = json!({"model": "tools", "messages": messages, "tools": tools,
            "temperature": 1, "seed": seed, "max_tokens": 60});
        let v = post(a, "/v1/chat/completions", &body).json();
        let c = &v["choices"][0];
        let (content, calls, finish) = streamed_chat(a, &body);
        assert_eq!(finish, c["finish_reason"]);
        assert_eq!(content, c["message"]["content"].as_str().unwrap_or(""));
        assert_eq!(
            calls.len(),
            c["message"]["tool_calls"].as_array().map_or(0, Vec::len)
        );
    }
}
