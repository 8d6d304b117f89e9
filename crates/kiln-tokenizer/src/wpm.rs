//! WordPiece (`tokenizer.ggml.model = "bert"`), as llama.cpp's `llm_tokenizer_wpm_session`.
//!
//! A text fragment is first normalized and cut into words (`preprocess`): with `strip_accents`,
//! each code point is replaced by llama.cpp's single-code-point "NFD" (its base letter) and accent
//! marks are dropped; white space ends a word; NUL, U+FFFD and control characters are dropped;
//! with `lowercase`, code points are lowercased (llama.cpp's table); punctuation, ASCII symbols and
//! CJK ideographs are words of their own. Each word is then prefixed with `▁` (the GGUF converter
//! writes word-initial pieces as `▁piece` and continuation pieces `##piece` as `piece`) and cut
//! greedily from the left into the longest pieces that are tokens. A word that cannot be cut
//! completely becomes the unknown token.
//!
//! Quirks kept: the piece search is over bytes and bounded by the longest token text in the
//! vocabulary; the CJK ranges copy the HF tokenizer's (one starts at U+2B920 where Unicode's
//! starts at U+2B820); lowercasing does not re-check the flags, which are read before it.
//!
//! Invariant: every word yields at least one id when the vocabulary has an unknown token, and the
//! ids of a word are either all pieces that together spell it or that single unknown id.

use crate::unicode::{flags_of, nfd, to_lower};
use crate::vocab::Vocab;

/// `tokenizer.ggml.normalizer.*`, with llama.cpp's defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordPiece {
    lowercase: bool,
    strip_accents: bool,
    /// The longest token text in bytes: no piece can be longer.
    max_token_len: usize,
}

impl WordPiece {
    /// llama.cpp: `lowercase` defaults to true and `strip_accents` to `lowercase`.
    pub(crate) fn new(
        vocab: &Vocab,
        lowercase: Option<bool>,
        strip_accents: Option<bool>,
    ) -> WordPiece {
        let lowercase = lowercase.unwrap_or(true);
        WordPiece {
            lowercase,
            strip_accents: strip_accents.unwrap_or(lowercase),
            max_token_len: vocab.texts.iter().map(|t| t.len()).max().unwrap_or(0),
        }
    }

    /// Encodes one raw-text fragment (no special tokens in it), appending ids to `out`.
    pub(crate) fn encode_fragment(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut word1 = String::new();
        for word in self.preprocess(text) {
            word1.clear();
            word1.push('\u{2581}');
            word1.push_str(&word);
            let bytes = word1.as_bytes();
            let n = bytes.len();
            let current = out.len();
            let mut i = 0;
            while i < n {
                // The longest piece starting at `i`.
                let longest = (i + 1..=n.min(i + self.max_token_len + 1))
                    .rev()
                    .find_map(|j| vocab.lookup(&bytes[i..j]).map(|id| (id, j)));
                match longest {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(current);
                        break;
                    }
                }
            }
            // llama.cpp pushes its unknown id even when there is none (-1); nothing is pushed here.
            if out.len() == current {
                out.extend(vocab.unk);
            }
        }
    }

    /// llama.cpp's `preprocess`: normalized words (see the module docs), none empty.
    fn preprocess(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        for c in text.chars() {
            let mut cpt = u32::from(c);
            if self.strip_accents {
                cpt = nfd(cpt);
            }
            let flags = flags_of(cpt);
            if flags.is_whitespace() {
                if words.last().is_some_and(|w| !w.is_empty()) {
                    words.push(String::new());
                }
                continue;
            }
            if cpt == 0 || cpt == 0xFFFD || flags.is_control() {
                continue;
            }
            if self.strip_accents && flags.is_accent_mark() {
                continue;
            }
            let shown = if self.lowercase { to_lower(cpt) } else { cpt };
            let Some(shown) = char::from_u32(shown) else {
                continue;
            };
            let alone =
                flags.is_punctuation() || (cpt < 0x7F && flags.is_symbol()) || is_chinese_char(cpt);
            let Some(last) = words.last_mut() else {
                continue;
            };
            if alone {
                if !last.is_empty() {
                    words.push(String::new());
                }
                if let Some(last) = words.last_mut() {
                    last.push(shown);
                }
                words.push(String::new());
            } else {
                last.push(shown);
            }
        }
        if words.last().is_some_and(|w| w.is_empty()) {
            words.pop();
        }
        words
    }
}

