//! kiln-tokenizer: tokenizers built from GGUF metadata that give exactly llama.cpp's ids.
//!
//! Kinds, chosen by `tokenizer.ggml.model` (llama.cpp's `LLAMA_VOCAB_TYPE_*`):
//! - `"llama"` (SPM): SentencePiece with score-ordered merges and `<0xNN>` byte fallback (Llama 2,
//!   Gemma 3, Phi-3, Baichuan, ...), spaces written as `▁`;
//! - `"gpt2"` (BPE): byte-level BPE with ranked merges, after the pre-tokenizer named by
//!   `tokenizer.ggml.pre`. Every name llama.cpp knows is supported (`bpe_pre.rs` lists them:
//!   `llama-bpe`, `qwen2`, `qwen35`, `gpt-2`, `falcon`, `starcoder`, `refact`, `command-r`,
//!   `deepseek-llm`, `deepseek-coder`, `deepseek-v3`, `gpt-4o`, `tekken`, `chatglm-bpe`, `bloom`,
//!   `default`, ... ) except `kimi-k2`; unknown names are refused by name, as llama.cpp refuses
//!   them;
//! - `"gemma4"` (BPE): SentencePiece-style BPE over `▁`-escaped raw UTF-8 with `<0xNN>` byte
//!   fallback, split only at newline runs (Gemma 4);
//! - `"bert"` (WPM): WordPiece with BERT's normalizer (lowercasing, accent stripping), `▁`-prefixed
//!   word-initial pieces and `[UNK]` for words it cannot cut; `add_special` wraps the text in
//!   CLS (BOS) and SEP.
//!
//! - `"t5"` (UGM): SentencePiece Unigram (T5, XLM-RoBERTa): the precompiled normalization
//!   charsmap, `▁`-escaped spaces, then the Viterbi best split by piece log-probabilities (see
//!   `ugm.rs`).
//!
//! Other kinds (`rwkv`, `plamo2`, ...) are refused by name.
//!
//! The reference is llama.cpp's `src/llama-vocab.cpp` and `src/unicode.cpp` as vendored in
//! llama-cpp-python 0.3.36 (upstream `0c1e57098`). Behaviour is ported, not approximated: the
//! special-token partition order, the per-kind defaults, the attribute fixes llama.cpp applies by
//! token text, llama.cpp's Unicode tables, its hand-written pre-tokenizer splitters, and for the
//! pre-tokenizer regexes it runs through `std::regex`, the same regexes on the same "collapsed"
//! text through an engine with the same (ECMAScript, leftmost-first) semantics.
//!
//! `tokenizer.json` models (WordPiece, Unigram, BPE as Hugging Face describes them) are run by the
//! HF `tokenizers` crate through [`HfTokenizer`].
//!
//! Chat templates (a GGUF's `tokenizer.chat_template`, a `tokenizer_config.json`'s
//! `chat_template`) are rendered as Hugging Face transformers renders them by [`ChatTemplate`]
//! (the `chat` module's docs list what is supported).
//!
//! Invariants:
//! - [`Tokenizer`] is immutable after construction (`Send + Sync`); all lookup structures (piece to
//!   id map, merge ranks, compiled pre-tokenizer regexes, special-token trie) are built once in
//!   [`Tokenizer::from_spec`].
//! - encoding never fails and never panics: any `&str` encodes; decoding accepts any id (ids
//!   outside the vocabulary decode to nothing).
//! - [`Tokenizer::decode`] equals the concatenation of a [`StreamDecoder`]'s output over the same
//!   ids.

mod bpe;
mod bpe_pre;
mod chat;
mod decode;
mod ecma_regex;
mod error;
mod gguf;
mod hash;
mod hf;
mod pretokenize;
mod regex_split;
mod special;
mod spm;
mod ugm;
mod unicode;
mod unicode_tables;
mod vocab;
mod wpm;

pub use chat::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions, SpecialTokens};
pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use hf::{HfTokenizer, Truncation};
pub use vocab::VocabSpec;

use bpe::Bpe;
use bpe_pre::bpe_settings;
use special::{partition, Fragment, SpecialMatcher};
use ugm::Unigram;
use vocab::{attr, keys, KindDefaults, Vocab};
use wpm::WordPiece;

