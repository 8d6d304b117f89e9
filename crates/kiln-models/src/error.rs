use kiln_backend::BackendError;
use kiln_core::GgmlType;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("architecture '{0}' is not supported (supported: {supported})", supported = crate::arch::SUPPORTED.join(", "))]
    UnsupportedArchitecture(String),
    #[error("Hugging Face model type '{0}' is not supported as a decoder (supported: {supported})", supported = crate::arch::SUPPORTED_HF_DECODERS.join(", "))]
    UnsupportedHfModel(String),
    #[error("metadata key {key}: {detail}")]
    Metadata { key: String, detail: String },
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "tensor {name} has type {ty}, which kiln cannot compute with \
         (supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K)"
    )]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("context full: {needed} positions needed, the KV cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error(
        "cannot go back to position {len}: its window reads from position {needs}, but the \
         windowed layers' ring holds positions from {kept_from} only"
    )]
    WindowOverwritten {
        len: usize,
        needs: usize,
        kept_from: usize,
    },
    #[error("layers {start}..{end} are not a range of the model's {n_layers} layers")]
    LayerRange {
        start: usize,
        end: usize,
        n_layers: usize,
    },
    #[error(
        "cannot put {front_layers} layers on the first backend of a split: \
         the model has {n_layers} layers"
    )]
    SplitPoint {
        front_layers: usize,
        n_layers: usize,
    },
    #[error("bad batch: {0}")]
    Batch(String),
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    BadToken { id: u32, vocab: usize },
    #[error("{file}: {detail}")]
    File { file: String, detail: String },
    #[error("{file}: key \"{key}\": {detail}")]
    Config {
        file: String,
        key: String,
        detail: String,
    },
    #[error("tensor {name} has dtype {dtype}; kiln computes with F32, F16 or BF16 safetensors")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("sequence of {len} tokens is longer than the model's limit of {max}")]
    SequenceTooLong { len: usize, max: usize },
    #[error("empty token sequence (an encoder needs at least one token)")]
    EmptySequence,
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<kiln_formats::GgufError> for ModelError {
    fn from(e: kiln_formats::GgufError) -> Self {
        ModelError::Metadata {
            key: String::new(),
            detail: e.to_string(),
        }
    }
}
