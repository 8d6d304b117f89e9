//! Iteration-level ("continuous") batching over a paged KV cache.
//!
//! A [`Scheduler`] owns a model's paged KV cache and its [`BlockPool`]. Requests join a bounded
//! waiting queue; every [`Scheduler::step`] runs ONE forward pass over all running sequences at
//! once (one matrix product per weight for the whole batch) and samples a token for each
//! sequence whose input reached its end. Between steps, waiting requests are admitted (first in,
//! first out) as blocks allow, so new requests join a running batch without waiting for it to
//! finish.
//!
//! - **Chunked prefill.** A step carries at most `max_step_tokens` tokens. Decoding sequences
//!   (one token each) are served first, then prompts are cut into chunks of what remains, so a
//!   long prompt cannot stall the streams already running.
//! - **Prefix caching.** A prompt takes the cached blocks of its longest known prefix (see
//!   [`crate::blocks`]); those positions are not computed again. Every full block is registered
//!   once its rows are computed.
//! - **Preemption.** When a running sequence needs a block and none is free, the most recently
//!   admitted sequence is preempted: its blocks are released and it goes back to the front of
//!   the queue, to be recomputed (prompt and the tokens generated so far) when blocks free up.
//!   Its output so far stays; the sampler's state (its random stream) continues.
//!   A sequence that needs more blocks than the whole pool, even alone, ends with
//!   [`FinishReason::CacheFull`].
//! - **Cancellation.** [`Scheduler::cancel`] releases a request's blocks at once.
//!
//! Invariants: every block of the pool is held by a running sequence's table, cached idle, or
//! free (checked by [`Scheduler::check`]); a finished, cancelled or preempted sequence holds no
//! block; a sequence's `computed` positions have their KV rows in its table's blocks.

use std::collections::VecDeque;

use kiln_backend::{Backend, KvDtype};
use kiln_core::config::{window_start, DecoderConfig};
use kiln_models::{kv_row_bytes, Decoder, PagedKvCache, PagedLayout, PagedSeq};

use crate::blocks::{BlockPool, BlockTable, PrefixStats, WindowTable};
use crate::constraint::prepare_all;
use crate::score::top_k;
use crate::{log_softmax, Constraint, EngineError, Sampler, SamplingParams};

/// Sizes of a scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Blocks in the KV pool, and positions per block.
    pub n_blocks: usize,
    /// Blocks of the sliding-window layers' own pool (see [`crate::blocks::WindowTable`]);
    /// `None`, or a model without windowed layers: those layers use the main pool like the
    /// others and hold every position. [`SchedulerConfig::for_memory`] sizes both.
    pub window_blocks: Option<usize>,
    pub block_size: usize,
    /// Tokens one step may carry (decode tokens plus prefill chunks).
    pub max_step_tokens: usize,
    /// Sequences running at once.
    pub max_running: usize,
    /// Requests that may wait; beyond it [`Scheduler::submit`] refuses.
    pub max_waiting: usize,
}

impl SchedulerConfig {
    /// This configuration with its pools sized to `bytes` of KV memory for `config`, stored as
    /// `dtype` (`n_blocks` and `window_blocks` are replaced; the other fields say how the pool
    /// is used). `n_blocks` is 0 when `bytes` cannot hold one block of every layer.
    ///
    /// A model without sliding-window layers gets one pool: `bytes / bytes per block`. With
    /// windowed layers, those get a pool of their own sized for the most they can ever hold at
    /// once: every running sequence's window (`max_running × (⌈(window − 1) / block⌉ + 3)`
    /// blocks, each sequence's window rows plus the blocks its next pass starts) and one step's
    /// new tokens (`⌈max_step_tokens / block⌉`); the global layers get the rest. So the
    /// positions the pool holds grow by the share of windowed layers (Gemma 3: five of six).
    /// When that reservation would leave the global layers fewer blocks than one pool of
    /// whole-model blocks has (a small budget, or many running sequences), both pools get the
    /// same count: what a single pool holds.
    pub fn sized_for(mut self, config: &DecoderConfig, dtype: KvDtype, bytes: usize) -> Self {
        let bs = self.block_size.max(1);
        let row = kv_row_bytes(config, dtype) * bs;
        let windowed = config.windowed_layers();
        let (global_block, window_block) = (row * (config.n_layers - windowed), row * windowed);
        let whole = bytes / (global_block + window_block).max(1);
        let Some(w) = config.widest_window() else {
            self.n_blocks = whole;
            self.window_blocks = None;
            return self;
        };
        let reserve = self.max_running * (w.saturating_sub(1).div_ceil(bs) + 3)
            + self.max_step_tokens.div_ceil(bs);
        let window_blocks = reserve.min(bytes / window_block.max(1));
        self.n_blocks = match bytes.checked_sub(window_blocks * window_block) {
            // Every layer windowed: the main pool only numbers positions (no memory).
            Some(_) if global_block == 0 => {
                (self.max_running * config.context_length.div_ceil(bs)).max(whole)
            }
            Some(rest) => rest / global_block,
            None => 0,
        };
        if self.n_blocks < whole {
            self.n_blocks = whole;
            self.window_blocks = Some(whole);
        } else {
            self.window_blocks = Some(window_blocks);
        }
        self
    }

