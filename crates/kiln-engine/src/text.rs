//! Text in and out of a decoder, whichever file it came from: a GGUF's own tokenizer (kiln's
//! port of llama.cpp's) or a Hugging Face folder's `tokenizer.json` (the HF `tokenizers` crate),
//! with that folder's special tokens and end-of-generation ids.
//!
//! Invariants: encoding is deterministic; [`TextStream`] emits exactly the text of the ids it
//! was given (its concatenated output plus `finish` equals `decode` of all of them; tested on
//! byte-level BPE and SentencePiece-style `tokenizer.json` files), holding back only an
//! incomplete UTF-8 sequence at the end.

use std::collections::BTreeSet;
use std::path::Path;

use kiln_tokenizer::{HfTokenizer, StreamDecoder, Tokenizer, Truncation};
use serde_json::Value;

use crate::EngineError;

/// A decoder's tokenizer.
pub enum TextTokenizer {
    /// From GGUF metadata (`tokenizer.ggml.*`). Both kinds are boxed: they are large.
    Gguf(Box<Tokenizer>),
    /// From a Hugging Face folder.
    Hf(Box<HfText>),
}

/// `tokenizer.json` plus what the folder's other files say about special tokens.
pub struct HfText {
    pub tokenizer: HfTokenizer,
    pub bos: Option<u32>,
    /// Ids that end generation: `eos_token_id` of `generation_config.json` and `config.json`
    /// (a number or a list) and `tokenizer_config.json`'s `eos_token`.
    pub end_of_generation: BTreeSet<u32>,
}

/// The token text of a `tokenizer_config.json` entry (`"<s>"` or `{"content": "<s>", ...}`).
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Option<Value>, EngineError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| EngineError::Input(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| EngineError::Input(format!("{}: not valid JSON: {e}", path.display())))
}

impl HfText {
    /// Reads `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` and
    /// `config.json` of `dir` (only the first is required).
    pub fn from_dir(dir: &Path) -> Result<HfText, EngineError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(no_tokenizer_json(dir));
        }
        let json = std::fs::read(&path)
            .map_err(|e| EngineError::Input(format!("{}: {e}", path.display())))?;
        let tok_config = read_json(&dir.join("tokenizer_config.json"))?;
        let generation = read_json(&dir.join("generation_config.json"))?;
        let config = read_json(&dir.join("config.json"))?;
        HfText::from_parts(
            dir,
            &json,
            tok_config.as_ref(),
            [&generation, &config].map(|c| c.as_ref().and_then(|c| c.get("eos_token_id"))),
        )
    }

    /// The tokenizer of the folder `dir` (named in messages) from its files already read: the
    /// bytes of `tokenizer.json`, `tokenizer_config.json` when there is one, and the
    /// `eos_token_id` of `generation_config.json` and of `config.json` (a number or a list: the
    /// ids that end generation, with the tokenizer config's `eos_token`).
    pub fn from_parts(
        dir: &Path,
        tokenizer_json: &[u8],
        tok_config: Option<&Value>,
        eos_token_ids: [Option<&Value>; 2],
    ) -> Result<HfText, EngineError> {
        let tokenizer = HfTokenizer::from_bytes(tokenizer_json, Truncation::None)
            .map_err(|e| EngineError::Input(format!("{}: {e}", dir.display())))?;
        let lookup = |key: &str| {
            token_text(tok_config.and_then(|c| c.get(key))).and_then(|t| tokenizer.token_to_id(t))
        };
        let mut end_of_generation = BTreeSet::new();
        end_of_generation.extend(lookup("eos_token"));
        for ids in eos_token_ids {
            match ids {
                Some(Value::Number(n)) => end_of_generation.extend(n.as_u64().map(|n| n as u32)),
                Some(Value::Array(list)) => end_of_generation
                    .extend(list.iter().filter_map(Value::as_u64).map(|n| n as u32)),
                _ => {}
            }
        }
        if end_of_generation.is_empty() {
            tracing::warn!(
                "{}: no end-of-generation token found; generation stops at the length limit",
                dir.display()
            );
        }
        Ok(HfText {
            bos: lookup("bos_token"),
            tokenizer,
            end_of_generation,
        })
    }
}

/// The error for a decoder folder without `tokenizer.json`.
pub(crate) fn no_tokenizer_json(dir: &Path) -> EngineError {
    EngineError::Input(format!(
        "{}: no tokenizer.json (a Hugging Face decoder folder needs config.json, safetensors \
         and tokenizer.json)",
        dir.display()
    ))
}

impl TextTokenizer {
    /// The tokenizer of a Hugging Face decoder folder.
    pub fn from_hf_dir(dir: &Path) -> Result<TextTokenizer, EngineError> {
        Ok(TextTokenizer::Hf(Box::new(HfText::from_dir(dir)?)))
    }

