//! The vocabulary: token texts, scores and attributes, the special ids, and the end-of-generation
//! set, in the state llama.cpp's `llama_vocab::impl::load` leaves them.
//!
//! Invariants after [`Vocab::build`]:
//! - `texts`, `scores` and `attrs` have one entry per token id; no text is empty (an empty token is
//!   renamed `[EMPTY_<id>]`, as llama.cpp does).
//! - `index` finds every text's id; where two ids share a text the later id wins.
//! - every special id (`bos`, `eos`, ...) and every id in `eog` is `< texts.len()`.
//! - `special_cache` lists the ids whose attributes include CONTROL, USER_DEFINED or UNKNOWN,
//!   longest text first (ties by ascending id; llama.cpp's `std::sort` leaves ties unspecified, which
//!   only matters for two equal-length special tokens that overlap in a text).
//! - the attribute fixes llama.cpp applies by token text (EOT/EOM/FIM detection, EOG marking,
//!   "unused" detection, the gpt-oss and Gemma 4 workarounds, per-model LSTRIP/RSTRIP) are applied.

use std::collections::HashSet;

use crate::hash::{Duplicates, TextIndex};
use crate::TokenizerError;

/// Token attributes, bit for bit llama.cpp's `llama_token_attr`.
pub(crate) mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// GGUF metadata keys read by [`crate::Tokenizer::from_gguf`].
pub(crate) mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    // llama.cpp's spelling.
    pub const SEP_ID: &str = "tokenizer.ggml.seperator_token_id";
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    pub const MASK_ID: &str = "tokenizer.ggml.mask_token_id";
    pub const FIM_PRE_ID: &str = "tokenizer.ggml.fim_pre_token_id";
    pub const FIM_SUF_ID: &str = "tokenizer.ggml.fim_suf_token_id";
    pub const FIM_MID_ID: &str = "tokenizer.ggml.fim_mid_token_id";
    pub const FIM_PAD_ID: &str = "tokenizer.ggml.fim_pad_token_id";
    pub const FIM_REP_ID: &str = "tokenizer.ggml.fim_rep_token_id";
    pub const FIM_SEP_ID: &str = "tokenizer.ggml.fim_sep_token_id";
    // Deprecated spellings of the FIM ids; where present they win, as in llama.cpp.
    pub const PREFIX_ID: &str = "tokenizer.ggml.prefix_token_id";
    pub const SUFFIX_ID: &str = "tokenizer.ggml.suffix_token_id";
    pub const MIDDLE_ID: &str = "tokenizer.ggml.middle_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    pub const REMOVE_EXTRA_WHITESPACES: &str = "tokenizer.ggml.remove_extra_whitespaces";
    pub const PRECOMPILED_CHARSMAP: &str = "tokenizer.ggml.precompiled_charsmap";
    pub const NORMALIZER_LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";
    pub const NORMALIZER_STRIP_ACCENTS: &str = "tokenizer.ggml.normalizer.strip_accents";
    pub const GENERAL_NAME: &str = "general.name";
    pub const GENERAL_ARCHITECTURE: &str = "general.architecture";
}

