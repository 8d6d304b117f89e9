//! Teacher-forced scoring: the log-probability of every next token of a sequence.

use kiln_backend::Backend;
use kiln_models::Decoder;

use crate::{EngineError, PREFILL_CHUNK};

/// Logit rows turned into log-probabilities at a time (bounds memory: rows × vocab × 4 bytes).
const LOGIT_ROWS: usize = 64;

/// The distribution at one position, predicting the next token.
#[derive(Clone, Debug, PartialEq)]
pub struct PositionScore {
    /// The `k` most likely `(token, logprob)`, descending; ties by lower id.
    pub top: Vec<(u32, f64)>,
    /// Log-probability of the token that actually follows.
    pub logprob_next: f64,
}

/// `log_softmax` in f64 of f32 logits.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    logits.iter().map(|&v| v as f64 - lse).collect()
}

/// The `k` largest entries of `lp` as `(index, value)`, descending, lower index first on ties.
pub(crate) fn top_k(lp: &[f64], k: usize) -> Vec<(u32, f64)> {
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, cmp);
    idx.truncate(k);
    idx.sort_unstable_by(cmp);
    idx.into_iter().map(|i| (i, lp[i as usize])).collect()
}

/// Evaluate `ids` in one sequence (prefill in chunks of [`PREFILL_CHUNK`]) and score every
/// position: `result[i]` predicts `ids[i + 1]`, so there are `ids.len() - 1` entries.
pub fn score<B: Backend>(
    b: &B,
    model: &Decoder<B>,
    ids: &[u32],
    k: usize,
) -> Result<Vec<PositionScore>, EngineError> {
    if ids.len() < 2 {
        return Ok(Vec::new());
    }
    let mut cache = model.new_cache(b, ids.len())?;
    let mut out = Vec::with_capacity(ids.len() - 1);
    for (c, chunk) in ids.chunks(PREFILL_CHUNK).enumerate() {
        let start = c * PREFILL_CHUNK;
        let hidden = model.forward(b, chunk, &mut cache)?;
        // Positions of this chunk that have a next token.
        let scored = chunk.len().min(ids.len() - 1 - start);
        for_each_logprobs(b, model, &hidden, 0..scored, |r, lp| {
            let next = ids[start + r + 1] as usize;
            out.push(PositionScore {
                top: top_k(lp, k),
                logprob_next: lp[next],
            });
        })?;
    }
    Ok(out)
}

/// Log-probabilities of rows `rows` of `hidden`, computed [`LOGIT_ROWS`] rows at a time so the
/// logits of a long sequence never sit in memory at once; `f(row, logprobs)`.
pub(crate) fn for_each_logprobs<B: Backend>(
    b: &B,
    model: &Decoder<B>,
    hidden: &B::Tensor,
    rows: std::ops::Range<usize>,
    mut f: impl FnMut(usize, &[f64]),
) -> Result<(), EngineError> {
    for r0 in rows.clone().step_by(LOGIT_ROWS) {
        let r1 = (r0 + LOGIT_ROWS).min(rows.end);
        let logits = b.to_f32(&model.logits(b, &b.rows(hidden, r0..r1)?)?)?;
        let vocab = logits.len() / (r1 - r0);
        for (i, row) in logits.chunks(vocab).enumerate() {
            f(r0 + i, &log_softmax(row));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalizes_and_top_k_orders() {
        let lp = log_softmax(&[1.0, 3.0, 3.0, -2.0]);
        let total: f64 = lp.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert_eq!(
            top_k(&lp, 3).iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert_eq!(top_k(&lp, 10).len(), 4);
    }
}
