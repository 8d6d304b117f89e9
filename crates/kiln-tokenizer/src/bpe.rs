//! BPE (`tokenizer.ggml.model = "gpt2"` or `"gemma4"`), as llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! A text fragment is split into words by the pre-tokenizer; each word's UTF-8 bytes are mapped to
//! GPT-2's printable stand-in characters (`bytes_to_unicode`); the word starts as one symbol per
//! character and the adjacent pair with the lowest merge rank (then the leftmost) is merged until
//! no pair has a rank. Each final symbol is emitted as its token, or, when the vocabulary lacks it,
//! byte by byte as single-byte tokens where those exist (llama.cpp drops the others).
//!
//! SentencePiece-style BPE (Gemma 4, Sarvam: `escape_whitespaces`, no `byte_encode`) differs in
//! three places: spaces become `▁` before the split, words are merged as raw UTF-8, and the byte
//! fallback uses `<0xNN>` tokens. For Gemma 4 a word of newlines that is itself a token is emitted
//! whole (llama.cpp's fix for its merges, which cannot build runs of newlines).
//!
//! Invariants: symbols of a word are contiguous and tile it; a merged-away symbol has length 0;
//! a queued pair is applied only if both symbols still have the lengths it was queued with.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::bpe_pre::BpeSettings;
use crate::hash::{Duplicates, TextIndex};
use crate::pretokenize::PreTokenizer;
use crate::vocab::Vocab;
use crate::TokenizerError;

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the other 68 bytes for
/// U+0100.. in byte order.
pub(crate) const fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        let cpt = if printable {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        table[b] = match char::from_u32(cpt) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

pub(crate) static BYTE_TO_CHAR: [char; 256] = byte_to_char_table();

const fn char_to_byte_table() -> [i16; 0x144] {
    let table = byte_to_char_table();
    let mut inverse = [-1i16; 0x144];
    let mut b = 0usize;
    while b < 256 {
        inverse[table[b] as usize] = b as i16;
        b += 1;
    }
    inverse
}

static CHAR_TO_BYTE: [i16; 0x144] = char_to_byte_table();

/// The inverse of [`BYTE_TO_CHAR`]: stand-in character to byte.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    CHAR_TO_BYTE
        .get(c as usize)
        .and_then(|&b| u8::try_from(b).ok())
}

/// The BPE model: pre-tokenizer and merge ranks.
pub(crate) struct Bpe {
    settings: BpeSettings,
    pre: PreTokenizer,
    /// `tokenizer.ggml.merges`; a merge's rank is its index.
    merges: Vec<String>,
    /// Merge line -> rank; the first of two equal lines wins (llama.cpp's `emplace`).
    index: TextIndex,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge. The heap pops the lowest rank first, then the leftmost pair.
#[derive(Debug, PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// llama.cpp's `unicode_len_utf8`: the sequence length announced by a lead byte (1 for stray
/// continuation bytes).
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

/// The `<0xNN>` token of byte `b`, as SentencePiece vocabularies name it.
pub(crate) fn byte_token_text(b: u8) -> [u8; 6] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [
        b'<',
        b'0',
        b'x',
        HEX[(b >> 4) as usize],
        HEX[(b & 15) as usize],
        b'>',
    ]
}

impl Bpe {
    /// The pre-tokenizer settings it was built with.
    pub(crate) fn settings(&self) -> &BpeSettings {
        &self.settings
    }

    /// Compiles the pre-tokenizer and builds the ranks from `tokenizer.ggml.merges` lines
    /// `"left right"`.
    pub(crate) fn new(settings: BpeSettings, merges: Vec<String>) -> Result<Bpe, TokenizerError> {
        let pre = PreTokenizer::new(settings.regexes)?;
        let index = TextIndex::build(&merges, Duplicates::FirstWins);
        Ok(Bpe {
            settings,
            pre,
            merges,
            index,
        })
    }

