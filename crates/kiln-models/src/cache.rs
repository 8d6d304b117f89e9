use std::ops::Range;

use kiln_backend::{Backend, KvDtype};
use kiln_core::config::DecoderConfig;

use crate::ModelError;

/// A contiguous KV cache for one sequence: per layer, `capacity` rows of keys and values; row
/// `j` holds position `j`.
///
/// Invariant: rows `0..len` are filled; `Decoder::forward` writes rows `len..len + n` and then
/// advances `len`. The engine's paged cache (several sequences, shared prefixes) replaces this
/// for serving; this one serves single-sequence generation, scoring and perplexity.
///
/// A cache holds a contiguous range of the model's layers (all of them, except for the part of a
/// [`crate::SplitDecoder`] on one backend): `k[j]` and `v[j]` belong to layer `layers.start + j`.
pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Kv>, // per layer: (capacity, n_kv_heads * head_dim)
    pub(crate) v: Vec<B::Kv>, // per layer: (capacity, n_kv_heads * head_dim_v)
    layers: Range<usize>,
    len: usize,
    capacity: usize,
}

/// Per layer of `layers`, a `(rows, kv_dim)` tensor of keys and a `(rows, v_dim)` one of values.
#[allow(clippy::type_complexity)]
fn kv_pools<B: Backend>(
    backend: &B,
    config: &DecoderConfig,
    layers: &Range<usize>,
    rows: usize,
) -> Result<(Vec<B::Kv>, Vec<B::Kv>), ModelError> {
    if layers.start > layers.end || layers.end > config.n_layers {
        return Err(ModelError::LayerRange {
            start: layers.start,
            end: layers.end,
            n_layers: config.n_layers,
        });
    }
    let mut k = Vec::with_capacity(layers.len());
    let mut v = Vec::with_capacity(layers.len());
    for _ in layers.clone() {
        k.push(backend.kv_zeros(rows, config.kv_dim())?);
        v.push(backend.kv_zeros(rows, config.v_dim())?);
    }
    Ok((k, v))
}

impl<B: Backend> KvCache<B> {
    /// A cache of every layer of the model.
    pub fn new(backend: &B, config: &DecoderConfig, capacity: usize) -> Result<Self, ModelError> {
        Self::for_layers(backend, config, 0..config.n_layers, capacity)
    }

    /// A cache of layers `layers` of the model only (a range of `0..config.n_layers`).
    pub fn for_layers(
        backend: &B,
        config: &DecoderConfig,
        layers: Range<usize>,
        capacity: usize,
    ) -> Result<Self, ModelError> {
        let (k, v) = kv_pools(backend, config, &layers, capacity)?;
        Ok(KvCache {
            k,
            v,
            layers,
            len: 0,
            capacity,
        })
    }

    /// The model layers whose keys and values this cache holds.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
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

/// A paged KV cache shared by many sequences: per layer, one pool of `n_blocks * block_size`
/// rows of keys and one of values. Which blocks a sequence owns is the engine's business (its
/// block manager keeps a table per sequence); a forward pass gets each sequence's view as a
/// [`PagedSeq`], and row `j` of a sequence lives in row `j % block_size` of block
/// `table[j / block_size]`.
///
/// Invariant: the pools of every layer have `n_blocks * block_size` rows; a forward pass writes
/// only the rows its sequences' tables map for their new positions, and reads only rows their
/// tables map below their lengths (the backend checks every table against the pool).
///
/// Like [`KvCache`], it holds a contiguous range of the model's layers: the pools `k[j]`, `v[j]`
/// belong to layer `layers.start + j`. Two paged caches of the same block size and count, for
/// complementary layer ranges, serve a [`crate::SplitDecoder`] under one set of block tables.
pub struct PagedKvCache<B: Backend> {
    pub(crate) k: Vec<B::Kv>, // per layer: (n_blocks * block_size, n_kv_heads * head_dim)
    pub(crate) v: Vec<B::Kv>, // per layer: (n_blocks * block_size, n_kv_heads * head_dim_v)
    layers: Range<usize>,
    block_size: usize,
    n_blocks: usize,
    max_positions: usize,
}

impl<B: Backend> PagedKvCache<B> {
    /// Pools of `n_blocks` blocks of `block_size` positions for every layer; a sequence may hold
    /// up to `max_positions` positions (the context length: long-context RoPE variants pick
    /// their factors from it, as they do from a contiguous cache's capacity).
    pub fn new(
        backend: &B,
        config: &DecoderConfig,
        n_blocks: usize,
        block_size: usize,
        max_positions: usize,
    ) -> Result<Self, ModelError> {
        Self::for_layers(
            backend,
            config,
            0..config.n_layers,
            n_blocks,
            block_size,
            max_positions,
        )
    }

    /// [`PagedKvCache::new`] for layers `layers` of the model only (a range of
    /// `0..config.n_layers`).
    pub fn for_layers(
        backend: &B,
        config: &DecoderConfig,
        layers: Range<usize>,
        n_blocks: usize,
        block_size: usize,
        max_positions: usize,
    ) -> Result<Self, ModelError> {
        let rows = n_blocks.checked_mul(block_size).filter(|_| block_size > 0);
        let Some(rows) = rows else {
            return Err(ModelError::Batch(format!(
                "a paged KV cache of {n_blocks} blocks of {block_size} positions"
            )));
        };
        let (k, v) = kv_pools(backend, config, &layers, rows)?;
        Ok(PagedKvCache {
            k,
            v,
            layers,
            block_size,
            n_blocks,
            max_positions,
        })
    }

