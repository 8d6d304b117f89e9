//! BPE pre-tokenizers: the split of a text into words before any merge, exactly as llama.cpp's
//! `unicode_regex_split` does it.
//!
//! A pre-tokenizer is llama.cpp's list of regexes for the model's `tokenizer.ggml.pre`
//! (`bpe_pre.rs`), applied in order, each one splitting the pieces left by the previous one. As in
//! llama.cpp, a regex is first looked up by its exact text among the hand-written splitters
//! (`unicode_regex_split_custom_*`: GPT-2, Llama 3, Qwen 2, Qwen 3.5, newline runs, AFMoE digit
//! groups), which are ported line for line below, quirks included (e.g. the `\s+(?!\S)` rule
//! leaves the last white space of a run to the next word). Every other regex runs through the
//! `std::regex` emulation of `regex_split.rs`. A few regexes that llama.cpp runs through
//! `std::regex` have hand-written equivalents here, for speed (character-class runs, ASCII digit
//! triples) or to stay linear where a backtracking engine is quadratic (SuperBPE's digit-group
//! lookahead); a test checks each against the general path.
//!
//! Invariants: every splitter works on code points in chunks (`offsets`: lengths in code points that
//! sum to the text length) and returns new chunk lengths that tile each input chunk exactly, in
//! order, with no empty chunk. Character classes come from llama.cpp's own Unicode tables
//! (`unicode.rs`), not from Rust's, so that both agree on every code point.

use crate::regex_split::StlRegex;
use crate::unicode::{flags_of, to_lower, Flags, NUMBER, PUNCTUATION};
use crate::TokenizerError;

/// A splitter llama.cpp (or kiln, for speed) implements by hand, chosen by the regex's text.
#[derive(Debug, Clone, Copy)]
enum Custom {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// As `Llama3` with `\p{N}` (single digits) instead of `\p{N}{1,3}`.
    Qwen2,
    /// As `Qwen2` with `[\p{L}\p{M}]+` for letters, and marks excluded from the symbol run.
    Qwen35,
    /// `[^\n]+|[\n]+`
    Newlines,
    /// llama.cpp's `unicode_regex_split_custom_afmoe` (see [`split_digit_groups`]).
    DigitGroups,
    /// `[class]+` over a collapsed class (kiln's fast path for a `std::regex` run).
    ClassRuns(fn(u32) -> bool),
    /// `[0-9][0-9][0-9]` (kiln's fast path for a `std::regex` run).
    DigitTriples,
    /// `(?=(\d{3})+(?!\d))` (kiln's fast path for a `std::regex` run, which takes quadratic time
    /// in the length of a digit run).
    DigitTripleBoundaries,
}

const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_ADAPTED: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINES: &str = "[^\\n]+|[\\n]+";
const AFMOE_DIGITS: &str = "\\p{AFMoE_digits}";
const TINY_AYA_DIGITS: &str = "\\d{1,3}(?=(?:\\d{3})*\\b)";
// Runs through `std::regex` in llama.cpp.
const DEFAULT_PUNCT: &str = "[\\p{P}\\$\\+<=>\\^~\\|]+";
const FALCON_PUNCT: &str = "[\\p{P}\\$\\+<=>\\^~\\|`]+";
const NUMBER_RUNS: &str = "\\p{N}+";
const DIGIT_TRIPLES: &str = "[0-9][0-9][0-9]";
const DIGIT_TRIPLE_BOUNDARIES: &str = "(?=(\\d{3})+(?!\\d))";

/// llama.cpp's dispatch in `unicode_regex_split_custom`, plus kiln's fast paths.
fn custom(expr: &str) -> Option<Custom> {
    Some(match expr {
        GPT2 => Custom::Gpt2,
        LLAMA3 | LLAMA3_ADAPTED => Custom::Llama3,
        QWEN2 => Custom::Qwen2,
        QWEN35 => Custom::Qwen35,
        NEWLINES => Custom::Newlines,
        AFMOE_DIGITS | TINY_AYA_DIGITS => Custom::DigitGroups,
        DEFAULT_PUNCT => Custom::ClassRuns(is_default_punct),
        FALCON_PUNCT => Custom::ClassRuns(is_falcon_punct),
        NUMBER_RUNS => Custom::ClassRuns(is_number_collapsed),
        DIGIT_TRIPLES => Custom::DigitTriples,
        DIGIT_TRIPLE_BOUNDARIES => Custom::DigitTripleBoundaries,
        _ => return None,
    })
}

#[derive(Debug)]
enum Step {
    Custom(Custom),
    Regex(StlRegex),
}

/// A BPE pre-tokenizer: llama.cpp's regex list for one `tokenizer.ggml.pre`, ready to run.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

