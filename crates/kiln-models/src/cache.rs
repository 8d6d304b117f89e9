use std::ops::Range;

use kiln_backend::{Backend, KvDtype, KvPages};
use kiln_core::config::{window_start, DecoderConfig};

use crate::ModelError;

/// How a cache stores the layers of sliding-window attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowedLayers {
    /// Only the rows a layer's window can still see (a ring; see [`KvCache`]). Outputs are
    /// bit-identical to [`WindowedLayers::Full`]'s.
    #[default]
    Ring,
    /// Every position, like a global layer (for comparisons).
    Full,
}

/// Rows per block of a windowed layer's ring in a [`KvCache`].
pub const RING_BLOCK: usize = 32;

/// A contiguous KV cache for one sequence: per layer, `capacity` rows of keys and values; row
/// `j` holds position `j`.
///
/// Invariant: rows `0..len` are filled; `Decoder::forward` writes rows `len..len + n` and then
/// advances `len`. The engine's paged cache (several sequences, shared prefixes) replaces this
/// for serving; this one serves single-sequence generation, scoring and perplexity.
///
/// **Windowed layers** (sliding-window attention of `window` positions) keep a ring instead
/// (unless built with [`WindowedLayers::Full`]): `ring_blocks` blocks of [`RING_BLOCK`] rows,
/// position `j` in row `j % RING_BLOCK` of block `(j / RING_BLOCK) % ring_blocks`, which the
/// attention ops read through a block table (`ring_table`, one entry per block of the capacity),
/// so they compute exactly what they compute over the full rows. A pass of `n` positions from
/// `len` reads positions `len + 1 - window .. len + n`, `window - 1 + n` consecutive positions,
/// and position `j` sits in ring row `j mod ring_rows`: so the ring holds all of them (and the
/// rows the pass writes overwrite none) when it has `ceil((window - 1 + n) / RING_BLOCK)`
/// blocks. It grows (keeping the rows still in the window) before a pass that needs more. So a
/// windowed layer holds about `window` plus the longest pass's rows, whatever the context;
/// positions before `kept_from()` are gone.
///
/// A cache holds a contiguous range of the model's layers (all of them, except for the part of a
/// [`crate::SplitDecoder`] on one backend): `k[j]` and `v[j]` belong to layer `layers.start + j`.
pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Kv>, // per layer: (rows, n_kv_heads * head_dim)
    pub(crate) v: Vec<B::Kv>, // per layer: (rows, n_kv_heads * head_dim_v)
    layers: Range<usize>,
    len: usize,
    capacity: usize,
    /// Per local layer: its window when it keeps a ring.
    windows: Vec<Option<usize>>,
    /// Blocks of every ring (0 when no layer keeps one).
    ring_blocks: usize,
    /// Logical block `t` → ring block `t % ring_blocks`, for every block of the capacity.
    ring_table: Vec<u32>,
}

/// Per layer of `layers`, a `(rows, kv_dim)` tensor of keys and a `(rows, v_dim)` one of values;
/// `rows(layer)` says how many rows.
#[allow(clippy::type_complexity)]
fn kv_pools<B: Backend>(
    backend: &B,
    config: &DecoderConfig,
    layers: &Range<usize>,
    rows: impl Fn(usize) -> usize,
) -> Result<(Vec<B::Kv>, Vec<B::Kv>), ModelError> {
    check_layer_range(config, layers)?;
    let dtype = backend.kv_dtype();
    for hd in [config.head_dim, config.head_dim_v] {
        dtype.check_whole_blocks("a KV cache for the model", "heads", hd)?;
    }
    let mut k = Vec::with_capacity(layers.len());
    let mut v = Vec::with_capacity(layers.len());
    for layer in layers.clone() {
        k.push(backend.kv_zeros(rows(layer), config.kv_dim())?);
        v.push(backend.kv_zeros(rows(layer), config.v_dim())?);
    }
    Ok((k, v))
}

fn check_layer_range(config: &DecoderConfig, layers: &Range<usize>) -> Result<(), ModelError> {
    if layers.start > layers.end || layers.end > config.n_layers {
        return Err(ModelError::LayerRange {
            start: layers.start,
            end: layers.end,
            n_layers: config.n_layers,
        });
    }
    Ok(())
}

/// The sliding window of model layer `layer`, if it has one.
fn layer_window(config: &DecoderConfig, layer: usize) -> Option<usize> {
    config.layer_attention.get(layer).and_then(|a| a.window())
}

