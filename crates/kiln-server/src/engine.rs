//! Model threads: each served model runs on its own OS thread, which owns the backend, the
//! weights and (for a decoder) the scheduler with its paged KV cache (a
//! [`Batcher`]: the model's backend type is erased before it gets here). HTTP handlers talk to
//! it through channels only, so a slow or vanished client never blocks a forward pass.
//!
//! - A decoder thread blocks while idle; otherwise it takes every queued command, then runs one
//!   scheduler step (one forward pass over the whole running batch) and routes the step's
//!   events to the requests' channels. A request whose receiver is gone (its client
//!   disconnected) is cancelled there and then, which frees its KV blocks before the next step.
//! - An embedding thread embeds one request at a time, its inputs in packed batches of at most
//!   `max_batch` sequences, so a request's vectors do not depend on what else is queued.
//! - [`DecoderStats`] are written by the thread after each step and read by `/metrics`.
//!
//! - A step that fails or panics (a bug: requests are validated before they reach the
//!   scheduler) fails the requests in flight; after a panic the scheduler is rebuilt with a
//!   fresh KV pool, so the model keeps serving. [`DecoderStats::alive`] turns false only if the
//!   thread itself ends.
//!
//! Invariants: a submitted request gets exactly one final event (`Finished` or `Failed`) unless
//! it was cancelled; a [`Ticket`] dropped before that cancels its request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;

use kiln_engine::{
    Batcher, DecoderRunner, EmbeddingRunner, Event, FinishReason, PositionScore, Request,
    RequestId, SchedulerConfig, SubmitError, TokenLogprob,
};
use tokio::sync::{mpsc, oneshot};

/// What a decoder thread reports about one request.
#[derive(Debug)]
pub enum Out {
    Token {
        token: u32,
        logprob: Option<TokenLogprob>,
    },
    Finished(FinishReason),
    /// The forward pass failed (a bug or an exhausted resource): the request ends.
    Failed(String),
}

/// A request's event channel; events carry the tag the request was submitted with, so that the
/// choices of one HTTP request share one channel.
pub type Events = mpsc::UnboundedSender<(usize, Out)>;

enum Command {
    Submit {
        tag: usize,
        req: Request,
        events: Events,
        reply: oneshot::Sender<Result<RequestId, SubmitError>>,
    },
    Cancel(RequestId),
    Score {
        ids: Vec<u32>,
        top: usize,
        reply: oneshot::Sender<Result<Vec<PositionScore>, String>>,
    },
}

/// What `/metrics` reads of a decoder thread (relaxed atomics: each value is exact, the set is
/// a snapshot of nearly one moment).
#[derive(Debug, Default)]
pub struct DecoderStats {
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub blocks_total: AtomicU64,
    pub blocks_used: AtomicU64,
    /// Of the free blocks, those holding a cached prefix (evictable).
    pub blocks_cached: AtomicU64,
    pub prefix_queried_blocks: AtomicU64,
    pub prefix_hit_blocks: AtomicU64,
    pub preemptions: AtomicU64,
    /// The sliding-window layers' own pool (0 and 0 when they have none).
    pub window_blocks_total: AtomicU64,
    pub window_blocks_used: AtomicU64,
    /// False once the thread has stopped (it only stops when the server does, or on a bug).
    pub alive: AtomicBool,
}

impl DecoderStats {
    fn update(&self, s: &dyn Batcher) {
        let pool = s.pool();
        self.running.store(s.running() as u64, Ordering::Relaxed);
        self.waiting.store(s.waiting() as u64, Ordering::Relaxed);
        self.blocks_total
            .store(pool.n_blocks() as u64, Ordering::Relaxed);
        self.blocks_used
            .store(pool.in_use() as u64, Ordering::Relaxed);
        self.blocks_cached
            .store(pool.cached_idle() as u64, Ordering::Relaxed);
        let p = s.prefix_stats();
        self.prefix_queried_blocks
            .store(p.queried_blocks, Ordering::Relaxed);
        self.prefix_hit_blocks
            .store(p.hit_blocks, Ordering::Relaxed);
        self.preemptions.store(s.preemptions(), Ordering::Relaxed);
        let (total, used) = s
            .window_pool()
            .map_or((0, 0), |p| (p.n_blocks(), p.in_use()));
        self.window_blocks_total
            .store(total as u64, Ordering::Relaxed);
        self.window_blocks_used
            .store(used as u64, Ordering::Relaxed);
    }

