//! SentencePiece BPE by scores (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session`.
//!
//! The fragment (spaces already escaped to U+2581) starts as one symbol per UTF-8 character; the
//! adjacent pair whose concatenation is a token with the highest score (then the leftmost) is merged
//! until no pair forms a token. Each final symbol is emitted as its token, or as byte-fallback
//! tokens `<0xNN>` when it is none.
//!
//! llama.cpp also records, per merged text, the pair that formed it (`rev_merge`) and re-splits a
//! final symbol along it when the symbol is no token. That path cannot be taken: a symbol grows only
//! by a merge whose text is a token, so a final symbol that is no token is a single character, and
//! no recorded merge text (two or more characters) equals a single character. It is omitted.
//!
//! Invariants: symbols are contiguous and tile the text; a merged-away symbol has length 0; a
//! queued pair is applied only if both symbols still have the lengths it was queued with.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::bpe::{byte_token_text, utf8_len};
use crate::vocab::Vocab;

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge. The heap pops the highest score first, then the leftmost pair.
#[derive(Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // As llama.cpp's comparator: scores compare as floats (so -0.0 == 0.0; a NaN ties).
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a [u8],
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

/// Encodes `text` (one raw fragment, spaces already escaped), appending ids to `out`.
pub(crate) fn encode_fragment(vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) {
    let mut session = Session {
        vocab,
        text,
        symbols: Vec::with_capacity(text.len()),
        queue: BinaryHeap::new(),
    };
    session.run(out);
}

impl<'a> Session<'a> {
    fn piece(&self, sym: Symbol) -> &'a [u8] {
        let text: &'a [u8] = self.text;
        &text[sym.start..sym.start + sym.len]
    }

    fn run(&mut self, out: &mut Vec<u32>) {
        let text = self.text;
        let mut offset = 0;
        while offset < text.len() {
            let len = utf8_len(text[offset]).min(text.len() - offset);
            let index = self.symbols.len();
            self.symbols.push(Symbol {
                start: offset,
                len,
                prev: index.checked_sub(1),
                next: (offset + len < text.len()).then_some(index + 1),
            });
            offset += len;
        }

        for i in 1..self.symbols.len() {
            self.try_add_bigram(Some(i - 1), Some(i));
        }

        while let Some(bigram) = self.queue.pop() {
            let (l, r) = (self.symbols[bigram.left], self.symbols[bigram.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue; // one side was merged since this pair was queued
            }
            self.symbols[bigram.left].len += r.len;
            self.symbols[bigram.right].len = 0;
            self.symbols[bigram.left].next = r.next;
            if let Some(next) = r.next {
                self.symbols[next].prev = Some(bigram.left);
            }
            let left = self.symbols[bigram.left];
            self.try_add_bigram(left.prev, Some(bigram.left));
            self.try_add_bigram(Some(bigram.left), left.next);
        }

        let mut i = (!self.symbols.is_empty()).then_some(0);
        while let Some(index) = i {
            let sym = self.symbols[index];
            let piece = self.piece(sym);
            match self.vocab.lookup(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece {
                        out.extend(self.byte_to_token(b));
                    }
                }
            }
            i = sym.next;
        }
    }

    /// llama.cpp's `byte_to_token` for SPM: `<0xNN>`, else the byte itself as a token. Where the
    /// vocabulary has neither, llama.cpp throws; we emit the unknown token (if any) instead.
    fn byte_to_token(&self, b: u8) -> Option<u32> {
        self.vocab
            .lookup(&byte_token_text(b))
            .or_else(|| self.vocab.lookup(&[b]))
            .or(self.vocab.unk)
    }

    fn try_add_bigram(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (self.symbols[left], self.symbols[right]);
        let text: &'a [u8] = self.text;
        let merged = &text[l.start..l.start + l.len + r.len];
        let Some(id) = self.vocab.lookup(merged) else {
            return;
        };
        let score = self.vocab.scores.get(id as usize).copied().unwrap_or(0.0);
        self.queue.push(Bigram {
            score,
            left,
            right,
            size: merged.len(),
        });
    }
}