/// Rows a windowed layer of a [`KvCache`] of `capacity` positions holds when its longest pass
/// is `longest_pass` positions (a global layer holds `capacity`).
pub fn ring_rows(window: usize, longest_pass: usize, capacity: usize) -> usize {
    ring_blocks(window, longest_pass.max(1), capacity) * RING_BLOCK
}

/// Ring blocks that a pass of `n` positions needs under a window of `window` (see [`KvCache`]),
/// at most the blocks of the whole `capacity`.
fn ring_blocks(window: usize, n: usize, capacity: usize) -> usize {
    (window.saturating_sub(1) + n)
        .div_ceil(RING_BLOCK)
        .min(capacity.div_ceil(RING_BLOCK))
}

/// A ring's block table as pages.
fn ring_pages(table: &[u32]) -> KvPages<'_> {
    KvPages {
        table,
        block_size: RING_BLOCK,
    }
}

/// Bytes of one position's keys and values in one layer, stored as `dtype`.
pub fn kv_row_bytes(config: &DecoderConfig, dtype: KvDtype) -> usize {
    dtype.row_bytes(config.kv_dim()) + dtype.row_bytes(config.v_dim())
}

impl<B: Backend> KvCache<B> {
    /// A cache of every layer of the model (windowed layers in rings).
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
        Self::with_layout(backend, config, layers, capacity, WindowedLayers::Ring)
    }

    /// [`KvCache::for_layers`], storing windowed layers as `windowed` says.
    pub fn with_layout(
        backend: &B,
        config: &DecoderConfig,
        layers: Range<usize>,
        capacity: usize,
        windowed: WindowedLayers,
    ) -> Result<Self, ModelError> {
        check_layer_range(config, &layers)?;
        let windows: Vec<Option<usize>> = layers
            .clone()
            .map(|l| layer_window(config, l).filter(|_| windowed == WindowedLayers::Ring))
            .collect();
        // A ring for one-position passes to start with; the first longer pass grows it.
        let ring_blocks = windows
            .iter()
            .flatten()
            .map(|&w| ring_blocks(w, 1, capacity))
            .max()
            .unwrap_or(0);
        let local = |l: usize| l - layers.start;
        let (k, v) = kv_pools(backend, config, &layers, |l| match windows[local(l)] {
            Some(_) => ring_blocks * RING_BLOCK,
            None => capacity,
        })?;
        let mut cache = KvCache {
            k,
            v,
            layers,
            len: 0,
            capacity,
            windows,
            ring_blocks,
            ring_table: Vec::new(),
        };
        cache.ring_table = cache.make_ring_table(ring_blocks);
        Ok(cache)
    }

    fn make_ring_table(&self, ring_blocks: usize) -> Vec<u32> {
        if ring_blocks == 0 {
            return Vec::new();
        }
        (0..self.capacity.div_ceil(RING_BLOCK))
            .map(|t| (t % ring_blocks) as u32)
            .collect()
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

    /// Rows of keys (and of values) each layer holds now: the capacity, or a ring's rows.
    pub fn layer_rows(&self) -> Vec<usize> {
        self.windows
            .iter()
            .map(|w| match w {
                Some(_) => self.ring_blocks * RING_BLOCK,
                None => self.capacity,
            })
            .collect()
    }

    /// The first position whose keys and values every layer still holds (0 without rings).
    pub fn kept_from(&self) -> usize {
        if self.ring_blocks == 0 {
            return 0;
        }
        self.len.saturating_sub(self.ring_blocks * RING_BLOCK)
    }

    /// Forget everything (the buffers are reused).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forget positions `len..` (to re-run from an earlier point). Refused, changing nothing,
    /// when a windowed layer's ring no longer holds what a pass from `len` would read.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if len >= self.len {
            return Ok(());
        }
        let kept = self.kept_from();
        if let Some(w) = self.windows.iter().flatten().max() {
            let needs = window_start(len, *w);
            if len > 0 && needs < kept {
                return Err(ModelError::WindowOverwritten {
                    len,
                    needs,
                    kept_from: kept,
                });
            }
        }
        self.len = len;
        Ok(())
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

    /// The ring pages of local layer `il`, if it keeps a ring.
    pub(crate) fn ring_pages(&self, il: usize) -> Option<KvPages<'_>> {
        self.windows[il].map(|_| ring_pages(&self.ring_table))
    }

    /// Writes the keys `k` and values `v` of positions `pos0..` into local layer `il`.
    pub(crate) fn store(
        &mut self,
        b: &B,
        il: usize,
        pos0: usize,
        k: &B::Tensor,
        v: &B::Tensor,
    ) -> Result<(), ModelError> {
        if self.windows[il].is_some() {
            let pages = ring_pages(&self.ring_table);
            b.write_paged_rows(&mut self.k[il], &pages, pos0, k)?;
            b.write_paged_rows(&mut self.v[il], &pages, pos0, v)?;
        } else {
            b.write_kv_rows(&mut self.k[il], pos0, k)?;
            b.write_kv_rows(&mut self.v[il], pos0, v)?;
        }
        Ok(())
    }

    /// Grows the rings (if any) so that a pass of `n` positions from `len` finds every row it
    /// reads: new buffers, with the rows the pass's window still sees copied over.
    pub(crate) fn make_room(&mut self, b: &B, n: usize) -> Result<(), ModelError> {
        let Some(&window) = self.windows.iter().flatten().max() else {
            return Ok(());
        };
        let want = ring_blocks(window, n, self.capacity);
        if want <= self.ring_blocks {
            return Ok(());
        }
        let new_table = self.make_ring_table(want);
        let keep = window_start(self.len, window)..self.len;
        let (old_pages, new_pages) = (ring_pages(&self.ring_table), ring_pages(&new_table));
        let rows = want * RING_BLOCK;
        let mut grown = Vec::new();
        for (il, w) in self.windows.iter().enumerate() {
            if w.is_none() {
                continue;
            }
            let moved = |old: &B::Kv| -> Result<B::Kv, ModelError> {
                let (old_rows, cols) = b.kv_shape(old);
                let mut new = b.kv_zeros(rows, cols)?;
                if !keep.is_empty() {
                    let all = b.kv_to_f32(old)?;
                    let mut live = Vec::with_capacity(keep.len() * cols);
                    for j in keep.clone() {
                        let r = old_pages.physical_row(j, old_rows).ok_or_else(|| {
                            ModelError::Batch(format!("ring row {j} outside the ring"))
                        })?;
                        live.extend_from_slice(&all[r * cols..(r + 1) * cols]);
                    }
                    let t = b.tensor_from_f32(&live, keep.len(), cols)?;
                    b.write_paged_rows(&mut new, &new_pages, keep.start, &t)?;
                }
                Ok(new)
            };
            grown.push((il, moved(&self.k[il])?, moved(&self.v[il])?));
        }
        for (il, k, v) in grown {
            self.k[il] = k;
            self.v[il] = v;
        }
        self.ring_blocks = want;
        self.ring_table = new_table;
        Ok(())
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

/// The sizes of a [`PagedKvCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedLayout {
    /// Blocks of the global layers' pools (and of every layer's, without `window_blocks`).
    pub n_blocks: usize,
    /// Blocks of the windowed layers' own pools, addressed by [`PagedSeq::window_table`];
    /// `None`: windowed layers have pools of `n_blocks` like the others, addressed by
    /// [`PagedSeq::table`].
    pub window_blocks: Option<usize>,
    pub block_size: usize,
    /// The most positions one sequence may hold.
    pub max_positions: usize,
}

