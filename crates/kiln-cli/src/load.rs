//! The way every command takes to its model: arguments → path → [`ModelFile`] (opened once) →
//! plan → the planned backends (`kiln_cli::backends`) → the model, its backends' types erased.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use kiln_backend::KvDtype;
use kiln_cli::backends::{cpu_options, place_decoder, place_embedding, Devices};
use kiln_cpu::CpuOptions;
use kiln_engine::plan::Candidate;
use kiln_engine::{
    DecoderRunner, DecoderUse, EmbeddingRunner, ModelFile, ModelKind, TextTokenizer,
};
use kiln_formats::LoadMode;
use kiln_hub::Hub;

use crate::plan::{choose, describe, PlanArgs, Workload};

/// The model every command uses when `-m` is not given.
pub const DEFAULT_MODEL: &str = "gemma3-270m";

/// `-m MODEL`: an alias known to `kiln pull` or a path to a GGUF file.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArg {
    /// Model: a known alias (fetched on first use; see `kiln pull --list`), a GGUF file, or a
    /// Hugging Face folder (config.json, safetensors, tokenizer.json).
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: String,
}

/// `--mmap`, `--kv-type`: how a decoder to run is held in memory, its weights and its KV cache.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// Memory-map a GGUF model instead of reading it into memory. By default its bytes are
    /// copied into private memory backed by transparent huge pages, which makes CPU decode
    /// (every weight read once per token) about 15% faster; a map opens instantly and shares
    /// the page cache with other processes that map the same file.
    #[arg(long = "mmap")]
    pub mmap: bool,
    #[command(flatten)]
    pub kv: KvTypeArg,
}

/// `--kv-type`: the KV cache's element type (the commands that run a decoder, and `kiln plan`).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct KvTypeArg {
    /// What the KV cache stores keys and values as: `f16` (half the memory, and half the bytes
    /// decode attention reads; llama.cpp's default too), `f32` (exactly the values computed),
    /// or llama.cpp's blocks `q8_0` (8.5 bits a value) and `q4_0` (4.5 bits; heads must be
    /// multiples of 32).
    #[arg(long = "kv-type", value_name = "f16|f32|q8_0|q4_0", default_value = "f16", value_parser = parse_kv_type)]
    pub kv_type: KvDtype,
}

fn parse_kv_type(s: &str) -> std::result::Result<KvDtype, String> {
    KvDtype::parse(s).ok_or_else(|| format!("{s:?} is not a KV cache type (f16, f32, q8_0, q4_0)"))
}

impl LoadArgs {
    /// How a GGUF file's bytes are held once its model is loaded.
    pub fn load_mode(&self) -> LoadMode {
        if self.mmap {
            LoadMode::Map
        } else {
            LoadMode::Read
        }
    }

    /// The pages a model's weights sit in when loaded with this option: huge pages asked for
    /// (the private copy of [`LoadMode::Read`]) for a GGUF file read into memory, else the
    /// system's small pages (a map, or a Hugging Face folder's safetensors).
    pub fn weight_pages(&self, kind: ModelKind) -> kiln_cpu::Pages {
        if self.mmap || kind != ModelKind::GgufDecoder {
            kiln_cpu::Pages::Small
        } else {
            kiln_cpu::Pages::Huge
        }
    }
}

/// `--threads N`.
#[derive(clap::Args, Clone, Debug)]
pub struct ThreadsArg {
    /// Worker threads (default: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
}

/// The path of `model`: a file or folder as given, or a known alias (fetched and verified on
/// first use).
pub fn resolve(model: &str) -> Result<PathBuf> {
    Ok(Hub::from_env().resolve(model)?)
}

/// Resolves `model` and opens it, once (see [`ModelFile`]); a GGUF file's bytes are held as
/// `mode` says once its model is loaded.
pub fn open(model: &str, mode: LoadMode) -> Result<ModelFile> {
    let path = resolve(model)?;
    ModelFile::open(&path, mode).with_context(|| format!("reading {}", path.display()))
}

/// A decoder planned and placed: what the commands that run one hold.
pub struct PlacedDecoder {
    pub model: Box<dyn DecoderRunner>,
    pub tokenizer: TextTokenizer,
    /// Milliseconds from the plan to a loaded model (the fetch of an alias not counted).
    pub load_ms: f64,
}

/// Opens `model` once and places it (see [`decoder_from`]); the file is closed once the model is
/// loaded (its parsed header, a large vocabulary's strings, is not needed past it).
pub fn decoder(
    model: &str,
    load: &LoadArgs,
    threads: usize,
    placement: &PlanArgs,
    work: Workload,
    usage: DecoderUse,
    tag: Option<&str>,
) -> Result<PlacedDecoder> {
    let mut file = open(model, load.load_mode())?;
    decoder_from(&mut file, threads, placement, work, usage, tag)
}

