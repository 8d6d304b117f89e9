//! Detokenization: token pieces, whole-sequence decoding, and the incremental [`StreamDecoder`].
//!
//! A token's piece follows llama.cpp's `token_to_piece`: CONTROL and UNKNOWN tokens render only
//! when asked (`render_special`); USER_DEFINED tokens always render as their text; NORMAL tokens
//! render with `▁` turned back into spaces (SentencePiece, WordPiece, and SentencePiece-style BPE
//! such as Gemma 4's) or with GPT-2's byte stand-ins turned back into bytes (byte-level BPE); BYTE
//! tokens render as their single byte (`<0xNN>`); UNUSED and UNDEFINED tokens
//! render as nothing. When the vocabulary adds a space prefix, the first token of a sequence loses
//! one leading space (llama.cpp's `detokenize`). llama.cpp's `clean_up_tokenization_spaces` pass is
//! not applied: it rewrites text across token boundaries, which a stream cannot do, and decoding
//! must equal the concatenated stream.
//!
//! Invariant of [`StreamDecoder`]: the concatenation of every `push` and the final `finish` equals
//! `decode` of all ids (both replace invalid UTF-8 the same way, maximal invalid subpart by
//! U+FFFD); a `push` only returns whole characters, holding back the bytes of a character that may
//! still be completed by the next tokens.

use crate::bpe::char_to_byte;
use crate::vocab::attr;
use crate::{Kind, Tokenizer};

impl Tokenizer {
    /// Appends the piece of `id` to `out`; with `lstrip`, drops one leading space.
    pub(crate) fn piece_into(
        &self,
        id: u32,
        render_special: bool,
        lstrip: bool,
        out: &mut Vec<u8>,
    ) {
        let vocab = &self.vocab;
        let Some(text) = vocab.texts.get(id as usize) else {
            return;
        };
        let a = vocab.attr(id);
        if !render_special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return;
        }
        let start = out.len();
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            let byte_level = match &self.kind {
                Kind::Bpe(bpe) => !bpe.settings().escape_whitespaces,
                Kind::Spm | Kind::Wpm(_) | Kind::Ugm(_) => false,
            };
            if byte_level {
                decode_byte_level(text, out);
            } else {
                for (i, part) in text.split('\u{2581}').enumerate() {
                    if i > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(part.as_bytes());
                }
            }
        } else if a & attr::BYTE != 0 {
            out.push(byte_of_byte_token(text));
        }
        if lstrip && out.get(start) == Some(&b' ') {
            out.remove(start);
        }
    }

    /// Whether the first token of a sequence loses a leading space.
    pub(crate) fn strips_first_space(&self) -> bool {
        self.vocab.add_space_prefix
    }
}

/// llama.cpp's `llama_decode_text`: GPT-2 stand-in characters back to bytes; a character outside
/// the map becomes `[UNK_BYTE_0x<hex>` + the whole token text + `]`.
fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// The byte of a `<0xNN>` token: `strtol(text[3..5], 16)` as llama.cpp computes it (leading hex
/// digits, 0 when there are none).
fn byte_of_byte_token(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or(&[]);
    let mut value = 0u8;
    for &d in digits.iter().take(2) {
        match (d as char).to_digit(16) {
            Some(v) => value = value.wrapping_mul(16).wrapping_add(v as u8),
            None => break,
        }
    }
    value
}

/// Appends to `out` the text of `pending[..]` up to the last point where a character could still be
/// completed by more bytes; invalid bytes become U+FFFD. Returns how many bytes were consumed.
fn drain_complete(pending: &[u8], out: &mut String) -> usize {
    let mut pos = 0;
    while pos < pending.len() {
        match std::str::from_utf8(&pending[pos..]) {
            Ok(s) => {
                out.push_str(s);
                return pending.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                if let Ok(s) = std::str::from_utf8(&pending[pos..pos + valid]) {
                    out.push_str(s);
                }
                match e.error_len() {
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        pos += valid + bad;
                    }
                    None => return pos + valid,
                }
            }
        }
    }
    pos
}

/// Incremental detokenizer: push ids one at a time and get text that is always whole UTF-8
/// characters. Bytes of a character split across tokens (byte-fallback tokens, or a BPE token that
/// ends inside a character) are held back until the character is complete; [`StreamDecoder::finish`]
/// flushes what is left, invalid leftovers as U+FFFD.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    render_special: bool,
    first: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder that renders control tokens only when `render_special` (as
    /// [`Tokenizer::decode`]).
    pub fn new(tokenizer: &'a Tokenizer, render_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            render_special,
            first: true,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let lstrip = self.first && self.tokenizer.strips_first_space();
        self.first = false;
        self.tokenizer
            .piece_into(id, self.render_special, lstrip, &mut self.pending);
        let mut out = String::new();
        let consumed = drain_complete(&self.pending, &mut out);
        self.pending.drain(..consumed);
        out
    }

    /// The bytes still held back (an incomplete character), as text with U+FFFD for what is invalid.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_holds_incomplete_and_replaces_invalid() {
        let mut out = String::new();
        // "a", then the first two bytes of a 4-byte emoji.
        assert_eq!(drain_complete(b"a\xF0\x9F", &mut out), 1);
        assert_eq!(out, "a");
        out.clear();
        // A stray continuation byte is invalid at once.
        assert_eq!(drain_complete(b"\x80b", &mut out), 2);
        assert_eq!(out, "\u{FFFD}b");
    }

    #[test]
    fn byte_token_values() {
        assert_eq!(byte_of_byte_token("<0x0A>"), 0x0A);
        assert_eq!(byte_of_byte_token("<0xFF>"), 0xFF);
        assert_eq!(byte_of_byte_token("<0x"), 0);
    }
}
