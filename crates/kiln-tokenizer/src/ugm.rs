//! Unigram tokenization (SentencePiece's UGM model; `tokenizer.ggml.model = "t5"`: T5,
//! XLM-RoBERTa and the embedding models built on it), as llama.cpp's `llm_tokenizer_ugm` does it.
//!
//! 1. **Normalization**, prefix by prefix of the input: a user-defined token is kept as it is;
//!    otherwise the longest prefix found in the precompiled charsmap (SentencePiece's NFKC-style
//!    rules, a double array of XOR-compressed units, see [`Charsmap`]) is replaced by its
//!    replacement string; otherwise the character is copied. Spaces in the result become `▁`: with
//!    `remove_extra_whitespaces` runs of spaces collapse into one `▁` before each word and
//!    trailing ones are dropped; otherwise every space is kept and `add_space_prefix` puts one
//!    `▁` before the first word.
//! 2. **Viterbi** over the normalized bytes, one character at a time: every token (normal,
//!    user-defined or unused) that starts at the character extends the best path to the
//!    character where it ends, scoring its log-probability (0 for user-defined tokens, to prefer
//!    them); a character no token covers by itself may also be taken as the unknown token at the
//!    lowest normal score minus 10. Sums are f64, as SentencePiece's; ties keep the first path.
//! 3. Backtracking from the end gives the tokens; runs of unknown tokens merge into one.
//!
//! Invariants: building never panics on any charsmap (a malformed one is refused with a typed
//! error); encoding never panics (trie indexes are bounds-checked, an out-of-range replacement
//! ends the match as no match).

use crate::hash::{Duplicates, TextIndex};
use crate::vocab::{attr, Vocab};
use crate::TokenizerError;

/// What a lone unknown character costs beyond the worst normal token (SentencePiece's
/// `kUnkPenalty`).
const UNKNOWN_PENALTY: f64 = 10.0;

/// SentencePiece's escaped space, U+2581.
const ESCAPED_SPACE: &str = "\u{2581}";

/// A set of token texts looked up by exact bytes, with the longest text's length (to bound the
/// prefixes worth trying).
struct Matcher {
    texts: Vec<Box<str>>,
    ids: Vec<u32>,
    index: TextIndex,
    max_len: usize,
}

impl Matcher {
    fn new(vocab: &Vocab, keep: impl Fn(u32) -> bool) -> Matcher {
        let (mut texts, mut ids) = (Vec::new(), Vec::new());
        for (id, text) in vocab.texts.iter().enumerate() {
            let id = id as u32;
            if keep(vocab.attr(id)) && !text.is_empty() {
                texts.push(text.clone());
                ids.push(id);
            }
        }
        // llama.cpp's trie keeps the last id inserted for a text.
        let index = TextIndex::build(&texts, Duplicates::LaterWins);
        let max_len = texts.iter().map(|t| t.len()).max().unwrap_or(0);
        Matcher {
            texts,
            ids,
            index,
            max_len,
        }
    }

    fn get(&self, bytes: &[u8]) -> Option<u32> {
        self.index
            .get(&self.texts, bytes)
            .and_then(|i| self.ids.get(i as usize).copied())
    }

    /// The length of the longest text that starts `s` (at a character boundary of `s`), 0 if none.
    fn longest_prefix(&self, s: &str) -> usize {
        let limit = self.max_len.min(s.len());
        (1..=limit)
            .rev()
            .find(|&n| s.is_char_boundary(n) && self.get(&s.as_bytes()[..n]).is_some())
            .unwrap_or(0)
    }
}

/// SentencePiece's precompiled normalization charsmap: a little-endian `u32` byte count, that
/// many bytes of double-array units (XOR-compressed compact double array, Kanda 2018: BASE in
/// bits 10–30 shifted by bit 9, LCHECK in bits 0–7 and 31, LEAF in bit 8, a leaf's value in bits
/// 0–30), then NUL-terminated replacement strings that leaves index.
struct Charsmap {
    units: Vec<u32>,
    replacements: Vec<u8>,
}

impl Charsmap {
    fn parse(bytes: &[u8]) -> Result<Charsmap, TokenizerError> {
        let bad = |detail: String| {
            TokenizerError::malformed("tokenizer.ggml.precompiled_charsmap", detail)
        };
        let header: [u8; 4] = bytes
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| bad(format!("{} bytes, too short for its header", bytes.len())))?;
        let blob = u32::from_le_bytes(header) as usize;
        let units = bytes
            .get(4..4 + blob)
            .filter(|_| blob.is_multiple_of(4) && 4 + blob < bytes.len())
            .ok_or_else(|| {
                bad(format!(
                    "a double array of {blob} bytes does not fit in {} bytes",
                    bytes.len()
                ))
            })?;
        Ok(Charsmap {
            units: units
                .chunks_exact(4)
                .map(|u| u32::from_le_bytes([u[0], u[1], u[2], u[3]]))
                .collect(),
            replacements: bytes[4 + blob..].to_vec(),
        })
    }

    fn base(unit: u32) -> u32 {
        (unit >> 10) << ((unit & (1 << 9)) >> 6)
    }

    /// The longest prefix of `s` the charsmap rewrites: its length and its replacement.
    fn longest_match(&self, s: &[u8]) -> Option<(usize, &[u8])> {
        let unit = |i: u32| self.units.get(i as usize).copied();
        let mut node = Self::base(unit(0)?);
        let mut best = None;
        for (i, &c) in s.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= u32::from(c);
            // A unit past the array ends the walk (a malformed charsmap matches less).
            let Some(u) = unit(node).filter(|u| u & ((1 << 31) | 0xff) == u32::from(c)) else {
                break;
            };
            let leaf = (u >> 8) & 1 == 1;
            node ^= Self::base(u);
            if leaf {
                let Some(value) = unit(node) else { break };
                best = Some((i + 1, (value & ((1 << 31) - 1)) as usize));
            }
        }
        let (len, at) = best?;
        let tail = self.replacements.get(at..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        Some((len, &tail[..end]))
    }
}

