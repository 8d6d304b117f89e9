//! Special-token partitioning, as llama.cpp's `tokenizer_st_partition`: before the main tokenizer
//! runs, occurrences of special tokens are cut out of the text and emitted as single ids.
//!
//! llama.cpp takes the special tokens one at a time, longest text first (`cache_special_tokens`),
//! and splits every remaining text fragment at each leftmost non-overlapping occurrence. So a longer
//! token always wins over a shorter one, even one that starts earlier. With `parse_special = false`
//! CONTROL and UNKNOWN tokens are skipped and only USER_DEFINED ones are matched.
//!
//! Speed: walking all special tokens over the text costs (tokens × text); Gemma has 6,414 of them.
//! A byte trie finds, in one pass, which special tokens occur in the text at all; only those are
//! then applied, in llama.cpp's order, which gives the same fragments because a token that does not
//! occur in the text cannot occur in any fragment of it.
//!
//! Invariants: the fragments tile the text in order, minus the special tokens' text and any white
//! space an LSTRIP/RSTRIP token swallows; fragment boundaries are UTF-8 character boundaries
//! (special texts are whole strings, stripped white space is ASCII).

use std::ops::Range;

use crate::hash::FastMap;
use crate::vocab::{attr, Vocab};

/// A piece of the text after partitioning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Raw text, as a byte range of the input; never empty.
    Text(Range<usize>),
    /// A special token matched in the text.
    Token(u32),
}

/// A byte trie over the special tokens' texts; terminals hold the token's rank in
/// `Vocab::special_cache`.
pub(crate) struct SpecialMatcher {
    edges: FastMap<(u32, u8), u32>,
    terminal: Vec<Option<u32>>,
    first_bytes: [bool; 256],
}

impl SpecialMatcher {
    pub(crate) fn new(vocab: &Vocab) -> SpecialMatcher {
        let mut m = SpecialMatcher {
            edges: FastMap::default(),
            terminal: vec![None],
            first_bytes: [false; 256],
        };
        for (rank, &id) in vocab.special_cache.iter().enumerate() {
            let Some(text) = vocab.texts.get(id as usize) else {
                continue;
            };
            let bytes = text.as_bytes();
            if let Some(&b) = bytes.first() {
                m.first_bytes[b as usize] = true;
            }
            let mut node = 0u32;
            for &b in bytes {
                let next = m.terminal.len() as u32;
                node = *m.edges.entry((node, b)).or_insert(next);
                if node == next {
                    m.terminal.push(None);
                }
            }
            // Two special tokens with one text: keep the first rank, the one llama.cpp applies
            // first.
            if let Some(slot) = m.terminal.get_mut(node as usize) {
                slot.get_or_insert(rank as u32);
            }
        }
        m
    }

    /// The ranks of the special tokens that occur anywhere in `text`, ascending.
    fn present(&self, text: &[u8]) -> Vec<u32> {
        let mut ranks = Vec::new();
        for start in 0..text.len() {
            if !self.first_bytes[text[start] as usize] {
                continue;
            }
            let mut node = 0u32;
            for &b in &text[start..] {
                match self.edges.get(&(node, b)) {
                    Some(&next) => node = next,
                    None => break,
                }
                if let Some(Some(rank)) = self.terminal.get(node as usize) {
                    ranks.push(*rank);
                }
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp uses for LSTRIP/RSTRIP.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Cuts the special tokens out of `text` (see the module docs).
pub(crate) fn partition(
    vocab: &Vocab,
    matcher: &SpecialMatcher,
    text: &str,
    parse_special: bool,
) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text(0..text.len()));
    let bytes = text.as_bytes();

    for rank in matcher.present(bytes) {
        let Some(&id) = vocab.special_cache.get(rank as usize) else {
            continue;
        };
        let token_attr = vocab.attr(id);
        if !parse_special && token_attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let Some(special) = vocab.texts.get(id as usize) else {
            continue;
        };
        let special: &str = special;

        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text(range) = fragment else {
                next.push(fragment);
                continue;
            };
            let (mut pos, end) = (range.start, range.end);
            while pos < end {
                let Some(found) = text.get(pos..end).and_then(|t| t.find(special)) else {
                    next.push(Fragment::Text(pos..end));
                    break;
                };
                let at = pos + found;
                let mut left_end = at;
                if token_attr & attr::LSTRIP != 0 {
                    while left_end > pos && is_c_space(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > pos {
                    next.push(Fragment::Text(pos..left_end));
                }
                next.push(Fragment::Token(id));
                pos = at + special.len();
                if token_attr & attr::RSTRIP != 0 {
                    while pos < end && is_c_space(bytes[pos]) {
                        pos += 1;
                    }
                }
            }
        }
        fragments = next;
    }
    fragments
}
