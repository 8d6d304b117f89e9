//! One decoder over two backends: the first layers on one (the *front*, e.g. a GPU that cannot
//! hold the whole model), the rest on another (the *back*, e.g. the CPU).
//!
//! The same model code runs on both: [`SplitDecoder`] calls the layer loop that [`Decoder`] runs
//! (`decoder.rs`'s `LayerRun`) once per backend, each inside its own backend's
//! [`Backend::run`].
//!
//! Invariants:
//! - **Where each weight lives.** For a split after layer `n` of `L` (`0 ≤ n ≤ L`): the
//!   embedding table and layers `0..n` on the front; layers `n..L`, the final norm and the output
//!   matrix on the back. A model with tied embeddings (no `output.weight` in the file) has the
//!   table twice: the front looks tokens up in it, the back multiplies by it. `n = 0` leaves only
//!   the embedding lookup on the front; `n = L` leaves only the head on the back.
//! - **Where the hidden state crosses.** Once per forward pass, after layer `n - 1` (after the
//!   embedding when `n = 0`): the front copies the `(tokens, d_model)` hidden states to the host
//!   ([`Backend::to_f32`]), the back copies them in ([`Backend::tensor_from_f32`]). Nothing else
//!   crosses: each backend holds the KV cache of its own layers, and the engine's block tables
//!   (paged cache) address both parts alike.
//! - **Same results.** A layer computes with the model's own layer index (attention kind, RoPE
//!   factors, trace names), so when both backends are of the same kind and compute the same bits
//!   for the same ops (as the CPU backend does, whatever its thread count), every hidden
//!   state, cache row and logit equals the single-backend [`Decoder`]'s bit for bit: the crossing
//!   copies f32 values exactly.
//! - **Positions.** The two parts of a cache always hold the same positions: a pass counts its
//!   new positions in both only once both parts have run.
//!
//! [`Decoder`]: crate::Decoder

use std::sync::Arc;

use kiln_backend::{Backend, Linear};
use kiln_core::config::DecoderConfig;

use crate::decoder::{embed, Batch, Caches, LayerRun};
use crate::{
    DecoderLayer, ModelError, NoTrace, PagedLayout, PagedSeq, SplitKvCache, SplitPagedKvCache,
    Trace,
};

/// A decoder-only language model split over two backends: layers `0..front.len()` on `F`, the
/// rest on `R` (see the module documentation for the invariants).
pub struct SplitDecoder<F: Backend, R: Backend> {
    pub config: DecoderConfig,
    pub token_embd: Arc<F::Weight>,  // (vocab, d_model) on the front
    pub front: Vec<DecoderLayer<F>>, // layers 0..n
    pub back: Vec<DecoderLayer<R>>,  // layers n..L
    pub output_norm: R::Weight,      // (d_model)
    pub output: Linear<R>,           // (vocab, d_model); the embedding table again when tied
}

impl<F: Backend, R: Backend> SplitDecoder<F, R> {
    /// Layers on the front backend (the split point `n`).
    pub fn front_layers(&self) -> usize {
        self.front.len()
    }

    /// As [`Decoder::forward`](crate::Decoder::forward): returns the final normalized hidden
    /// states `(ids.len(), d_model)`, on the back.
    pub fn forward(
        &self,
        front: &F,
        back: &R,
        ids: &[u32],
        cache: &mut SplitKvCache<F, R>,
    ) -> Result<R::Tensor, ModelError> {
        self.forward_traced(front, back, ids, cache, &NoTrace)
    }

    /// [`SplitDecoder::forward`] with a trace that sees each layer on its own backend, under the
    /// model's layer index.
    pub fn forward_traced<T: Trace<F> + Trace<R>>(
        &self,
        front: &F,
        back: &R,
        ids: &[u32],
        cache: &mut SplitKvCache<F, R>,
        trace: &T,
    ) -> Result<R::Tensor, ModelError> {
        let SplitKvCache {
            front: fc,
            back: bc,
        } = cache;
        let (mut fc, mut bc) = ([fc], [bc]);
        self.forward_inner(
            front,
            back,
            &[ids],
            &mut Caches::Contiguous(&mut fc),
            &mut Caches::Contiguous(&mut bc),
            trace,
        )
    }

