//! The decoder-only transformer forward pass, one for every family.
//!
//! Per layer (pre-norm residual blocks; the optional post-norms are Gemma's "sandwich"):
//!
//! ```text
//! h = norm(x) ; q,k,v = h·Wq, h·Wk, h·Wv ; q,k = qk_norm(q,k)? ; q,k = rope(q,k)
//! a = attention(q, K, V) · Wo ; x = x + post_attn_norm?(a)
//! h = norm(x) ; f = (act(h·Wgate) * h·Wup) · Wdown ; x = x + post_ffn_norm?(f)
//! ```
//! then `logits = norm(x) · Woutᵀ`.

use std::ops::Range;
use std::sync::Arc;

use kiln_backend::{
    Activation, AttentionJob, AttentionParams, Backend, Linear, RopeParams, RopeStyle,
};
use kiln_core::config::DecoderConfig;

use crate::{KvCache, ModelError, PagedKvCache, PagedSeq};

/// A do-nothing-by-default hook on every named intermediate, so a test can diff a model layer by
/// layer against a reference (and `examples/decode_segments` can time the stretches between
/// them).
///
/// Per layer, in order: `attn_norm` (the normed input), `q_proj` (the query projection, before
/// its norm and rope), `q` and `k` (single sequence only: roped, as stored), `attn` (the
/// attention's output rows, before O), `attn_out` (after O), `ffn_norm` (the FFN's normed
/// input), `ffn_act` (the gated activation; dense FFNs only), `ffn_out`, `l_out`; `embd` once
/// before the layers.
pub trait Trace<B: Backend>: Sync {
    fn trace(&self, _backend: &B, _name: &str, _layer: usize, _x: &B::Tensor) {}
    /// The router's choices of a mixture-of-experts layer, one per token of the forward pass.
    fn routes(&self, _layer: usize, _routes: &[Route]) {}
}

/// The default hook: does nothing.
pub struct NoTrace;
impl<B: Backend> Trace<B> for NoTrace {}

/// One transformer block's weights.
pub struct DecoderLayer<B: Backend> {
    pub attn_norm: B::Weight,              // (d_model)
    pub q: Linear<B>,                      // (n_heads * head_dim, d_model)
    pub k: Linear<B>,                      // (n_kv_heads * head_dim, d_model)
    pub v: Linear<B>,                      // (n_kv_heads * head_dim_v, d_model)
    pub q_norm: Option<B::Weight>,         // (head_dim) QK-norm: Gemma 3, Qwen 3
    pub k_norm: Option<B::Weight>,         // (head_dim)
    pub o: Linear<B>,                      // (d_model, n_heads * head_dim_v)
    pub post_attn_norm: Option<B::Weight>, // (d_model) Gemma's sandwich norm
    pub ffn_norm: B::Weight,               // (d_model)
    pub ffn: Ffn<B>,
    pub post_ffn_norm: Option<B::Weight>, // (d_model)
}

/// A layer's feed-forward block.
pub enum Ffn<B: Backend> {
    /// `down(act(gate(h)) · up(h))`.
    Dense {
        gate: Linear<B>, // (ffn_dim, d_model)
        up: Linear<B>,   // (ffn_dim, d_model)
        down: Linear<B>, // (d_model, ffn_dim)
    },
    Moe(MoeFfn<B>),
}

/// A mixture of experts: a router and, per expert, a gated FFN of its own (zero-copy views of
/// the file, so an expert's weights are only read when a token is routed to it).
pub struct MoeFfn<B: Backend> {
    pub router: Linear<B>,    // (n_experts, d_model)
    pub gate: Vec<Linear<B>>, // per expert (expert_ffn_dim, d_model)
    pub up: Vec<Linear<B>>,   // per expert (expert_ffn_dim, d_model)
    pub down: Vec<Linear<B>>, // per expert (d_model, expert_ffn_dim)
    pub shared: Option<SharedExpert<B>>,
}

/// Qwen2-MoE's shared expert: a gated FFN every token runs, its output scaled per token by
/// `sigmoid(h · gate_inp)`.
pub struct SharedExpert<B: Backend> {
    pub gate_inp: Linear<B>, // (1, d_model)
    pub gate: Linear<B>,     // (shared_ffn_dim, d_model)
    pub up: Linear<B>,       // (shared_ffn_dim, d_model)
    pub down: Linear<B>,     // (d_model, shared_ffn_dim)
}

/// The router's choice for one token: experts in descending weight order, and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

