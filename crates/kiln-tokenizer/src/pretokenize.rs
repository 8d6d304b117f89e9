//! BPE pre-tokenizers: the split of a text into words before any merge, exactly as llama.cpp does
//! it (`unicode.cpp`).
//!
//! llama.cpp does not run the pre-tokenizer regexes through a regex engine for the kinds supported
//! here: it matches the regex text against a table and runs a hand-written splitter
//! (`unicode_regex_split_custom_gpt2/_llama3/_qwen2`). Those splitters are ported line for line
//! below, including their quirks (e.g. the `\s+(?!\S)` rule leaves the last white space of a run to
//! the next word). The "default" pre-tokenizer is a cascade of four regexes, three of which llama.cpp
//! runs through `std::regex` on a "collapsed" text; each is a character-class run or a fixed-length
//! digit pattern, reimplemented here with the same results.
//!
//! Invariants: every splitter works on code points in chunks (`offsets`: lengths in code points that
//! sum to the text length) and returns new chunk lengths that tile each input chunk exactly, in
//! order, with no empty chunk. Character classes come from llama.cpp's own Unicode tables
//! (`unicode_tables.rs`), not from Rust's, so that both agree on every code point.

use crate::unicode_tables::CPT_FLAG_RUNS;

const NUMBER: u16 = 0x0002;
const LETTER: u16 = 0x0004;
const PUNCTUATION: u16 = 0x0020;
const CATEGORIES: u16 = 0x00FF;
const WHITESPACE: u16 = 0x0100;

/// A BPE pre-tokenizer, as named by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// As `Llama3` with `\p{N}` (single digits) instead of `\p{N}{1,3}`.
    Qwen2,
    /// llama.cpp's fallback: `[\p{P}\$\+<=>\^~\|]+`, then the GPT-2 regex, then `\p{N}+`, then
    /// `[0-9][0-9][0-9]`, each splitting the pieces of the previous one.
    Default,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flags(u16);

impl Flags {
    fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE != 0
    }
    /// llama.cpp's `flags.as_uint() != 0`: true for every code point (the table sets bit 0x8000
    /// on all of them), false for "outside the chunk".
    fn any(self) -> bool {
        self.0 != 0
    }
    fn category(self) -> u16 {
        self.0 & CATEGORIES
    }
}

const fn ascii_flags() -> [u16; 128] {
    let mut table = [0u16; 128];
    let mut run = 0;
    let mut c = 0;
    while c < 128 {
        while run + 1 < CPT_FLAG_RUNS.len() && CPT_FLAG_RUNS[run + 1].0 <= c as u32 {
            run += 1;
        }
        table[c] = CPT_FLAG_RUNS[run].1;
        c += 1;
    }
    table
}

static ASCII_FLAGS: [u16; 128] = ascii_flags();

fn flags_of(cpt: u32) -> Flags {
    if let Some(&f) = ASCII_FLAGS.get(cpt as usize) {
        return Flags(f);
    }
    // The runs start at 0 and are sorted, so the run holding `cpt` is the last one starting at or
    // before it. Code points past the table (never produced from a `&str`) have no flags.
    let i = CPT_FLAG_RUNS.partition_point(|&(start, _)| start <= cpt);
    match i.checked_sub(1).and_then(|i| CPT_FLAG_RUNS.get(i)) {
        Some(&(_, f)) if cpt < 0x110000 => Flags(f),
        _ => Flags(0),
    }
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

/// One chunk being split: llama.cpp's `_get_cpt`, `_get_flags` and `_add_token` closures.
struct Chunk<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl<'a> Chunk<'a> {
    fn new(cpts: &'a [u32], ini: usize, len: usize, out: &'a mut Vec<usize>) -> Self {
        Chunk {
            cpts,
            ini,
            end: ini + len,
            prev_end: ini,
            out,
        }
    }

    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts.get(pos).copied().unwrap_or(OUT_OF_RANGE)
        } else {
            OUT_OF_RANGE
        }
    }

    fn flags(&self, pos: usize) -> Flags {
        match self.cpt(pos) {
            OUT_OF_RANGE => Flags(0),
            c => flags_of(c),
        }
    }

    /// Ends the current word at `end`; returns its length (0 adds nothing).
    fn add_token(&mut self, end: usize) -> usize {
        let len = end.saturating_sub(self.prev_end);
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn is(cpt: u32, c: char) -> bool {
    cpt == c as u32
}

/// llama.cpp's `unicode_tolower`, restricted to what the contraction rules can observe: outside
/// ASCII its table maps only U+0130 to `i` and U+212A to `k` into ASCII, and neither letter occurs
/// in a contraction.
fn to_lower_ascii(cpt: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cpt) {
        cpt + 32
    } else {
        cpt
    }
}

