//! Tokenizers described by a Hugging Face `tokenizer.json`, run by the HF `tokenizers` crate.
//!
//! The file's own `truncation` and `padding` settings are always discarded: they describe how a
//! training script batched its inputs, not how the model must be fed (all-MiniLM-L6-v2 ships
//! `padding: Fixed 128` and `truncation: 128` while sentence-transformers truncates at 256 and
//! never pads a single text). The caller says how to truncate with [`Truncation`]; kiln never pads
//! (batches are packed, see kiln-models' encoder).
//!
//! Invariant: an [`HfTokenizer`] is immutable after construction, so one instance serves many
//! threads.

use std::path::Path;

use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

use crate::TokenizerError;

/// What to do with a text longer than the model accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truncation {
    /// Keep the first `max_len - specials` tokens of the text, then add the special tokens
    /// (sentence-transformers' `truncation="longest_first"` for single texts).
    To(usize),
    /// Encode everything; [`HfTokenizer::encode`] reports the length and the caller decides.
    None,
}

/// A `tokenizer.json` tokenizer with truncation chosen by the caller and no padding.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    truncation: Truncation,
    /// Added tokens marked `special` (control tokens), by id.
    specials: std::collections::HashMap<u32, String>,
    /// The decoder maps GPT-2's byte stand-ins back to bytes (byte-level BPE).
    byte_level: bool,
}

impl HfTokenizer {
    /// Loads `path` (a `tokenizer.json`).
    pub fn from_file(path: &Path, truncation: Truncation) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|e| TokenizerError::TokenizerJson {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_bytes(&bytes, truncation).map_err(|e| match e {
            TokenizerError::TokenizerJson { reason, .. } => TokenizerError::TokenizerJson {
                path: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Parses the contents of a `tokenizer.json`.
    pub fn from_bytes(json: &[u8], truncation: Truncation) -> Result<Self, TokenizerError> {
        let err = |reason: String| TokenizerError::TokenizerJson {
            path: "tokenizer.json".into(),
            reason,
        };
        let mut inner = tokenizers::Tokenizer::from_bytes(json).map_err(|e| err(e.to_string()))?;
        inner.with_padding(None);
        let params = match truncation {
            Truncation::To(0) => return Err(err("truncation length 0".into())),
            Truncation::To(max_length) => Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }),
            Truncation::None => None,
        };
        inner
            .with_truncation(params)
            .map_err(|e| err(e.to_string()))?;
        let specials = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        // The decoder's kind, from the file (the library does not expose it).
        let byte_level = serde_json::from_slice::<serde_json::Value>(json)
            .ok()
            .and_then(|v| {
                v.get("decoder")
                    .map(|d| d.to_string().contains("\"ByteLevel\""))
            })
            .unwrap_or(false);
        Ok(HfTokenizer {
            inner,
            truncation,
            specials,
            byte_level,
        })
    }

    pub fn truncation(&self) -> Truncation {
        self.truncation
    }

    /// Token ids of `text`, with the model's special tokens when `add_special`.
    ///
    /// Errors only where the HF library does (e.g. a max length smaller than the special tokens
    /// of the template); any text, including the empty string, encodes.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode_fast(text, add_special).map_err(|e| {
            TokenizerError::TokenizerJson {
                path: "tokenizer.json".into(),
                reason: format!("encoding failed: {e}"),
            }
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens dropped when `skip_special`); unknown ids decode to nothing.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.inner.decode(ids, skip_special).unwrap_or_default()
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The text of token `id` when it is a special (control) token.
    pub fn special_text(&self, id: u32) -> Option<String> {
        self.specials.get(&id).cloned()
    }

    /// The bytes token `id` stands for inside a text (no space stripped, a partial UTF-8
    /// sequence kept whole): GPT-2's stand-ins mapped back for byte-level BPE; for
    /// SentencePiece-style vocabularies `▁` is a space and `<0xNN>` its byte. Empty for an
    /// unknown id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(tok) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        if self.specials.contains_key(&id) {
            return tok.into_bytes();
        }
        if self.byte_level {
            if let Some(b) = tok.chars().map(crate::bpe::char_to_byte).collect() {
                return b;
            }
            return tok.into_bytes();
        }
        let b = tok.as_bytes();
        if b.len() == 6 && b.starts_with(b"<0x") && b[5] == b'>' {
            if let Ok(v) = u8::from_str_radix(&tok[3..5], 16) {
                return vec![v];
            }
        }
        tok.replace('\u{2581}', " ").into_bytes()
    }
}