    /// Token ids of `text`. `add_special`: the model's own additions (BOS); `parse_special`:
    /// special-token text in `text` becomes those tokens (`tokenizer.json` always does this).
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, EngineError> {
        match self {
            TextTokenizer::Gguf(t) => Ok(t.encode(text, add_special, parse_special)),
            TextTokenizer::Hf(h) => h
                .tokenizer
                .encode(text, add_special)
                .map_err(|e| EngineError::Input(e.to_string())),
        }
    }

    /// Text of `ids`; special tokens are rendered only with `render_special`.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        match self {
            TextTokenizer::Gguf(t) => t.decode(ids, render_special),
            TextTokenizer::Hf(h) => h.tokenizer.decode(ids, !render_special),
        }
    }

    /// The text of one token, specials included (for listings).
    pub fn piece(&self, id: u32) -> String {
        match self {
            TextTokenizer::Gguf(t) => String::from_utf8_lossy(&t.token_to_piece(id, true)).into(),
            TextTokenizer::Hf(h) => h.tokenizer.decode(&[id], false),
        }
    }

    /// The bytes one token stands for (specials rendered; a byte-fallback token is its byte),
    /// as OpenAI's log-probabilities report them.
    pub fn piece_bytes(&self, id: u32) -> Vec<u8> {
        match self {
            TextTokenizer::Gguf(t) => t.token_to_piece(id, true),
            TextTokenizer::Hf(h) => h.tokenizer.decode(&[id], false).into_bytes(),
        }
    }

    /// Tokens in the vocabulary (added tokens included).
    pub fn vocab_size(&self) -> usize {
        match self {
            TextTokenizer::Gguf(t) => t.vocab_size(),
            TextTokenizer::Hf(h) => h.tokenizer.vocab_size(),
        }
    }

    pub fn bos(&self) -> Option<u32> {
        match self {
            TextTokenizer::Gguf(t) => t.bos(),
            TextTokenizer::Hf(h) => h.bos,
        }
    }

    pub fn is_end_of_generation(&self, id: u32) -> bool {
        match self {
            TextTokenizer::Gguf(t) => t.is_end_of_generation(id),
            TextTokenizer::Hf(h) => h.end_of_generation.contains(&id),
        }
    }

    /// Incremental detokenization for streaming.
    pub fn stream(&self) -> TextStream<'_> {
        match self {
            TextTokenizer::Gguf(t) => TextStream::Gguf(t.stream_decoder()),
            TextTokenizer::Hf(h) => TextStream::Hf {
                tokenizer: &h.tokenizer,
                ids: Vec::new(),
                emitted: String::new(),
            },
        }
    }
}

/// See [`TextTokenizer::stream`].
pub enum TextStream<'a> {
    Gguf(StreamDecoder<'a>),
    /// Decodes all ids so far (up to a trailing run of byte-fallback tokens) and emits what
    /// extends the text already emitted, holding back a text that ends in U+FFFD (a character
    /// whose bytes are still arriving). Decoding the whole
    /// sequence keeps every decoder rule of `tokenizer.json` (leading-space stripping, byte
    /// fallback) exactly as `decode` applies it; the cost grows with the length, which is
    /// negligible next to a forward pass at the lengths one generation reaches.
    Hf {
        tokenizer: &'a HfTokenizer,
        ids: Vec<u32>,
        emitted: String,
    },
}

impl TextStream<'_> {
    /// Text completed by `id` (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        match self {
            TextStream::Gguf(d) => d.push(id),
            TextStream::Hf {
                tokenizer,
                ids,
                emitted,
            } => {
                ids.push(id);
                // A run of byte-fallback tokens (`<0xNN>`) decodes as one group, and an invalid
                // group turns all its bytes into U+FFFD: text from an unfinished run may still
                // change, so only ids up to the last other token are decoded.
                let stable = ids
                    .iter()
                    .rposition(|&i| !is_byte_token(tokenizer, i))
                    .map_or(0, |p| p + 1);
                let now = tokenizer.decode(&ids[..stable], true);
                match now.strip_prefix(emitted.as_str()) {
                    Some(new) if !new.is_empty() && !now.ends_with('\u{FFFD}') => {
                        let new = new.to_string();
                        emitted.push_str(&new);
                        new
                    }
                    _ => String::new(),
                }
            }
        }
    }

    /// Whatever is still held back.
    pub fn finish(self) -> String {
        match self {
            TextStream::Gguf(d) => d.finish(),
            TextStream::Hf {
                tokenizer,
                ids,
                emitted,
            } => {
                let now = tokenizer.decode(&ids, true);
                now.strip_prefix(emitted.as_str())
                    .unwrap_or_default()
                    .to_string()
            }
        }
    }
}

/// Whether `id` is a SentencePiece byte-fallback token (`<0x0A>`).
fn is_byte_token(tokenizer: &HfTokenizer, id: u32) -> bool {
    tokenizer.id_to_token(id).is_some_and(|t| {
        t.len() == 6
            && t.starts_with("<0x")
            && t.ends_with('>')
            && t.get(3..5)
                .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
    })
}
