//! kiln-tokenizer: tokenizers built from GGUF metadata that give exactly llama.cpp's ids.
//!
//! Two kinds, chosen by `tokenizer.ggml.model`:
//! - `"llama"`: SentencePiece with score-ordered merges and `<0xNN>` byte fallback (Llama 2,
//!   Gemma 3, ...), spaces written as `▁`;
//! - `"gpt2"`: byte-level BPE with ranked merges, after a pre-tokenizer named by
//!   `tokenizer.ggml.pre`: `llama3`/`llama-bpe`, `qwen2`, `gpt-2`, `default`, and the names
//!   llama.cpp treats identically to one of those (`llama-v3`, `deepseek-r1-qwen`, `phi-2`, `mpt`,
//!   `olmo`, ...). Other pre-tokenizers are refused by name.
//!
//! The reference is llama.cpp's `src/llama-vocab.cpp` and `src/unicode.cpp` as vendored in
//! llama-cpp-python 0.3.36 (upstream `0c1e57098`). Behaviour is ported, not approximated: the
//! special-token partition order, the per-kind defaults, the attribute fixes llama.cpp applies by
//! token text, and llama.cpp's Unicode tables are all reproduced.
//!
//! `tokenizer.json` models (WordPiece, Unigram, BPE as Hugging Face describes them) are run by the
//! HF `tokenizers` crate through [`HfTokenizer`].
//!
//! Invariants:
//! - [`Tokenizer`] is immutable after construction (`Send + Sync`); all lookup structures (piece to
//!   id map, merge ranks, special-token trie) are built once in [`Tokenizer::from_spec`].
//! - encoding never fails and never panics: any `&str` encodes; decoding accepts any id (ids
//!   outside the vocabulary decode to nothing).
//! - [`Tokenizer::decode`] equals the concatenation of a [`StreamDecoder`]'s output over the same
//!   ids.

mod bpe;
mod decode;
mod error;
mod gguf;
mod hash;
mod hf;
mod pretokenize;
mod special;
mod spm;
mod unicode_tables;
mod vocab;

pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use hf::{HfTokenizer, Truncation};
pub use vocab::VocabSpec;

use bpe::Bpe;
use pretokenize::PreTokenizer;
use special::{partition, Fragment, SpecialMatcher};
use vocab::{attr, keys, KindDefaults, Vocab};

/// The tokenizer kind and its model data.
pub(crate) enum Kind {
    Spm,
    Bpe(Bpe),
}

/// A tokenizer: encodes text to ids and decodes ids to text as llama.cpp does for the same GGUF.
pub struct Tokenizer {
    vocab: Vocab,
    kind: Kind,
    special: SpecialMatcher,
}

impl std::fmt::Debug for Tokenizer {
    // A summary: the derived form would print every token of the vocabulary.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Spm => "SentencePiece".to_string(),
            Kind::Bpe(bpe) => format!("BPE ({:?})", bpe.pre()),
        };
        f.debug_struct("Tokenizer")
            .field("kind", &kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos())
            .field("eos", &self.eos())
            .field("add_bos", &self.add_bos())
            .finish()
    }
}

