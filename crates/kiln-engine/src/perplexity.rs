//! Perplexity as llama.cpp's `llama-perplexity` computes it.
//!
//! The text's tokens (with BOS) are cut into consecutive chunks of `n_ctx` (a shorter remainder
//! is dropped); each chunk is evaluated from an empty cache with its first token replaced by BOS;
//! only the second half is scored — the logits at positions `n_ctx/2 .. n_ctx-1` predict tokens
//! `n_ctx/2 + 1 .. n_ctx`. PPL = exp(mean negative log-likelihood over all scored tokens).

use kiln_backend::Backend;
use kiln_models::Decoder;

use crate::score::for_each_logprobs;
use crate::{EngineError, PREFILL_CHUNK};

#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    pub chunks: usize,
    /// Running perplexity after each chunk (llama-perplexity prints these).
    pub running: Vec<f64>,
    pub scored_tokens: usize,
}

/// `on_chunk(i, n, running_ppl)` is called after each chunk, for progress.
pub fn perplexity<B: Backend>(
    b: &B,
    model: &Decoder<B>,
    ids: &[u32],
    bos: Option<u32>,
    n_ctx: usize,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<Perplexity, EngineError> {
    if n_ctx < 4 {
        return Err(EngineError::Input(format!(
            "context of {n_ctx} tokens is too small for perplexity"
        )));
    }
    let n_chunks = ids.len() / n_ctx;
    if n_chunks == 0 {
        return Err(EngineError::Input(format!(
            "the text has {} tokens, fewer than one context of {n_ctx}: use a longer text or a smaller -c",
            ids.len()
        )));
    }
    let first = n_ctx / 2;
    let mut cache = model.new_cache(b, n_ctx)?;
    let (mut nll, mut count) = (0.0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunks);
    for c in 0..n_chunks {
        let mut tokens = ids[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(bos) = bos {
            tokens[0] = bos;
        }
        cache.clear();
        for (k, part) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let h = model.forward(b, part, &mut cache)?;
            // Rows of this part at positions first..n_ctx-1: they predict the scored tokens.
            let start = k * PREFILL_CHUNK;
            let lo = first.saturating_sub(start).min(part.len());
            let hi = (n_ctx - 1).saturating_sub(start).min(part.len());
            if lo < hi {
                for_each_logprobs(b, model, &h, lo..hi, |r, lp| {
                    nll -= lp[tokens[start + r + 1] as usize];
                    count += 1;
                })?;
            }
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(c + 1, n_chunks, ppl);
    }
    Ok(Perplexity {
        ppl: (nll / count as f64).exp(),
        chunks: n_chunks,
        running,
        scored_tokens: count,
    })
}