/// Splits `cpts` (tiled by `offsets`) with the pre-tokenizer's rules; returns the word lengths.
pub(crate) fn split_offsets(pre: PreTokenizer, cpts: &[u32]) -> Vec<usize> {
    let whole = [cpts.len()];
    match pre {
        PreTokenizer::Gpt2 => split_gpt2(cpts, &whole),
        PreTokenizer::Llama3 => split_llama3(cpts, &whole, true),
        PreTokenizer::Qwen2 => split_llama3(cpts, &whole, false),
        PreTokenizer::Default => {
            let o = split_class_runs(cpts, &whole, is_default_punct);
            let o = split_gpt2(cpts, &o);
            let o = split_class_runs(cpts, &o, is_number_collapsed);
            split_digit_triples(cpts, &o)
        }
    }
}

/// Splits `text` into words; each word is a sub-slice of `text`, and together they tile it.
pub(crate) fn split_words(pre: PreTokenizer, text: &str) -> Vec<&str> {
    let cpts: Vec<u32> = text.chars().map(u32::from).collect();
    let lengths = split_offsets(pre, &cpts);
    let mut words = Vec::with_capacity(lengths.len());
    let mut chars = text.char_indices().map(|(i, _)| i).chain([text.len()]);
    let mut start = chars.next().unwrap_or(0);
    for len in lengths {
        let end = chars.nth(len.saturating_sub(1)).unwrap_or(text.len());
        if let Some(word) = text.get(start..end) {
            words.push(word);
        }
        start = end;
    }
    words
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `pos`: the contraction's length in code points, if any.
fn contraction_len(c: &Chunk<'_>, pos: usize, lower: fn(u32) -> u32) -> Option<usize> {
    if !is(c.cpt(pos), '\'') || pos + 1 >= c.end {
        return None;
    }
    let next = lower(c.cpt(pos + 1));
    if is(next, 's') || is(next, 't') || is(next, 'm') || is(next, 'd') {
        return Some(2);
    }
    if pos + 2 < c.end {
        let next_next = lower(c.cpt(pos + 2));
        if (is(next, 'r') && is(next_next, 'e'))
            || (is(next, 'v') && is(next_next, 'e'))
            || (is(next, 'l') && is(next_next, 'l'))
        {
            return Some(3);
        }
    }
    None
}

/// llama.cpp `unicode_regex_split_custom_gpt2`.
fn split_gpt2(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut c = Chunk::new(cpts, start, len, &mut out);
        start += len;
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            let flags = c.flags(pos);

            if let Some(n) = contraction_len(&c, pos, |x| x) {
                pos += c.add_token(pos + n);
                continue;
            }

            let space = is(cpt, ' ');
            let mut flags2 = if space { c.flags(pos + 1) } else { flags };
            // <space>?\p{L}+
            if flags2.is_letter() {
                pos += space as usize;
                while flags2.is_letter() {
                    pos += 1;
                    flags2 = c.flags(pos);
                }
                c.add_token(pos);
                continue;
            }
            // <space>?\p{N}+
            if flags2.is_number() {
                pos += space as usize;
                while flags2.is_number() {
                    pos += 1;
                    flags2 = c.flags(pos);
                }
                c.add_token(pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            if other(flags2) {
                pos += space as usize;
                while other(flags2) {
                    pos += 1;
                    flags2 = c.flags(pos);
                }
                c.add_token(pos);
                continue;
            }

            let mut num_whitespaces = 0;
            while c.flags(pos + num_whitespaces).is_whitespace() {
                num_whitespaces += 1;
            }
            // \s+(?!\S)
            if num_whitespaces > 1 && c.cpt(pos + num_whitespaces) != OUT_OF_RANGE {
                pos += num_whitespaces - 1;
                c.add_token(pos);
                continue;
            }
            // \s+
            if num_whitespaces > 0 {
                pos += num_whitespaces;
                c.add_token(pos);
                continue;
            }
            // no match
            pos += 1;
            c.add_token(pos);
        }
    }
    out
}

/// llama.cpp `unicode_regex_split_custom_llama3` (`digits_upto_3`) and `_qwen2` (single digits);
/// the two differ only in the `\p{N}` rule.
fn split_llama3(cpts: &[u32], offsets: &[usize], digits_upto_3: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut c = Chunk::new(cpts, start, len, &mut out);
        start += len;
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            let flags = c.flags(pos);

            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if let Some(n) = contraction_len(&c, pos, to_lower_ascii) {
                pos += c.add_token(pos + n);
                continue;
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(is(cpt, '\r') || is(cpt, '\n') || flags.is_number())
                && (flags.is_letter() || c.flags(pos + 1).is_letter())
            {
                pos += 1;
                while c.flags(pos).is_letter() {
                    pos += 1;
                }
                c.add_token(pos);
                continue;
            }

            if flags.is_number() {
                if digits_upto_3 {
                    // \p{N}{1,3}
                    let mut ini = pos;
                    while c.flags(pos).is_number() {
                        pos += 1;
                        if pos - ini >= 3 {
                            c.add_token(pos);
                            ini = pos;
                        }
                    }
                    c.add_token(pos);
                } else {
                    // \p{N}
                    pos += 1;
                    c.add_token(pos);
                }
                continue;
            }

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the current code point's flags for
            // "any", not the next one's)
            let space = is(cpt, ' ');
            let mut flags2 = if space { c.flags(pos + 1) } else { flags };
            let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number());
            if other(flags2) && flags.any() {
                pos += space as usize;
                while other(flags2) && flags2.any() {
                    pos += 1;
                    flags2 = c.flags(pos);
                }
                let mut cpt2 = c.cpt(pos);
                while is(cpt2, '\r') || is(cpt2, '\n') {
                    pos += 1;
                    cpt2 = c.cpt(pos);
                }
                c.add_token(pos);
                continue;
            }

            let mut num_whitespaces = 0;
            let mut last_end_r_or_n = 0;
            while c.flags(pos + num_whitespaces).is_whitespace() {
                let cpt2 = c.cpt(pos + num_whitespaces);
                if is(cpt2, '\r') || is(cpt2, '\n') {
                    last_end_r_or_n = pos + num_whitespaces + 1;
                }
                num_whitespaces += 1;
            }
            // \s*[\r\n]+
            if last_end_r_or_n > 0 {
                pos = last_end_r_or_n;
                c.add_token(pos);
                continue;
            }
            // \s+(?!\S)
            if num_whitespaces > 1 && c.cpt(pos + num_whitespaces) != OUT_OF_RANGE {
                pos += num_whitespaces - 1;
                c.add_token(pos);
                continue;
            }
            // \s+
            if num_whitespaces > 0 {
                pos += num_whitespaces;
                c.add_token(pos);
                continue;
            }
            // no match
            pos += 1;
            c.add_token(pos);
        }
    }
    out
}