/// Plans the decoder in `file` for `work` (the plan logged as `[tag] plan: ...`, or through
/// `tracing` when `tag` is `None`), builds the planned backends (`threads` threads, the KV cache
/// as `work` says, batch-invariant kernels when it is to serve) and loads the model onto them,
/// for `usage`.
pub fn decoder_from(
    file: &mut ModelFile,
    threads: usize,
    placement: &PlanArgs,
    work: Workload,
    usage: DecoderUse,
    tag: Option<&str>,
) -> Result<PlacedDecoder> {
    file.require_decoder()?;
    // A served request gets the same tokens whatever it is batched with (see
    // `CpuOptions::batch_invariant`).
    let cpu = cpu_options(threads, work.kv_dtype, usage == DecoderUse::Serve)?;
    let (chosen, devices) = plan_for(file, placement, &cpu, work, usage.runs_split(), tag)?;
    let t0 = Instant::now();
    let model = place_decoder(file, &chosen.placement, &devices, usage)
        .with_context(|| format!("loading the model in {}", file.path().display()))?;
    let tokenizer = file.tokenizer()?;
    Ok(PlacedDecoder {
        model,
        tokenizer,
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// The plan of `file` for `work` and the devices it may use, logged as `[tag] plan: ...`
/// (through `tracing` without a tag), with the devices `auto` left out and why.
fn plan_for(
    file: &ModelFile,
    placement: &PlanArgs,
    cpu: &CpuOptions,
    work: Workload,
    split: bool,
    tag: Option<&str>,
) -> Result<(Candidate, Devices)> {
    let (chosen, devices, notes) = choose(file, placement, cpu, work, split)?;
    let log = |line: String| match tag {
        Some(tag) => eprintln!("[{tag}] {line}"),
        None => tracing::info!("{}: {line}", file.path().display()),
    };
    if chosen.placement == kiln_engine::plan::Placement::Cpu {
        for n in notes {
            log(n);
        }
    }
    log(describe(&chosen));
    Ok((chosen, devices))
}

/// An embedding model opened, planned and placed.
pub struct PlacedEmbedding {
    pub model: Box<dyn EmbeddingRunner>,
    pub load_ms: f64,
}

/// Opens the embedding model `model` once and places it: see [`embedding_from`].
pub fn embedding(
    model: &str,
    threads: usize,
    placement: &PlanArgs,
    batch: usize,
    truncate: bool,
    tag: Option<&str>,
) -> Result<PlacedEmbedding> {
    let path = resolve(model)?;
    let file = ModelFile::open(&path, LoadMode::Map).with_context(|| {
        let what = if path.is_dir() {
            ""
        } else {
            " (an embedding model is a folder: config.json, model.safetensors, tokenizer.json)"
        };
        format!("reading {}{what}", path.display())
    })?;
    embedding_from(file, threads, placement, batch, truncate, tag)
}

/// Plans the embedding model in `file` for `batch` texts per pass (logged as [`decoder_from`]
/// logs), and loads it onto the planned backend (`threads` threads); `truncate` as `kiln embed
/// --no-truncate` says.
pub fn embedding_from(
    file: ModelFile,
    threads: usize,
    placement: &PlanArgs,
    batch: usize,
    truncate: bool,
    tag: Option<&str>,
) -> Result<PlacedEmbedding> {
    file.require_encoder()?;
    let cpu = cpu_options(threads, KvDtype::default(), false)?;
    let work = Workload {
        ctx: usize::MAX,
        batch,
        kv_budget: None,
        kv_dtype: KvDtype::default(),
    };
    let (chosen, devices) = plan_for(&file, placement, &cpu, work, false, tag)?;
    let t0 = Instant::now();
    let model = place_embedding(&file, &chosen.placement, &devices, truncate)?;
    Ok(PlacedEmbedding {
        model,
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_streams_the_pages_the_weights_will_sit_in() {
        let read = LoadArgs {
            mmap: false,
            kv: KvTypeArg {
                kv_type: KvDtype::F16,
            },
        };
        let map = LoadArgs {
            mmap: true,
            kv: KvTypeArg {
                kv_type: KvDtype::F16,
            },
        };
        // A GGUF file read into memory: the private copy asks for huge pages.
        assert_eq!(
            read.weight_pages(ModelKind::GgufDecoder),
            kiln_cpu::Pages::Huge
        );
        // A map of the file, or a Hugging Face folder (its safetensors are mapped): small ones.
        assert_eq!(
            map.weight_pages(ModelKind::GgufDecoder),
            kiln_cpu::Pages::Small
        );
        assert_eq!(
            read.weight_pages(ModelKind::HfDecoder),
            kiln_cpu::Pages::Small
        );
    }
}