/// The tokenizer kind and its model data.
pub(crate) enum Kind {
    Spm,
    Bpe(Bpe),
    Wpm(WordPiece),
    Ugm(Unigram),
}

impl Kind {
    /// Encodes one text fragment onto `out`. `after_special`: the fragment starts the text or
    /// follows a special token, where llama.cpp gives SentencePiece its prefix space (when the
    /// vocabulary asks for it); the other kinds encode every fragment alike.
    fn encode_fragment(&self, vocab: &Vocab, piece: &str, after_special: bool, out: &mut Vec<u32>) {
        match self {
            Kind::Bpe(bpe) => bpe.encode_fragment(vocab, piece, out),
            Kind::Wpm(wpm) => wpm.encode_fragment(vocab, piece, out),
            Kind::Ugm(ugm) => ugm.encode_fragment(vocab, piece, vocab.add_space_prefix, out),
            Kind::Spm => {
                let mut escaped = String::with_capacity(piece.len() + 3);
                if vocab.add_space_prefix && after_special {
                    escaped.push('\u{2581}');
                }
                for c in piece.chars() {
                    escaped.push(if c == ' ' { '\u{2581}' } else { c });
                }
                spm::encode_fragment(vocab, escaped.as_bytes(), out)
            }
        }
    }
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
            Kind::Bpe(bpe) => format!("BPE ({})", bpe.settings().kind),
            Kind::Wpm(_) => "WordPiece".to_string(),
            Kind::Ugm(_) => "Unigram".to_string(),
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

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &kiln_formats::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(gguf::spec_from_gguf(file)?)
    }

    /// Builds the tokenizer described by `spec` (the GGUF metadata as plain data).
    pub fn from_spec(mut spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        // The kind's defaults (llama.cpp's `load`), which explicit metadata overrides.
        let none = KindDefaults {
            bos: None,
            eos: None,
            unk: None,
            sep: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
        };
        let (defaults, bpe) = match spec.model.as_str() {
            "llama" => {
                let spm = KindDefaults {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    add_bos: true,
                    add_space_prefix: true,
                    ..none
                };
                (spm, None)
            }
            "t5" => {
                // llama.cpp's UGM defaults: EOS 1, UNK 2, EOS appended, no BOS.
                let ugm = KindDefaults {
                    eos: Some(1),
                    unk: Some(2),
                    add_eos: true,
                    ..none
                };
                (ugm, None)
            }
            "bert" => {
                let wpm = KindDefaults {
                    bos: Some(101),
                    unk: Some(100),
                    sep: Some(102),
                    add_bos: true,
                    ..none
                };
                (wpm, None)
            }
            model @ ("gpt2" | "gemma4") => {
                // The "gemma4" model ignores `tokenizer.ggml.pre` and has no default ids.
                let gemma4_model = model == "gemma4";
                let settings = bpe_settings(if gemma4_model {
                    Some("gemma4")
                } else {
                    spec.pre.as_deref()
                })?;
                let bpe_defaults = KindDefaults {
                    bos: (!gemma4_model && !settings.no_default_bos).then_some(11),
                    eos: (!gemma4_model).then_some(11),
                    add_bos: settings.add_bos,
                    ..none
                };
                // llama.cpp's Gemma 4 workaround: BOS is added whatever the metadata says.
                if settings.kind == "GEMMA4" {
                    spec.add_bos = Some(true);
                }
                let merges = spec
                    .merges
                    .take()
                    .ok_or_else(|| TokenizerError::MissingKey(keys::MERGES.to_string()))?;
                (bpe_defaults, Some(Bpe::new(settings, merges)?))
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let wordpiece = (spec.model == "bert")
            .then_some((spec.normalizer_lowercase, spec.normalizer_strip_accents));
        let unigram = (spec.model == "t5").then(|| {
            (
                spec.precompiled_charsmap.take(),
                spec.remove_extra_whitespaces.unwrap_or(false),
            )
        });
        let vocab = Vocab::build(spec, defaults)?;
        let kind =
            match (bpe, wordpiece, unigram) {
                (Some(bpe), _, _) => Kind::Bpe(bpe),
                (None, Some((lowercase, strip_accents)), _) => {
                    Kind::Wpm(WordPiece::new(&vocab, lowercase, strip_accents))
                }
                (None, None, Some((charsmap, remove_extra_whitespaces))) => Kind::Ugm(
                    Unigram::new(&vocab, charsmap.as_deref(), remove_extra_whitespaces)?,
                ),
                (None, None, None) => Kind::Spm,
            };
        let special = SpecialMatcher::new(&vocab);
        Ok(Tokenizer {
            vocab,
            kind,
            special,
        })
    }

    /// Encodes `text`. `add_special`: add BOS (and EOS) as the model's add_bos/add_eos flags say;
    /// for WordPiece, always CLS (BOS) first and SEP last, as llama.cpp does.
    /// `parse_special`: match control tokens in the text (llama.cpp's `special=true`);
    /// user-defined tokens are matched either way.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let vocab = &self.vocab;
        let fragments = partition(vocab, &self.special, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos() {
            out.extend(vocab.bos);
        }
        let mut after_special = true;
        for fragment in &fragments {
            match fragment {
                Fragment::Text(range) => {
                    let piece = text.get(range.clone()).unwrap_or("");
                    self.kind
                        .encode_fragment(vocab, piece, after_special, &mut out);
                    after_special = false;
                }
                Fragment::Token(id) => {
                    out.push(*id);
                    after_special = true;
                }
            }
        }
        if add_special && self.add_eos() {
            out.extend(vocab.eos);
        }
        if add_special && self.add_sep() {
            out.extend(vocab.sep);
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

    /// The separator token (WordPiece's SEP).
    pub fn sep(&self) -> Option<u32> {
        self.vocab.sep
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS (WordPiece: CLS, always).
    pub fn add_bos(&self) -> bool {
        let wanted = matches!(self.kind, Kind::Wpm(_)) || self.vocab.add_bos;
        wanted && self.vocab.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS (never for WordPiece).
    pub fn add_eos(&self) -> bool {
        !matches!(self.kind, Kind::Wpm(_)) && self.vocab.add_eos && self.vocab.eos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` ends with SEP (WordPiece, always).
    pub fn add_sep(&self) -> bool {
        matches!(self.kind, Kind::Wpm(_)) && self.vocab.sep.is_some()
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
    fn unigram_takes_the_most_probable_split() {
        let spec = |charsmap: Option<Vec<u8>>| VocabSpec {
            model: "t5".into(),
            tokens: [
                "<pad>",
                "</s>",
                "<unk>",
                "\u{2581}a",
                "\u{2581}b",
                "\u{2581}ab",
                "b",
            ]
            .map(String::from)
            .to_vec(),
            scores: Some(vec![0.0, 0.0, 0.0, -1.0, -1.0, -1.5, -3.0]),
            token_types: Some(vec![3, 3, 2, 1, 1, 1, 1]),
            add_space_prefix: Some(true),
            remove_extra_whitespaces: Some(true),
            precompiled_charsmap: charsmap,
            ..VocabSpec::default()
        };
        let t = Tokenizer::from_spec(spec(None)).unwrap();
        // "▁ab" (-1.5) beats "▁a" + "b" (-4); spaces collapse; "c" is unknown, with EOS (1) after
        // it when specials are added (llama.cpp's UGM default).
        assert_eq!(t.encode("ab   b", false, false), [5, 4]);
        assert_eq!(t.encode(" ab c", true, false), [5, 2, 1]);
        assert_eq!(t.decode(&[5, 4], false), "ab b");
        let err = Tokenizer::from_spec(spec(Some(vec![9, 0]))).unwrap_err();
        assert!(err.to_string().contains("precompiled_charsmap"), "{err}");
    }

    #[test]
    fn unsupported_kinds_are_named() {
        let err = Tokenizer::from_spec(VocabSpec {
            model: "rwkv".into(),
            tokens: vec!["a".into()],
            ..VocabSpec::default()
        })
        .unwrap_err();
        assert!(matches!(err, TokenizerError::UnsupportedModel(ref m) if m == "rwkv"));
        let err = Tokenizer::from_spec(VocabSpec {
            model: "gpt2".into(),
            pre: Some("kimi-k2".into()),
            tokens: vec!["a".into()],
            merges: Some(vec![]),
            ..VocabSpec::default()
        })
        .unwrap_err();
        assert!(matches!(err, TokenizerError::UnsupportedPreTokenizer(ref p) if p == "kimi-k2"));
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
