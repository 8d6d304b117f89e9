//! Errors of tokenizer construction. Encoding and decoding never fail: any text encodes, and any id
//! decodes (ids outside the vocabulary decode to nothing).

/// Why a tokenizer could not be built from a vocabulary description.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key the tokenizer needs is absent.
    #[error("missing tokenizer metadata key `{0}`")]
    MissingKey(String),
    /// A metadata key is present but its value has the wrong type or an impossible value.
    #[error("malformed tokenizer metadata `{key}`: {reason}")]
    Malformed {
        /// The GGUF key (or `VocabSpec` field named after it).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer kind this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (tokenizer.ggml.model); supported: llama (SentencePiece), gpt2 and gemma4 (BPE), bert (WordPiece)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a BPE pre-tokenizer this crate does not implement (one llama.cpp
    /// does not know either, or `kimi-k2`).
    #[error("unsupported pre-tokenizer `{0}` (tokenizer.ggml.pre); supported: the names llama.cpp knows, except kimi-k2")]
    UnsupportedPreTokenizer(String),
    /// A pre-tokenizer regex cannot be run as llama.cpp runs it.
    #[error("pre-tokenizer regex `{regex}`: {reason}")]
    PreTokenizerRegex {
        /// The regex, as llama.cpp lists it.
        regex: String,
        /// Why it is refused.
        reason: String,
    },
    /// A `tokenizer.json` file could not be read or parsed.
    #[error("{path}: {reason}")]
    TokenizerJson { path: String, reason: String },
}

impl TokenizerError {
    pub(crate) fn malformed(key: &str, reason: impl Into<String>) -> Self {
        TokenizerError::Malformed {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}
