//! Resolving a model name and loading it onto the CPU backend.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use kiln_backend::KvDtype;
use kiln_cpu::CpuBackend;
use kiln_engine::{EmbeddingModel, TextTokenizer};
use kiln_formats::{GgufFile, LoadMode};
use kiln_hub::Hub;
use kiln_models::Decoder;
use kiln_tokenizer::Tokenizer;

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
    /// decode attention reads; llama.cpp's default too) or `f32` (exactly the values computed).
    #[arg(long = "kv-type", value_name = "f16|f32", default_value = "f16", value_parser = parse_kv_type)]
    pub kv_type: KvDtype,
}

fn parse_kv_type(s: &str) -> std::result::Result<KvDtype, String> {
    KvDtype::parse(s).ok_or_else(|| format!("{s:?} is not a KV cache type (f16, f32)"))
}

impl LoadArgs {
    /// How a GGUF file is opened for running.
    pub fn load_mode(&self) -> LoadMode {
        if self.mmap {
            LoadMode::Map
        } else {
            LoadMode::Read
        }
    }

    /// The pages a model's weights sit in when loaded from `path` with this option: huge pages
    /// asked for (the private copy of [`LoadMode::Read`]) for a GGUF file read into memory,
    /// else the system's small pages (a map, or a Hugging Face folder's safetensors).
    pub fn weight_pages(&self, path: &std::path::Path) -> kiln_cpu::Pages {
        if self.mmap || path.is_dir() {
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

pub fn resolve(model: &str) -> Result<PathBuf> {
    Ok(Hub::from_env().resolve(model)?)
}

pub fn open_gguf(model: &str) -> Result<GgufFile> {
    let path = resolve(model)?;
    open_path(&path)
}

fn open_path(path: &std::path::Path) -> Result<GgufFile> {
    open_path_with(path, LoadMode::Map)
}

fn open_path_with(path: &std::path::Path, mode: LoadMode) -> Result<GgufFile> {
    GgufFile::open_with(path, mode).with_context(|| format!("reading {}", path.display()))
}

pub fn tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    Tokenizer::from_gguf(file).context("building the tokenizer from the GGUF metadata")
}

/// A model ready to run.
pub struct Loaded {
    pub backend: CpuBackend,
    pub model: Decoder<CpuBackend>,
    pub tokenizer: TextTokenizer,
    pub load_ms: f64,
}

/// Load `model` (fetching it first when it is a known alias not yet cached; the fetch is not
/// counted in `load_ms`): a GGUF file, opened as `--mmap` says, or a Hugging Face decoder folder
/// (`config.json`, safetensors, `tokenizer.json`; always mapped).
pub fn load(model: &str, mmap: &LoadArgs, options: &kiln_cpu::CpuOptions) -> Result<Loaded> {
    let path = resolve(model)?;
    let t0 = Instant::now();
    let backend = CpuBackend::with_options(options)?;
    if path.is_dir() {
        if !kiln_engine::is_hf_decoder_dir(&path) {
            let support = kiln_models::check_hf_dir(&path);
            anyhow::bail!(
                "{}: not a decoder kiln runs ({} model type {}){}",
                path.display(),
                support.kind,
                support.architecture,
                match support.verdict {
                    Err(e) => format!(": {e}"),
                    Ok(_) => "; use `kiln embed` for encoders".into(),
                }
            );
        }
        let model = kiln_models::load_hf_decoder(&backend, &path)
            .with_context(|| format!("loading the model in {}", path.display()))?;
        let tokenizer = TextTokenizer::from_hf_dir(&path)?;
        return Ok(Loaded {
            backend,
            model,
            tokenizer,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
        });
    }
    let file = open_path_with(&path, mmap.load_mode())?;
    // The model first: an architecture kiln does not run is the error worth reporting.
    let model = kiln_models::load_gguf_decoder(&backend, &file).context("loading the model")?;
    let tokenizer = TextTokenizer::Gguf(Box::new(tokenizer(&file)?));
    Ok(Loaded {
        backend,
        model,
        tokenizer,
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// The folder of the embedding model `model` (an alias, fetched on first use, or a folder).
pub fn embedding_dir(model: &str) -> Result<PathBuf> {
    let path = resolve(model)?;
    if !path.is_dir() {
        anyhow::bail!(
            "{}: an embedding model is a folder (config.json, model.safetensors, tokenizer.json)",
            path.display()
        );
    }
    Ok(path)
}

/// An embedding model ready to run.
pub struct LoadedEmbedding {
    pub backend: CpuBackend,
    pub model: EmbeddingModel<CpuBackend>,
    pub load_ms: f64,
}

/// Load the embedding model `model` (an alias, fetched on first use, or a folder); `truncate`
/// as `kiln embed --no-truncate` says.
pub fn load_embedding(model: &str, threads: usize, truncate: bool) -> Result<LoadedEmbedding> {
    let path = embedding_dir(model)?;
    let t0 = Instant::now();
    let backend = CpuBackend::new(threads)?;
    let model = EmbeddingModel::load(&backend, &path, truncate)
        .with_context(|| format!("loading the embedding model in {}", path.display()))?;
    Ok(LoadedEmbedding {
        backend,
        model,
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_streams_the_pages_the_weights_will_sit_in() {
        let dir = std::env::temp_dir();
        let file = dir.join("model.gguf");
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
        assert_eq!(read.weight_pages(&file), kiln_cpu::Pages::Huge);
        // A map of the file, or a Hugging Face folder (its safetensors are mapped): small ones.
        assert_eq!(map.weight_pages(&file), kiln_cpu::Pages::Small);
        assert_eq!(read.weight_pages(&dir), kiln_cpu::Pages::Small);
    }
}