/// The `N` products of one `matmul_many` call, in order.
fn products<T, const N: usize>(ys: Vec<T>) -> Result<[T; N], ModelError> {
    let got = ys.len();
    ys.try_into().map_err(|_| {
        ModelError::Backend(kiln_backend::shape_err(
            "matmul_many",
            format!("{got} products for {N} weights"),
        ))
    })
}

/// `act(h·gate) * (h·up)`, both products in one call: the inner activation of a gated FFN.
fn gated<B: Backend>(
    b: &B,
    h: &B::Tensor,
    gate: &Linear<B>,
    up: &Linear<B>,
    act: Activation,
) -> Result<B::Tensor, ModelError> {
    let [g, u] = products(b.matmul_many(h, &[gate, up])?)?;
    Ok(b.gated_activation(&g, &u, act)?)
}

/// Softmax over `logits`, the `top_k` largest probabilities (ties to the lower index, as
/// `torch.topk` on CPU), divided by their sum when `normalize`.
pub fn route(logits: &[f32], top_k: usize, normalize: bool) -> Route {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        exps[b as usize]
            .total_cmp(&exps[a as usize])
            .then(a.cmp(&b))
    });
    order.truncate(top_k);
    let mut weights: Vec<f32> = order.iter().map(|&e| exps[e as usize] / sum).collect();
    if normalize {
        let total: f32 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= total);
    }
    Route {
        experts: order,
        weights,
    }
}

/// A decoder-only language model resident on backend `B`.
pub struct Decoder<B: Backend> {
    pub config: DecoderConfig,
    pub token_embd: Arc<B::Weight>, // (vocab, d_model)
    pub layers: Vec<DecoderLayer<B>>,
    pub output_norm: B::Weight, // (d_model)
    pub output: Linear<B>,      // (vocab, d_model); tied to token_embd when the file has no output
}

/// The KV storage of the sequences of one forward pass, on one backend (for a run of layers: a
/// [`crate::SplitDecoder`] has one per backend).
pub(crate) enum Caches<'c, 'p, B: Backend> {
    /// One contiguous cache per sequence.
    Contiguous(&'c mut [&'p mut KvCache<B>]),
    /// One paged cache, a block table per sequence.
    Paged {
        cache: &'c mut PagedKvCache<B>,
        views: &'c [PagedSeq<'p>],
    },
}

impl<B: Backend> Caches<'_, '_, B> {
    fn count(&self) -> usize {
        match self {
            Caches::Contiguous(c) => c.len(),
            Caches::Paged { views, .. } => views.len(),
        }
    }

    /// Positions sequence `i` has filled.
    fn len(&self, i: usize) -> usize {
        match self {
            Caches::Contiguous(c) => c[i].len(),
            Caches::Paged { views, .. } => views[i].len,
        }
    }

    /// The context length of sequence `i` (picks long-context RoPE factors).
    fn capacity(&self, i: usize) -> usize {
        match self {
            Caches::Contiguous(c) => c[i].capacity(),
            Caches::Paged { cache, .. } => cache.max_positions(),
        }
    }

    /// An error unless every cache holds exactly the layers `layers` (indexed locally from
    /// `layers.start`).
    fn check_layers(&self, layers: &Range<usize>) -> Result<(), ModelError> {
        let mismatch = |held: Range<usize>| {
            (held != *layers).then(|| {
                ModelError::Batch(format!(
                    "a KV cache of layers {held:?} for a run of layers {layers:?}"
                ))
            })
        };
        let error = match self {
            Caches::Contiguous(c) => c.iter().find_map(|c| mismatch(c.layers())),
            Caches::Paged { cache, .. } => mismatch(cache.layers()),
        };
        error.map_or(Ok(()), Err)
    }

    /// Whether sequence `i` has room for `n` more positions (the paged table's coverage is
    /// checked by the backend when rows are written).
    fn check_room(&self, i: usize, n: usize) -> Result<(), ModelError> {
        match self {
            Caches::Contiguous(c) => c[i].check_room(n),
            Caches::Paged { cache, views } => {
                let needed = views[i].len + n;
                let capacity = cache
                    .max_positions()
                    .min(views[i].table.len() * cache.block_size());
                if needed > capacity {
                    return Err(ModelError::ContextFull { needed, capacity });
                }
                Ok(())
            }
        }
    }

