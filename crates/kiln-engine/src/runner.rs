//! The engine boundary: a model on the backend(s) its plan chose, with the backends' types
//! erased. Models, caches and kernels are generic over `B: Backend` (monomorphized, no dynamic
//! call on the hot path); the commands and the server hold a `Box<dyn DecoderRunner>` or a
//! `Box<dyn EmbeddingRunner>` and never name a backend. The erasure happens once, when the
//! placement is built ([`decoder_on`], [`split_decoder_on`], [`embedding_on`]).
//!
//! What a placement cannot do is refused by [`DecoderRunner::check`] before anything is loaded
//! that a command would then not use: today a split decoder generates, but does not score,
//! compute perplexity or serve a continuous batch (those run the single-backend paths).

use kiln_backend::{Backend, KvDtype};
use kiln_core::config::DecoderConfig;
use kiln_models::{Decoder, SplitDecoder};

use crate::{
    generate, perplexity, score, BlockPool, Embedding, EmbeddingModel, EngineError, Event,
    GenerateOptions, Generation, Perplexity, PositionScore, PrefixStats, Request, RequestId,
    Scheduler, SchedulerConfig, SubmitError,
};

/// What a command asks of a decoder placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderUse {
    /// Generate tokens for one sequence (`kiln run`).
    Generate,
    /// Teacher-forced scores and perplexity (`kiln score`, `kiln perplexity`).
    Score,
    /// Continuous batching over a paged KV cache (`kiln serve`).
    Serve,
}

impl DecoderUse {
    /// Whether a decoder split over two backends does this: it generates; scoring and the
    /// batched scheduler run the single-backend paths only. Known before anything is loaded.
    pub fn runs_split(self) -> bool {
        self == DecoderUse::Generate
    }
}

/// A decoder placed on its backend(s); see the module docs.
pub trait DecoderRunner: Send {
    fn config(&self) -> &DecoderConfig;

    /// Where it runs, for logs ("cpu (2 threads, AVX2)", or both sides of a split).
    fn placement(&self) -> String;

    /// The element type of the KV caches it makes.
    fn kv_dtype(&self) -> KvDtype;

    /// Whether this placement can serve `usage`; an error that says why not otherwise.
    fn check(&self, usage: DecoderUse) -> Result<(), EngineError>;

    /// [`generate`] for one sequence.
    fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        is_end: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError>;

    /// [`score`]: teacher-forced log-probabilities of `ids` with the `top` most likely tokens.
    fn score(&self, ids: &[u32], top: usize) -> Result<Vec<PositionScore>, EngineError>;

    /// [`perplexity`] of `ids` in chunks of `n_ctx`.
    fn perplexity(
        &self,
        ids: &[u32],
        bos: Option<u32>,
        n_ctx: usize,
        on_chunk: &mut dyn FnMut(usize, usize, f64),
    ) -> Result<Perplexity, EngineError>;

    /// A continuous-batching scheduler that owns this model (the server's engine thread).
    fn into_batcher(self: Box<Self>, cfg: SchedulerConfig)
        -> Result<Box<dyn Batcher>, EngineError>;
}

/// A [`Scheduler`] with the model it runs, the backend's type erased (see [`Scheduler`] for
/// what each method does).
pub trait Batcher: Send {
    fn submit(&mut self, req: Request) -> Result<RequestId, SubmitError>;
    fn cancel(&mut self, id: RequestId) -> bool;
    fn waiting(&self) -> usize;
    fn running(&self) -> usize;
    fn is_idle(&self) -> bool;
    fn pool(&self) -> &BlockPool;
    fn window_pool(&self) -> Option<&BlockPool>;
    fn prefix_stats(&self) -> PrefixStats;
    fn preemptions(&self) -> u64;
    fn check(&self) -> Result<(), String>;
    /// One scheduler step: a forward pass over the running batch.
    fn step(&mut self) -> Result<Vec<Event>, EngineError>;
    /// [`score`] between two steps.
    fn score(&self, ids: &[u32], top: usize) -> Result<Vec<PositionScore>, EngineError>;
    /// Drops every request and starts over with a fresh KV pool (after a bug left the state
    /// untrusted).
    fn restart(&mut self) -> Result<(), EngineError>;
}

