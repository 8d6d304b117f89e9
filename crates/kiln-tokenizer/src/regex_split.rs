//! The general path of llama.cpp's `unicode_regex_split`: a pre-tokenizer regex that has no
//! hand-written splitter runs through `std::regex`, and so does it here, through the same steps.
//!
//! - A regex naming a Unicode category (`\p{L}`, `\p{N}`, `\p{P}`, `\p{M}`, `\p{S}`, `\p{Lu}`, ...)
//!   runs on a "collapsed" text: ASCII code points stay themselves, non-ASCII white space becomes
//!   `\v` (0x0B), and every other non-ASCII code point becomes one byte naming its category (0xD1
//!   number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 anything else). The regex
//!   is rewritten to match: each `\p{..}` becomes its byte plus the ASCII members of the category
//!   (`\p{L}` is `[\xD2A-Za-z]`). So all letter categories collapse into one (`\p{Lu}` matches
//!   lowercase letters too), and an ASCII character belongs to llama.cpp's fixed ASCII list of its
//!   category, whatever the Unicode tables say. Such a regex may not contain non-ASCII characters.
//! - Any other regex runs on the code points, with non-ASCII white space replaced by `\v`
//!   (`std::wregex`'s `\s` is ASCII-only).
//!
//! The regex is then applied to each chunk left by the previous regex separately, as
//! `std::regex_iterator` does: the matches and the gaps between them become the new chunks.
//!
//! Invariants: the returned chunk lengths (in code points) tile each input chunk exactly and in
//! order, with no empty chunk (llama.cpp emits empty ones for empty matches; they hold no text and
//! produce no tokens, so dropping them changes nothing). Matching never fails: should the
//! backtracking engine give up on a pathological text (`fancy-regex`'s backtrack limit, where
//! `std::regex` would recurse until the stack overflows), the rest of the chunk stays one chunk.
//!
//! One difference is knowingly left: after an empty match `std::regex_iterator` first retries at
//! the same position for a non-empty match; here the search goes on from the next code point. The
//! two differ only for a regex that prefers an empty match where a non-empty one starts, which
//! none of llama.cpp's pre-tokenizer regexes does.

use crate::ecma_regex::translate;
use crate::unicode::{flags_of, ACCENT_MARK, LETTER, NUMBER, PUNCTUATION, SYMBOL};
use crate::TokenizerError;

/// llama.cpp's `k_ucat_enum`: the category names it rewrites, and the category of each.
const CATEGORY_NAMES: &[(&str, u16)] = &[
    ("\\p{N}", NUMBER),
    ("\\p{L}", LETTER),
    ("\\p{P}", PUNCTUATION),
    ("\\p{M}", ACCENT_MARK),
    ("\\p{S}", SYMBOL),
    ("\\p{Lu}", LETTER),
    ("\\p{Ll}", LETTER),
    ("\\p{Lt}", LETTER),
    ("\\p{Lm}", LETTER),
    ("\\p{Lo}", LETTER),
];

