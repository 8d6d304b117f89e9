//! Constrained decoding as the scheduler sees it: a per-request [`TokenConstraint`] (a grammar,
//! in practice kiln-grammar's) that restricts the tokens the sampler may pick at each step.
//!
//! Per step, for each constrained sequence that samples: [`TokenConstraint::prepare`] works out
//! the allowed set (on worker threads, several sequences in parallel, overlapped with the
//! forward pass: it depends only on the tokens committed so far); then, on the row of logits,
//! `logit_bias` is added, [`TokenConstraint::apply`] sets every token it does not allow to −∞,
//! and the sampler picks from what is left; the pick is [`TokenConstraint::commit`]ted. A
//! constraint that [`TokenConstraint::is_done`] ends its request (`FinishReason::Stop`).
//!
//! Invariants: `prepare` never leaves an empty set (it fails instead, and the request ends with
//! [`crate::Event::Failed`], never with an arbitrary token); `apply` leaves at least one finite
//! logit, so the sampler's pick is always one the constraint allows.

use std::fmt;

/// A restriction of the next token, stepped once per generated token (see the module docs).
pub trait TokenConstraint: Send {
    /// Works out the set of tokens allowed next. May run on another thread, while the forward
    /// pass runs. `Err`: nothing can follow (the message says why); the request fails.
    fn prepare(&mut self) -> Result<(), String>;
    /// Sets the logits of the tokens the prepared set does not allow to −∞.
    fn apply(&self, logits: &mut [f32]);
    /// Takes the sampled token (one the prepared set allowed).
    fn commit(&mut self, token: u32) -> Result<(), String>;
    /// Whether the constraint has ended: the request ends with this token.
    fn is_done(&self) -> bool;
}

/// A request's constraint, boxed (its `Debug` names it only).
pub struct Constraint(pub Box<dyn TokenConstraint>);

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint(..)")
    }
}

impl Constraint {
    pub fn new(c: impl TokenConstraint + 'static) -> Constraint {
        Constraint(Box::new(c))
    }
}

/// Runs `prepare` on every constraint, spread over up to `threads` threads; the results in
/// order. A panic in a constraint is re-raised here.
pub(crate) fn prepare_all(cs: &mut [Constraint], threads: usize) -> Vec<Result<(), String>> {
    let threads = threads.clamp(1, cs.len().max(1));
    if threads == 1 {
        return cs.iter_mut().map(|c| c.0.prepare()).collect();
    }
    let per = cs.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = cs
            .chunks_mut(per)
            .map(|chunk| {
                s.spawn(move || chunk.iter_mut().map(|c| c.0.prepare()).collect::<Vec<_>>())
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(u32);

    impl TokenConstraint for Count {
        fn prepare(&mut self) -> Result<(), String> {
            self.0 += 1;
            if self.0 > 3 {
                Err("spent".into())
            } else {
                Ok(())
            }
        }
        fn apply(&self, _: &mut [f32]) {}
        fn commit(&mut self, _: u32) -> Result<(), String> {
            Ok(())
        }
        fn is_done(&self) -> bool {
            false
        }
    }

    #[test]
    fn prepare_all_keeps_the_order_on_any_number_of_threads() {
        for threads in [1, 2, 3, 8] {
            let mut cs: Vec<Constraint> = (0..7).map(|i| Constraint::new(Count(i))).collect();
            let r = prepare_all(&mut cs, threads);
            let want: Vec<Result<(), String>> = (0..7)
                .map(|i| if i >= 3 { Err("spent".into()) } else { Ok(()) })
                .collect();
            assert_eq!(r, want, "{threads} threads");
        }
        assert!(prepare_all(&mut [], 4).is_empty());
    }
}