    /// The model layers whose keys and values this cache holds.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// The most positions one sequence may hold.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Bytes of KV memory per block (all layers, keys and values, stored as `dtype`).
    pub fn bytes_per_block(config: &DecoderConfig, block_size: usize, dtype: KvDtype) -> usize {
        config.n_layers * block_size * (config.kv_dim() + config.v_dim()) * dtype.bytes()
    }
}

/// One sequence's part of a [`PagedKvCache`] in a forward pass: its block table and how many
/// positions are already filled (the new tokens go at `len..`). The table must cover the new
/// positions too; the caller (the engine's block manager) allocates before the pass and counts
/// the new tokens after it.
#[derive(Clone, Copy, Debug)]
pub struct PagedSeq<'a> {
    pub table: &'a [u32],
    pub len: usize,
}

/// The layers of each side of a split after layer `front_layers`: `0..front_layers` and
/// `front_layers..n_layers`, or [`ModelError::SplitPoint`] past the model's layer count.
pub(crate) fn split_layers(
    config: &DecoderConfig,
    front_layers: usize,
) -> Result<(Range<usize>, Range<usize>), ModelError> {
    let n_layers = config.n_layers;
    if front_layers > n_layers {
        return Err(ModelError::SplitPoint {
            front_layers,
            n_layers,
        });
    }
    Ok((0..front_layers, front_layers..n_layers))
}

/// The contiguous KV cache of a [`crate::SplitDecoder`]: the front backend's layers
/// `0..front_layers` in one [`KvCache`], the back backend's `front_layers..n_layers` in another.
///
/// Invariant: both parts have the same capacity and length (a forward pass advances both, and
/// only once both parts have run).
pub struct SplitKvCache<F: Backend, R: Backend> {
    pub(crate) front: KvCache<F>,
    pub(crate) back: KvCache<R>,
}

impl<F: Backend, R: Backend> SplitKvCache<F, R> {
    /// A cache of `capacity` positions for a model split after layer `front_layers`.
    pub fn new(
        front: &F,
        back: &R,
        config: &DecoderConfig,
        front_layers: usize,
        capacity: usize,
    ) -> Result<Self, ModelError> {
        let (front_range, back_range) = split_layers(config, front_layers)?;
        Ok(SplitKvCache {
            front: KvCache::for_layers(front, config, front_range, capacity)?,
            back: KvCache::for_layers(back, config, back_range, capacity)?,
        })
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.front.len()
    }

    pub fn is_empty(&self) -> bool {
        self.front.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.front.capacity()
    }

    /// Forget everything (the buffers are reused).
    pub fn clear(&mut self) {
        self.front.clear();
        self.back.clear();
    }

    /// Forget positions `len..` (to re-run from an earlier point).
    pub fn truncate(&mut self, len: usize) {
        self.front.truncate(len);
        self.back.truncate(len);
    }

    /// The front backend's part (layers `0..front_layers`).
    pub fn front(&self) -> &KvCache<F> {
        &self.front
    }

    /// The back backend's part (layers `front_layers..n_layers`).
    pub fn back(&self) -> &KvCache<R> {
        &self.back
    }
}

/// The paged KV cache of a [`crate::SplitDecoder`]: two [`PagedKvCache`]s, the front backend's
/// layers `0..front_layers` and the back backend's `front_layers..n_layers`, with the same block
/// size, block count and context, so that one block table per sequence (the engine's) addresses
/// both: a sequence's block `t` is block `t` of every layer on either backend.
pub struct SplitPagedKvCache<F: Backend, R: Backend> {
    pub(crate) front: PagedKvCache<F>,
    pub(crate) back: PagedKvCache<R>,
}

impl<F: Backend, R: Backend> SplitPagedKvCache<F, R> {
    /// [`PagedKvCache::new`] for a model split after layer `front_layers`.
    pub fn new(
        front: &F,
        back: &R,
        config: &DecoderConfig,
        front_layers: usize,
        n_blocks: usize,
        block_size: usize,
        max_positions: usize,
    ) -> Result<Self, ModelError> {
        let (front_range, back_range) = split_layers(config, front_layers)?;
        let (blocks, size, max) = (n_blocks, block_size, max_positions);
        Ok(SplitPagedKvCache {
            front: PagedKvCache::for_layers(front, config, front_range, blocks, size, max)?,
            back: PagedKvCache::for_layers(back, config, back_range, blocks, size, max)?,
        })
    }

    pub fn block_size(&self) -> usize {
        self.front.block_size()
    }

    pub fn n_blocks(&self) -> usize {
        self.front.n_blocks()
    }

    /// The most positions one sequence may hold.
    pub fn max_positions(&self) -> usize {
        self.front.max_positions()
    }

    /// The front backend's part (layers `0..front_layers`).
    pub fn front(&self) -> &PagedKvCache<F> {
        &self.front
    }

    /// The back backend's part (layers `front_layers..n_layers`).
    pub fn back(&self) -> &PagedKvCache<R> {
        &self.back
    }
}