/// llama.cpp's `k_ucat_cpt` and `k_ucat_map`: a category's collapsed byte and the regex class text
/// of its ASCII members.
fn collapsed_category(category: u16) -> Option<(u32, &'static str)> {
    Some(match category {
        NUMBER => (0xD1, "0-9"),
        LETTER => (0xD2, "A-Za-z"),
        PUNCTUATION => (0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
        ACCENT_MARK => (0xD4, ""),
        SYMBOL => (0xD5, "\\$\\+<->^`\\|\\~"),
        _ => return None,
    })
}

/// A non-ASCII code point as `std::regex` sees it in the collapsed text.
fn collapse(cpt: u32) -> u32 {
    if cpt < 128 {
        return cpt;
    }
    let flags = flags_of(cpt);
    if flags.is_whitespace() {
        0x0B
    } else {
        collapsed_category(flags.category()).map_or(0xD0, |(byte, _)| byte)
    }
}

/// llama.cpp's rewrite of a regex for the collapsed text (the `regex_expr_collapsed` loop),
/// returning code points (the category bytes are code points 0xD0..=0xD5).
fn collapse_regex(expr: &str) -> Vec<u32> {
    let bytes = expr.as_bytes();
    let mut out: Vec<u32> = Vec::with_capacity(bytes.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let prev = i.checked_sub(1).map(|p| bytes[p]);
        if b == b'[' && prev != Some(b'\\') {
            out.push('[' as u32);
            inside = true;
            i += 1;
            continue;
        }
        if inside && b == b']' && prev != Some(b'\\') {
            out.push(']' as u32);
            inside = false;
            i += 1;
            continue;
        }
        if b == b'\\' && i + 3 < bytes.len() && bytes[i + 1] == b'p' && bytes[i + 2] == b'{' {
            let close = bytes[i + 3..]
                .iter()
                .position(|&c| c == b'}')
                .map(|p| p + i + 3);
            if let Some(close) = close.filter(|&c| c <= i + 10) {
                let name = expr.get(i..=close).unwrap_or("");
                let known = CATEGORY_NAMES.iter().find(|(n, _)| *n == name);
                if let Some((byte, members)) = known.and_then(|&(_, c)| collapsed_category(c)) {
                    if !inside {
                        out.push('[' as u32);
                    }
                    out.push(byte);
                    out.extend(members.chars().map(u32::from));
                    if !inside {
                        out.push(']' as u32);
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(b as u32);
        i += 1;
    }
    out
}

/// One pre-tokenizer regex compiled as llama.cpp would run it through `std::regex`.
#[derive(Debug)]
pub(crate) struct StlRegex {
    regex: fancy_regex::Regex,
    collapsed: bool,
}

impl StlRegex {
    pub(crate) fn new(expr: &str) -> Result<StlRegex, TokenizerError> {
        let error = |reason: String| TokenizerError::PreTokenizerRegex {
            regex: expr.to_string(),
            reason,
        };
        let collapsed = CATEGORY_NAMES.iter().any(|(name, _)| expr.contains(name));
        let pattern: Vec<u32> = if collapsed {
            if !expr.is_ascii() {
                // llama.cpp throws here (at the first tokenization).
                return Err(error(
                    "a regex with Unicode categories must be ASCII (llama.cpp rejects it too)"
                        .into(),
                ));
            }
            collapse_regex(expr)
        } else {
            expr.chars().map(u32::from).collect()
        };
        let translated = translate(&pattern).map_err(error)?;
        let regex = fancy_regex::RegexBuilder::new(&translated)
            .backtrack_limit(10_000_000)
            .build()
            .map_err(|e| error(e.to_string()))?;
        Ok(StlRegex { regex, collapsed })
    }

    /// Splits each chunk of `cpts` (lengths `offsets`) at the matches; returns the new lengths.
    pub(crate) fn split(&self, cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
        // The text the regex sees, and the byte offset of each code point in it.
        let mut text = String::with_capacity(cpts.len());
        let mut byte_of = Vec::with_capacity(cpts.len() + 1);
        for &cpt in cpts {
            byte_of.push(text.len());
            let seen = if self.collapsed {
                collapse(cpt)
            } else if cpt > 0x7F && flags_of(cpt).is_whitespace() {
                0x0B
            } else {
                cpt
            };
            text.push(char::from_u32(seen).unwrap_or('\u{FFFD}'));
        }
        byte_of.push(text.len());
        let cpt_at = |byte: usize| byte_of.partition_point(|&b| b < byte);

        let mut out = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for &len in offsets {
            let (Some(&b0), Some(&b1)) = (byte_of.get(start), byte_of.get(start + len)) else {
                break;
            };
            let chunk = text.get(b0..b1).unwrap_or("");
            let mut emitted = b0; // end of the last piece pushed, absolute
            let mut push = |end: usize, out: &mut Vec<usize>| {
                let n = cpt_at(end) - cpt_at(emitted);
                if n > 0 {
                    out.push(n);
                }
                emitted = end;
            };
            let mut pos = 0;
            while pos <= chunk.len() {
                let Ok(Some(m)) = self.regex.find_from_pos(chunk, pos) else {
                    break;
                };
                push(b0 + m.start(), &mut out);
                push(b0 + m.end(), &mut out);
                pos = if m.end() > m.start() {
                    m.end()
                } else {
                    match chunk.get(m.end()..).and_then(|rest| rest.chars().next()) {
                        Some(c) => m.end() + c.len_utf8(),
                        None => break,
                    }
                };
            }
            push(b1, &mut out);
            start += len;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(expr: &str, text: &str) -> Vec<String> {
        let re = StlRegex::new(expr).unwrap();
        let cpts: Vec<u32> = text.chars().map(u32::from).collect();
        let mut words = Vec::new();
        let mut start = 0;
        for len in re.split(&cpts, &[cpts.len()]) {
            words.push(
                cpts[start..start + len]
                    .iter()
                    .filter_map(|&c| char::from_u32(c))
                    .collect(),
            );
            start += len;
        }
        words
    }

    #[test]
    fn collapsed_regex_rewrite() {
        let text = |v: Vec<u32>| -> String { v.into_iter().filter_map(char::from_u32).collect() };
        assert_eq!(text(collapse_regex(r"\p{N}")), "[\u{D1}0-9]");
        assert_eq!(
            text(collapse_regex(r"[^\s\p{L}\p{N}]+")),
            "[^\\s\u{D2}A-Za-z\u{D1}0-9]+"
        );
        assert_eq!(text(collapse_regex(r"\p{Han}+")), r"\p{Han}+");
    }

    #[test]
    fn categories_collapse() {
        // ½ is a number, Ä a letter, ・ punctuation; ideographic space is white space.
        assert_eq!(split(r"\p{N}+", "a½1b"), ["a", "½1", "b"]);
        assert_eq!(
            split(r"\s?\p{L}+", "Äb\u{3000}ÿ2"),
            ["Äb", "\u{3000}ÿ", "2"]
        );
        // Every letter category is one class once collapsed.
        assert_eq!(split(r"\p{Lu}+", "ABcd1"), ["ABcd", "1"]);
        // ASCII keeps llama.cpp's fixed list: '$' is a symbol, not punctuation.
        assert_eq!(split(r"\p{P}+", "a$,.!b"), ["a$", ",.!", "b"]);
    }

    #[test]
    fn wide_regex_sees_code_points() {
        // Not collapsed: literal non-ASCII ranges work, non-ASCII white space is `\s`.
        assert_eq!(split("[一-龥]+", "ab漢字c"), ["ab", "漢字", "c"]);
        assert_eq!(split(r"\s+$", "a\u{3000} "), ["a", "\u{3000} "]);
        assert_eq!(split(r"[\r\n]", "a\r\nb"), ["a", "\r", "\n", "b"]);
    }

    #[test]
    fn chunks_are_split_separately() {
        let re = StlRegex::new("[0-9][0-9][0-9]").unwrap();
        let cpts: Vec<u32> = "12345678".chars().map(u32::from).collect();
        // A match never crosses a chunk boundary.
        assert_eq!(re.split(&cpts, &[2, 6]), [2, 3, 3]);
        // Empty matches only split.
        let re = StlRegex::new(r"(?=(\d{3})+(?!\d))").unwrap();
        assert_eq!(re.split(&cpts, &[8]), [2, 3, 3]);
    }

    #[test]
    fn refused_regexes_name_the_reason() {
        let err = StlRegex::new(r"\p{L}+|[一-龥]+").unwrap_err();
        assert!(err.to_string().contains("ASCII"), "{err}");
        assert!(StlRegex::new(r"(?i:'s)").is_err());
    }
}
