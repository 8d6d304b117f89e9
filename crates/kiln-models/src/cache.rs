use kiln_backend::Backend;
use kiln_core::config::DecoderConfig;

use crate::ModelError;

/// A contiguous KV cache for one sequence: per layer, `capacity` rows of keys and values; row
/// `j` holds position `j`.
///
/// Invariant: rows `0..len` are filled; `Decoder::forward` writes rows `len..len + n` and then
/// advances `len`. The engine's paged cache (several sequences, shared prefixes) replaces this
/// for serving; this one serves single-sequence generation, scoring and perplexity.
pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Tensor>, // per layer: (capacity, n_kv_heads * head_dim)
    pub(crate) v: Vec<B::Tensor>, // per layer: (capacity, n_kv_heads * head_dim_v)
    len: usize,
    capacity: usize,
}

impl<B: Backend> KvCache<B> {
    pub fn new(backend: &B, config: &DecoderConfig, capacity: usize) -> Result<Self, ModelError> {
        let mut k = Vec::with_capacity(config.n_layers);
        let mut v = Vec::with_capacity(config.n_layers);
        for _ in 0..config.n_layers {
            k.push(backend.zeros(capacity, config.kv_dim())?);
            v.push(backend.zeros(capacity, config.v_dim())?);
        }
        Ok(KvCache {
            k,
            v,
            len: 0,
            capacity,
        })
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forget everything (the buffers are reused).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forget positions `len..` (to re-run from an earlier point).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub(crate) fn check_room(&self, n: usize) -> Result<(), ModelError> {
        let needed = self.len + n;
        if needed > self.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