    pub fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    /// `(running, waiting, blocks used, blocks free)`.
    pub fn occupancy(&self) -> (u64, u64, u64, u64) {
        let total = Self::get(&self.blocks_total);
        let used = Self::get(&self.blocks_used);
        (
            Self::get(&self.running),
            Self::get(&self.waiting),
            used,
            total - used.min(total),
        )
    }
}

/// The handle of a decoder thread.
#[derive(Clone)]
pub struct DecoderEngine {
    tx: std_mpsc::Sender<Command>,
    pub stats: Arc<DecoderStats>,
}

/// A submitted request; dropping it cancels the request (a no-op once it has finished).
pub struct Ticket {
    id: RequestId,
    tx: std_mpsc::Sender<Command>,
    armed: bool,
}

impl Ticket {
    /// The request has ended in the engine: nothing to cancel.
    pub fn finished(mut self) {
        self.armed = false;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.tx.send(Command::Cancel(self.id));
        }
    }
}

/// Why a request did not reach the scheduler.
#[derive(Debug, thiserror::Error)]
pub enum EngineCallError {
    #[error(transparent)]
    Refused(#[from] SubmitError),
    #[error("the model's engine thread has stopped")]
    Stopped,
    /// The request's input is invalid (a 400).
    #[error("{0}")]
    Input(String),
    /// The model failed (a 500).
    #[error("{0}")]
    Failed(String),
}

impl DecoderEngine {
    /// Starts the thread that serves `model` with a scheduler sized by `cfg`.
    pub fn spawn(
        name: &str,
        model: Box<dyn DecoderRunner>,
        cfg: SchedulerConfig,
    ) -> Result<DecoderEngine, String> {
        let scheduler = model.into_batcher(cfg).map_err(|e| e.to_string())?;
        let stats = Arc::new(DecoderStats::default());
        stats.update(scheduler.as_ref());
        stats.alive.store(true, Ordering::Relaxed);
        let (tx, rx) = std_mpsc::channel();
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name(format!("kiln-decoder-{name}"))
            .spawn(move || {
                let _alive = Alive(&thread_stats.alive);
                decoder_loop(scheduler, &rx, &thread_stats);
            })
            .map_err(|e| format!("starting the engine thread: {e}"))?;
        Ok(DecoderEngine { tx, stats })
    }

    /// Queues `req`; its events go to `events` tagged `tag`.
    pub async fn submit(
        &self,
        tag: usize,
        req: Request,
        events: Events,
    ) -> Result<Ticket, EngineCallError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Submit {
                tag,
                req,
                events,
                reply,
            })
            .map_err(|_| EngineCallError::Stopped)?;
        let id = answer.await.map_err(|_| EngineCallError::Stopped)??;
        Ok(Ticket {
            id,
            tx: self.tx.clone(),
            armed: true,
        })
    }

    /// Teacher-forced log-probabilities of `ids` with the `top` most likely tokens at each
    /// position (see [`kiln_engine::score`]); runs between two scheduler steps.
    pub async fn score(
        &self,
        ids: Vec<u32>,
        top: usize,
    ) -> Result<Vec<PositionScore>, EngineCallError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Score { ids, top, reply })
            .map_err(|_| EngineCallError::Stopped)?;
        answer
            .await
            .map_err(|_| EngineCallError::Stopped)?
            .map_err(EngineCallError::Failed)
    }
}

/// Marks its thread stopped when dropped (also when it unwinds).
struct Alive<'a>(&'a AtomicBool);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

