//! [`CausalLm`]: what single-sequence generation needs from a decoder, whatever its placement.
//!
//! A model's methods take the backend(s) it lives on as arguments; the trait is implemented by a
//! model *bound* to them ([`Decoder::on`], [`SplitDecoder::on`]), so that the engine can run a
//! whole model and a split one through the same code without naming a backend.
//!
//! The step is split in two, hidden state then logits, so that a prompt cut into chunks computes
//! logits for its last position only, and the hidden state stays on the device that computes
//! the logits.

use kiln_backend::Backend;
use kiln_core::config::DecoderConfig;

use crate::{Decoder, KvCache, ModelError, SplitDecoder, SplitKvCache};

/// A causal language model ready to run: one sequence, one KV cache.
pub trait CausalLm {
    /// The KV cache of one sequence.
    type Cache;
    /// A final normalized hidden state `(1, d_model)`, where the logits are computed.
    type Hidden;

    fn config(&self) -> &DecoderConfig;

    /// An empty KV cache holding `capacity` positions.
    fn new_cache(&self, capacity: usize) -> Result<Self::Cache, ModelError>;

    /// Runs `ids` (at least one) at the positions after those in `cache`, appends their keys and
    /// values to it, and returns the final hidden state of the last of them.
    fn forward_last(
        &self,
        ids: &[u32],
        cache: &mut Self::Cache,
    ) -> Result<Self::Hidden, ModelError>;

    /// The logits `(vocab)` of a hidden state, on the host.
    fn logits(&self, hidden: &Self::Hidden) -> Result<Vec<f32>, ModelError>;
}

/// A [`Decoder`] bound to its backend.
pub struct DecoderOn<'a, B: Backend> {
    pub backend: &'a B,
    pub model: &'a Decoder<B>,
}

impl<B: Backend> Decoder<B> {
    /// This model bound to `backend`, the one it was loaded onto.
    pub fn on<'a>(&'a self, backend: &'a B) -> DecoderOn<'a, B> {
        DecoderOn {
            backend,
            model: self,
        }
    }
}

/// The last row of `h`, `(rows, d_model)` with `rows` ≥ 1.
fn last_row<B: Backend>(b: &B, h: B::Tensor) -> Result<B::Tensor, ModelError> {
    let rows = b.shape(&h).0;
    Ok(match rows {
        1 => h,
        _ => b.rows(&h, rows - 1..rows)?,
    })
}

fn check_not_empty(ids: &[u32]) -> Result<(), ModelError> {
    match ids.is_empty() {
        true => Err(ModelError::Batch("a forward pass of no tokens".into())),
        false => Ok(()),
    }
}

impl<B: Backend> CausalLm for DecoderOn<'_, B> {
    type Cache = KvCache<B>;
    type Hidden = B::Tensor;

    fn config(&self) -> &DecoderConfig {
        &self.model.config
    }

    fn new_cache(&self, capacity: usize) -> Result<KvCache<B>, ModelError> {
        self.model.new_cache(self.backend, capacity)
    }

    fn forward_last(&self, ids: &[u32], cache: &mut KvCache<B>) -> Result<B::Tensor, ModelError> {
        check_not_empty(ids)?;
        last_row(self.backend, self.model.forward(self.backend, ids, cache)?)
    }

    fn logits(&self, hidden: &B::Tensor) -> Result<Vec<f32>, ModelError> {
        let b = self.backend;
        Ok(b.to_f32(&self.model.logits(b, hidden)?)?)
    }
}

/// A [`SplitDecoder`] bound to its two backends.
pub struct SplitDecoderOn<'a, F: Backend, R: Backend> {
    pub front: &'a F,
    pub back: &'a R,
    pub model: &'a SplitDecoder<F, R>,
}

impl<F: Backend, R: Backend> SplitDecoder<F, R> {
    /// This model bound to the backends it was loaded onto.
    pub fn on<'a>(&'a self, front: &'a F, back: &'a R) -> SplitDecoderOn<'a, F, R> {
        SplitDecoderOn {
            front,
            back,
            model: self,
        }
    }
}

impl<F: Backend, R: Backend> CausalLm for SplitDecoderOn<'_, F, R> {
    type Cache = SplitKvCache<F, R>;
    type Hidden = R::Tensor;

    fn config(&self) -> &DecoderConfig {
        &self.model.config
    }

    fn new_cache(&self, capacity: usize) -> Result<SplitKvCache<F, R>, ModelError> {
        self.model.new_cache(self.front, self.back, capacity)
    }

    fn forward_last(
        &self,
        ids: &[u32],
        cache: &mut SplitKvCache<F, R>,
    ) -> Result<R::Tensor, ModelError> {
        check_not_empty(ids)?;
        let h = self.model.forward(self.front, self.back, ids, cache)?;
        last_row(self.back, h)
    }

    fn logits(&self, hidden: &R::Tensor) -> Result<Vec<f32>, ModelError> {
        let b = self.back;
        Ok(b.to_f32(&self.model.logits(b, hidden)?)?)
    }
}
