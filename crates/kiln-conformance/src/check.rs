//! Comparisons with messages that say which element of which case failed, by how much, against
//! which bound.

use kiln_backend::{BackendError, Result};

use crate::reference::Expected;

/// The worst element of `got` against `want` (by error over its bound), and how many exceed
/// their bound; `None` when all are within.
pub fn worst(got: &[f32], want: &Expected) -> Option<(usize, usize, f64)> {
    assert_eq!(got.len(), want.len(), "output length");
    let mut worst: Option<(usize, f64)> = None;
    let mut failures = 0;
    for (i, ((&g, &w), &t)) in got.iter().zip(&want.value).zip(&want.tol).enumerate() {
        let err = (g as f64 - w).abs();
        // NaN fails (the comparison is false), as does any error beyond the bound.
        if err <= t {
            continue;
        }
        failures += 1;
        let ratio = if t > 0.0 { err / t } else { f64::INFINITY };
        if worst.is_none_or(|(_, r)| ratio.is_nan() || ratio > r) {
            worst = Some((i, ratio));
        }
    }
    worst.map(|(i, r)| (i, failures, r))
}

/// `ratio` (an error over its bound) for a message: "12.5×", or "the value is exact" where the
/// bound is 0.
fn times(ratio: f64) -> String {
    if ratio < 1e9 {
        format!("{ratio:.1}×")
    } else {
        "the value is exact".into()
    }
}

/// Asserts that every element of `got` is within its bound of `want`; `cols` is the output's row
/// length (to name the failing row and column).
#[track_caller]
pub fn close(what: &str, got: &[f32], want: &Expected, cols: usize) {
    margin(what, got, want);
    if let Some((i, failures, ratio)) = worst(got, want) {
        let cols = cols.max(1);
        panic!(
            "{what}: {failures} of {} elements beyond their bound; worst at [{}, {}]: got {}, \
             want {}, |error| {:.3e} > bound {:.3e} ({})",
            got.len(),
            i / cols,
            i % cols,
            got[i],
            want.value[i],
            (got[i] as f64 - want.value[i]).abs(),
            want.tol[i],
            times(ratio),
        );
    }
}

/// With `KILN_CONFORMANCE_MARGINS` set, prints the largest ratio of an element's error to its
/// bound (how much of the bound a backend uses: near 1 is close to failing, far below 1 means
/// the bound is loose for this backend).
pub fn margin(what: &str, got: &[f32], want: &Expected) {
    if std::env::var_os("KILN_CONFORMANCE_MARGINS").is_none() {
        return;
    }
    let ratio = got
        .iter()
        .zip(&want.value)
        .zip(&want.tol)
        .map(|((&g, &w), &t)| {
            let err = (g as f64 - w).abs();
            if err == 0.0 {
                0.0
            } else {
                err / t
            }
        })
        .fold(0.0, f64::max);
    eprintln!("margin {ratio:.3e}: {what}");
}

/// Asserts that `got` and `want` are the same bits (NaNs included), naming the first difference.
#[track_caller]
pub fn bits(what: &str, got: &[f32], want: &[f32], cols: usize) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    let differ = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let cols = cols.max(1);
        panic!(
            "{what}: {differ} of {} elements differ in their bits; first at [{}, {}]: {} vs {}",
            got.len(),
            i / cols,
            i % cols,
            got[i],
            want[i]
        );
    }
}

/// Asserts that an op refused its operands as a shape mismatch.
#[track_caller]
pub fn shape_error<T>(what: &str, r: Result<T>) {
    match r {
        Err(BackendError::Shape { .. }) => {}
        Err(e) => panic!("{what}: expected a shape error, got {e}"),
        Ok(_) => panic!("{what}: expected a shape error, the op succeeded"),
    }
}

/// Asserts that an op failed with any error (where the trait does not say which kind).
#[track_caller]
pub fn error<T>(what: &str, r: Result<T>) {
    if r.is_ok() {
        panic!("{what}: expected an error, the op succeeded");
    }
}

/// Asserts that `got` is within the bounds of one of `candidates` (the ways a backend may
/// legitimately compute the op, e.g. with its activations quantized or not), naming how far it
/// is from each when it matches none.
#[track_caller]
pub fn close_any(what: &str, got: &[f32], candidates: &[(String, Expected)], cols: usize) {
    let mut joint = Joint::new(what);
    joint.add("", got, candidates, cols);
    joint.finish();
}

/// Calls that a backend must compute one same way: each call's result is checked against the
/// same list of candidates (the ways allowed), and one candidate must hold for every call. (A
/// backend quantizes an input's activations once, whatever the weight: one product of a
/// single output could pass for either way, a batch of calls cannot.)
pub struct Joint {
    what: String,
    names: Vec<String>,
    /// Per candidate, what failed.
    failures: Vec<Vec<String>>,
}

impl Joint {
    pub fn new(what: &str) -> Self {
        Joint {
            what: what.to_string(),
            names: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// One call (`call` names it) and the candidates it may match, in the same order as every
    /// other call's.
    pub fn add(&mut self, call: &str, got: &[f32], candidates: &[(String, Expected)], cols: usize) {
        if self.names.is_empty() {
            self.names = candidates.iter().map(|(n, _)| n.clone()).collect();
            self.failures = vec![Vec::new(); candidates.len()];
        }
        let names: Vec<&String> = candidates.iter().map(|(n, _)| n).collect();
        assert!(
            names.iter().zip(&self.names).all(|(a, b)| *a == b),
            "candidates differ between calls"
        );
        for (c, (_, want)) in candidates.iter().enumerate() {
            match worst(got, want) {
                None => {
                    let sep = if call.is_empty() { "" } else { ": " };
                    margin(
                        &format!("{}{sep}{call} (as {})", self.what, self.names[c]),
                        got,
                        want,
                    )
                }
                Some((i, failures, ratio)) => {
                    let cols = cols.max(1);
                    self.failures[c].push(format!(
                        "{call}{}{failures} of {} elements beyond their bound; worst at [{}, {}]: \
                         got {}, want {}, |error| {:.3e} > bound {:.3e} ({})",
                        if call.is_empty() { "" } else { ": " },
                        got.len(),
                        i / cols,
                        i % cols,
                        got[i],
                        want.value[i],
                        (got[i] as f64 - want.value[i]).abs(),
                        want.tol[i],
                        times(ratio),
                    ))
                }
            }
        }
    }

    /// Panics unless one candidate held for every call.
    #[track_caller]
    pub fn finish(self) {
        if self.failures.iter().any(|f| f.is_empty()) {
            return;
        }
        let report: Vec<String> = self
            .names
            .iter()
            .zip(&self.failures)
            .map(|(name, f)| format!("as {name}:\n    {}", f.join("\n    ")))
            .collect();
        panic!("{}:\n  {}", self.what, report.join("\n  "));
    }
}
