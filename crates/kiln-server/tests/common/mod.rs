//! The fixture server both test files start: the tiny random-weight Llama decoder (GGUF) and the
//! ModernBERT embedder, each on its own engine thread as `kiln serve` runs them, on a local port.
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_engine::{EmbeddingModel, SchedulerConfig, TextTokenizer};
use kiln_formats::GgufFile;
use kiln_server::{DecoderEngine, DecoderEntry, EmbedEngine, EmbedEntry, ServerState};
use kiln_tokenizer::{ChatTemplate, Tokenizer};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn llama_path() -> PathBuf {
    fixtures().join("decoders/llama/model-f32.gguf")
}

/// The fixture decoder served as `name`, with the GGUF's chat template or without one, on a
/// batch-invariant CPU backend (as `kiln serve` runs it).
pub fn decoder_entry(name: &str, with_template: bool, cfg: SchedulerConfig) -> DecoderEntry {
    let file = GgufFile::open(&llama_path()).unwrap();
    let template = if with_template {
        ChatTemplate::from_gguf(&file).unwrap()
    } else {
        None
    };
    decoder_with_template(name, template, cfg)
}

/// A chat template in the Hermes tool-call format, short enough for the fixture's 256-token
/// context: each turn as `role:` and its text, an assistant turn's calls as `<tool_call>`
/// blocks, a tool result with the id of its call, and the names of the tools offered.
pub const HERMES_TEMPLATE: &str = "{% if tools %}tools:{% for t in tools %} \
{{ t.function.name }}{% endfor %}\n{% endif %}{% for m in messages %}{{ m.role }}:\
{% if m.content %}{{ m.content }}{% endif %}{% if m.tool_calls %}{% for c in m.tool_calls %}\
<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}\
{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}\n{% endfor %}\
{% if add_generation_prompt %}assistant:{% endif %}";

/// The fixture decoder with `template` as its chat template.
pub fn decoder_with_template(
    name: &str,
    template: Option<ChatTemplate>,
    cfg: SchedulerConfig,
) -> DecoderEntry {
    let file = GgufFile::open(&llama_path()).unwrap();
    let backend = CpuBackend::with_options(&CpuOptions {
        batch_invariant: true,
        ..CpuOptions::threads(1)
    })
    .unwrap();
    let model = kiln_models::load_gguf_decoder(&backend, &file).unwrap();
    let tokenizer = TextTokenizer::Gguf(Box::new(Tokenizer::from_gguf(&file).unwrap()));
    let context = model.config.context_length;
    let width = model.config.vocab_size;
    DecoderEntry::new(
        name.into(),
        DecoderEngine::spawn(name, kiln_engine::decoder_on(backend, model), cfg).unwrap(),
        tokenizer,
        template,
        context,
        width,
    )
}

/// The ModernBERT fixture served as `embed`.
pub fn embed_entry() -> EmbedEntry {
    let backend = CpuBackend::new(1).unwrap();
    let dir = fixtures().join("encoders/modernbert-tiny");
    let model = EmbeddingModel::load(&backend, &dir, false).unwrap();
    EmbedEntry {
        name: "embed".into(),
        engine: EmbedEngine::spawn("embed", kiln_engine::embedding_on(backend, model), 64).unwrap(),
    }
}

/// Serves `decoders` and `embedders` on a free local port until the runtime is dropped.
pub fn serve(
    decoders: Vec<DecoderEntry>,
    embedders: Vec<EmbedEntry>,
) -> (SocketAddr, tokio::runtime::Runtime) {
    let state = Arc::new(ServerState::new(decoders, embedders));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(kiln_server::serve(listener, state, std::future::pending()));
    (addr, rt)
}