fn decoder_loop(mut s: Box<dyn Batcher>, rx: &std_mpsc::Receiver<Command>, stats: &DecoderStats) {
    // Request id → (tag, channel).
    let mut routes: std::collections::HashMap<RequestId, (usize, Events)> = Default::default();
    loop {
        if s.is_idle() {
            match rx.recv() {
                Ok(cmd) => handle(s.as_mut(), &mut routes, cmd),
                Err(_) => return, // every handle is gone: the server stopped
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            handle(s.as_mut(), &mut routes, cmd);
        }
        if !s.is_idle() {
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.step()));
            let step = match step {
                Ok(step) => step,
                Err(panic) => {
                    // A bug: the scheduler's state is no longer trusted. Fail what was in flight
                    // and start over with a fresh KV pool, so the model keeps serving.
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!("scheduler step panicked: {what}; restarting the scheduler");
                    for (_, (tag, tx)) in routes.drain() {
                        let _ =
                            tx.send((tag, Out::Failed("the model failed (internal error)".into())));
                    }
                    if let Err(e) = s.restart() {
                        tracing::error!("restarting the scheduler failed: {e}");
                        return;
                    }
                    stats.update(s.as_ref());
                    continue;
                }
            };
            match step {
                Ok(events) => {
                    // Before the events go out: a client that sees its request end and then
                    // reads /metrics finds its blocks already counted free.
                    stats.update(s.as_ref());
                    for e in events {
                        route(s.as_mut(), &mut routes, e);
                    }
                }
                Err(e) => {
                    // Not reachable from a request (submit validates), so a bug: fail what runs,
                    // keep serving.
                    tracing::error!("scheduler step failed: {e}");
                    for (id, (tag, tx)) in routes.drain() {
                        s.cancel(id);
                        let _ = tx.send((tag, Out::Failed(format!("the model failed: {e}"))));
                    }
                }
            }
        }
        stats.update(s.as_ref());
    }
}

fn handle(
    s: &mut dyn Batcher,
    routes: &mut std::collections::HashMap<RequestId, (usize, Events)>,
    cmd: Command,
) {
    match cmd {
        Command::Submit {
            tag,
            req,
            events,
            reply,
        } => {
            let result = s.submit(req);
            if let Ok(id) = result {
                routes.insert(id, (tag, events));
            }
            if let Err(Ok(id)) = reply.send(result) {
                // The handler went away while waiting for the answer.
                s.cancel(id);
                routes.remove(&id);
            }
        }
        Command::Cancel(id) => {
            s.cancel(id);
            routes.remove(&id);
        }
        Command::Score { ids, top, reply } => {
            let _ = reply.send(s.score(&ids, top).map_err(|e| e.to_string()));
        }
    }
}

fn route(
    s: &mut dyn Batcher,
    routes: &mut std::collections::HashMap<RequestId, (usize, Events)>,
    e: Event,
) {
    let (id, out, last) = match e {
        Event::Token { id, token, logprob } => (id, Out::Token { token, logprob }, false),
        Event::Finished { id, reason } => (id, Out::Finished(reason), true),
        Event::Failed { id, error } => (id, Out::Failed(error), true),
    };
    let Some((tag, tx)) = routes.get(&id) else {
        return;
    };
    if tx.send((*tag, out)).is_err() {
        // The client is gone: free its blocks now.
        s.cancel(id);
        routes.remove(&id);
    } else if last {
        routes.remove(&id);
    }
}