    /// Bytes of KV memory the pools of this configuration take for `config` (stored as
    /// `dtype`).
    pub fn kv_bytes(&self, config: &DecoderConfig, dtype: KvDtype) -> usize {
        let row = kv_row_bytes(config, dtype) * self.block_size;
        // Without a window pool, windowed layers take blocks of the main pool.
        let windowed = match self.window_blocks {
            Some(_) => config.windowed_layers(),
            None => 0,
        };
        row * ((config.n_layers - windowed) * self.n_blocks
            + windowed * self.window_blocks.unwrap_or(0))
    }
}

/// One generation request.
#[derive(Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end the generation (included in the output).
    pub stop_ids: Vec<u32>,
    /// Report each generated token's log-probability and the `k` most likely alternatives
    /// (`Some(k)`, k may be 0); `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// What the output must match (a grammar): see [`crate::constraint`].
    pub constraint: Option<Constraint>,
}

/// A generated token's log-probability under the model (the distribution before any sampling
/// filter or penalty, as OpenAI reports it), and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f64,
    /// `(token, logprob)`, most likely first, lower id first on ties.
    pub top: Vec<(u32, f64)>,
}

pub type RequestId = u64;

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The sequence alone needs more KV blocks than the whole pool holds.
    CacheFull,
}

/// What a step produced, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token {
        id: RequestId,
        token: u32,
        /// When the request asked for log-probabilities.
        logprob: Option<TokenLogprob>,
    },
    Finished {
        id: RequestId,
        reason: FinishReason,
    },
    /// The request cannot go on and ends here: its constraint allows no further token or
    /// refused the one sampled (the message says which).
    Failed {
        id: RequestId,
        error: String,
    },
}

/// A request refused at submission.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full ({0} requests waiting)")]
    QueueFull(usize),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("the prompt needs {needed} KV blocks; the whole pool has {pool}")]
    PromptTooLarge { needed: usize, pool: usize },
    #[error("max_tokens must be at least 1")]
    NoTokens,
    #[error("token id {id} is outside the vocabulary ({vocab} tokens)")]
    BadToken { id: u32, vocab: usize },
    #[error(transparent)]
    Sampling(#[from] EngineError),
}

struct Seq {
    id: RequestId,
    /// The prompt, then the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    logprobs: Option<usize>,
    sampler: Sampler,
    constraint: Option<Constraint>,
    /// The blocks while running (`None` while waiting).
    table: Option<BlockTable>,
    /// The windowed layers' blocks while running, when they have a pool of their own.
    window: Option<WindowTable>,
    /// Positions whose KV rows are in the table's blocks.
    computed: usize,
}