/// A paged KV cache shared by many sequences: per layer, one pool of `n_blocks * block_size`
/// rows of keys and one of values. Which blocks a sequence owns is the engine's business (its
/// block manager keeps a table per sequence); a forward pass gets each sequence's view as a
/// [`PagedSeq`], and row `j` of a sequence lives in row `j % block_size` of block
/// `table[j / block_size]`.
///
/// **Windowed layers** may have pools of their own ([`PagedLayout::window_blocks`]), smaller
/// than the global layers': a sequence then has a second table for them
/// ([`PagedSeq::window_table`]), which need map only the blocks its window still sees (the
/// engine recycles the others), since attention reads nothing below a query's window.
///
/// Invariant: the pools of every layer have `n_blocks * block_size` rows (windowed layers with
/// their own pools: `window_blocks * block_size`); a forward pass writes only the rows its
/// sequences' tables map for their new positions, and reads only rows their tables map below
/// their lengths, inside each query's window (the backend checks those entries against the
/// pool).
///
/// Like [`KvCache`], it holds a contiguous range of the model's layers: the pools `k[j]`, `v[j]`
/// belong to layer `layers.start + j`. Two paged caches of the same layout, for complementary
/// layer ranges, serve a [`crate::SplitDecoder`] under one set of block tables.
pub struct PagedKvCache<B: Backend> {
    pub(crate) k: Vec<B::Kv>, // per layer: (blocks * block_size, n_kv_heads * head_dim)
    pub(crate) v: Vec<B::Kv>, // per layer: (blocks * block_size, n_kv_heads * head_dim_v)
    layers: Range<usize>,
    layout: PagedLayout,
    /// Per local layer: whether it reads the window table (a windowed layer with its own pool).
    windowed: Vec<bool>,
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
        let layout = PagedLayout {
            n_blocks,
            window_blocks: None,
            block_size,
            max_positions,
        };
        Self::with_layout(backend, config, 0..config.n_layers, &layout)
    }

    /// The pools of layers `layers` of the model (a range of `0..config.n_layers`), sized as
    /// `layout` says.
    pub fn with_layout(
        backend: &B,
        config: &DecoderConfig,
        layers: Range<usize>,
        layout: &PagedLayout,
    ) -> Result<Self, ModelError> {
        let rows = |blocks: usize| {
            blocks
                .checked_mul(layout.block_size)
                .filter(|_| layout.block_size > 0)
                .ok_or_else(|| {
                    ModelError::Batch(format!(
                        "a paged KV cache of {blocks} blocks of {} positions",
                        layout.block_size
                    ))
                })
        };
        let global_rows = rows(layout.n_blocks)?;
        let window_rows = rows(layout.window_blocks.unwrap_or(0))?;
        check_layer_range(config, &layers)?;
        let windowed: Vec<bool> = layers
            .clone()
            .map(|l| layout.window_blocks.is_some() && layer_window(config, l).is_some())
            .collect();
        let first = layers.start;
        let (k, v) = kv_pools(backend, config, &layers, |l| {
            if windowed[l - first] {
                window_rows
            } else {
                global_rows
            }
        })?;
        Ok(PagedKvCache {
            k,
            v,
            layers,
            layout: *layout,
            windowed,
        })
    }

    /// The model layers whose keys and values this cache holds.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn layout(&self) -> &PagedLayout {
        &self.layout
    }

    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.layout.n_blocks
    }

    /// The most positions one sequence may hold.
    pub fn max_positions(&self) -> usize {
        self.layout.max_positions
    }

    /// The pages of local layer `il` for sequence `seq`: its window table when the layer has a
    /// pool of its own, else its table.
    pub(crate) fn pages<'s>(&self, il: usize, seq: &PagedSeq<'s>) -> KvPages<'s> {
        KvPages {
            table: if self.windowed[il] {
                seq.window_table
            } else {
                seq.table
            },
            block_size: self.layout.block_size,
        }
    }
}