    /// Stores sequence `i`'s new keys and values of the cache's `il`-th layer (counted from the
    /// first layer it holds) at positions `pos0..`.
    fn store(
        &mut self,
        b: &B,
        i: usize,
        il: usize,
        pos0: usize,
        k: &B::Tensor,
        v: &B::Tensor,
    ) -> Result<(), ModelError> {
        match self {
            Caches::Contiguous(c) => c[i].store(b, il, pos0, k, v)?,
            Caches::Paged { cache, views } => {
                let pages = cache.pages(il, &views[i]);
                b.write_paged_rows(&mut cache.k[il], &pages, pos0, k)?;
                b.write_paged_rows(&mut cache.v[il], &pages, pos0, v)?;
            }
        }
        Ok(())
    }

    /// The attention of sequence `i`'s queries `q` (at positions `pos0..`) over its positions
    /// `..pos0 + rows` of the cache's `il`-th layer, as a job of `Backend::attention_many`.
    fn job<'s>(
        &'s self,
        b: &B,
        i: usize,
        il: usize,
        pos0: usize,
        q: &'s B::Tensor,
    ) -> AttentionJob<'s, B::Tensor, B::Kv> {
        let n_kv = pos0 + b.shape(q).0;
        match self {
            Caches::Contiguous(c) => AttentionJob {
                q,
                k: &c[i].k[il],
                v: &c[i].v[il],
                pages: c[i].ring_pages(il),
                q_pos: pos0,
                n_kv,
            },
            Caches::Paged { cache, views } => AttentionJob {
                q,
                k: &cache.k[il],
                v: &cache.v[il],
                pages: Some(cache.pages(il, &views[i])),
                q_pos: pos0,
                n_kv,
            },
        }
    }

    /// Grows the windowed layers' rings of contiguous caches for the pass `batch` (see
    /// [`KvCache`]); paged caches hold what their tables map.
    fn make_room(&mut self, b: &B, batch: &Batch) -> Result<(), ModelError> {
        if let Caches::Contiguous(c) = self {
            for (cache, (rows, _)) in c.iter_mut().zip(&batch.spans) {
                cache.make_room(b, rows.len())?;
            }
        }
        Ok(())
    }

    /// Counts the new positions of contiguous caches (paged ones are counted by the caller).
    pub(crate) fn advance(&mut self, seqs: &[&[u32]]) {
        if let Caches::Contiguous(c) = self {
            for (cache, seq) in c.iter_mut().zip(seqs) {
                cache.advance(seq.len());
            }
        }
    }
}

impl<B: Backend> Decoder<B> {
    /// Run `ids` (at positions `cache.len()..`) through the model, appending their keys and
    /// values to `cache`, and return the final normalized hidden states `(ids.len(), d_model)`.
    /// [`Decoder::logits`] turns any subset of those rows into logits.
    pub fn forward(
        &self,
        b: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
    ) -> Result<B::Tensor, ModelError> {
        self.forward_traced(b, ids, cache, &NoTrace)
    }

    pub fn forward_traced(
        &self,
        b: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        b.run(|| self.forward_inner(b, &[ids], &mut Caches::Contiguous(&mut [cache]), trace))
    }

    /// Several sequences in one pass: sequence `i` continues `caches[i]`. Every matrix product
    /// runs once over the tokens of all sequences; attention runs per sequence over its own
    /// cache. Returns the final normalized hidden states of all tokens, sequence after sequence
    /// (`(Σ len, d_model)`). A sequence's results do not depend on the others in the batch
    /// beyond the rounding of matrix products over more rows.
    pub fn forward_batch(
        &self,
        b: &B,
        seqs: &[&[u32]],
        caches: &mut [&mut KvCache<B>],
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        b.run(|| self.forward_inner(b, seqs, &mut Caches::Contiguous(caches), trace))
    }

