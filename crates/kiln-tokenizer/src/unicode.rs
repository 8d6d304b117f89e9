//! llama.cpp's view of Unicode (`unicode.cpp`): per-code-point category flags, lowercase, and its
//! single-code-point "NFD", all read from llama.cpp's own tables (`unicode_tables.rs`) rather than
//! from Rust's, so that both agree on every code point.
//!
//! Invariants: a code point belongs to at most one category (the tables are ranges with one flag
//! set each); code points past U+10FFFF (never produced from a `&str`) have no flags at all.

use crate::unicode_tables::{CPT_FLAG_RUNS, LOWERCASE, NFD_RANGES};

pub(crate) const NUMBER: u16 = 0x0002;
pub(crate) const LETTER: u16 = 0x0004;
pub(crate) const ACCENT_MARK: u16 = 0x0010;
pub(crate) const PUNCTUATION: u16 = 0x0020;
pub(crate) const SYMBOL: u16 = 0x0040;
pub(crate) const CONTROL: u16 = 0x0080;
const CATEGORIES: u16 = 0x00FF;
const WHITESPACE: u16 = 0x0100;

/// llama.cpp's `unicode_cpt_flags`, reduced to the category bits and white space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flags(pub(crate) u16);

impl Flags {
    pub(crate) fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    pub(crate) fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    pub(crate) fn is_accent_mark(self) -> bool {
        self.0 & ACCENT_MARK != 0
    }
    pub(crate) fn is_punctuation(self) -> bool {
        self.0 & PUNCTUATION != 0
    }
    pub(crate) fn is_symbol(self) -> bool {
        self.0 & SYMBOL != 0
    }
    pub(crate) fn is_control(self) -> bool {
        self.0 & CONTROL != 0
    }
    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE != 0
    }
    /// llama.cpp's `flags.as_uint() != 0`: true for every code point (the table sets bit 0x8000
    /// on all of them), false for "outside the chunk".
    pub(crate) fn any(self) -> bool {
        self.0 != 0
    }
    /// llama.cpp's `category_flag()`.
    pub(crate) fn category(self) -> u16 {
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

/// llama.cpp's `unicode_cpt_flags_from_cpt`.
pub(crate) fn flags_of(cpt: u32) -> Flags {
    if let Some(&f) = ASCII_FLAGS.get(cpt as usize) {
        return Flags(f);
    }
    // The runs start at 0 and are sorted, so the run holding `cpt` is the last one starting at or
    // before it.
    let i = CPT_FLAG_RUNS.partition_point(|&(start, _)| start <= cpt);
    match i.checked_sub(1).and_then(|i| CPT_FLAG_RUNS.get(i)) {
        Some(&(_, f)) if cpt < 0x110000 => Flags(f),
        _ => Flags(0),
    }
}

/// llama.cpp's `unicode_tolower`: the table's lowercase, or the code point itself.
pub(crate) fn to_lower(cpt: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cpt) {
        return cpt + 32;
    }
    match LOWERCASE.binary_search_by_key(&cpt, |&(from, _)| from) {
        Ok(i) => LOWERCASE.get(i).map_or(cpt, |&(_, to)| to),
        Err(_) => cpt,
    }
}

/// llama.cpp's `unicode_cpts_normalize_nfd` for one code point: not a real NFD, but the first code
/// point of the decomposition (`é` becomes `e`, the accent is dropped).
pub(crate) fn nfd(cpt: u32) -> u32 {
    let i = NFD_RANGES.partition_point(|&(first, _, _)| first <= cpt);
    match i.checked_sub(1).and_then(|i| NFD_RANGES.get(i)) {
        Some(&(first, last, to)) if first <= cpt && cpt <= last => to,
        _ => cpt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_llama_tables() {
        assert!(flags_of('a' as u32).is_letter());
        assert!(flags_of('7' as u32).is_number());
        assert!(flags_of(' ' as u32).is_whitespace());
        assert!(flags_of(0x3000).is_whitespace());
        assert!(flags_of('é' as u32).is_letter());
        assert!(flags_of(0x0301).is_accent_mark());
        assert!(flags_of('$' as u32).is_symbol());
        assert!(flags_of('!' as u32).is_punctuation());
        assert!(flags_of(0x7F).is_control());
        assert!(flags_of(0x1F600).any());
        assert!(!flags_of(0x1F600).is_letter());
        assert_eq!(flags_of(0x110000), Flags(0));
    }

    #[test]
    fn lowercase_and_nfd() {
        assert_eq!(to_lower('Q' as u32), 'q' as u32);
        assert_eq!(to_lower('Ä' as u32), 'ä' as u32);
        assert_eq!(to_lower('Б' as u32), 'б' as u32);
        assert_eq!(to_lower(0x0130), 'i' as u32); // İ
        assert_eq!(to_lower('q' as u32), 'q' as u32);
        assert_eq!(nfd('Ä' as u32), 'A' as u32);
        assert_eq!(nfd('ử' as u32), 'u' as u32);
        assert_eq!(nfd('a' as u32), 'a' as u32);
        assert_eq!(nfd(0x10FFFF), 0x10FFFF);
    }
}
