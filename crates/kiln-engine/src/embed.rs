//! Sentence embeddings end to end: a Hugging Face / sentence-transformers folder loaded as an
//! [`EmbeddingModel`], texts tokenized exactly as sentence-transformers does, batches packed
//! without padding, pooled and normalized as the folder says.
//!
//! Truncation follows sentence-transformers: texts longer than `max_seq_length` tokens (special
//! tokens included) keep their first tokens and the closing special token. With truncation off,
//! such a text is an error that says how long it is, and nothing is embedded silently cut.

use std::path::{Path, PathBuf};

use kiln_backend::Backend;
use kiln_core::config::EncoderConfig;
use kiln_formats::SafetensorsModel;
use kiln_models::hf::SentenceConfig;
use kiln_models::{load_encoder, Encoder};
use kiln_tokenizer::{HfTokenizer, Truncation};

use crate::EngineError;

/// One embedded text.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// Token ids the model saw (specials included, after truncation).
    pub ids: Vec<u32>,
    pub vector: Vec<f32>,
}

/// An encoder with its tokenizer and sentence-transformers pipeline.
pub struct EmbeddingModel<B: Backend> {
    pub encoder: Encoder<B>,
    pub tokenizer: HfTokenizer,
    pub sentence: SentenceConfig,
    /// Longest input in tokens: `max_seq_length`, capped by the model's positions.
    pub max_seq_length: usize,
    pub dir: PathBuf,
}

fn missing(dir: &Path, file: &str) -> EngineError {
    EngineError::Input(format!(
        "{}: no {file} (an embedding model folder needs config.json, model.safetensors or \
         model.safetensors.index.json, and tokenizer.json)",
        dir.display()
    ))
}

impl<B: Backend> EmbeddingModel<B> {
    /// Loads the folder `dir` onto `backend` (opened as a [`ModelFile`](crate::ModelFile)).
    /// With `truncate` false, over-long texts are refused by [`EmbeddingModel::tokenize`]
    /// instead of cut.
    pub fn load(backend: &B, dir: &Path, truncate: bool) -> Result<Self, EngineError> {
        if !dir.join("config.json").is_file() {
            return Err(missing(dir, "config.json"));
        }
        crate::ModelFile::open(dir, kiln_formats::LoadMode::Map)?.load_embedding(backend, truncate)
    }

    /// The encoder of the folder `dir` from its parts already read: its configuration, its
    /// checkpoint, and the bytes of its `tokenizer.json`. The folder's sentence-transformers
    /// files (pooling, normalization, `max_seq_length`) are read here.
    pub fn from_parts(
        backend: &B,
        dir: &Path,
        config: EncoderConfig,
        checkpoint: &SafetensorsModel,
        tokenizer_json: &[u8],
        truncate: bool,
    ) -> Result<Self, EngineError> {
        let sentence = SentenceConfig::read(dir)?;
        let max_seq_length = sentence
            .max_seq_length
            .unwrap_or(config.max_positions)
            .min(config.max_positions);
        let truncation = if truncate {
            Truncation::To(max_seq_length)
        } else {
            Truncation::None
        };
        let tokenizer = HfTokenizer::from_bytes(tokenizer_json, truncation)
            .map_err(|e| EngineError::Input(format!("{}: {e}", dir.display())))?;
        let encoder = load_encoder(backend, checkpoint, config)?;
        Ok(EmbeddingModel {
            encoder,
            tokenizer,
            sentence,
            max_seq_length,
            dir: dir.to_owned(),
        })
    }

    /// Output dimension.
    pub fn dim(&self) -> usize {
        self.encoder.config.d_model
    }

    /// Token ids of `text` as the model will see them.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let lowered;
        let text = if self.sentence.do_lower_case {
            lowered = text.to_lowercase();
            &lowered
        } else {
            text
        };
        let ids = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EngineError::Input(e.to_string()))?;
        if ids.len() > self.max_seq_length {
            return Err(EngineError::Input(format!(
                "text of {} tokens is longer than the model's max_seq_length of {} \
                 (truncation is off)",
                ids.len(),
                self.max_seq_length
            )));
        }
        Ok(ids)
    }

    /// Embeddings of token sequences, all in one packed batch.
    pub fn embed_ids(&self, backend: &B, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, EngineError> {
        Ok(self.encoder.embed(
            backend,
            seqs,
            self.sentence.pooling,
            self.sentence.normalize,
        )?)
    }

    /// Tokenizes all of `texts` first (so an over-long text, with truncation off, fails before
    /// any batch runs, naming its position), then embeds them in batches of `batch_size`
    /// sequences, handing each batch to `on_batch(index of its first text, embeddings)` in input
    /// order.
    pub fn embed_texts<E: From<EngineError>>(
        &self,
        backend: &B,
        texts: &[&str],
        batch_size: usize,
        mut on_batch: impl FnMut(usize, Vec<Embedding>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut ids = Vec::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            ids.push(
                self.tokenize(t)
                    .map_err(|e| EngineError::Input(format!("text {}: {e}", i + 1)))?,
            );
        }
        let batch_size = batch_size.max(1);
        for (b, chunk) in ids.chunks(batch_size).enumerate() {
            let seqs: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
            let vectors = self.embed_ids(backend, &seqs)?;
            let batch = chunk
                .iter()
                .zip(vectors)
                .map(|(ids, vector)| Embedding {
                    ids: ids.clone(),
                    vector,
                })
                .collect();
            on_batch(b * batch_size, batch)?;
        }
        Ok(())
    }
}