    /// The rank of merging `left` with `right`. llama.cpp splits each merge line at its first
    /// space after the first byte, so the pair matches the line `left + " " + right` exactly when
    /// `left` has no space after its first byte.
    fn rank(&self, key: &mut Vec<u8>, left: &[u8], right: &[u8]) -> Option<u32> {
        if left.get(1..).is_some_and(|rest| rest.contains(&b' ')) {
            return None;
        }
        key.clear();
        key.extend_from_slice(left);
        key.push(b' ');
        key.extend_from_slice(right);
        self.index.get(&self.merges, key)
    }

    /// Encodes one raw-text fragment (no special tokens in it), appending ids to `out`.
    pub(crate) fn encode_fragment(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut key = Vec::new();
        let mut encoded = String::new();
        let mut symbols: Vec<Symbol> = Vec::new();
        let mut queue: BinaryHeap<Bigram> = BinaryHeap::new();
        let settings = &self.settings;
        let escaped;
        let text = if settings.escape_whitespaces {
            escaped = text.replace(' ', "\u{2581}");
            &escaped
        } else {
            text
        };
        for word in self.pre.split_words(text) {
            let bytes = if settings.byte_encode {
                encoded.clear();
                encoded.extend(word.bytes().map(|b| BYTE_TO_CHAR[b as usize]));
                encoded.as_bytes()
            } else {
                word.as_bytes()
            };

            symbols.clear();
            queue.clear();
            let whole = (settings.ignore_merges
                || (settings.kind == "GEMMA4" && bytes.iter().all(|&b| b == b'\n')))
                && vocab.lookup(bytes).is_some();
            if whole {
                symbols.push(Symbol {
                    start: 0,
                    len: bytes.len(),
                    prev: None,
                    next: None,
                });
            } else {
                let mut offset = 0;
                while offset < bytes.len() {
                    let len = utf8_len(bytes[offset]).min(bytes.len() - offset);
                    let index = symbols.len();
                    symbols.push(Symbol {
                        start: offset,
                        len,
                        prev: index.checked_sub(1),
                        next: (offset + len < bytes.len()).then_some(index + 1),
                    });
                    offset += len;
                }
            }
            for i in 1..symbols.len() {
                self.push_bigram(bytes, &symbols, Some(i - 1), Some(i), &mut queue, &mut key);
            }

            while let Some(bigram) = queue.pop() {
                let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
                if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                    continue; // outdated
                }
                symbols[bigram.left].len += r.len;
                symbols[bigram.right].len = 0;
                symbols[bigram.left].next = r.next;
                if let Some(next) = r.next {
                    symbols[next].prev = Some(bigram.left);
                }
                let left = symbols[bigram.left];
                self.push_bigram(
                    bytes,
                    &symbols,
                    left.prev,
                    Some(bigram.left),
                    &mut queue,
                    &mut key,
                );
                self.push_bigram(
                    bytes,
                    &symbols,
                    Some(bigram.left),
                    left.next,
                    &mut queue,
                    &mut key,
                );
            }

            for sym in symbols.iter().filter(|s| s.len > 0) {
                let piece = &bytes[sym.start..sym.start + sym.len];
                match vocab.lookup(piece) {
                    Some(id) => out.push(id),
                    None if settings.byte_encode => {
                        out.extend(piece.iter().filter_map(|&b| vocab.lookup(&[b])))
                    }
                    None => out.extend(
                        piece
                            .iter()
                            .filter_map(|&b| vocab.lookup(&byte_token_text(b))),
                    ),
                }
            }
        }
    }

    fn push_bigram(
        &self,
        bytes: &[u8],
        symbols: &[Symbol],
        left: Option<usize>,
        right: Option<usize>,
        queue: &mut BinaryHeap<Bigram>,
        key: &mut Vec<u8>,
    ) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let rank = self.rank(
            key,
            &bytes[l.start..l.start + l.len],
            &bytes[r.start..r.start + r.len],
        );
        if let Some(rank) = rank {
            queue.push(Bigram {
                rank,
                left,
                right,
                size: l.len + r.len,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2() {
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[0xAD], '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
