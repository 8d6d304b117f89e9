//! Translation of the ECMAScript regexes llama.cpp hands to `std::regex` into `fancy-regex` syntax
//! with the same meaning.
//!
//! llama.cpp compiles its pre-tokenizer regexes with `std::regex` (libstdc++, ECMAScript grammar,
//! "C" locale). Where the two dialects differ, the ECMAScript meaning is spelled out explicitly:
//! `\s`, `\d`, `\w` and `\b` are ASCII-only (the "C" locale), `.` is any code point but `\n` and
//! `\r`, groups do not capture (llama.cpp passes `nosubs`), and every literal and class is written
//! as explicit `\x{..}` code points and ranges, so no character is ever read as Rust regex syntax
//! (Rust classes have set operators such as `--`, `&&` and `~~` that ECMAScript reads as literal
//! characters). Constructs ECMAScript or libstdc++ would reject (back-references, lookbehind,
//! `(?i:...)`, a quantifier with nothing to repeat, unknown escapes) are refused with the reason.
//!
//! Invariant: the output matches exactly the code point sequences the input matches under
//! ECMAScript's leftmost, priority-ordered (backtracking) semantics, which is also the order in
//! which `fancy-regex` and the `regex` crate it delegates to report matches.

use std::fmt::Write;

const MAX_CPT: u32 = 0x10FFFF;
const SURROGATES: (u32, u32) = (0xD800, 0xDFFF);

/// ASCII white space as the "C" locale's `isspace` sees it: `\t \n \v \f \r` and space.
const SPACE: &[(u32, u32)] = &[(0x09, 0x0D), (0x20, 0x20)];
const DIGIT: &[(u32, u32)] = &[(0x30, 0x39)];
const WORD: &[(u32, u32)] = &[(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)];
/// ECMAScript `.` in libstdc++: anything but `\n` and `\r`.
const LINE_TERMINATORS: &[(u32, u32)] = &[(0x0A, 0x0A), (0x0D, 0x0D)];

/// Translates `pattern` (ECMAScript, as code points) into `fancy-regex` syntax.
pub(crate) fn translate(pattern: &[u32]) -> Result<String, String> {
    let mut p = Parser {
        pattern,
        pos: 0,
        out: String::with_capacity(pattern.len() * 8),
    };
    p.alternation()?;
    match p.peek() {
        None => Ok(p.out),
        Some(c) => Err(format!("unexpected {:?} at {}", char_of(c), p.pos)),
    }
}

fn char_of(c: u32) -> char {
    char::from_u32(c).unwrap_or('\u{FFFD}')
}

fn is(c: Option<u32>, ch: char) -> bool {
    c == Some(ch as u32)
}

/// Sorts and merges `ranges`.
fn normalize(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The code points (surrogates excluded) not in `ranges`.
fn complement(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(lo, hi) in normalize([ranges, &[SURROGATES]].concat()).iter() {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = hi.saturating_add(1);
    }
    if next <= MAX_CPT {
        out.push((next, MAX_CPT));
    }
    out
}

/// Writes a class matching exactly the code points of `ranges` (surrogates, which Rust regexes
/// cannot name and `&str` cannot hold, are left out).
fn write_class(out: &mut String, ranges: &[(u32, u32)]) {
    let ranges: Vec<(u32, u32)> = normalize(ranges.to_vec())
        .into_iter()
        .flat_map(|(lo, hi)| {
            // Split around the surrogate block.
            let below = (lo < SURROGATES.0).then(|| (lo, hi.min(SURROGATES.0 - 1)));
            let above = (hi > SURROGATES.1).then(|| (lo.max(SURROGATES.1 + 1), hi));
            below.into_iter().chain(above)
        })
        .collect();
    if ranges.is_empty() {
        // ECMAScript `[]`: matches nothing.
        out.push_str("(?!)");
        return;
    }
    out.push('[');
    for (lo, hi) in ranges {
        if lo == hi {
            let _ = write!(out, "\\x{{{lo:X}}}");
        } else {
            let _ = write!(out, "\\x{{{lo:X}}}-\\x{{{hi:X}}}");
        }
    }
    out.push(']');
}

fn write_literal(out: &mut String, c: u32) {
    let _ = write!(out, "\\x{{{c:X}}}");
}

struct Parser<'a> {
    pattern: &'a [u32],
    pos: usize,
    out: String,
}