impl Seq {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Continuous batching of one decoder model over a paged KV cache (see the module docs).
pub struct Scheduler<B: Backend> {
    cfg: SchedulerConfig,
    pool: BlockPool,
    /// The windowed layers' pool, and the widest window (when they have a pool of their own).
    window_pool: Option<(BlockPool, usize)>,
    cache: PagedKvCache<B>,
    waiting: VecDeque<Seq>,
    /// In admission order (the last is preempted first).
    running: Vec<Seq>,
    next_id: RequestId,
    context: usize,
    vocab: usize,
    preemptions: u64,
    /// Threads that prepare the constraints' masks.
    mask_threads: usize,
    /// Whether they run during the forward pass (there are cores it leaves free) or before it.
    mask_overlap: bool,
}

impl<B: Backend> Scheduler<B> {
    pub fn new(b: &B, model: &Decoder<B>, cfg: SchedulerConfig) -> Result<Self, EngineError> {
        if cfg.max_step_tokens == 0 || cfg.max_running == 0 {
            return Err(EngineError::Input(
                "a scheduler step needs room for at least one token and one sequence".into(),
            ));
        }
        let pool_of =
            |n| BlockPool::new(n, cfg.block_size).map_err(|e| EngineError::Input(e.to_string()));
        let pool = pool_of(cfg.n_blocks)?;
        let context = model.config.context_length;
        let widest = model.config.widest_window();
        let window_pool = match (cfg.window_blocks, widest) {
            (Some(n), Some(w)) => Some((pool_of(n)?, w)),
            _ => None,
        };
        let layout = PagedLayout {
            n_blocks: cfg.n_blocks,
            window_blocks: window_pool.as_ref().map(|(p, _)| p.n_blocks()),
            block_size: cfg.block_size,
            max_positions: context,
        };
        let c = &model.config;
        let cache = PagedKvCache::with_layout(b, c, 0..c.n_layers, &layout)?;
        // Masks overlap the forward pass on the cores it leaves free; when it takes them all
        // (the CPU backend), they run just before it, on all of them.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let free = cores.saturating_sub(b.host_threads());
        let (mask_threads, mask_overlap) = if free > 0 {
            (free, true)
        } else {
            (cores, false)
        };
        Ok(Scheduler {
            cfg,
            pool,
            window_pool,
            cache,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            context,
            vocab: model.config.vocab_size,
            preemptions: 0,
            mask_threads,
            mask_overlap,
        })
    }