    /// As [`Decoder::forward_batch`](crate::Decoder::forward_batch): sequence `i` continues
    /// `caches[i]`.
    pub fn forward_batch<T: Trace<F> + Trace<R>>(
        &self,
        front: &F,
        back: &R,
        seqs: &[&[u32]],
        caches: &mut [&mut SplitKvCache<F, R>],
        trace: &T,
    ) -> Result<R::Tensor, ModelError> {
        let (mut fc, mut bc): (Vec<_>, Vec<_>) = caches
            .iter_mut()
            .map(|c| (&mut c.front, &mut c.back))
            .unzip();
        self.forward_inner(
            front,
            back,
            seqs,
            &mut Caches::Contiguous(&mut fc),
            &mut Caches::Contiguous(&mut bc),
            trace,
        )
    }

    /// As [`Decoder::forward_paged`](crate::Decoder::forward_paged): both parts of `cache` under
    /// the same block tables `views`.
    pub fn forward_paged<T: Trace<F> + Trace<R>>(
        &self,
        front: &F,
        back: &R,
        seqs: &[&[u32]],
        cache: &mut SplitPagedKvCache<F, R>,
        views: &[PagedSeq<'_>],
        trace: &T,
    ) -> Result<R::Tensor, ModelError> {
        let SplitPagedKvCache {
            front: fc,
            back: bc,
        } = cache;
        self.forward_inner(
            front,
            back,
            seqs,
            &mut Caches::Paged { cache: fc, views },
            &mut Caches::Paged { cache: bc, views },
            trace,
        )
    }

    /// The front's part (embedding, layers `0..n`, on `F`), the crossing, and the back's part
    /// (layers `n..L`, final norm, on `R`). Positions are counted once both parts have run.
    fn forward_inner<T: Trace<F> + Trace<R>>(
        &self,
        f: &F,
        r: &R,
        seqs: &[&[u32]],
        front_caches: &mut Caches<'_, '_, F>,
        back_caches: &mut Caches<'_, '_, R>,
        trace: &T,
    ) -> Result<R::Tensor, ModelError> {
        let c = &self.config;
        // Both parts of a cache hold the same positions: the front's lay the batch out.
        let batch = Batch::new(c, seqs, front_caches)?;
        let n = self.front.len();
        let crossing = f.run(|| -> Result<Vec<f32>, ModelError> {
            let x = embed(f, c, &self.token_embd, &batch, trace)?;
            let run = LayerRun {
                config: c,
                first: 0,
                layers: &self.front,
            };
            let x = run.forward(f, x, &batch, front_caches, trace)?;
            Ok(f.to_f32(&x)?)
        })?;
        let h = r.run(|| -> Result<R::Tensor, ModelError> {
            let x = r.tensor_from_f32(&crossing, batch.rows(), c.d_model)?;
            let run = LayerRun {
                config: c,
                first: n,
                layers: &self.back,
            };
            let x = run.forward(r, x, &batch, back_caches, trace)?;
            Ok(r.rms_norm(&x, &self.output_norm, c.norm_eps)?)
        })?;
        front_caches.advance(seqs);
        back_caches.advance(seqs);
        Ok(h)
    }

    /// Logits `(rows, vocab)` of final hidden states (any rows of `forward`'s result), on the
    /// back.
    pub fn logits(&self, back: &R, hidden: &R::Tensor) -> Result<R::Tensor, ModelError> {
        Ok(back.run(|| back.matmul(hidden, &self.output))?)
    }

    /// A KV cache for this model holding `capacity` positions, each part on its backend.
    pub fn new_cache(
        &self,
        front: &F,
        back: &R,
        capacity: usize,
    ) -> Result<SplitKvCache<F, R>, ModelError> {
        SplitKvCache::new(front, back, &self.config, self.front.len(), capacity)
    }

    /// A paged KV cache for this model (see [`crate::PagedKvCache::with_layout`]), each part on
    /// its backend, both under the same block tables.
    pub fn new_paged_cache(
        &self,
        front: &F,
        back: &R,
        layout: &PagedLayout,
    ) -> Result<SplitPagedKvCache<F, R>, ModelError> {
        SplitPagedKvCache::new(front, back, &self.config, self.front.len(), layout)
    }
}