/// One sequence's part of a [`PagedKvCache`] in a forward pass: its block table and how many
/// positions are already filled (the new tokens go at `len..`). The table must cover the new
/// positions too; the caller (the engine's block manager) allocates before the pass and counts
/// the new tokens after it. `window_table` addresses the windowed layers' own pools (when the
/// cache has them): it must map the new positions and every position the pass's windows see;
/// its other entries are not read (the engine sets them to [`PagedSeq::UNMAPPED`]).
#[derive(Clone, Copy, Debug)]
pub struct PagedSeq<'a> {
    pub table: &'a [u32],
    pub window_table: &'a [u32],
    pub len: usize,
}

impl<'a> PagedSeq<'a> {
    /// A window table's entry for a block it holds no longer (or not yet).
    pub const UNMAPPED: u32 = u32::MAX;

    /// A sequence of a cache without windowed pools (one table for every layer).
    pub fn new(table: &'a [u32], len: usize) -> Self {
        PagedSeq {
            table,
            window_table: &[],
            len,
        }
    }
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

    /// Forget positions `len..` (to re-run from an earlier point); refused, changing nothing,
    /// as [`KvCache::truncate`] refuses it.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        let (front_len, back_len) = (self.front.len, self.back.len);
        self.front.truncate(len)?;
        if let Err(e) = self.back.truncate(len) {
            self.front.len = front_len;
            self.back.len = back_len;
            return Err(e);
        }
        Ok(())
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
    /// [`PagedKvCache::with_layout`] for a model split after layer `front_layers`.
    pub fn new(
        front: &F,
        back: &R,
        config: &DecoderConfig,
        front_layers: usize,
        layout: &PagedLayout,
    ) -> Result<Self, ModelError> {
        let (front_range, back_range) = split_layers(config, front_layers)?;
        Ok(SplitPagedKvCache {
            front: PagedKvCache::with_layout(front, config, front_range, layout)?,
            back: PagedKvCache::with_layout(back, config, back_range, layout)?,
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
