//! `kiln serve`: the OpenAI-compatible HTTP server.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use kiln_engine::{DecoderUse, ModelFile, ModelKind, SchedulerConfig};
use kiln_server::{DecoderEngine, DecoderEntry, EmbedEngine, EmbedEntry, ServerState};
use kiln_tokenizer::{ChatTemplate, SpecialTokens};

use crate::load::{decoder_from, embedding_from, open, LoadArgs, ThreadsArg, DEFAULT_MODEL};
use crate::plan::{PlanArgs, Workload};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A model to serve: `MODEL` or `NAME=MODEL`, where MODEL is a known alias (fetched on first
    /// use), a GGUF file, a Hugging Face decoder folder, or a sentence-transformers embedding
    /// folder. Repeat to serve several models (a decoder and an embedding model is the common
    /// case). Requests pick one by NAME (default: the alias, or the file or folder name).
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    models: Vec<String>,
    /// A Jinja chat template file for a decoder, as `FILE` (the first decoder) or `NAME=FILE`.
    /// Overrides the model's own template; needed for chat on a base model that has none.
    #[arg(long = "chat-template")]
    chat_templates: Vec<String>,
    /// How the decoders write tool calls: `auto` (recognized from each chat template: Hermes
    /// `<tool_call>` for Qwen, Llama 3.x JSON, Mistral `[TOOL_CALLS]`, else kiln's generic
    /// format), or `hermes`, `llama3`, `mistral`, `generic` for every decoder.
    #[arg(long = "tool-call-format", default_value = "auto")]
    tool_call_format: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at startup).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    #[command(flatten)]
    mmap: LoadArgs,
    /// KV-cache memory per decoder, in MiB (keys and values of every layer, stored as
    /// `--kv-type` says). It sets how many tokens all running sequences hold together.
    #[arg(long = "kv-memory", default_value_t = 1024)]
    kv_memory_mib: usize,
    /// Positions per KV-cache block (the unit of allocation and of prefix sharing).
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Sequences decoded together at most (the batch).
    #[arg(long, default_value_t = 64)]
    max_running: usize,
    /// Requests that may wait for admission; beyond it requests get 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_waiting: usize,
    /// Tokens one forward pass carries at most (decode tokens plus prompt chunks): lower keeps
    /// running streams smoother while long prompts are prefilled.
    #[arg(long, default_value_t = 512)]
    max_step_tokens: usize,
    /// `max_tokens` of a request that gives none.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: u64,
    /// Most sequences an embedding model runs in one forward pass.
    #[arg(long, default_value_t = 64)]
    embed_batch: usize,
}

/// `NAME=VALUE` or `VALUE` (a name has no path separator).
fn split_named(spec: &str) -> (Option<&str>, &str) {
    match spec.split_once('=') {
        Some((name, value)) if !name.is_empty() && !name.contains(['/', '\\']) => {
            (Some(name), value)
        }
        _ => (None, spec),
    }
}

/// The name a model is served under when none is given.
fn default_name(model: &str, file: &ModelFile) -> String {
    if !Path::new(model).exists() {
        return model.to_string(); // an alias
    }
    let path = file.path();
    let stem = match file.kind() {
        ModelKind::GgufDecoder => path.file_stem(),
        ModelKind::HfDecoder | ModelKind::HfEncoder => path.file_name(),
    };
    stem.map_or_else(|| model.to_string(), |s| s.to_string_lossy().into_owned())
}

fn read_template(file: &str, tokens: SpecialTokens) -> Result<ChatTemplate> {
    let source = std::fs::read_to_string(file)
        .with_context(|| format!("reading the chat template {file}"))?;
    ChatTemplate::new(&source, tokens).with_context(|| format!("the chat template {file}"))
}

/// The model's own chat template, or `--chat-template FILE` in its place (with the model's
/// special tokens), and where it came from.
fn chat_template(
    model: &ModelFile,
    file: Option<&str>,
    tokenizer: &kiln_engine::TextTokenizer,
    end_ids: &[u32],
) -> Result<(Option<ChatTemplate>, String)> {
    if let Some(file) = file {
        let tokens = model.special_tokens(tokenizer, end_ids)?;
        return Ok((Some(read_template(file, tokens)?), format!("from {file}")));
    }
    Ok(match model.chat_template()? {
        Some((t, from)) => (Some(t), from),
        None => (None, "none".into()),
    })
}