/// The class `[\p{P}\$\+<=>\^~\|]` as llama.cpp's collapsed `std::regex` sees it: ASCII code points
/// stand for themselves (its ASCII `\p{P}` list plus `$+<=>^~|`; not the backtick), and any other
/// code point matches when it is not white space and its category is exactly punctuation.
fn is_default_punct(cpt: u32) -> bool {
    match char::from_u32(cpt) {
        Some(c) if c.is_ascii() => "!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|".contains(c),
        _ => {
            let f = flags_of(cpt);
            !f.is_whitespace() && f.category() == PUNCTUATION
        }
    }
}

/// The class `\p{N}` as llama.cpp's collapsed `std::regex` sees it: ASCII digits, or a non-ASCII
/// code point that is not white space and whose category is exactly number.
fn is_number_collapsed(cpt: u32) -> bool {
    if cpt < 128 {
        (b'0' as u32..=b'9' as u32).contains(&cpt)
    } else {
        let f = flags_of(cpt);
        !f.is_whitespace() && f.category() == NUMBER
    }
}

/// `std::regex` split by `[class]+`: maximal runs of class members become words, and so do the
/// gaps between them.
fn split_class_runs(cpts: &[u32], offsets: &[usize], class: fn(u32) -> bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let chunk = cpts.get(start..start + len).unwrap_or(&[]);
        start += len;
        let mut run_len = 0;
        let mut run_class = None;
        for &cpt in chunk {
            let in_class = class(cpt);
            if run_class != Some(in_class) && run_len > 0 {
                out.push(run_len);
                run_len = 0;
            }
            run_class = Some(in_class);
            run_len += 1;
        }
        if run_len > 0 {
            out.push(run_len);
        }
    }
    out
}