    /// [`Decoder::forward_batch`] over a paged cache: sequence `i` continues at position
    /// `views[i].len`, its keys and values going to and coming from the blocks of
    /// `views[i].table` (which must already cover the new positions). The cache does not count
    /// positions: the caller adds `seqs[i].len()` to its own count after the pass. Every value
    /// is computed as over contiguous caches holding the same rows (the same bits).
    pub fn forward_paged(
        &self,
        b: &B,
        seqs: &[&[u32]],
        cache: &mut PagedKvCache<B>,
        views: &[PagedSeq<'_>],
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        b.run(|| self.forward_inner(b, seqs, &mut Caches::Paged { cache, views }, trace))
    }

    fn forward_inner(
        &self,
        b: &B,
        seqs: &[&[u32]],
        caches: &mut Caches<'_, '_, B>,
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        let c = &self.config;
        let batch = Batch::new(c, seqs, caches)?;
        let x = embed(b, c, &self.token_embd, &batch, trace)?;
        let run = LayerRun {
            config: c,
            first: 0,
            layers: &self.layers,
        };
        let x = run.forward(b, x, &batch, caches, trace)?;
        let h = b.rms_norm(&x, &self.output_norm, c.norm_eps)?;
        caches.advance(seqs);
        Ok(h)
    }

    /// Logits `(rows, vocab)` of final hidden states (any rows of `forward`'s result).
    pub fn logits(&self, b: &B, hidden: &B::Tensor) -> Result<B::Tensor, ModelError> {
        Ok(b.run(|| b.matmul(hidden, &self.output))?)
    }

    /// A KV cache for this model holding `capacity` positions.
    pub fn new_cache(&self, b: &B, capacity: usize) -> Result<KvCache<B>, ModelError> {
        KvCache::new(b, &self.config, capacity)
    }
}

/// The tokens of one forward pass, sequence after sequence, and where each sequence sits: its
/// rows of the batch and its positions.
pub(crate) struct Batch {
    /// Every token of the pass.
    ids: Vec<u32>,
    /// Per sequence: its rows and its first position.
    spans: Vec<(Range<usize>, usize)>,
    /// Per token: its position in its sequence.
    positions: Vec<u32>,
}

impl Batch {
    /// Checks `seqs` against the model and `caches` (one per sequence, each with room for its
    /// tokens) and lays them out.
    pub(crate) fn new<B: Backend>(
        c: &DecoderConfig,
        seqs: &[&[u32]],
        caches: &Caches<'_, '_, B>,
    ) -> Result<Batch, ModelError> {
        if seqs.len() != caches.count() || seqs.is_empty() {
            return Err(ModelError::Batch(format!(
                "{} sequences with {} caches",
                seqs.len(),
                caches.count()
            )));
        }
        let ids: Vec<u32> = seqs.concat();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ModelError::BadToken {
                id,
                vocab: c.vocab_size,
            });
        }
        // Row range and first position of each sequence.
        let mut spans = Vec::with_capacity(seqs.len());
        let mut positions = Vec::with_capacity(ids.len());
        let mut row = 0;
        for (i, seq) in seqs.iter().enumerate() {
            caches.check_room(i, seq.len())?;
            let pos0 = caches.len(i);
            positions.extend((pos0..pos0 + seq.len()).map(|p| p as u32));
            spans.push((row..row + seq.len(), pos0));
            row += seq.len();
        }
        Ok(Batch {
            ids,
            spans,
            positions,
        })
    }

    /// Tokens in the pass (the rows of its hidden states).
    pub(crate) fn rows(&self) -> usize {
        self.ids.len()
    }
}

/// The scaled token embeddings of the batch `(rows, d_model)`: the input of layer 0.
pub(crate) fn embed<B: Backend>(
    b: &B,
    c: &DecoderConfig,
    token_embd: &B::Weight,
    batch: &Batch,
    trace: &dyn Trace<B>,
) -> Result<B::Tensor, ModelError> {
    let mut x = b.embedding(token_embd, &batch.ids)?;
    if let Some(s) = c.embed_scale {
        x = b.scale(&x, s)?;
    }
    trace.trace(b, "embd", 0, &x);
    Ok(x)
}

/// A contiguous run of a model's layers on one backend: `layers` are the model's layers
/// `first..first + layers.len()` (all of them for a [`Decoder`], one side of the split for a
/// [`crate::SplitDecoder`]). The configuration (attention kind, RoPE) and the trace see the
/// model's own layer index; a KV cache holds the run's layers only, indexed from `first`.
pub(crate) struct LayerRun<'m, B: Backend> {
    pub config: &'m DecoderConfig,
    pub first: usize,
    pub layers: &'m [DecoderLayer<B>],
}

