//! Stop strings over streamed text, as OpenAI's `stop` parameter works: generation ends at the
//! first stop string to appear in the generated text (the first to be complete), and the text
//! returned ends just before it, however the string was split across tokens.
//!
//! Invariant: text is released only when no stop string can begin inside it. A [`StopMatcher`]
//! holds back the longest tail of what it was given that is a prefix of some stop string (such
//! a tail could still grow into a match), so a match can never straddle text already released,
//! and the concatenation of everything released is exactly the generated text cut before the
//! first match (or all of it, after [`StopMatcher::finish`]).

/// Finds stop strings in text pushed piece by piece.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received and not yet released.
    pending: String,
    stopped: bool,
}

/// What one [`StopMatcher::push`] released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// Text safe to send on.
    pub text: String,
    /// Whether a stop string was found (the generation should end; `text` ends before it).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored: they would match everywhere).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string was found already.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds generated text; releases what can no longer be part of a stop string. After a
    /// match, further pushes release nothing.
    pub fn push(&mut self, piece: &str) -> Released {
        if self.stopped {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        self.pending.push_str(piece);
        // The match that is complete first ends the text (earliest end, then earliest start):
        // generating token by token, that is where the generation would have stopped, so the
        // result does not depend on how the text was split into pieces.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at + s.len(), at)))
            .min();
        if let Some((_, at)) = first {
            self.stopped = true;
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.held_back();
        let cut = self.pending.len() - keep;
        let text = self.pending[..cut].to_string();
        self.pending.replace_range(..cut, "");
        Released {
            text,
            stopped: false,
        }
    }

    /// Releases whatever is held back (the generation ended for another reason).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that begin some stop string (the longest such tail,
    /// starting on a character boundary).
    fn held_back(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stops {
            // Tails shorter than the stop string, longest first.
            let max = (s.len() - 1).min(p.len());
            for len in (best + 1..=max).rev() {
                let start = p.len() - len;
                if p.is_char_boundary(start) && s.starts_with(&p[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Pushes `pieces` and returns everything released and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = matcher(stops);
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_found() {
        assert_eq!(
            run(
                &["\n\nUser:"],
                &["Hello", " there.\n", "\nUs", "er:", " more"]
            ),
            ("Hello there.".to_string(), true)
        );
    }

    #[test]
    fn text_that_only_looked_like_a_stop_string_is_released() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("the E").text, "the ");
        assert_eq!(m.push("N").text, "");
        assert_eq!(m.push("D?").text, "");
        assert!(m.stopped());
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("the EN").text, "the ");
        assert_eq!(m.push("TRY").text, "ENTRY");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        // "b" is complete before "abc" is, in one piece or several.
        assert_eq!(run(&["b", "abc"], &["xxabc"]), ("xxa".to_string(), true));
        assert_eq!(
            run(&["b", "abc"], &["xxa", "bc"]),
            ("xxa".to_string(), true)
        );
        // Ending together: the one that starts first.
        assert_eq!(run(&["bc", "abc"], &["xabc"]), ("x".to_string(), true));
        assert_eq!(
            run(&["cd", "abcdef"], &["ab", "cdef"]),
            ("ab".to_string(), true)
        );
    }

    #[test]
    fn without_a_match_every_byte_comes_out_once() {
        let pieces = ["a", "bé", "ç", "d\n", "e"];
        assert_eq!(run(&["éçx", "\n\n"], &pieces), (pieces.concat(), false));
        assert_eq!(run(&[], &pieces), (pieces.concat(), false));
        assert_eq!(run(&[""], &pieces), (pieces.concat(), false));
    }

    #[test]
    fn multibyte_stop_strings_cut_on_characters() {
        assert_eq!(run(&["。"], &["你好", "。再"]), ("你好".to_string(), true));
        let mut m = matcher(&["éa"]);
        assert_eq!(m.push("xé").text, "x");
        assert_eq!(m.push("b").text, "éb");
    }

    #[test]
    fn after_a_stop_nothing_more_is_released() {
        let mut m = matcher(&["!"]);
        assert!(m.push("hi!").stopped);
        let r = m.push("more");
        assert_eq!((r.text.as_str(), r.stopped), ("", true));
        assert_eq!(m.finish(), "");
    }
}