    /// Queues a request; refused (nothing queued) when invalid or when the queue is full.
    pub fn submit(&mut self, req: Request) -> Result<RequestId, SubmitError> {
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::NoTokens);
        }
        // A bad id would fail every later step of the whole batch: refuse it here.
        if let Some(&id) = req.prompt.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(SubmitError::BadToken {
                id,
                vocab: self.vocab,
            });
        }
        if req.prompt.len() >= self.context {
            return Err(SubmitError::PromptTooLong {
                prompt: req.prompt.len(),
                context: self.context,
            });
        }
        // Room for the prompt and the first generated token, or it could never run.
        let needed = self.pool.blocks_for(req.prompt.len() + 1);
        if needed > self.pool.n_blocks() {
            return Err(SubmitError::PromptTooLarge {
                needed,
                pool: self.pool.n_blocks(),
            });
        }
        if self.waiting.len() >= self.cfg.max_waiting {
            return Err(SubmitError::QueueFull(self.waiting.len()));
        }
        let sampler = Sampler::new(req.sampling)?;
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            max_tokens: req.max_tokens,
            stop_ids: req.stop_ids,
            logprobs: req.logprobs,
            sampler,
            constraint: req.constraint,
            table: None,
            window: None,
            computed: 0,
        });
        Ok(id)
    }

    /// Ends request `id` wherever it is, releasing its blocks; false when it is not known (it
    /// finished already).
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut seq = self.running.remove(i);
            self.release(&mut seq);
            return true;
        }
        false
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Whether a step has anything to do.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The windowed layers' pool, when they have one of their own.
    pub fn window_pool(&self) -> Option<&BlockPool> {
        self.window_pool.as_ref().map(|(p, _)| p)
    }

    /// Releases the blocks of a sequence taken out of `running`.
    fn release(&mut self, s: &mut Seq) {
        if let Some(t) = s.table.take() {
            self.pool.release(t);
        }
        if let (Some(t), Some((wp, _))) = (s.window.take(), self.window_pool.as_mut()) {
            wp.release_window(t);
        }
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.pool.prefix_stats()
    }

    /// Sequences preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Verifies the block invariants (tests).
    pub fn check(&self) -> Result<(), String> {
        if self
            .waiting
            .iter()
            .any(|s| s.table.is_some() || s.window.is_some())
        {
            return Err("a waiting sequence holds blocks".into());
        }
        let tables: Vec<&BlockTable> = self
            .running
            .iter()
            .map(|s| s.table.as_ref().ok_or("a running sequence holds no table"))
            .collect::<Result<_, _>>()?;
        self.pool.check(&tables)?;
        if let Some((wp, w)) = &self.window_pool {
            let mut held = Vec::new();
            for s in &self.running {
                let t = s
                    .window
                    .as_ref()
                    .ok_or("a running sequence holds no window table")?;
                // Below the window of the next pass, nothing is held.
                let first = window_start(s.computed, *w) / self.cfg.block_size;
                if t.entries()[..first.min(t.entries().len())]
                    .iter()
                    .any(|&b| b != WindowTable::UNMAPPED)
                {
                    return Err("a window table holds a block no window sees".into());
                }
                held.push(t.held());
            }
            let held: Vec<&[u32]> = held.iter().map(|h| h.as_slice()).collect();
            wp.check_held(&held)?;
        }
        Ok(())
    }

    /// Admits what fits, runs one forward pass over the running sequences, samples, and
    /// returns the tokens and endings it produced. Does nothing when idle.
    pub fn step(&mut self, b: &B, model: &Decoder<B>) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        self.admit();
        if self.running.is_empty() {
            return Ok(events);
        }
        // Inputs: decoding sequences first (one token each), then prefill chunks.
        let mut budget = self.cfg.max_step_tokens;
        let mut inputs: Vec<(usize, Vec<u32>)> = Vec::new();
        let order: Vec<usize> = {
            let (mut dec, mut pre): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
            for (i, s) in self.running.iter().enumerate() {
                if s.len() - s.computed == 1 {
                    dec.push(i);
                } else {
                    pre.push(i);
                }
            }
            dec.append(&mut pre);
            dec
        };
        for i in order {
            if budget == 0 {
                break;
            }
            let s = &self.running[i];
            let n = (s.len() - s.computed).min(budget);
            inputs.push((i, s.tokens[s.computed..s.computed + n].to_vec()));
            budget -= n;
        }
        inputs.sort_by_key(|(i, _)| *i);
        // The windowed layers' blocks for the rows each pass reads and writes; a sequence whose
        // blocks the window pool cannot supply now waits a step (the pool is sized so that
        // every running sequence finds them: see `SchedulerConfig::sized_for`).
        if let Some((wp, w)) = self.window_pool.as_mut() {
            let running = &mut self.running;
            inputs.retain(|(i, t)| {
                let s = &mut running[*i];
                let rows = window_start(s.computed, *w)..s.computed + t.len();
                s.window
                    .as_mut()
                    .is_some_and(|wt| wp.map_window(wt, rows).is_ok())
            });
            if inputs.is_empty() {
                let mut s = self.running.remove(0);
                self.release(&mut s);
                events.push(Event::Finished {
                    id: s.id,
                    reason: FinishReason::CacheFull,
                });
                return Ok(events);
            }
        }
        let seqs: Vec<&[u32]> = inputs.iter().map(|(_, t)| t.as_slice()).collect();
        // Where the forward pass leaves cores free, the constraints of the sequences that sample
        // this step prepare their masks during it (they depend only on the tokens committed so
        // far). Otherwise masks are made after it, and only where the sampler's own pick is one
        // the constraint refuses (see `sample`).
        let owners: Vec<usize> = inputs
            .iter()
            .filter(|(i, t)| {
                let s = &self.running[*i];
                self.mask_overlap && s.computed + t.len() == s.len() && s.constraint.is_some()
            })
            .map(|(i, _)| *i)
            .collect();
        let mut cs: Vec<Constraint> = owners
            .iter()
            .filter_map(|&i| self.running[i].constraint.take())
            .collect();
        let views: Vec<PagedSeq<'_>> = inputs
            .iter()
            .map(|(i, _)| {
                let s = &self.running[*i];
                PagedSeq {
                    table: s.table.as_ref().map_or(&[], |t| t.blocks()),
                    window_table: s.window.as_ref().map_or(&[], |t| t.entries()),
                    len: s.computed,
                }
            })
            .collect();
        let cache = &mut self.cache;
        let threads = self.mask_threads;
        let (h, prepared) = if cs.is_empty() {
            let h = model.forward_paged(b, &seqs, cache, &views, &kiln_models::NoTrace);
            (h, Vec::new())
        } else {
            std::thread::scope(|sc| {
                let worker = sc.spawn(|| prepare_all(&mut cs, threads));
                let h = model.forward_paged(b, &seqs, cache, &views, &kiln_models::NoTrace);
                let prepared = worker
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p));
                (h, prepared)
            })
        };
        // Each constraint back to its sequence (before `?`: a failed pass keeps them), with
        // why it cannot go on, if it cannot.
        let mut mask_errors: Vec<(usize, String)> = Vec::new();
        for ((&i, c), r) in owners.iter().zip(cs).zip(prepared) {
            self.running[i].constraint = Some(c);
            if let Err(e) = r {
                mask_errors.push((i, e));
            }
        }
        let masked_already = owners;
        let h = h?;
        // The last row of each sequence whose input reached its end.
        let mut row = 0;
        let mut last_rows = Vec::new();
        let mut sampled = Vec::new();
        for (i, t) in &inputs {
            row += t.len();
            let s = &mut self.running[*i];
            s.computed += t.len();
            if let Some(table) = s.table.as_mut() {
                self.pool.register_computed(table, s.computed);
                if let (Some(wt), Some((wp, w))) = (s.window.as_mut(), self.window_pool.as_mut()) {
                    wp.register_window(wt, table);
                    // The next pass starts at `computed`: nothing before its window is read.
                    wp.release_window_below(wt, window_start(s.computed, *w));
                }
            }
            if s.computed == s.len() {
                last_rows.push(row as u32 - 1);
                sampled.push(*i);
            }
        }
        if !sampled.is_empty() {
            let last = b.gather_rows(&h, &last_rows)?;
            let mut logits = b.to_f32(&model.logits(b, &last)?)?;
            let vocab = logits.len() / sampled.len();
            let mut finished = Vec::new();
            // Each sequence's row in place (no copy: a row is a whole vocabulary, 1 MiB for
            // Gemma's 262k tokens).
            let mut rows: Vec<&mut [f32]> = logits.chunks_exact_mut(vocab).collect();
            let mut picks: Vec<Option<u32>> = vec![None; sampled.len()];
            let mut lps = Vec::with_capacity(sampled.len());
            let mut unmasked: Vec<usize> = Vec::new();
            for (k, &i) in sampled.iter().enumerate() {
                let s = &mut self.running[i];
                let l = &mut *rows[k];
                // Log-probabilities of the model's own distribution, before the sampler's
                // penalties and filters change `l`.
                lps.push(s.logprobs.map(|top| {
                    let lp = log_softmax(l);
                    let best = top_k(&lp, top);
                    (lp, best)
                }));
                if let Some((_, error)) = mask_errors.iter().find(|(j, _)| *j == i) {
                    events.push(Event::Failed {
                        id: s.id,
                        error: error.clone(),
                    });
                    finished.push(i);
                    continue;
                }
                s.sampler.adjust(l, &s.tokens);
                picks[k] = match s.constraint.as_mut() {
                    None => Some(s.sampler.pick(l)),
                    Some(c) if masked_already.contains(&i) => {
                        c.0.apply(l);
                        Some(s.sampler.pick(l))
                    }
                    // The pick without a mask, kept when the constraint allows it (exact; see
                    // `Sampler::draws_exactly_unmasked`); a mask only when it does not.
                    Some(c) if s.sampler.draws_exactly_unmasked() => {
                        let t = s.sampler.pick(l);
                        c.0.accepts(t).then_some(t)
                    }
                    Some(_) => None,
                };
                if picks[k].is_none() {
                    unmasked.push(k);
                }
            }
            // The masks still needed, in parallel, then the picks from them.
            if !unmasked.is_empty() {
                let mut cs: Vec<Constraint> = unmasked
                    .iter()
                    .filter_map(|&k| self.running[sampled[k]].constraint.take())
                    .collect();
                let prepared = prepare_all(&mut cs, self.mask_threads);
                for ((&k, c), r) in unmasked.iter().zip(cs).zip(prepared) {
                    let s = &mut self.running[sampled[k]];
                    match r {
                        Ok(()) => {
                            c.0.apply(rows[k]);
                            picks[k] = Some(s.sampler.pick(rows[k]));
                        }
                        Err(error) => {
                            events.push(Event::Failed { id: s.id, error });
                            finished.push(sampled[k]);
                        }
                    }
                    s.constraint = Some(c);
                }
            }
            for ((&i, pick), lp) in sampled.iter().zip(picks).zip(lps) {
                let Some(token) = pick else {
                    continue; // failed above
                };
                let s = &mut self.running[i];
                let grammar_done = match s.constraint.as_mut() {
                    Some(c) => match c.0.commit(token) {
                        Ok(()) => c.0.is_done(),
                        Err(error) => {
                            events.push(Event::Failed { id: s.id, error });
                            finished.push(i);
                            continue;
                        }
                    },
                    None => false,
                };
                s.tokens.push(token);
                let logprob = lp.map(|(lp, top)| TokenLogprob {
                    logprob: lp[token as usize],
                    top,
                });
                events.push(Event::Token {
                    id: s.id,
                    token,
                    logprob,
                });
                let reason = if s.stop_ids.contains(&token) || grammar_done {
                    Some(FinishReason::Stop)
                } else if s.generated() >= s.max_tokens || s.len() >= self.context {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    events.push(Event::Finished { id: s.id, reason });
                    finished.push(i);
                }
            }
            // Finished sequences leave (their blocks first, so others can grow into them).
            finished.sort_unstable();
            for &i in finished.iter().rev() {
                let mut s = self.running.remove(i);
                self.release(&mut s);
            }
            self.grow_tables(&mut events);
        }
        Ok(events)
    }

    /// Gives every running sequence a block for its newest token, preempting the most recently
    /// admitted sequences when the pool runs out. A sequence that is alone and still finds no
    /// block can never run: it ends with [`FinishReason::CacheFull`].
    fn grow_tables(&mut self, events: &mut Vec<Event>) {
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            let len = s.len();
            let Some(table) = s.table.as_mut() else {
                i += 1;
                continue;
            };
            let missing = len - table.len();
            if missing == 0 {
                i += 1;
                continue;
            }
            if self.pool.append(table, &s.tokens[len - missing..]).is_ok() {
                i += 1;
                continue;
            }
            if self.running.len() == 1 {
                let mut s = self.running.remove(0);
                self.release(&mut s);
                events.push(Event::Finished {
                    id: s.id,
                    reason: FinishReason::CacheFull,
                });
                break;
            }
            // Out of blocks: preempt the last admitted (possibly this one, which ends the
            // loop) and retry.
            self.preempt(self.running.len() - 1);
        }
    }

    /// Sends running sequence `i` back to the front of the queue, releasing its blocks.
    fn preempt(&mut self, i: usize) {
        let mut s = self.running.remove(i);
        self.release(&mut s);
        s.computed = 0;
        self.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// Admits waiting sequences in order while sequences and blocks allow.
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_running {
            let Some(s) = self.waiting.front() else {
                break;
            };
            // With a window pool, a shared prefix helps only as far as the windowed layers'
            // blocks that its end still sees are cached too.
            let bs = self.cfg.block_size;
            let share = match &self.window_pool {
                None => usize::MAX,
                Some((wp, w)) => {
                    let hashes = self.pool.cached_prefix(&s.tokens);
                    let window_cached = |k: usize| {
                        let first = window_start(k * bs, *w) / bs;
                        (first..k).all(|i| {
                            wp.cached(hashes[i], &s.tokens[i * bs..(i + 1) * bs])
                                .is_some()
                        })
                    };
                    (0..=hashes.len())
                        .rev()
                        .find(|&k| window_cached(k))
                        .unwrap_or(0)
                }
            };
            let Ok((table, hit)) = self.pool.allocate_prompt_within(&s.tokens, share) else {
                break;
            };
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            s.computed = hit.cached_tokens;
            if let Some((wp, w)) = self.window_pool.as_mut() {
                let hashes = &table.prefix_hashes()[..hit.cached_tokens / bs];
                let first = window_start(hit.cached_tokens, *w) / bs;
                s.window = Some(wp.share_window(&s.tokens, hashes, first));
            }
            s.table = Some(table);
            self.running.push(s);
        }
    }
}