/// A batch of texts or token-id sequences to embed.
pub enum EmbedInput {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

/// Embeddings of one request's inputs, in order, with the token count of each.
pub type EmbedResult = Result<Vec<(Vec<f32>, usize)>, EngineCallError>;

struct EmbedJob {
    input: EmbedInput,
    reply: oneshot::Sender<EmbedResult>,
}

/// The handle of an embedding thread.
#[derive(Clone)]
pub struct EmbedEngine {
    tx: std_mpsc::Sender<EmbedJob>,
    pub alive: Arc<AtomicBool>,
    /// Values in one of the model's vectors.
    pub dim: usize,
}

impl EmbedEngine {
    /// Starts the thread that serves `model`, embedding at most `max_batch` sequences per
    /// forward pass.
    pub fn spawn(
        name: &str,
        model: Box<dyn EmbeddingRunner>,
        max_batch: usize,
    ) -> Result<EmbedEngine, String> {
        let (tx, rx) = std_mpsc::channel::<EmbedJob>();
        let alive = Arc::new(AtomicBool::new(true));
        let thread_alive = alive.clone();
        let max_batch = max_batch.max(1);
        let dim = model.dim();
        std::thread::Builder::new()
            .name(format!("kiln-embed-{name}"))
            .spawn(move || {
                let _alive = Alive(&thread_alive);
                while let Ok(job) = rx.recv() {
                    embed_job(model.as_ref(), job, max_batch);
                }
            })
            .map_err(|e| format!("starting the embedding thread: {e}"))?;
        Ok(EmbedEngine { tx, alive, dim })
    }

    pub async fn embed(
        &self,
        input: EmbedInput,
    ) -> Result<Vec<(Vec<f32>, usize)>, EngineCallError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(EmbedJob { input, reply })
            .map_err(|_| EngineCallError::Stopped)?;
        answer.await.map_err(|_| EngineCallError::Stopped)?
    }
}

/// Embeds one request, in packed batches of at most `max_batch` of its sequences. Requests are
/// never packed together: the dense kernels pick their path by the number of rows, so packing
/// requests together would change the last bits of a request's vectors with whatever else was
/// queued (measured: up to 1.4e-7), and the server promises the vectors a request gets alone.
fn embed_job(model: &dyn EmbeddingRunner, job: EmbedJob, max_batch: usize) {
    if job.reply.is_closed() {
        return;
    }
    // A panic (a bug) fails this request only; the thread keeps serving.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        embed_one(model, job.input, max_batch)
    }))
    .unwrap_or_else(|_| {
        tracing::error!("embedding panicked");
        Err(EngineCallError::Failed(
            "the model failed (internal error)".into(),
        ))
    });
    let _ = job.reply.send(result);
}

fn embed_one(model: &dyn EmbeddingRunner, input: EmbedInput, max_batch: usize) -> EmbedResult {
    let seqs = match input {
        EmbedInput::Ids(ids) => check_ids(model, ids),
        EmbedInput::Texts(texts) => texts
            .iter()
            .enumerate()
            .map(|(i, t)| model.tokenize(t).map_err(|e| format!("input[{i}]: {e}")))
            .collect(),
    }
    .map_err(EngineCallError::Input)?;
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(max_batch) {
        let refs: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
        let vectors = model.embed_ids(&refs).map_err(|e| {
            tracing::error!("embedding failed: {e}");
            EngineCallError::Failed(format!("the model failed: {e}"))
        })?;
        out.extend(vectors.into_iter().zip(chunk.iter().map(Vec::len)));
    }
    Ok(out)
}

/// Token-id inputs must be non-empty, inside the vocabulary and no longer than the model reads.
fn check_ids(model: &dyn EmbeddingRunner, ids: Vec<Vec<u32>>) -> Result<Vec<Vec<u32>>, String> {
    let vocab = model.vocab_size();
    let max_seq_length = model.max_seq_length();
    for (i, seq) in ids.iter().enumerate() {
        if seq.is_empty() {
            return Err(format!("input[{i}] is empty"));
        }
        if seq.len() > max_seq_length {
            return Err(format!(
                "input[{i}] has {} tokens; the model reads at most {}",
                seq.len(),
                max_seq_length
            ));
        }
        if let Some(&bad) = seq.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!(
                "input[{i}]: token id {bad} is outside the vocabulary ({vocab} tokens)"
            ));
        }
    }
    Ok(ids)
}