/// The Unigram model of a vocabulary.
pub(crate) struct Unigram {
    tokens: Matcher,
    user_defined: Matcher,
    charsmap: Option<Charsmap>,
    unknown_score: f64,
    remove_extra_whitespaces: bool,
}

impl Unigram {
    pub(crate) fn new(
        vocab: &Vocab,
        charsmap: Option<&[u8]>,
        remove_extra_whitespaces: bool,
    ) -> Result<Unigram, TokenizerError> {
        let min_normal = (0..vocab.texts.len() as u32)
            .filter(|&id| vocab.attr(id) & attr::NORMAL != 0)
            .map(|id| vocab.scores.get(id as usize).copied().unwrap_or(0.0))
            .fold(f32::MAX, f32::min);
        Ok(Unigram {
            tokens: Matcher::new(vocab, |a| {
                a & (attr::NORMAL | attr::USER_DEFINED | attr::UNUSED) != 0
            }),
            user_defined: Matcher::new(vocab, |a| a & attr::USER_DEFINED != 0),
            charsmap: charsmap.map(Charsmap::parse).transpose()?,
            // In f32, as llama.cpp computes it, then widened.
            unknown_score: f64::from(min_normal - UNKNOWN_PENALTY as f32),
            remove_extra_whitespaces,
        })
    }

    /// Step 1 of the module docs.
    fn normalize(&self, text: &str, add_space_prefix: bool) -> String {
        let mut out = String::with_capacity(text.len() * 3);
        let (mut prefixed, mut in_word) = (false, false);
        let merge = self.remove_extra_whitespaces;
        let mut rest = text;
        while !rest.is_empty() {
            let user = self.user_defined.longest_prefix(rest);
            let (piece, consumed): (&[u8], usize) = if user > 0 {
                (&rest.as_bytes()[..user], user)
            } else if let Some((len, replacement)) = self
                .charsmap
                .as_ref()
                .and_then(|m| m.longest_match(rest.as_bytes()))
                .filter(|&(len, _)| rest.is_char_boundary(len))
            {
                (replacement, len)
            } else {
                let len = rest.chars().next().map_or(1, char::len_utf8);
                (&rest.as_bytes()[..len], len)
            };
            // Replacements are whole UTF-8 strings; a charsmap that is not loses its bytes to
            // U+FFFD rather than breaking the output.
            for c in String::from_utf8_lossy(piece).chars() {
                if c != ' ' {
                    if !in_word {
                        in_word = true;
                        if (add_space_prefix && !prefixed) || merge {
                            out.push_str(ESCAPED_SPACE);
                            prefixed = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.push_str(ESCAPED_SPACE);
                    }
                }
            }
            rest = &rest[consumed..];
        }
        out
    }

    /// Encodes one text fragment (steps 1–3 of the module docs) onto `out`.
    pub(crate) fn encode_fragment(
        &self,
        vocab: &Vocab,
        text: &str,
        add_space_prefix: bool,
        out: &mut Vec<u32>,
    ) {
        let normalized = self.normalize(text, add_space_prefix);
        let n = normalized.len();
        if n == 0 {
            return;
        }
        let unk = vocab.unk.unwrap_or(0);
        // best[i]: the best path to byte i: (score, token ending at i, where it starts).
        let mut best: Vec<(f64, u32, usize)> = vec![(f64::MIN, unk, 0); n + 1];
        best[0] = (0.0, unk, 0);
        let bytes = normalized.as_bytes();
        let mut start = 0;
        for c in normalized.chars() {
            let char_end = start + c.len_utf8();
            let here = best[start].0;
            let mut whole_char = false;
            let limit = (start + self.tokens.max_len).min(n);
            for end in (char_end..=limit).filter(|&e| normalized.is_char_boundary(e)) {
                let Some(id) = self.tokens.get(&bytes[start..end]) else {
                    continue;
                };
                whole_char |= end == char_end;
                let score = if vocab.attr(id) & attr::USER_DEFINED != 0 {
                    0.0
                } else {
                    f64::from(vocab.scores.get(id as usize).copied().unwrap_or(0.0))
                };
                if here + score > best[end].0 {
                    best[end] = (here + score, id, start);
                }
            }
            if !whole_char && here + self.unknown_score > best[char_end].0 {
                best[char_end] = (here + self.unknown_score, unk, start);
            }
            start = char_end;
        }
        let first = out.len();
        let (mut at, mut prev_unknown) = (n, false);
        loop {
            let (_, id, from) = best[at];
            let unknown = id == unk;
            if !(prev_unknown && unknown) {
                out.push(id);
            }
            if from == 0 {
                break;
            }
            prev_unknown = unknown;
            at = from;
        }
        out[first..].reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A charsmap that is too short, or whose double array runs past its end, is refused by
    /// name; the smallest well-formed one (no units past the root) matches nothing.
    #[test]
    fn malformed_charsmaps_are_refused() {
        for bytes in [&[1u8, 0][..], &[8, 0, 0, 0, 1, 2, 3, 4][..]] {
            let e = Charsmap::parse(bytes).err().unwrap().to_string();
            assert!(e.contains("precompiled_charsmap"), "{e}");
        }
        let empty = Charsmap::parse(&[4, 0, 0, 0, 0, 0, 0, 0, b'x', 0]).unwrap();
        assert_eq!(empty.longest_match(b"abc"), None);
    }
}