/// What a BPE pre-tokenizer name sets in llama.cpp: the splitter, `ignore_merges`, and `add_bos`.
fn bpe_pre(name: Option<&str>) -> Result<(PreTokenizer, bool, bool), TokenizerError> {
    Ok(match name {
        None | Some("default") => (PreTokenizer::Default, false, false),
        Some(
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
            | "lfm2" | "jina-v5-nano",
        ) => (PreTokenizer::Llama3, true, true),
        Some("qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2") => {
            (PreTokenizer::Qwen2, false, false)
        }
        Some(
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
            | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo",
        ) => (PreTokenizer::Gpt2, false, false),
        Some(other) => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
    })
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &kiln_formats::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(gguf::spec_from_gguf(file)?)
    }

    /// Builds the tokenizer described by `spec` (the GGUF metadata as plain data).
    pub fn from_spec(mut spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        let (kind, defaults) = match spec.model.as_str() {
            "llama" => (
                None,
                KindDefaults {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    add_bos: true,
                    add_eos: false,
                    add_space_prefix: true,
                },
            ),
            "gpt2" => {
                let (pre, ignore_merges, add_bos) = bpe_pre(spec.pre.as_deref())?;
                let merges = spec
                    .merges
                    .take()
                    .ok_or_else(|| TokenizerError::MissingKey(keys::MERGES.to_string()))?;
                (
                    Some(Bpe::new(pre, ignore_merges, merges)),
                    KindDefaults {
                        bos: Some(11),
                        eos: Some(11),
                        unk: None,
                        add_bos,
                        add_eos: false,
                        add_space_prefix: false,
                    },
                )
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let vocab = Vocab::build(spec, defaults)?;
        let kind = match kind {
            Some(bpe) => Kind::Bpe(bpe),
            None => Kind::Spm,
        };
        let special = SpecialMatcher::new(&vocab);
        Ok(Tokenizer {
            vocab,
            kind,
            special,
        })
    }

    /// Encodes `text`. `add_special`: add BOS (and EOS) as the model's add_bos/add_eos flags say.
    /// `parse_special`: match control tokens in the text (llama.cpp's `special=true`);
    /// user-defined tokens are matched either way.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let vocab = &self.vocab;
        let fragments = partition(vocab, &self.special, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && vocab.add_bos {
            out.extend(vocab.bos);
        }
        match &self.kind {
            Kind::Spm => {
                // llama.cpp prefixes a space to a text fragment that follows a special token or
                // starts the text, when the vocabulary asks for it.
                let mut prev_special = true;
                let mut escaped = String::new();
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            escaped.clear();
                            if vocab.add_space_prefix && prev_special {
                                escaped.push('\u{2581}');
                            }
                            for c in text.get(range.clone()).unwrap_or("").chars() {
                                escaped.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm::encode_fragment(vocab, escaped.as_bytes(), &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                    }
                }
            }
            Kind::Bpe(bpe) => {
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(range) => bpe.encode_fragment(
                            vocab,
                            text.get(range.clone()).unwrap_or(""),
                            &mut out,
                        ),
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
        }
        if add_special && vocab.add_eos {
            out.extend(vocab.eos);
        }
        out
    }

    /// Decodes `ids`: the concatenated token pieces (control tokens rendered only when
    /// `render_special`), invalid UTF-8 replaced by U+FFFD. See the `decode` module for the rules.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            self.piece_into(
                id,
                render_special,
                i == 0 && self.strips_first_space(),
                &mut bytes,
            );
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes `id` renders as (byte-fallback tokens give raw bytes, which may be part of a
    /// UTF-8 character). Control tokens render only when `render_special`.
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.piece_into(id, render_special, false, &mut out);
        out
    }

    /// The number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.n_tokens()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// The end-of-turn token (from metadata, or found by text as llama.cpp does).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos && self.vocab.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos && self.vocab.eos.is_some()
    }

    /// Whether generation stops at `id`: EOS, EOT, EOM, the FIM pad/repo/separator tokens and
    /// the tokens llama.cpp recognises by text (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`,
    /// `<|endoftext|>`, `</s>`, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// Whether `id` is a control token (rendered only with `render_special`).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// The id of the token whose vocabulary text is exactly `piece` (e.g. `"<end_of_turn>"`,
    /// `"▁the"`).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.vocab.lookup(piece.as_bytes())
    }

    /// The vocabulary text of `id` (as stored in the GGUF, e.g. `"▁the"` or `"<0x0A>"`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(|t| &**t)
    }

    /// An incremental detokenizer over this vocabulary, rendering as `decode(ids, false)`.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tokenizer_is_send_sync() {
        assert_send_sync::<Tokenizer>();
    }

    #[test]
    fn debug_is_a_summary() {
        let text = format!("{:?}", tiny_spm());
        assert!(
            text.contains("SentencePiece") && text.contains("vocab_size: 265"),
            "{text}"
        );
    }

    /// A tiny SentencePiece vocabulary: byte tokens for every byte plus a few merges.
    fn tiny_spm() -> Tokenizer {
        let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0, 0.0, 0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for (text, score) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -2.0),
            ("hi", -1.5),
            ("▁hi", -0.5),
            ("<b>", 0.0),
        ] {
            tokens.push(text.to_string());
            types.push(if text == "<b>" { 4 } else { 1 });
            scores.push(score);
        }
        Tokenizer::from_spec(VocabSpec {
            model: "llama".into(),
            tokens,
            scores: Some(scores),
            token_types: Some(types),
            ..VocabSpec::default()
        })
        .unwrap()
    }

    #[test]
    fn spm_merges_prefix_and_byte_fallback() {
        let t = tiny_spm();
        let hi = t.token_id("▁hi").unwrap();
        assert_eq!(t.encode("hi", false, false), [hi]);
        // 'é' is no token: its two UTF-8 bytes fall back to <0xC3><0xA9>.
        let e = t.encode("hié", false, false);
        assert_eq!(e, [hi, 3 + 0xC3, 3 + 0xA9]);
        assert_eq!(t.decode(&e, false), "hié");
        // BOS added, and `</s>` is control: matched only with parse_special.
        assert_eq!(t.encode("", true, false), [1]);
        assert!(t.encode("</s>", false, false).len() > 1);
        assert_eq!(t.encode("</s>", false, true), [2]);
        assert!(t.is_end_of_generation(2));
        // User-defined tokens are matched without parse_special; the text after one gets a space
        // prefix, as llama.cpp does.
        let b = t.token_id("<b>").unwrap();
        assert_eq!(t.encode("<b>hi", false, false), [b, hi]);
    }

    #[test]
    fn unsupported_kinds_are_named() {
        let err = Tokenizer::from_spec(VocabSpec {
            model: "bert".into(),
            tokens: vec!["a".into()],
            ..VocabSpec::default()
        })
        .unwrap_err();
        assert!(matches!(err, TokenizerError::UnsupportedModel(ref m) if m == "bert"));
        let err = Tokenizer::from_spec(VocabSpec {
            model: "gpt2".into(),
            pre: Some("deepseek-coder".into()),
            tokens: vec!["a".into()],
            merges: Some(vec![]),
            ..VocabSpec::default()
        })
        .unwrap_err();
        assert!(
            matches!(err, TokenizerError::UnsupportedPreTokenizer(ref p) if p == "deepseek-coder")
        );
        let err = Tokenizer::from_spec(VocabSpec {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens: vec!["a".into()],
            ..VocabSpec::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.merges"));
    }
}
