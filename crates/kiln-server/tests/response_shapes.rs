//! The JSON the server answers with, pinned by shape: for representative requests against the
//! tiny fixture decoder and embedder, every response body (and every SSE event) is reduced to a
//! skeleton that keeps its keys in the order they are sent, and each value's kind (`str`, `int`,
//! `float`, `bool`, `null`, objects and arrays). So a field that is renamed, reordered, dropped,
//! or turns from `null` into absent (or back) fails here, while the generated text may vary.

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kiln_engine::SchedulerConfig;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::json;

mod common;
use common::{decoder_entry, embed_entry, serve};

/// The fixture decoder as `tiny` (with its chat template) and the ModernBERT fixture as
/// `embed`, served on a local port.
fn start() -> (SocketAddr, tokio::runtime::Runtime) {
    let sched = SchedulerConfig {
        n_blocks: 256,
        window_blocks: None,
        block_size: 16,
        max_step_tokens: 256,
        max_running: 64,
        max_waiting: 256,
    };
    serve(
        vec![decoder_entry("tiny", true, sched)],
        vec![embed_entry()],
    )
}

/// Status, content type and body of one request (HTTP/1.1, `Connection: close`).
fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_string())
    };
    let mut body = raw[split + 4..].to_vec();
    if header("transfer-encoding").as_deref() == Some("chunked") {
        let mut rest = &body[..];
        let mut out = Vec::new();
        loop {
            let end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..end]).unwrap().trim(), 16)
                .unwrap();
            rest = &rest[end + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = out;
    }
    let kind = header("content-type").unwrap_or_default();
    (status, kind, String::from_utf8(body).unwrap())
}

/// The fields of the API (kept by name in a skeleton); other keys are data (the tokens of a
/// completion's `top_logprobs`) and read `*`.
const FIELDS: &[&str] = &[
    "bytes",
    "choices",
    "code",
    "completion_tokens",
    "content",
    "created",
    "data",
    "delta",
    "embedding",
    "error",
    "finish_reason",
    "id",
    "index",
    "logprob",
    "logprobs",
    "message",
    "model",
    "object",
    "owned_by",
    "param",
    "prompt_tokens",
    "refusal",
    "role",
    "status",
    "stopped_models",
    "text",
    "text_offset",
    "token",
    "token_logprobs",
    "tokens",
    "top_logprobs",
    "total_tokens",
    "type",
    "usage",
];

/// Reads JSON text into its skeleton, keys in the order they appear in the text. Runs of equal
/// array elements (or equal `*` entries) read as one.
#[derive(Clone, Copy)]
struct Skeleton;

impl<'de> DeserializeSeed<'de> for Skeleton {
    type Value = String;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

fn push_unless_repeated(out: &mut Vec<String>, item: String) {
    if out.last() != Some(&item) {
        out.push(item);
    }
}

impl<'de> Visitor<'de> for Skeleton {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<String, E> {
        Ok("bool".into())
    }
    fn visit_u64<E>(self, _: u64) -> Result<String, E> {
        Ok("int".into())
    }
    fn visit_i64<E>(self, _: i64) -> Result<String, E> {
        Ok("int".into())
    }
    fn visit_f64<E>(self, _: f64) -> Result<String, E> {
        Ok("float".into())
    }
    fn visit_str<E>(self, _: &str) -> Result<String, E> {
        Ok("str".into())
    }
    fn visit_unit<E>(self) -> Result<String, E> {
        Ok("null".into())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            push_unless_repeated(&mut items, item);
        }
        Ok(format!("[{}]", items.join(",")))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            let key = if FIELDS.contains(&key.as_str()) {
                key
            } else {
                "*".to_string()
            };
            push_unless_repeated(&mut entries, format!("{key}:{value}"));
        }
        Ok(format!("{{{}}}", entries.join(",")))
    }
}

fn skeleton(text: &str) -> String {
    let mut de = serde_json::Deserializer::from_str(text);
    let s = Skeleton
        .deserialize(&mut de)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    de.end().unwrap();
    s
}

