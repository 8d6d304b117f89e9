//! Single-sequence generation: prefill the prompt, then sample one token per decode step.

use std::time::Instant;

use kiln_models::CausalLm;

use crate::{EngineError, Sampler, SamplingParams, PREFILL_CHUNK};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token (it is the last of `ids`).
    EndOfGeneration,
    /// `max_tokens` reached.
    Length,
    /// The caller's callback asked to stop.
    Callback,
}

#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated tokens (not the prompt).
    pub ids: Vec<u32>,
    pub stop: StopReason,
    /// Wall time of the prompt's forward passes.
    pub prompt_secs: f64,
    /// Wall time of the decode steps (forward + sampling of each token after the first).
    pub decode_secs: f64,
    /// Number of single-token forward passes.
    pub decode_steps: usize,
}

impl Generation {
    pub fn prompt_tps(&self, prompt_len: usize) -> f64 {
        prompt_len as f64 / self.prompt_secs.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            self.decode_steps as f64 / self.decode_secs.max(1e-9)
        }
    }
}

/// Generate from `prompt` with `model`, a model bound to its backend(s) (`decoder.on(&backend)`,
/// or a split model's `on(&front, &back)`). `on_token(id)` sees each token as it is chosen and
/// returns whether to continue. `is_end` tells end-of-generation tokens.
pub fn generate<M: CausalLm>(
    model: &M,
    prompt: &[u32],
    opts: &GenerateOptions,
    is_end: impl Fn(u32) -> bool,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Input("the prompt is empty".into()));
    }
    let ctx = model.config().context_length;
    if prompt.len() >= ctx {
        return Err(EngineError::Input(format!(
            "the prompt has {} tokens; the model's context holds {ctx}",
            prompt.len()
        )));
    }
    let mut sampler = Sampler::new(opts.sampling.clone())?;
    let capacity = (prompt.len() + opts.max_tokens).min(ctx);
    let mut cache = model.new_cache(capacity)?;

    let t0 = Instant::now();
    // Only the last prompt position's logits are needed.
    let n_parts = prompt.len().div_ceil(PREFILL_CHUNK);
    let mut logits = Vec::new();
    for (i, part) in prompt.chunks(PREFILL_CHUNK).enumerate() {
        let last = model.forward_last(part, &mut cache)?;
        if i + 1 == n_parts {
            logits = model.logits(&last)?;
        }
    }
    // Positions in the cache.
    let mut filled = prompt.len();
    let prompt_secs = t0.elapsed().as_secs_f64();

    let mut history = prompt.to_vec();
    let mut ids = Vec::new();
    let t1 = Instant::now();
    let mut decode_steps = 0;
    let stop = loop {
        let id = sampler.sample(&mut logits, &history);
        ids.push(id);
        history.push(id);
        if !on_token(id) {
            break StopReason::Callback;
        }
        if !opts.ignore_eos && is_end(id) {
            break StopReason::EndOfGeneration;
        }
        if ids.len() >= opts.max_tokens || filled >= capacity {
            break StopReason::Length;
        }
        let last = model.forward_last(&[id], &mut cache)?;
        logits = model.logits(&last)?;
        filled += 1;
        decode_steps += 1;
    };
    Ok(Generation {
        ids,
        stop,
        prompt_secs,
        decode_secs: t1.elapsed().as_secs_f64(),
        decode_steps,
    })
}