pub fn run(a: ServeArgs) -> Result<()> {
    init_logging();
    let tool_format = match a.tool_call_format.as_str() {
        "auto" => None,
        name => Some(
            kiln_server::tools::ToolFormat::from_name(name)
                .map_err(|e| anyhow::anyhow!("--tool-call-format: {e}"))?,
        ),
    };
    // Which decoder each --chat-template belongs to.
    let mut templates: Vec<(Option<String>, String)> = a
        .chat_templates
        .iter()
        .map(|s| {
            let (name, file) = split_named(s);
            (name.map(str::to_string), file.to_string())
        })
        .collect();
    let mut decoders = Vec::new();
    let mut embedders = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for spec in &a.models {
        let (name, model) = split_named(spec);
        let mut file = open(model, a.mmap.load_mode())?;
        let name = name.map_or_else(|| default_name(model, &file), str::to_string);
        if !names.insert(name.clone()) {
            bail!("two models are named '{name}'; name them with --model NAME=MODEL");
        }
        let path = file.path().display().to_string();
        let threads = a.threads.threads;
        if file.kind() == ModelKind::HfEncoder {
            let m = embedding_from(file, threads, &a.placement, a.embed_batch, false, None)?;
            tracing::info!(
                "loaded '{name}' ({path}): embedding model, {} dimensions, up to {} tokens per \
                 input, on {} in {:.0} ms",
                m.model.dim(),
                m.model.max_seq_length(),
                m.model.placement(),
                m.load_ms
            );
            let engine =
                EmbedEngine::spawn(&name, m.model, a.embed_batch).map_err(anyhow::Error::msg)?;
            embedders.push(EmbedEntry { name, engine });
            continue;
        }
        let work = Workload {
            ctx: usize::MAX,
            batch: a.max_running,
            kv_budget: Some((a.kv_memory_mib as u64) << 20),
            kv_dtype: a.mmap.kv.kv_type,
        };
        let m = decoder_from(
            &mut file,
            threads,
            &a.placement,
            work,
            DecoderUse::Serve,
            None,
        )?;
        let cfg = m.model.config().clone();
        let end_ids: Vec<u32> = (0..cfg.vocab_size as u32)
            .filter(|&id| m.tokenizer.is_end_of_generation(id))
            .collect();
        let template_file = templates
            .iter()
            .position(|(n, _)| n.as_deref() == Some(name.as_str()))
            .or_else(|| {
                (decoders.is_empty())
                    .then(|| templates.iter().position(|(n, _)| n.is_none()))
                    .flatten()
            })
            .map(|i| templates.remove(i).1);
        let (template, template_from) =
            chat_template(&file, template_file.as_deref(), &m.tokenizer, &end_ids)?;
        // The file's parsed header (a large vocabulary's strings) is not needed past here.
        drop(file);
        let budget = a.kv_memory_mib << 20;
        let sched = SchedulerConfig {
            n_blocks: 0,
            window_blocks: None,
            block_size: a.block_size,
            max_step_tokens: a.max_step_tokens,
            max_running: a.max_running,
            max_waiting: a.max_waiting,
        }
        .sized_for(&cfg, m.model.kv_dtype(), budget);
        let n_blocks = sched.n_blocks;
        if n_blocks == 0 {
            let one = SchedulerConfig {
                n_blocks: 1,
                window_blocks: None,
                ..sched.clone()
            };
            bail!(
                "--kv-memory {} MiB holds no block of {} positions ({} KiB each for this model)",
                a.kv_memory_mib,
                a.block_size,
                one.kv_bytes(&cfg, m.model.kv_dtype()) >> 10
            );
        }
        let positions = n_blocks * a.block_size;
        tracing::info!(
            "loaded '{name}' ({path}): {} decoder, {} layers, context {} tokens, on {} in {:.0} \
             ms; chat template: {template_from}",
            cfg.arch,
            cfg.n_layers,
            cfg.context_length,
            m.model.placement(),
            m.load_ms,
        );
        let windowed = match sched.window_blocks {
            Some(w) => format!(
                " (sliding-window layers: {w} blocks of their own, {} positions)",
                w * a.block_size
            ),
            None => String::new(),
        };
        tracing::info!(
            "'{name}' KV cache: {n_blocks} blocks of {} positions ({positions} positions in \
             all){windowed}, {:.0} MiB of {}; up to {} sequences decoded together, {} waiting",
            a.block_size,
            sched.kv_bytes(&cfg, m.model.kv_dtype()) as f64 / (1 << 20) as f64,
            m.model.kv_dtype(),
            a.max_running,
            a.max_waiting
        );
        if positions < cfg.context_length {
            tracing::info!(
                "'{name}': the KV cache holds {positions} positions, fewer than the context of {}; \
                 a longer sequence ends with finish_reason \"length\" (raise --kv-memory)",
                cfg.context_length
            );
        }
        let context = cfg.context_length;
        let engine = DecoderEngine::spawn(&name, m.model, sched).map_err(anyhow::Error::msg)?;
        let mut entry =
            DecoderEntry::new(name, engine, m.tokenizer, template, context, cfg.vocab_size);
        if let Some(f) = tool_format {
            entry.tool_format = f;
        }
        tracing::info!(
            "'{}': tool calls in the {} format",
            entry.name,
            entry.tool_format.name()
        );
        decoders.push(entry);
    }
    if let Some((name, file)) = templates.first() {
        bail!(
            "--chat-template {file}: {}",
            match name {
                Some(n) => format!("no decoder is named '{n}'"),
                None =>
                    "no decoder left to apply it to (name it: --chat-template NAME=FILE)".into(),
            }
        );
    }
    let mut state = ServerState::new(decoders, embedders);
    state.limits.default_max_tokens = a.default_max_tokens;
    let state = Arc::new(state);
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("--host {} --port {}: not an address", a.host, a.port))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        // The handlers first: a signal that arrives once the server says it listens must stop
        // it gracefully, not kill it with the default action.
        let shutdown = shutdown_signal()?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr()?;
        tracing::info!("listening on http://{local} (OpenAI API under /v1; /health, /metrics)");
        kiln_server::serve(listener, state, shutdown)
            .await
            .context("serving")
    })
}

/// A future that resolves on Ctrl-C (SIGINT) or SIGTERM: the server stops accepting connections
/// and finishes the requests in flight. The handlers are installed by this call (inside the
/// runtime), not when the future is first polled.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let (mut interrupt, mut terminate) = {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind| signal(kind).context("installing a signal handler");
        (
            install(SignalKind::interrupt())?,
            install(SignalKind::terminate())?,
        )
    };
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down: finishing the requests in flight");
    })
}

/// Logs to stderr; `RUST_LOG` filters (default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