/// A response's skeleton: `status body` for JSON, and for an SSE stream `status` then one line
/// per run of events with the same skeleton.
fn shape(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let (status, kind, text) = request(addr, method, path, body.as_bytes());
    if kind.starts_with("text/event-stream") {
        let mut lines = Vec::new();
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let line = if data == "[DONE]" {
                data.to_string()
            } else {
                skeleton(data)
            };
            push_unless_repeated(&mut lines, line);
        }
        format!("{status}\n{}", lines.join("\n"))
    } else {
        assert!(kind.starts_with("application/json"), "{kind}: {text}");
        format!("{status} {}", skeleton(&text))
    }
}

const USAGE: &str = "usage:{completion_tokens:int,prompt_tokens:int,total_tokens:int}";

#[test]
fn every_response_keeps_its_json_shape() {
    let (addr, _rt) = start();
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "the cat"}],
                              "max_tokens": 4, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        shape(addr, "POST", "/v1/chat/completions", &body.to_string())
    };
    let completion = |extra: serde_json::Value| {
        let mut body = json!({"model": "tiny", "prompt": "the cat", "max_tokens": 4,
                              "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        shape(addr, "POST", "/v1/completions", &body.to_string())
    };
    let embeddings = |extra: serde_json::Value| {
        let mut body = json!({"model": "embed", "input": ["the cat", "a mat"]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        shape(addr, "POST", "/v1/embeddings", &body.to_string())
    };
    let cases: Vec<(&str, String, String)> = vec![
        (
            "models",
            shape(addr, "GET", "/v1/models", ""),
            "200 {data:[{created:int,id:str,object:str,owned_by:str}],object:str}".into(),
        ),
        (
            "health",
            shape(addr, "GET", "/health", ""),
            "200 {status:str}".into(),
        ),
        (
            "no route",
            shape(addr, "GET", "/v1/nope", ""),
            "404 {error:{code:str,message:str,param:null,type:str}}".into(),
        ),
        (
            "bad body",
            shape(addr, "POST", "/v1/completions", "{"),
            "400 {error:{code:null,message:str,param:null,type:str}}".into(),
        ),
        (
            "bad parameter",
            chat(json!({"temperature": 5})),
            "400 {error:{code:null,message:str,param:str,type:str}}".into(),
        ),
        (
            "unknown model",
            shape(
                addr,
                "POST",
                "/v1/embeddings",
                r#"{"model": "gpt-9", "input": "x"}"#,
            ),
            "404 {error:{code:str,message:str,param:str,type:str}}".into(),
        ),
        (
            "chat",
            chat(json!({})),
            format!(
                "200 {{choices:[{{finish_reason:str,index:int,logprobs:null,\
                 message:{{content:str,role:str}}}}],created:int,id:str,model:str,object:str,\
                 {USAGE}}}"
            ),
        ),
        (
            "chat, logprobs, n 2",
            chat(json!({"logprobs": true, "top_logprobs": 2, "n": 2})),
            format!(
                "200 {{choices:[{{finish_reason:str,index:int,logprobs:{{content:[{{bytes:[int],\
                 logprob:float,token:str,top_logprobs:[{{bytes:[int],logprob:float,token:str}}]}}],\
                 refusal:null}},message:{{content:str,role:str}}}}],created:int,id:str,model:str,\
                 object:str,{USAGE}}}"
            ),
        ),
        (
            "completion",
            completion(json!({})),
            format!(
                "200 {{choices:[{{finish_reason:str,index:int,logprobs:null,text:str}}],\
                 created:int,id:str,model:str,object:str,{USAGE}}}"
            ),
        ),
        (
            "completion, echo, logprobs, two prompts",
            completion(json!({"prompt": ["the cat", "a mat"], "echo": true, "logprobs": 2})),
            format!(
                "200 {{choices:[{{finish_reason:str,index:int,logprobs:{{text_offset:[int],\
                 token_logprobs:[null,float],tokens:[str],top_logprobs:[null,{{*:float}}]}},\
                 text:str}}],created:int,id:str,model:str,object:str,{USAGE}}}"
            ),
        ),
        (
            "completion scoring the prompt",
            completion(json!({"max_tokens": 0, "echo": true, "logprobs": 1})),
            format!(
                "200 {{choices:[{{finish_reason:str,index:int,logprobs:{{text_offset:[int],\
                 token_logprobs:[null,float],tokens:[str],top_logprobs:[null,{{*:float}}]}},\
                 text:str}}],created:int,id:str,model:str,object:str,{USAGE}}}"
            ),
        ),
        (
            "chat stream with usage",
            chat(json!({"stream": true, "stream_options": {"include_usage": true}})),
            "200\n\
             {choices:[{delta:{content:str,role:str},finish_reason:null,index:int}],created:int,\
             id:str,model:str,object:str,usage:null}\n\
             {choices:[{delta:{content:str},finish_reason:null,index:int}],created:int,id:str,\
             model:str,object:str,usage:null}\n\
             {choices:[{delta:{},finish_reason:str,index:int}],created:int,id:str,\
             model:str,object:str,usage:null}\n\
             {choices:[],created:int,id:str,model:str,object:str,\
             usage:{completion_tokens:int,prompt_tokens:int,total_tokens:int}}\n\
             [DONE]"
                .into(),
        ),
        (
            "chat stream with logprobs",
            chat(json!({"stream": true, "logprobs": true, "top_logprobs": 1})),
            "200\n\
             {choices:[{delta:{content:str,role:str},finish_reason:null,index:int,logprobs:null}],\
             created:int,id:str,model:str,object:str}\n\
             {choices:[{delta:{content:str},finish_reason:null,index:int,logprobs:{content:[{\
             bytes:[int],logprob:float,token:str,top_logprobs:[{bytes:[int],logprob:float,\
             token:str}]}],refusal:null}}],created:int,id:str,model:str,object:str}\n\
             {choices:[{delta:{},finish_reason:str,index:int,logprobs:{content:[],\
             refusal:null}}],created:int,id:str,model:str,object:str}\n\
             [DONE]"
                .into(),
        ),
        (
            "completion stream",
            completion(json!({"stream": true})),
            "200\n\
             {choices:[{finish_reason:null,index:int,logprobs:null,text:str}],created:int,id:str,\
             model:str,object:str}\n\
             {choices:[{finish_reason:str,index:int,logprobs:null,text:str}],created:int,id:str,\
             model:str,object:str}\n\
             [DONE]"
                .into(),
        ),
        (
            "completion stream, echo, logprobs, usage",
            completion(json!({"stream": true, "echo": true, "logprobs": 1,
                              "stream_options": {"include_usage": true}})),
            "200\n\
             {choices:[{finish_reason:null,index:int,logprobs:{text_offset:[int],\
             token_logprobs:[null,float],tokens:[str],top_logprobs:[null,{*:float}]},text:str}],\
             created:int,id:str,model:str,object:str,usage:null}\n\
             {choices:[{finish_reason:null,index:int,logprobs:{text_offset:[int],\
             token_logprobs:[float],tokens:[str],top_logprobs:[{*:float}]},text:str}],\
             created:int,id:str,model:str,object:str,usage:null}\n\
             {choices:[{finish_reason:str,index:int,logprobs:{text_offset:[],\
             token_logprobs:[],tokens:[],top_logprobs:[]},text:str}],\
             created:int,id:str,model:str,object:str,usage:null}\n\
             {choices:[],created:int,id:str,model:str,object:str,\
             usage:{completion_tokens:int,prompt_tokens:int,total_tokens:int}}\n\
             [DONE]"
                .into(),
        ),
        (
            "completion stream scoring the prompt",
            completion(json!({"stream": true, "echo": true, "max_tokens": 0})),
            "200\n\
             {choices:[{finish_reason:null,index:int,logprobs:null,text:str}],created:int,id:str,\
             model:str,object:str}\n\
             {choices:[{finish_reason:str,index:int,text:str}],created:int,id:str,model:str,\
             object:str}\n\
             [DONE]"
                .into(),
        ),
        (
            "embeddings",
            embeddings(json!({})),
            "200 {data:[{embedding:[float],index:int,object:str}],model:str,object:str,\
             usage:{prompt_tokens:int,total_tokens:int}}"
                .into(),
        ),
        (
            "embeddings as base64",
            embeddings(json!({"encoding_format": "base64"})),
            "200 {data:[{embedding:str,index:int,object:str}],model:str,object:str,\
             usage:{prompt_tokens:int,total_tokens:int}}"
                .into(),
        ),
    ];
    let mut wrong = Vec::new();
    for (name, got, want) in &cases {
        if got != want {
            wrong.push(format!("{name}:\n  got:  {got:?}\n  want: {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