/// llama.cpp's `is_chinese_char` (the HF BERT tokenizer's ranges, its typo included).
fn is_chinese_char(cpt: u32) -> bool {
    (0x04E00..=0x09FFF).contains(&cpt)
        || (0x03400..=0x04DBF).contains(&cpt)
        || (0x20000..=0x2A6DF).contains(&cpt)
        || (0x2A700..=0x2B73F).contains(&cpt)
        || (0x2B740..=0x2B81F).contains(&cpt)
        || (0x2B920..=0x2CEAF).contains(&cpt)
        || (0x0F900..=0x0FAFF).contains(&cpt)
        || (0x2F800..=0x2FA1F).contains(&cpt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{KindDefaults, VocabSpec};

    fn vocab(tokens: &[&str]) -> Vocab {
        let spec = VocabSpec {
            model: "bert".into(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            ..VocabSpec::default()
        };
        Vocab::build(
            spec,
            KindDefaults {
                bos: None,
                eos: None,
                unk: Some(0),
                sep: None,
                add_bos: false,
                add_eos: false,
                add_space_prefix: false,
            },
        )
        .unwrap()
    }

    fn words(wp: &WordPiece, text: &str) -> Vec<String> {
        wp.preprocess(text)
    }

    #[test]
    fn preprocess_normalizes_and_splits() {
        let v = vocab(&["[UNK]"]);
        let wp = WordPiece::new(&v, None, None);
        assert_eq!(
            words(&wp, "  Héllo, WORLD!\u{7}\tÄpfel 漢字 a$b a½"),
            ["hello", ",", "world", "!", "apfel", "漢", "字", "a", "$", "b", "a½"]
        );
        // Combining marks are dropped with the accents; without stripping they stay.
        assert_eq!(words(&wp, "e\u{301}"), ["e"]);
        let keep = WordPiece::new(&v, Some(false), None);
        assert_eq!(words(&keep, "Äe\u{301}"), ["Äe\u{301}"]);
        let lower_only = WordPiece::new(&v, Some(true), Some(false));
        assert_eq!(words(&lower_only, "Ä"), ["ä"]);
    }

    #[test]
    fn preprocess_is_llama_cpps() {
        use crate::bpe_pre::tests::llama_cpp_splits;
        let v = vocab(&["[UNK]"]);
        let fixture = llama_cpp_splits();
        // WPM0: lowercase and strip accents (the default); WPM1: neither; WPM2: lowercase only.
        let modes = [
            ("WPM0", None, None),
            ("WPM1", Some(false), None),
            ("WPM2", Some(true), Some(false)),
        ];
        for (list, lowercase, strip_accents) in modes {
            let wp = WordPiece::new(&v, lowercase, strip_accents);
            for case in fixture["cases"].as_array().unwrap() {
                let text = case["text"].as_str().unwrap();
                let theirs: Vec<&str> = case["wordpiece"][list]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|w| w.as_str().unwrap())
                    .collect();
                assert_eq!(wp.preprocess(text), theirs, "{list} on {text:?}");
            }
        }
    }

    #[test]
    fn longest_pieces_or_unknown() {
        let v = vocab(&["[UNK]", "▁un", "▁unaff", "able", "aff", "▁x", "ord"]);
        let wp = WordPiece::new(&v, None, None);
        let mut out = Vec::new();
        wp.encode_fragment(&v, "unaffable Xord unz", &mut out);
        // "unaffable" = ▁unaff + able; "xord" = ▁x + ord; "unz" cannot be cut: [UNK].
        assert_eq!(out, [2, 3, 5, 6, 0]);
    }
}
