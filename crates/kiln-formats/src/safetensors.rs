//! safetensors reader: single files and sharded checkpoints (`model.safetensors.index.json`).
//!
//! Each file is memory-mapped and its header parsed by the `safetensors` crate (which checks that
//! the tensors' byte ranges are contiguous, non-overlapping, match their dtype and shape, and end
//! exactly at the end of the file). Tensor data is handed out as zero-copy [`SharedBytes`] views
//! that keep the map alive.
//!
//! Invariants of a [`SafetensorsModel`]:
//! - every tensor name is unique across all shards (a name in two shards is an error);
//! - with an index file, every tensor the index names is in the shard it names, and every shard
//!   is a plain file name in the index's folder (no path components);
//! - every [`SafeTensor::bytes`] holds exactly `shape.product() × dtype size` bytes.
//!
//! Shapes keep safetensors' (PyTorch's) order: `shape[last]` is contiguous. GGUF (and kiln's
//! backends) name dims the other way round; [`SafeTensor::ggml_dims`] converts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_core::{GgmlType, SharedBytes};
pub use safetensors::Dtype;

/// File name of a single-file checkpoint in a model folder.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the index of a sharded checkpoint in a model folder.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Why a safetensors checkpoint could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid safetensors file: {detail}")]
    Header { path: PathBuf, detail: String },
    #[error("{path}: malformed index: {detail}")]
    Index { path: PathBuf, detail: String },
    #[error("{dir}: no {SINGLE_FILE} or {INDEX_FILE}")]
    NotFound { dir: PathBuf },
    #[error("tensor {name} is in both {first} and {second}")]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
}

/// One tensor: its dtype, PyTorch-order shape and a view of its bytes.
#[derive(Clone, Debug)]
pub struct SafeTensor {
    pub name: String,
    pub dtype: Dtype,
    /// Row-major, last dim contiguous.
    pub shape: Vec<usize>,
    pub bytes: SharedBytes,
    /// Index into [`SafetensorsModel::files`].
    pub file: usize,
}

