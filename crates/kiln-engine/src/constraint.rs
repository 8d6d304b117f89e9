//! Constrained decoding as the scheduler sees it: a per-request [`TokenConstraint`] (a grammar,
//! in practice kiln-grammar's) that restricts the tokens the sampler may pick at each step.
//!
//! Per step, for each constrained sequence that samples, the row of logits gets `logit_bias` and
//! the penalties, then the constraint's mask, then the sampler's pick, which is
//! [`TokenConstraint::commit`]ted; a constraint that [`TokenConstraint::is_done`] ends its
//! request (`FinishReason::Stop`). The mask ([`TokenConstraint::prepare`], the costly part: a walk
//! of the vocabulary) is made in one of two ways:
//! - where the forward pass leaves cores free (a GPU backend), for every constrained sequence
//!   that samples, on worker threads during the pass (it depends only on the tokens committed so
//!   far), then [`TokenConstraint::apply`]'d before the pick;
//! - where the pass takes every core (the CPU backend), after it, and only when needed: the
//!   sampler picks without a mask, and when the constraint [`TokenConstraint::accepts`] the pick
//!   (a cheap test) it is kept; else the mask is made (the sequences that need one in parallel)
//!   and the pick made again from the masked row. This is exact for greedy decoding and for
//!   draws without top-k/top-p/min-p (see `Sampler::draws_exactly_unmasked`); with those
//!   filters the mask always comes first.
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
    /// Whether `token` may come next, found without working out the whole set (the cheap test
    /// of a pick made before any mask).
    fn accepts(&mut self, token: u32) -> bool;
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
        fn accepts(&mut self, _: u32) -> bool {
            true
        }
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