impl<B: Backend> LayerRun<'_, B> {
    /// Runs the hidden states `x` of `batch` through the layers, on backend `b`, and returns the
    /// output of the last of them (`x` itself for an empty run).
    ///
    /// `caches` hold exactly this run's layers (checked). Their keys and values are written; their
    /// positions are not counted (the caller advances them once every run of the pass has
    /// succeeded).
    pub(crate) fn forward(
        &self,
        b: &B,
        mut x: B::Tensor,
        batch: &Batch,
        caches: &mut Caches<'_, '_, B>,
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        let (c, first) = (self.config, self.first);
        caches.check_layers(&(first..first + self.layers.len()))?;
        caches.make_room(b, batch)?;
        let (spans, positions) = (&batch.spans, &batch.positions);
        let single = spans.len() == 1;
        let act = Activation::from(c.activation);
        let style = RopeStyle::from(c.rope_kind);
        for (local, layer) in self.layers.iter().enumerate() {
            let il = first + local;
            let attention = c.layer_attention[il];
            let window = attention.window();
            let params = AttentionParams {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                scale: c.attention_scale,
                sliding_window: window,
                softcap: c.attn_logit_softcap,
            };

            // Attention block.
            let h = b.rms_norm(&x, &layer.attn_norm, c.norm_eps)?;
            trace.trace(b, "attn_norm", il, &h);
            let [mut q, mut k, v] = products(b.matmul_many(&h, &[&layer.q, &layer.k, &layer.v])?)?;
            trace.trace(b, "q_proj", il, &q);
            if let Some(w) = &layer.q_norm {
                q = b.rms_norm(&q, w, c.norm_eps)?;
            }
            if let Some(w) = &layer.k_norm {
                k = b.rms_norm(&k, w, c.norm_eps)?;
            }
            // Per sequence: rope (its cache's capacity picks long-rope), cache append, attention.
            let a = if single {
                None
            } else {
                Some(b.zeros(batch.rows(), c.n_heads * c.head_dim_v)?)
            };
            // First every sequence's rope and cache append, then the attention of all of them
            // in one call (which the backend may run concurrently).
            let mut queries = Vec::with_capacity(spans.len());
            // Rope is row by row: when every sequence takes the same rope (the usual case; long
            // rope depends on each cache's capacity), the whole batch is rotated in two calls
            // rather than two per sequence, and the sequences' rows are cut from the result.
            let ropes: Vec<_> = spans
                .iter()
                .enumerate()
                .map(|(i, (rows, pos0))| {
                    c.rope_for(attention, caches.capacity(i), pos0 + rows.len())
                })
                .collect();
            let shared = (!single && ropes.windows(2).all(|w| w[0] == w[1]))
                .then(|| -> Result<_, ModelError> {
                    let params = |n_heads| {
                        RopeParams::new(&ropes[0], n_heads, c.head_dim, c.rope_dim, style)
                    };
                    Ok((
                        b.rope(&q, positions, &params(c.n_heads))?,
                        b.rope(&k, positions, &params(c.n_kv_heads))?,
                    ))
                })
                .transpose()?;
            for (i, (rows, pos0)) in spans.iter().enumerate() {
                let rope = &*ropes[i];
                let rope_params =
                    |n_heads| RopeParams::new(rope, n_heads, c.head_dim, c.rope_dim, style);
                let pos = &positions[rows.clone()];
                let vs;
                let (q_r, k_r, v_in) = if single {
                    let q_r = b.rope(&q, pos, &rope_params(c.n_heads))?;
                    let k_r = b.rope(&k, pos, &rope_params(c.n_kv_heads))?;
                    (q_r, k_r, &v)
                } else {
                    vs = b.rows(&v, rows.clone())?;
                    match &shared {
                        Some((q_all, k_all)) => (
                            b.rows(q_all, rows.clone())?,
                            b.rows(k_all, rows.clone())?,
                            &vs,
                        ),
                        None => {
                            let qs = b.rows(&q, rows.clone())?;
                            let ks = b.rows(&k, rows.clone())?;
                            let q_r = b.rope(&qs, pos, &rope_params(c.n_heads))?;
                            let k_r = b.rope(&ks, pos, &rope_params(c.n_kv_heads))?;
                            (q_r, k_r, &vs)
                        }
                    }
                };
                if single {
                    trace.trace(b, "q", il, &q_r);
                    trace.trace(b, "k", il, &k_r);
                }
                caches.store(b, i, local, *pos0, &k_r, v_in)?;
                queries.push(q_r);
            }
            let jobs: Vec<_> = spans
                .iter()
                .zip(&queries)
                .enumerate()
                .map(|(i, ((_, pos0), q_r))| caches.job(b, i, local, *pos0, q_r))
                .collect();
            let mut outs = b.attention_many(&jobs, &params)?;
            drop(jobs);
            let a = match a {
                Some(mut all) => {
                    for ((rows, _), out) in spans.iter().zip(&outs) {
                        b.write_rows(&mut all, rows.start, out)?;
                    }
                    all
                }
                None => outs
                    .pop()
                    .ok_or_else(|| ModelError::Batch("no sequence".into()))?,
            };
            trace.trace(b, "attn", il, &a);
            let a = b.matmul(&a, &layer.o)?;
            trace.trace(b, "attn_out", il, &a);
            x = match &layer.post_attn_norm {
                Some(w) => b.add_rms_norm(&x, &a, w, c.norm_eps)?,
                None => b.add(&x, &a)?,
            };

            // Feed-forward block.
            let h = b.rms_norm(&x, &layer.ffn_norm, c.norm_eps)?;
            trace.trace(b, "ffn_norm", il, &h);
            let f = match &layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    let f = gated(b, &h, gate, up, act)?;
                    trace.trace(b, "ffn_act", il, &f);
                    b.matmul(&f, down)?
                }
                Ffn::Moe(moe) => self.moe_ffn(b, &h, moe, act, il, trace)?,
            };
            trace.trace(b, "ffn_out", il, &f);
            x = match &layer.post_ffn_norm {
                Some(w) => b.add_rms_norm(&x, &f, w, c.norm_eps)?,
                None => b.add(&x, &f)?,
            };
            trace.trace(b, "l_out", il, &x);
        }
        Ok(x)
    }

    /// `Σ_e p_e · expert_e(h)` over each token's routed experts, plus the shared expert's gated
    /// output where the layer has one. Tokens are grouped by expert so
    /// that each selected expert runs once over all its tokens; experts nobody chose are not
    /// touched. Each token's sum runs over its experts in ascending expert order, so a token's
    /// result does not depend on the other tokens of the batch.
    fn moe_ffn(
        &self,
        b: &B,
        h: &B::Tensor,
        moe: &MoeFfn<B>,
        act: Activation,
        layer: usize,
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        let Some(cfg) = &self.config.moe else {
            return Err(ModelError::Metadata {
                key: "expert_count".into(),
                detail: "a mixture-of-experts layer in a model without experts".into(),
            });
        };
        let (n, d) = b.shape(h);
        let logits = b.to_f32(&b.matmul(h, &moe.router)?)?;
        let routes: Vec<Route> = logits
            .chunks_exact(cfg.n_experts)
            .map(|l| route(l, cfg.top_k, cfg.normalize_top_k))
            .collect();
        trace.routes(layer, &routes);
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); cfg.n_experts];
        let mut weights: Vec<Vec<f32>> = vec![Vec::new(); cfg.n_experts];
        for (t, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                rows[e as usize].push(t as u32);
                weights[e as usize].push(w);
            }
        }
        let mut out = b.zeros(n, d)?;
        for e in 0..cfg.n_experts {
            if rows[e].is_empty() {
                continue;
            }
            let x = b.gather_rows(h, &rows[e])?;
            let g = b.matmul(&x, &moe.gate[e])?;
            let u = b.matmul(&x, &moe.up[e])?;
            let y = b.matmul(&b.gated_activation(&g, &u, act)?, &moe.down[e])?;
            b.scatter_add_rows(&mut out, &rows[e], &y, &weights[e])?;
        }
        // The shared expert last, as transformers adds it to the routed sum.
        if let Some(s) = &moe.shared {
            let y = b.matmul(&gated(b, h, &s.gate, &s.up, act)?, &s.down)?;
            let gates: Vec<f32> = b
                .to_f32(&b.matmul(h, &s.gate_inp)?)?
                .iter()
                .map(|&z| 1.0 / (1.0 + (-z).exp()))
                .collect();
            let all: Vec<u32> = (0..n as u32).collect();
            b.scatter_add_rows(&mut out, &all, &y, &gates)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routing_keeps_the_top_k_softmax_weights() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let exps: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
        let sum: f64 = exps.iter().sum();
        // Ties go to the lower index; weights are the full softmax's.
        let r = route(&logits, 3, false);
        assert_eq!(r.experts, [1, 3, 4]);
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            assert!((w as f64 - exps[e as usize] / sum).abs() < 1e-7, "{r:?}");
        }
        // Renormalised: the kept weights sum to 1, in the same proportions.
        let n = route(&logits, 3, true);
        assert_eq!(n.experts, r.experts);
        assert!((n.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let kept: f64 = r.experts.iter().map(|&e| exps[e as usize]).sum();
        assert!((n.weights[2] as f64 - exps[4] / kept).abs() < 1e-7);
        // top_k = all experts and normalising changes nothing but rounding.
        let all = route(&logits, 5, true);
        assert_eq!(all.experts, [1, 3, 4, 0, 2]);
    }
}