/// A tokenizer described as plain data: the GGUF `tokenizer.ggml.*` metadata, one field per key.
/// `None` means the key is absent (llama.cpp's per-kind default applies).
#[derive(Debug, Clone, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: `"llama"` (SentencePiece), `"gpt2"` (BPE), `"gemma4"` (BPE over
    /// `▁`-escaped text), `"bert"` (WordPiece) or `"t5"` (Unigram).
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer name (`"llama-bpe"`, `"qwen2"`, `"gpt-2"`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token texts, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: SentencePiece merge scores (higher merges first).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: BPE merges `"left right"`, highest priority first.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id`.
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.mask_token_id`.
    pub mask_id: Option<u32>,
    /// `tokenizer.ggml.fim_pre_token_id` (or the deprecated `prefix_token_id`).
    pub fim_pre_id: Option<u32>,
    /// `tokenizer.ggml.fim_suf_token_id` (or the deprecated `suffix_token_id`).
    pub fim_suf_id: Option<u32>,
    /// `tokenizer.ggml.fim_mid_token_id` (or the deprecated `middle_token_id`).
    pub fim_mid_id: Option<u32>,
    /// `tokenizer.ggml.fim_pad_token_id`.
    pub fim_pad_id: Option<u32>,
    /// `tokenizer.ggml.fim_rep_token_id`.
    pub fim_rep_id: Option<u32>,
    /// `tokenizer.ggml.fim_sep_token_id`.
    pub fim_sep_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.precompiled_charsmap`: SentencePiece's normalization rules (Unigram).
    pub precompiled_charsmap: Option<Vec<u8>>,
    /// `tokenizer.ggml.remove_extra_whitespaces` (Unigram; default false).
    pub remove_extra_whitespaces: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece; llama.cpp's default is true).
    pub normalizer_lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; defaults to `normalizer_lowercase`).
    pub normalizer_strip_accents: Option<bool>,
    /// `general.name` (llama.cpp sets LSTRIP/RSTRIP attributes for some model names).
    pub model_name: Option<String>,
    /// `general.architecture` (same use as `model_name`).
    pub architecture: Option<String>,
}

/// What the tokenizer kind (and pre-tokenizer) decides before the metadata is read: llama.cpp's
/// defaults, which explicit metadata overrides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KindDefaults {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
}

/// The vocabulary in its final, queryable form (see the module invariants).
pub(crate) struct Vocab {
    pub texts: Vec<Box<str>>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    pub index: TextIndex,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub eog: HashSet<u32>,
    pub special_cache: Vec<u32>,
}

/// Token texts that llama.cpp takes for end-of-generation tokens (and marks CONTROL).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// llama.cpp's `llama_token_type` (GGUF `token_type` values) to attributes.
fn attr_of_token_type(token_type: i32) -> u32 {
    match token_type {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

impl Vocab {
    /// Builds the vocabulary from `spec` as llama.cpp's loader does, given the kind's defaults.
    pub(crate) fn build(
        mut spec: VocabSpec,
        defaults: KindDefaults,
    ) -> Result<Vocab, TokenizerError> {
        let n_tokens = spec.tokens.len();
        if n_tokens == 0 {
            return Err(TokenizerError::malformed(
                keys::TOKENS,
                "the vocabulary is empty",
            ));
        }
        if u32::try_from(n_tokens).is_err() {
            return Err(TokenizerError::malformed(
                keys::TOKENS,
                format!("{n_tokens} tokens do not fit 32-bit ids"),
            ));
        }
        if let Some(scores) = &spec.scores {
            if scores.len() < n_tokens {
                return Err(TokenizerError::malformed(
                    keys::SCORES,
                    format!("{} scores for {n_tokens} tokens", scores.len()),
                ));
            }
        }
        if let Some(types) = &spec.token_types {
            if types.len() < n_tokens {
                return Err(TokenizerError::malformed(
                    keys::TOKEN_TYPE,
                    format!("{} token types for {n_tokens} tokens", types.len()),
                ));
            }
        }

        let scores = match &spec.scores {
            Some(s) => s[..n_tokens].to_vec(),
            None => vec![0.0; n_tokens],
        };
        let mut attrs: Vec<u32> = match &spec.token_types {
            Some(t) => t[..n_tokens]
                .iter()
                .map(|&t| attr_of_token_type(t))
                .collect(),
            None => vec![attr::NORMAL; n_tokens],
        };
        let texts: Vec<Box<str>> = std::mem::take(&mut spec.tokens)
            .into_iter()
            .enumerate()
            .map(|(id, text)| {
                if text.is_empty() {
                    format!("[EMPTY_{id}]").into_boxed_str()
                } else {
                    text.into_boxed_str()
                }
            })
            .collect();
        let index = TextIndex::build(&texts, Duplicates::LaterWins);
        let lookup = |text: &str| index.get(&texts, text.as_bytes());

        // Special ids: the kind's default (dropped when out of range), then the metadata value
        // (ignored when out of range), as llama.cpp does.
        let pick = |default: Option<u32>, explicit: Option<u32>| -> Option<u32> {
            let default = default.filter(|&id| (id as usize) < n_tokens);
            match explicit {
                Some(id) if (id as usize) < n_tokens => Some(id),
                _ => default,
            }
        };
        let bos = pick(defaults.bos, spec.bos_id);
        let eos = pick(defaults.eos, spec.eos_id);
        let unk = pick(defaults.unk, spec.unk_id);
        let sep = pick(defaults.sep, spec.sep_id);
        let mut eot = pick(None, spec.eot_id);
        let mut eom = pick(None, spec.eom_id);
        let mut fim_pre = pick(None, spec.fim_pre_id);
        let mut fim_suf = pick(None, spec.fim_suf_id);
        let mut fim_mid = pick(None, spec.fim_mid_id);
        let mut fim_pad = pick(None, spec.fim_pad_id);
        let mut fim_rep = pick(None, spec.fim_rep_id);
        let mut fim_sep = pick(None, spec.fim_sep_id);

        let add_space_prefix = spec.add_space_prefix.unwrap_or(defaults.add_space_prefix);
        let add_bos = spec.add_bos.unwrap_or(defaults.add_bos);
        let add_eos = spec.add_eos.unwrap_or(defaults.add_eos);

        // Auto-detect EOT/EOM/FIM ids by text where the metadata gave none, marking each found
        // token CONTROL. llama.cpp walks an unordered map here; we walk ids in order, which only
        // matters for a vocabulary holding two candidate texts for the same role.
        let detect: [(&mut Option<u32>, &[&str]); 8] = [
            (&mut eot, EOT_TEXTS),
            (&mut eom, EOM_TEXTS),
            (&mut fim_pre, FIM_PRE_TEXTS),
            (&mut fim_suf, FIM_SUF_TEXTS),
            (&mut fim_mid, FIM_MID_TEXTS),
            (&mut fim_pad, FIM_PAD_TEXTS),
            (&mut fim_rep, FIM_REP_TEXTS),
            (&mut fim_sep, FIM_SEP_TEXTS),
        ];
        for (slot, candidates) in detect {
            if slot.is_some() {
                continue;
            }
            let found = candidates.iter().filter_map(|c| lookup(c)).min();
            if let Some(id) = found {
                *slot = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }

        // Control tokens whose text says "unused" are unused.
        for (id, text) in texts.iter().enumerate() {
            if attrs[id] & attr::CONTROL != 0 && text.contains("unused") {
                attrs[id] |= attr::UNUSED;
            }
        }

        // The end-of-generation set.
        let mut eog: HashSet<u32> = HashSet::new();
        eog.extend(fim_pad);
        eog.extend(fim_rep);
        eog.extend(fim_sep);
        for text in EOG_TEXTS {
            if let Some(id) = lookup(text) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        // gpt-oss: these are always rendered.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = lookup(text) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend(eos);
        eog.extend(eot);
        eog.extend(eom);

        // o200k_harmony and solar-open: `<|end|>` ends a message, not the generation.
        {
            let has = |s: &str| eog.iter().any(|&id| &*texts[id as usize] == s);
            let has_return = has("<|return|>");
            let has_call = has("<|call|>") || has("<|calls|>");
            let has_flush = has("<|flush|>");
            let end_id = eog
                .iter()
                .copied()
                .find(|&id| &*texts[id as usize] == "<|end|>");
            if let Some(end_id) = end_id {
                if has_call && (has_return || has_flush) {
                    eog.remove(&end_id);
                    attrs[end_id as usize] = attr::USER_DEFINED;
                }
            }
        }
        // Gemma 4 and PLaMo: `</s>` is an ordinary token.
        {
            let has_marker = eog
                .iter()
                .any(|&id| matches!(&*texts[id as usize], "<|tool_response>" | "<|plamo:eos|>"));
            let s_id = eog
                .iter()
                .copied()
                .find(|&id| &*texts[id as usize] == "</s>");
            if let (true, Some(s_id)) = (has_marker, s_id) {
                eog.remove(&s_id);
                attrs[s_id as usize] = attr::NORMAL;
            }
        }

        let mut special_cache: Vec<u32> = (0..n_tokens as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_cache.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        apply_model_attrs(&spec, &lookup, &special_cache, &mut attrs);

        Ok(Vocab {
            texts,
            scores,
            attrs,
            index,
            bos,
            eos,
            eot,
            unk,
            sep,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
            special_cache,
        })
    }

    pub(crate) fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    /// The id whose text is exactly `text`.
    pub(crate) fn lookup(&self, text: &[u8]) -> Option<u32> {
        self.index.get(&self.texts, text)
    }

    /// The attributes of `id`; ids outside the vocabulary have none.
    pub(crate) fn attr(&self, id: u32) -> u32 {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(attr::UNDEFINED)
    }
}

/// llama.cpp's per-model LSTRIP/RSTRIP attributes (it has no GGUF field for them).
fn apply_model_attrs(
    spec: &VocabSpec,
    lookup: &dyn Fn(&str) -> Option<u32>,
    special_cache: &[u32],
    attrs: &mut [u32],
) {
    let set = |attrs: &mut [u32], text: &str, flag: u32, on: bool| {
        if let Some(a) = lookup(text).and_then(|id| attrs.get_mut(id as usize)) {
            *a = if on { *a | flag } else { *a & !flag };
        }
    };
    let name = spec
        .model_name
        .as_deref()
        .unwrap_or("")
        .to_ascii_lowercase();
    let pre = spec.pre.as_deref().unwrap_or("");
    let arch = spec.architecture.as_deref().unwrap_or("");
    let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|sub| s.contains(sub));
    if contains_any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
        || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
    {
        set(attrs, "<mask>", attr::LSTRIP, true);
    } else if contains_any(&name, &["phi-3", "phi3"]) {
        for &id in special_cache {
            if let Some(a) = attrs.get_mut(id as usize) {
                *a |= attr::RSTRIP;
            }
        }
        set(attrs, "</s>", attr::RSTRIP, true);
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            set(attrs, text, attr::RSTRIP, false);
        }
    } else if name.contains("modern-bert") {
        set(attrs, "[MASK]", attr::LSTRIP, true);
    }
}