impl PreTokenizer {
    /// Compiles llama.cpp's regex list `exprs` (in its order).
    pub(crate) fn new(exprs: &[&str]) -> Result<PreTokenizer, TokenizerError> {
        let steps = exprs
            .iter()
            .map(|&expr| match custom(expr) {
                Some(c) => Ok(Step::Custom(c)),
                None => StlRegex::new(expr).map(Step::Regex),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { steps })
    }

    /// Splits `cpts` into words; returns the word lengths in code points.
    pub(crate) fn split_offsets(&self, cpts: &[u32]) -> Vec<usize> {
        let mut offsets = vec![cpts.len()];
        for step in &self.steps {
            offsets = match step {
                Step::Custom(Custom::Gpt2) => split_gpt2(cpts, &offsets),
                Step::Custom(Custom::Llama3) => split_llama3(cpts, &offsets, Variant::Llama3),
                Step::Custom(Custom::Qwen2) => split_llama3(cpts, &offsets, Variant::Qwen2),
                Step::Custom(Custom::Qwen35) => split_llama3(cpts, &offsets, Variant::Qwen35),
                Step::Custom(Custom::Newlines) => split_newlines(cpts, &offsets),
                Step::Custom(Custom::DigitGroups) => split_digit_groups(cpts, &offsets),
                Step::Custom(Custom::ClassRuns(class)) => split_class_runs(cpts, &offsets, *class),
                Step::Custom(Custom::DigitTriples) => split_digit_triples(cpts, &offsets),
                Step::Custom(Custom::DigitTripleBoundaries) => {
                    split_digit_triple_boundaries(cpts, &offsets)
                }
                Step::Regex(re) => re.split(cpts, &offsets),
            };
        }
        offsets.retain(|&len| len > 0);
        offsets
    }

    /// Splits `text` into words; each word is a sub-slice of `text`, and together they tile it.
    pub(crate) fn split_words<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let cpts: Vec<u32> = text.chars().map(u32::from).collect();
        let lengths = self.split_offsets(&cpts);
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

/// Which of llama.cpp's three near-identical splitters [`split_llama3`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// `unicode_regex_split_custom_llama3`: `\p{N}{1,3}`.
    Llama3,
    /// `unicode_regex_split_custom_qwen2`: `\p{N}`.
    Qwen2,
    /// `unicode_regex_split_custom_qwen35`: as Qwen2, with accent marks joining letter runs and
    /// leaving symbol runs.
    Qwen35,
}

/// llama.cpp `unicode_regex_split_custom_llama3`, `_qwen2` and `_qwen35` (see [`Variant`]).
fn split_llama3(cpts: &[u32], offsets: &[usize], variant: Variant) -> Vec<usize> {
    let marks = variant == Variant::Qwen35;
    let letter = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
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
            if let Some(n) = contraction_len(&c, pos, to_lower) {
                pos += c.add_token(pos + n);
                continue;
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+  (Qwen 3.5: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)
            if !(is(cpt, '\r') || is(cpt, '\n') || flags.is_number())
                && (letter(flags) || letter(c.flags(pos + 1)))
            {
                pos += 1;
                while letter(c.flags(pos)) {
                    pos += 1;
                }
                c.add_token(pos);
                continue;
            }

            if flags.is_number() {
                if variant == Variant::Llama3 {
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

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (Qwen 3.5: [^\s\p{L}\p{M}\p{N}]; llama.cpp tests the
            // current code point's flags for "any", not the next one's)
            let space = is(cpt, ' ');
            let mut flags2 = if space { c.flags(pos + 1) } else { flags };
            let other = |f: Flags| !(f.is_whitespace() || letter(f) || f.is_number());
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

/// llama.cpp `unicode_regex_split_custom_newlines`: runs of `\n` and runs of anything else.
fn split_newlines(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    split_class_runs(cpts, offsets, |c| c == '\n' as u32)
}

/// llama.cpp `unicode_regex_split_custom_afmoe` (also used for Tiny Aya's
/// `\d{1,3}(?=(?:\d{3})*\b)`): a run of `\p{N}` splits into groups of three counted from its end.
/// Quirk kept: the text before a digit run is not a word of its own but joins the run's first
/// group (`"ab1234"` gives `"ab1"`, `"234"`), as llama.cpp's `_add_token` emits from the previous
/// word's end.
fn split_digit_groups(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut c = Chunk::new(cpts, start, len, &mut out);
        start += len;
        let mut pos = c.ini;
        while pos < c.end {
            if !c.flags(pos).is_number() {
                pos += 1;
                continue;
            }
            let digit_start = pos;
            while pos < c.end && c.flags(pos).is_number() {
                pos += 1;
            }
            let count = pos - digit_start;
            let mut current = digit_start;
            if !count.is_multiple_of(3) {
                current += count % 3;
                c.add_token(current);
            }
            while current < digit_start + count {
                current += 3;
                c.add_token(current);
            }
        }
        let end = c.end;
        c.add_token(end);
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

/// Falcon's class `[\p{P}\$\+<=>\^~\|`]`: [`is_default_punct`] plus the backtick.
fn is_falcon_punct(cpt: u32) -> bool {
    cpt == '`' as u32 || is_default_punct(cpt)
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

/// `std::regex` split by the empty matches of `(?=(\d{3})+(?!\d))`: a chunk is cut before every
/// ASCII digit from which a multiple of three ASCII digits runs to the end of the digit run (so
/// `"1234567"` becomes `"1"`, `"234"`, `"567"`). The lookahead cannot see past the chunk.
fn split_digit_triple_boundaries(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let is_digit = |c: u32| (b'0' as u32..=b'9' as u32).contains(&c);
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let chunk = cpts.get(start..start + len).unwrap_or(&[]);
        start += len;
        let mut piece_start = 0;
        let mut i = 0;
        while i < chunk.len() {
            if !is_digit(chunk[i]) {
                i += 1;
                continue;
            }
            let run_end = i + chunk[i..].iter().take_while(|&&c| is_digit(c)).count();
            let mut cut = i + (run_end - i) % 3;
            while cut < run_end {
                if cut > piece_start {
                    out.push(cut - piece_start);
                    piece_start = cut;
                }
                cut += 3;
            }
            i = run_end;
        }
        if chunk.len() > piece_start {
            out.push(chunk.len() - piece_start);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'t>(exprs: &[&str], text: &'t str) -> Vec<&'t str> {
        PreTokenizer::new(exprs).unwrap().split_words(text)
    }

    const DEFAULT: &[&str] = &[DEFAULT_PUNCT, GPT2, NUMBER_RUNS, DIGIT_TRIPLES];

    #[test]
    fn gpt2_rules() {
        assert_eq!(
            words(&[GPT2], "Hello world's  end!!\n\n x"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n\n", " x"]
        );
    }

    #[test]
    fn llama3_rules() {
        assert_eq!(
            words(&[LLAMA3_ADAPTED], "I'VE 12345 apples...\r\n  ok"),
            ["I", "'VE", " ", "123", "45", " apples", "...\r\n", " ", " ok"]
        );
        assert_eq!(words(&[QWEN2], "x 123"), ["x", " ", "1", "2", "3"]);
    }

    #[test]
    fn qwen35_keeps_marks_with_letters() {
        // "e" + U+0301 (combining acute): for Qwen 2 the mark is no letter, so it starts the next
        // word (`[^\r\n\p{L}\p{N}]?\p{L}+`) or stands alone; Qwen 3.5 keeps it in the word.
        assert_eq!(
            words(&[QWEN2], "re\u{301}sume\u{301}"),
            ["re", "\u{301}sume", "\u{301}"]
        );
        assert_eq!(
            words(&[QWEN35], "re\u{301}sume\u{301}"),
            ["re\u{301}sume\u{301}"]
        );
        assert_eq!(words(&[QWEN35], "a \u{301}b"), ["a", " \u{301}b"]);
    }

    #[test]
    fn newline_runs() {
        assert_eq!(words(&[NEWLINES], "a b\n\nc\n"), ["a b", "\n\n", "c", "\n"]);
    }

    #[test]
    fn digit_groups_glue_the_prefix() {
        assert_eq!(
            words(&[AFMOE_DIGITS], "ab1234567 x12"),
            ["ab1", "234", "567", " x12"]
        );
    }

    #[test]
    fn default_cascade() {
        assert_eq!(
            words(DEFAULT, "a+b=1234567 `x`"),
            ["a", "+", "b", "=", "123", "456", "7", " `", "x", "`"]
        );
    }

    #[test]
    fn fast_paths_equal_the_std_regex_path() {
        let texts = [
            "a+b=1234567 `x`, ½3 ١٢٣٤ (é) ¿qué? «x» — 𝟘𝟙𝟚𝟛 ⅷ\u{3000}1234\t$5",
            "!!!???...,;:@[\\]_{}$+<=>^~|`'\"#%&*/-",
            "12 123 1234 12345 x9999999y 1٢34567",
        ];
        for expr in [
            DEFAULT_PUNCT,
            FALCON_PUNCT,
            NUMBER_RUNS,
            DIGIT_TRIPLES,
            DIGIT_TRIPLE_BOUNDARIES,
        ] {
            let fast = PreTokenizer::new(&[expr]).unwrap();
            let general = PreTokenizer {
                steps: vec![Step::Regex(StlRegex::new(expr).unwrap())],
            };
            for text in texts {
                assert_eq!(
                    fast.split_words(text),
                    general.split_words(text),
                    "{expr} on {text:?}"
                );
            }
        }
    }

    #[test]
    fn words_tile_the_text() {
        let text = "Ünïcödé 🦙 text, 1234\t\tand\u{3000}more  \n\n x";
        for exprs in [
            &[GPT2][..],
            &[LLAMA3],
            &[QWEN2],
            &[QWEN35],
            &[NEWLINES],
            &[AFMOE_DIGITS],
            DEFAULT,
        ] {
            assert_eq!(words(exprs, text).concat(), text);
        }
    }
}