/// `model` on `backend`, erased.
pub fn decoder_on<B>(backend: B, model: Decoder<B>) -> Box<dyn DecoderRunner>
where
    B: Backend + Send + 'static,
    Decoder<B>: Send,
{
    Box::new(OnBackend { backend, model })
}

/// `model` split over `front` and `back`, erased.
pub fn split_decoder_on<F, R>(
    front: F,
    back: R,
    model: SplitDecoder<F, R>,
) -> Box<dyn DecoderRunner>
where
    F: Backend + Send + 'static,
    R: Backend + Send + 'static,
    SplitDecoder<F, R>: Send,
{
    Box::new(Split { front, back, model })
}

struct OnBackend<B: Backend> {
    backend: B,
    model: Decoder<B>,
}

impl<B> DecoderRunner for OnBackend<B>
where
    B: Backend + Send + 'static,
    Decoder<B>: Send,
{
    fn config(&self) -> &DecoderConfig {
        &self.model.config
    }

    fn placement(&self) -> String {
        self.backend.name()
    }

    fn kv_dtype(&self) -> KvDtype {
        self.backend.kv_dtype()
    }

    fn check(&self, _usage: DecoderUse) -> Result<(), EngineError> {
        Ok(())
    }

    fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        is_end: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        generate(
            &self.model.on(&self.backend),
            prompt,
            opts,
            is_end,
            on_token,
        )
    }

    fn score(&self, ids: &[u32], top: usize) -> Result<Vec<PositionScore>, EngineError> {
        score(&self.backend, &self.model, ids, top)
    }

    fn perplexity(
        &self,
        ids: &[u32],
        bos: Option<u32>,
        n_ctx: usize,
        on_chunk: &mut dyn FnMut(usize, usize, f64),
    ) -> Result<Perplexity, EngineError> {
        perplexity(&self.backend, &self.model, ids, bos, n_ctx, on_chunk)
    }

    fn into_batcher(
        self: Box<Self>,
        cfg: SchedulerConfig,
    ) -> Result<Box<dyn Batcher>, EngineError> {
        let scheduler = Scheduler::new(&self.backend, &self.model, cfg.clone())?;
        Ok(Box::new(Batched {
            backend: self.backend,
            model: self.model,
            scheduler,
            cfg,
        }))
    }
}

struct Batched<B: Backend> {
    backend: B,
    model: Decoder<B>,
    scheduler: Scheduler<B>,
    cfg: SchedulerConfig,
}

impl<B> Batcher for Batched<B>
where
    B: Backend + Send + 'static,
    Decoder<B>: Send,
{
    fn submit(&mut self, req: Request) -> Result<RequestId, SubmitError> {
        self.scheduler.submit(req)
    }
    fn cancel(&mut self, id: RequestId) -> bool {
        self.scheduler.cancel(id)
    }
    fn waiting(&self) -> usize {
        self.scheduler.waiting()
    }
    fn running(&self) -> usize {
        self.scheduler.running()
    }
    fn is_idle(&self) -> bool {
        self.scheduler.is_idle()
    }
    fn pool(&self) -> &BlockPool {
        self.scheduler.pool()
    }
    fn window_pool(&self) -> Option<&BlockPool> {
        self.scheduler.window_pool()
    }
    fn prefix_stats(&self) -> PrefixStats {
        self.scheduler.prefix_stats()
    }
    fn preemptions(&self) -> u64 {
        self.scheduler.preemptions()
    }
    fn check(&self) -> Result<(), String> {
        self.scheduler.check()
    }
    fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        self.scheduler.step(&self.backend, &self.model)
    }
    fn score(&self, ids: &[u32], top: usize) -> Result<Vec<PositionScore>, EngineError> {
        score(&self.backend, &self.model, ids, top)
    }
    fn restart(&mut self) -> Result<(), EngineError> {
        self.scheduler = Scheduler::new(&self.backend, &self.model, self.cfg.clone())?;
        Ok(())
    }
}

struct Split<F: Backend, R: Backend> {
    front: F,
    back: R,
    model: SplitDecoder<F, R>,
}