/// What an escape sequence stands for.
enum Escape {
    Char(u32),
    Class(Vec<(u32, u32)>),
    WordBoundary(bool),
}

impl Parser<'_> {
    fn peek(&self) -> Option<u32> {
        self.pattern.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<u32> {
        self.pattern.get(self.pos + offset).copied()
    }

    fn next(&mut self) -> Option<u32> {
        let c = self.peek();
        self.pos += 1;
        c
    }

    fn alternation(&mut self) -> Result<(), String> {
        loop {
            self.sequence()?;
            if is(self.peek(), '|') {
                self.pos += 1;
                self.out.push('|');
            } else {
                return Ok(());
            }
        }
    }

    fn sequence(&mut self) -> Result<(), String> {
        while let Some(c) = self.peek() {
            if c == '|' as u32 || c == ')' as u32 {
                return Ok(());
            }
            self.term()?;
        }
        Ok(())
    }

    /// An atom and its quantifier, or an assertion.
    fn term(&mut self) -> Result<(), String> {
        let at = self.pos;
        let Some(c) = self.next() else {
            return Ok(());
        };
        let quantifiable = match char_of(c) {
            '^' | '$' => {
                self.out.push(char_of(c));
                false
            }
            '(' => self.group()?,
            '[' => {
                let ranges = self.class()?;
                write_class(&mut self.out, &ranges);
                true
            }
            '.' => {
                write_class(&mut self.out, &complement(LINE_TERMINATORS));
                true
            }
            '\\' => match self.escape(false)? {
                Escape::Char(c) => {
                    write_literal(&mut self.out, c);
                    true
                }
                Escape::Class(ranges) => {
                    write_class(&mut self.out, &ranges);
                    true
                }
                Escape::WordBoundary(at_boundary) => {
                    self.write_word_boundary(at_boundary);
                    false
                }
            },
            '*' | '+' | '?' | '{' => return Err(format!("nothing to repeat at {at}")),
            _ => {
                write_literal(&mut self.out, c);
                true
            }
        };
        if self.quantifier()? && !quantifiable {
            return Err(format!("quantified assertion at {at}"));
        }
        Ok(())
    }

    /// After `(`: a group; returns whether it may be quantified (lookaheads may not).
    fn group(&mut self) -> Result<bool, String> {
        let at = self.pos;
        let quantifiable = if is(self.peek(), '?') {
            let kind = self.peek_at(1);
            self.pos += 2;
            match kind.map(char_of) {
                Some(':') => {
                    self.out.push_str("(?:");
                    true
                }
                Some('=') => {
                    self.out.push_str("(?=");
                    false
                }
                Some('!') => {
                    self.out.push_str("(?!");
                    false
                }
                _ => return Err(format!("unsupported group syntax at {at}")),
            }
        } else {
            // Capturing groups capture nothing under `nosubs`.
            self.out.push_str("(?:");
            true
        };
        self.alternation()?;
        if !is(self.next(), ')') {
            return Err(format!("unclosed group opened at {at}"));
        }
        self.out.push(')');
        Ok(quantifiable)
    }

    /// `?`, `*`, `+`, `{n}`, `{n,}`, `{n,m}`, each optionally lazy; returns whether one was read.
    fn quantifier(&mut self) -> Result<bool, String> {
        let at = self.pos;
        match self.peek().map(char_of) {
            Some(q @ ('?' | '*' | '+')) => {
                self.pos += 1;
                self.out.push(q);
            }
            Some('{') => {
                self.pos += 1;
                let min = self.number().ok_or_else(|| format!("bad repeat at {at}"))?;
                let max = if is(self.peek(), ',') {
                    self.pos += 1;
                    if is(self.peek(), '}') {
                        None
                    } else {
                        Some(self.number().ok_or_else(|| format!("bad repeat at {at}"))?)
                    }
                } else {
                    Some(min)
                };
                if !is(self.next(), '}') || max.is_some_and(|max| max < min) {
                    return Err(format!("bad repeat at {at}"));
                }
                let _ = match max {
                    Some(max) if max == min => write!(self.out, "{{{min}}}"),
                    Some(max) => write!(self.out, "{{{min},{max}}}"),
                    None => write!(self.out, "{{{min},}}"),
                };
            }
            _ => return Ok(false),
        }
        if is(self.peek(), '?') {
            self.pos += 1;
            self.out.push('?');
        }
        if matches!(self.peek().map(char_of), Some('?' | '*' | '+' | '{')) {
            return Err(format!("repeated quantifier at {}", self.pos));
        }
        Ok(true)
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        let mut value = 0u32;
        while let Some(d) = self.peek().and_then(|c| char_of(c).to_digit(10)) {
            value = value.checked_mul(10)?.checked_add(d)?;
            self.pos += 1;
        }
        (self.pos > start).then_some(value)
    }

    /// `count` hexadecimal digits.
    fn hex(&mut self, count: usize) -> Result<u32, String> {
        let mut value = 0u32;
        for _ in 0..count {
            let d = self
                .next()
                .and_then(|c| char_of(c).to_digit(16))
                .ok_or_else(|| format!("bad hexadecimal escape at {}", self.pos))?;
            value = value * 16 + d;
        }
        Ok(value)
    }

    /// After `\`. Inside a class, `\b` is a backspace and boundaries do not exist.
    fn escape(&mut self, in_class: bool) -> Result<Escape, String> {
        let at = self.pos;
        let c = self
            .next()
            .ok_or_else(|| "pattern ends with a backslash".to_string())?;
        Ok(match char_of(c) {
            'd' => Escape::Class(DIGIT.to_vec()),
            'D' => Escape::Class(complement(DIGIT)),
            's' => Escape::Class(SPACE.to_vec()),
            'S' => Escape::Class(complement(SPACE)),
            'w' => Escape::Class(WORD.to_vec()),
            'W' => Escape::Class(complement(WORD)),
            'b' if in_class => Escape::Char(0x08),
            'b' => Escape::WordBoundary(true),
            'B' if !in_class => Escape::WordBoundary(false),
            'n' => Escape::Char(0x0A),
            'r' => Escape::Char(0x0D),
            't' => Escape::Char(0x09),
            'v' => Escape::Char(0x0B),
            'f' => Escape::Char(0x0C),
            '0' if !self.peek().is_some_and(|d| char_of(d).is_ascii_digit()) => Escape::Char(0),
            'x' => Escape::Char(self.hex(2)?),
            'u' => {
                let v = self.hex(4)?;
                if (SURROGATES.0..=SURROGATES.1).contains(&v) {
                    return Err(format!("surrogate escape at {at}"));
                }
                Escape::Char(v)
            }
            'c' => {
                let letter = self
                    .next()
                    .filter(|&l| char_of(l).is_ascii_alphabetic())
                    .ok_or_else(|| format!("bad control escape at {at}"))?;
                Escape::Char(letter % 32)
            }
            // Identity escapes of syntax characters (and of any other non-alphanumeric ASCII
            // character, which ECMAScript also reads literally).
            other if other.is_ascii() && !other.is_ascii_alphanumeric() => Escape::Char(c),
            other => return Err(format!("unsupported escape \\{other} at {at}")),
        })
    }

    /// After `[`: the class's code point ranges (negation applied).
    fn class(&mut self) -> Result<Vec<(u32, u32)>, String> {
        let at = self.pos;
        let negated = is(self.peek(), '^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let c = self
                .next()
                .ok_or_else(|| format!("unclosed class opened at {at}"))?;
            if c == ']' as u32 {
                break;
            }
            if c == '[' as u32 && matches!(self.peek().map(char_of), Some(':' | '.' | '=')) {
                return Err(format!("POSIX class syntax at {}", self.pos));
            }
            let lo = match self.class_atom(c)? {
                Escape::Char(c) => c,
                Escape::Class(class) => {
                    ranges.extend(class);
                    continue;
                }
                Escape::WordBoundary(_) => return Err(format!("boundary in a class at {at}")),
            };
            // A range, unless the `-` is the class's last character.
            if is(self.peek(), '-') && self.peek_at(1).is_some_and(|c| c != ']' as u32) {
                self.pos += 1;
                let first = self.next().unwrap_or(0);
                let hi = match self.class_atom(first)? {
                    Escape::Char(c) => c,
                    _ => return Err(format!("class escape as a range end at {}", self.pos)),
                };
                if hi < lo {
                    return Err(format!("range out of order at {}", self.pos));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(if negated {
            complement(&ranges)
        } else {
            normalize(ranges)
        })
    }

    fn class_atom(&mut self, c: u32) -> Result<Escape, String> {
        if c == '\\' as u32 {
            self.escape(true)
        } else {
            Ok(Escape::Char(c))
        }
    }

    /// ECMAScript `\b` (`\B` when `!at_boundary`) over ASCII word characters. At the ends of the
    /// searched text the outside counts as non-word, as `std::regex` counts it.
    fn write_word_boundary(&mut self, at_boundary: bool) {
        let mut word = String::new();
        write_class(&mut word, WORD);
        let (a, b) = if at_boundary { ("!", "=") } else { ("=", "!") };
        let _ = write!(
            self.out,
            "(?:(?<={word})(?{a}{word})|(?<!{word})(?{b}{word}))"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn re(pattern: &str) -> fancy_regex::Regex {
        let cpts: Vec<u32> = pattern.chars().map(u32::from).collect();
        let translated = translate(&cpts).unwrap();
        fancy_regex::Regex::new(&translated).unwrap_or_else(|e| panic!("{translated}: {e}"))
    }

    fn matches(pattern: &str, text: &str) -> Vec<String> {
        let re = re(pattern);
        let mut out = Vec::new();
        let mut pos = 0;
        while let Ok(Some(m)) = re.find_from_pos(text, pos) {
            out.push(m.as_str().to_string());
            pos = if m.end() > m.start() {
                m.end()
            } else {
                match text[m.end()..].chars().next() {
                    Some(c) => m.end() + c.len_utf8(),
                    None => break,
                }
            };
        }
        out
    }

    #[test]
    fn ecmascript_classes_are_ascii() {
        // `\s` is the "C" locale's: no-break space and ideographic space are not white space.
        assert_eq!(
            matches(r"\s+", "a \t\u{a0}\u{3000}\x0b b"),
            [" \t", "\x0b "]
        );
        assert_eq!(matches(r"\d+", "12٣4"), ["12", "4"]);
        assert_eq!(matches(r"\w+", "ab_c-é"), ["ab_c"]);
        assert_eq!(matches(r".+", "a\nb\rc"), ["a", "b", "c"]);
        assert_eq!(matches(r"\bx\B", "x xy yx"), ["x"]);
    }

    #[test]
    fn rust_class_operators_are_literals() {
        // In Rust `--` and `~~` inside a class are set operations; in ECMAScript they are text.
        assert_eq!(matches("[!--]+", "a!#-b"), ["!#-"]);
        assert_eq!(matches("[a&&b]+", "xa&&by"), ["a&&b"]);
        assert_eq!(matches("[~~x]+", "~x~y"), ["~x~"]);
        assert_eq!(matches("[^(\\s|.,)]+", "a (b|c), d."), ["a", "b", "c", "d"]);
        assert_eq!(matches(r"[\[-\]]+", "a[\\]b"), ["[\\]"]);
    }

    #[test]
    fn groups_quantifiers_and_lookahead() {
        assert_eq!(matches(r"\s+(?!\S)|\s+", "a   b  "), ["  ", " ", "  "]);
        assert_eq!(matches("(?:ab){2,}|a{1,2}?", "abababa"), ["ababab", "a"]);
        assert_eq!(matches(r"[0-9][0-9][0-9]", "12345678"), ["123", "456"]);
        assert_eq!(matches(r"\s+$", "a  b  "), ["  "]);
        assert_eq!(
            matches("(IMGIMG)((A|B){1,4})Z", "xIMGIMGABZ"),
            ["IMGIMGABZ"]
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            r"(?i:a)", r"(?<=a)b", r"(a)\1", r"*a", r"a**", r"[a", r"(a", r"\p{L}", r"a{2,1}",
            r"[z-a]", r"^*",
        ] {
            let cpts: Vec<u32> = bad.chars().map(u32::from).collect();
            assert!(translate(&cpts).is_err(), "{bad}");
        }
    }

    #[test]
    fn empty_and_full_classes() {
        assert!(matches("[]a", "a").is_empty());
        assert_eq!(matches(r"[^]", "ab"), ["a", "b"]);
        assert_eq!(matches(r"[\s\S]+", "a\nb"), ["a\nb"]);
    }
}