impl SafeTensor {
    /// The element type kiln computes with, for the float dtypes it supports.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        match self.dtype {
            Dtype::F32 => Some(GgmlType::F32),
            Dtype::F16 => Some(GgmlType::F16),
            Dtype::BF16 => Some(GgmlType::BF16),
            _ => None,
        }
    }

    /// Dims in GGUF order (`dims[0]` contiguous).
    pub fn ggml_dims(&self) -> Vec<usize> {
        self.shape.iter().rev().copied().collect()
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A checkpoint made of one or more safetensors files.
#[derive(Debug)]
pub struct SafetensorsModel {
    files: Vec<PathBuf>,
    tensors: HashMap<String, SafeTensor>,
    /// Free-form `__metadata__` of the first file (e.g. `{"format": "pt"}`).
    metadata: HashMap<String, String>,
}

impl SafetensorsModel {
    /// Opens a checkpoint: a `.safetensors` file, an index `.json` file, or a folder holding
    /// [`INDEX_FILE`] (preferred) or [`SINGLE_FILE`].
    pub fn open(path: &Path) -> Result<Self, SafetensorsError> {
        if path.is_dir() {
            let index = path.join(INDEX_FILE);
            if index.is_file() {
                return Self::open_index(&index);
            }
            let single = path.join(SINGLE_FILE);
            if single.is_file() {
                return Self::open_files(&[single]);
            }
            return Err(SafetensorsError::NotFound {
                dir: path.to_owned(),
            });
        }
        if path.extension().is_some_and(|e| e == "json") {
            return Self::open_index(path);
        }
        Self::open_files(&[path.to_owned()])
    }

    /// Opens a sharded checkpoint from its index file; shards are looked up beside it.
    pub fn open_index(index: &Path) -> Result<Self, SafetensorsError> {
        let index_err = |detail: String| SafetensorsError::Index {
            path: index.to_owned(),
            detail,
        };
        let text = std::fs::read_to_string(index).map_err(|source| SafetensorsError::Io {
            path: index.to_owned(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| index_err(e.to_string()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| index_err("no \"weight_map\" object".into()))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shards: Vec<String> = Vec::new();
        for (name, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| index_err(format!("shard of {name} is not a string")))?;
            if shard.is_empty()
                || Path::new(shard).components().count() != 1
                || shard.contains(['/', '\\'])
                || shard == ".."
            {
                return Err(index_err(format!(
                    "shard \"{shard}\" of {name} is not a plain file name"
                )));
            }
            if !shards.iter().any(|s| s == shard) {
                shards.push(shard.to_string());
            }
        }
        shards.sort();
        let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
        let model = Self::open_files(&paths)?;
        for (name, shard) in map {
            let in_shard = model
                .tensors
                .get(name)
                .map(|t| &model.files[t.file])
                .is_some_and(|p| p.file_name().and_then(|f| f.to_str()) == shard.as_str());
            if !in_shard {
                return Err(index_err(format!(
                    "tensor {name} is not in {}",
                    shard.as_str().unwrap_or_default()
                )));
            }
        }
        Ok(model)
    }

    /// Opens one or more safetensors files as one checkpoint.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, SafetensorsError> {
        let mut model = SafetensorsModel {
            files: Vec::new(),
            tensors: HashMap::new(),
            metadata: HashMap::new(),
        };
        for path in paths {
            let io = |source| SafetensorsError::Io {
                path: path.clone(),
                source,
            };
            let file = std::fs::File::open(path).map_err(io)?;
            let bytes = if file.metadata().map_err(io)?.len() == 0 {
                SharedBytes::from_vec(Vec::new())
            } else {
                // SAFETY: read-only map; model files are taken to be immutable while in use
                // (the same contract as the GGUF reader and every mmap-based loader).
                let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
                SharedBytes::new(Arc::new(map))
            };
            model.add_file(path.clone(), bytes)?;
        }
        Ok(model)
    }

    /// Parses one file's bytes (tests, in-memory checkpoints).
    pub fn from_bytes(name: &str, bytes: SharedBytes) -> Result<Self, SafetensorsError> {
        let mut model = SafetensorsModel {
            files: Vec::new(),
            tensors: HashMap::new(),
            metadata: HashMap::new(),
        };
        model.add_file(PathBuf::from(name), bytes)?;
        Ok(model)
    }

    fn add_file(&mut self, path: PathBuf, bytes: SharedBytes) -> Result<(), SafetensorsError> {
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| {
            SafetensorsError::Header {
                path: path.clone(),
                detail: e.to_string(),
            }
        })?;
        let data_start = 8 + header_len;
        let file = self.files.len();
        if file == 0 {
            if let Some(m) = meta.metadata() {
                self.metadata = m.clone();
            }
        }
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            // read_metadata checked that the ranges tile the data section exactly.
            let view = bytes.slice(data_start + s..data_start + e).ok_or_else(|| {
                SafetensorsError::Header {
                    path: path.clone(),
                    detail: format!("tensor {name} lies outside the file"),
                }
            })?;
            if let Some(prev) = self.tensors.get(&name) {
                return Err(SafetensorsError::Duplicate {
                    name,
                    first: self.files[prev.file].clone(),
                    second: path,
                });
            }
            self.tensors.insert(
                name.clone(),
                SafeTensor {
                    name,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    bytes: view,
                    file,
                },
            );
        }
        self.files.push(path);
        Ok(())
    }

    /// The files of the checkpoint, in the order they were opened.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn tensor(&self, name: &str) -> Option<&SafeTensor> {
        self.tensors.get(name)
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> Vec<&SafeTensor> {
        let mut v: Vec<&SafeTensor> = self.tensors.values().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The `__metadata__` map of the first file.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes.len()).sum()
    }
}

/// Serializes tensors as a safetensors file (tests and synthetic checkpoints). Each entry is
/// `(name, dtype, shape, little-endian bytes)`.
pub fn write_safetensors(
    tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)],
) -> Result<Vec<u8>, String> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.to_string(), v))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}