impl<F, R> Split<F, R>
where
    F: Backend,
    R: Backend,
{
    fn unsupported(&self, what: &str) -> EngineError {
        EngineError::Unsupported(format!(
            "{what} runs on one backend; this model is split ({})",
            self.describe()
        ))
    }

    fn describe(&self) -> String {
        let front = self.model.front_layers();
        let back = self.model.config.n_layers - front;
        format!(
            "layers 0..{front} on {}, {back} more and the output on {}",
            self.front.name(),
            self.back.name()
        )
    }
}

impl<F, R> DecoderRunner for Split<F, R>
where
    F: Backend + Send + 'static,
    R: Backend + Send + 'static,
    SplitDecoder<F, R>: Send,
{
    fn config(&self) -> &DecoderConfig {
        &self.model.config
    }

    fn placement(&self) -> String {
        format!("split: {}", self.describe())
    }

    fn kv_dtype(&self) -> KvDtype {
        self.back.kv_dtype()
    }

    fn check(&self, usage: DecoderUse) -> Result<(), EngineError> {
        if usage.runs_split() {
            return Ok(());
        }
        Err(self.unsupported(match usage {
            DecoderUse::Serve => "serving",
            _ => "scoring",
        }))
    }

    fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        is_end: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        let model = self.model.on(&self.front, &self.back);
        generate(&model, prompt, opts, is_end, on_token)
    }

    fn score(&self, _ids: &[u32], _top: usize) -> Result<Vec<PositionScore>, EngineError> {
        Err(self.unsupported("scoring"))
    }

    fn perplexity(
        &self,
        _ids: &[u32],
        _bos: Option<u32>,
        _n_ctx: usize,
        _on_chunk: &mut dyn FnMut(usize, usize, f64),
    ) -> Result<Perplexity, EngineError> {
        Err(self.unsupported("perplexity"))
    }

    fn into_batcher(
        self: Box<Self>,
        _cfg: SchedulerConfig,
    ) -> Result<Box<dyn Batcher>, EngineError> {
        Err(self.unsupported("serving"))
    }
}

/// An embedding model placed on its backend, the backend's type erased.
pub trait EmbeddingRunner: Send {
    /// The model (tokenizer, configuration, pipeline), without its backend.
    fn dim(&self) -> usize;
    /// Longest input in tokens.
    fn max_seq_length(&self) -> usize;
    /// Size of the vocabulary (token ids given directly must be below it).
    fn vocab_size(&self) -> usize;
    fn placement(&self) -> String;
    /// Token ids of `text` as the model will see them.
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, EngineError>;
    /// Embeddings of token sequences, all in one packed batch.
    fn embed_ids(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, EngineError>;
    /// [`EmbeddingModel::embed_texts`]: `texts` in batches of `batch_size`, each batch handed to
    /// `on_batch` with the index of its first text.
    fn embed_texts(
        &self,
        texts: &[&str],
        batch_size: usize,
        on_batch: &mut dyn FnMut(usize, Vec<Embedding>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError>;
}

/// `model` on `backend`, erased.
pub fn embedding_on<B>(backend: B, model: EmbeddingModel<B>) -> Box<dyn EmbeddingRunner>
where
    B: Backend + Send + 'static,
    EmbeddingModel<B>: Send,
{
    Box::new(EmbeddingOn { backend, model })
}

struct EmbeddingOn<B: Backend> {
    backend: B,
    model: EmbeddingModel<B>,
}

impl<B> EmbeddingRunner for EmbeddingOn<B>
where
    B: Backend + Send + 'static,
    EmbeddingModel<B>: Send,
{
    fn dim(&self) -> usize {
        self.model.dim()
    }
    fn max_seq_length(&self) -> usize {
        self.model.max_seq_length
    }
    fn vocab_size(&self) -> usize {
        self.model.encoder.config.vocab_size
    }
    fn placement(&self) -> String {
        self.backend.name()
    }
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.model.tokenize(text)
    }
    fn embed_ids(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.model.embed_ids(&self.backend, seqs)
    }
    fn embed_texts(
        &self,
        texts: &[&str],
        batch_size: usize,
        on_batch: &mut dyn FnMut(usize, Vec<Embedding>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        self.model
            .embed_texts(&self.backend, texts, batch_size, on_batch)
    }
}