/// `std::regex` split by `[0-9][0-9][0-9]`: leftmost non-overlapping ASCII digit triples become
/// words, and so do the gaps between them.
fn split_digit_triples(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let is_digit = |c: u32| (b'0' as u32..=b'9' as u32).contains(&c);
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let chunk = cpts.get(start..start + len).unwrap_or(&[]);
        start += len;
        let mut gap_start = 0;
        let mut i = 0;
        while i + 3 <= chunk.len() {
            if chunk[i..i + 3].iter().all(|&c| is_digit(c)) {
                if i > gap_start {
                    out.push(i - gap_start);
                }
                out.push(3);
                i += 3;
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if chunk.len() > gap_start {
            out.push(chunk.len() - gap_start);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        split_words(pre, text)
    }

    #[test]
    fn flags_follow_llama_tables() {
        assert!(flags_of('a' as u32).is_letter());
        assert!(flags_of('7' as u32).is_number());
        assert!(flags_of(' ' as u32).is_whitespace());
        assert!(flags_of(0x3000).is_whitespace());
        assert!(flags_of('é' as u32).is_letter());
        assert!(flags_of(0x1F600).any());
        assert!(!flags_of(0x1F600).is_letter());
        assert_eq!(flags_of(0x110000), Flags(0));
    }

    #[test]
    fn gpt2_rules() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello world's  end!!\n\n x"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n\n", " x"]
        );
    }

    #[test]
    fn llama3_rules() {
        assert_eq!(
            words(PreTokenizer::Llama3, "I'VE 12345 apples...\r\n  ok"),
            ["I", "'VE", " ", "123", "45", " apples", "...\r\n", " ", " ok"]
        );
        assert_eq!(
            words(PreTokenizer::Qwen2, "x 123"),
            ["x", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn default_cascade() {
        assert_eq!(
            words(PreTokenizer::Default, "a+b=1234567 `x`"),
            ["a", "+", "b", "=", "123", "456", "7", " `", "x", "`"]
        );
    }

    #[test]
    fn words_tile_the_text() {
        let text = "Ünïcödé 🦙 text, 1234\t\tand\u{3000}more  ";
        for pre in [
            PreTokenizer::Gpt2,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
            PreTokenizer::Default,
        ] {
            assert_eq!(words(pre, text).concat(), text);
        }
    }
}
