//! The operands and shape of one attention call ([`Job`], [`Layout`]), the query vectors it
//! groups into blocks ([`Query`], [`Block`]), and a block's online-softmax [`State`].

use kiln_backend::{KvDtype, KvPages};

use crate::kernels::BLOCK;

/// Flops below which attention runs on the calling thread: handing it to the team costs more.
pub(super) const PARALLEL_MIN_FLOPS: usize = 1 << 20;

/// The operands and shape of one call, over a cache of `E`.
pub(super) struct Job<'a, E> {
    /// `[rows, q_cols]`, row `i` at position `q_pos + i`.
    pub(super) q: &'a [f32],
    /// `[capacity, kv_cols]` each; row `j` at position `j`.
    pub(super) k: &'a [E],
    pub(super) v: &'a [E],
    pub(super) layout: Layout<'a>,
}

// (Derived `Clone`/`Copy` would ask the same of `E`, which references do not need.)
impl<E> Clone for Job<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Job<'_, E> {}

impl<'a, E> std::ops::Deref for Job<'a, E> {
    type Target = Layout<'a>;
    fn deref(&self) -> &Layout<'a> {
        &self.layout
    }
}

/// The shape of one call: where the query rows sit, the heads, and the softmax's parameters.
#[derive(Clone, Copy)]
pub(super) struct Layout<'a> {
    pub(super) q_pos: usize,
    pub(super) hd: usize,
    /// Query heads per KV head.
    pub(super) group: usize,
    pub(super) q_cols: usize,
    pub(super) kv_cols: usize,
    pub(super) scale: f32,
    pub(super) window: Option<usize>,
    pub(super) softcap: Option<f32>,
    /// The block table of a paged cache (checked to map every row read); `None`: contiguous.
    pub(super) pages: Option<KvPages<'a>>,
    /// A cache of Q8_0/Q4_0 blocks: its rows, read through [`Job::dequantize_head`] (the job's
    /// own `k` and `v` are then empty, its element type f32).
    pub(super) blocks: Option<BlockRows<'a>>,
}

/// The keys and values of a block cache, as bytes: `row_bytes` a row.
#[derive(Clone, Copy)]
pub(super) struct BlockRows<'a> {
    pub(super) ty: KvDtype,
    pub(super) k: &'a [u8],
    pub(super) v: &'a [u8],
    pub(super) row_bytes: usize,
}

impl<'a, E> Job<'a, E> {
    pub(super) fn new(q: &'a [f32], k: &'a [E], v: &'a [E], layout: Layout<'a>) -> Self {
        Job { q, k, v, layout }
    }

    /// The keys `[lo, hi)` query row `i` sees.
    pub(super) fn visible(&self, i: usize) -> (usize, usize) {
        let hi = self.q_pos + i + 1;
        (self.window.map_or(0, |w| hi.saturating_sub(w)), hi)
    }

    /// The query vectors of KV head `kvh` for rows `[r0, r0 + rows)`, row-major (row, then head
    /// of the group), `BLOCK` per block.
    pub(super) fn blocks(&self, kvh: usize, r0: usize, rows: usize) -> Vec<Block<'_>> {
        let all: Vec<Query<'_>> = (0..rows * self.group)
            .map(|v| {
                let (i, h) = (r0 + v / self.group, kvh * self.group + v % self.group);
                let at = i * self.q_cols + h * self.hd;
                let (lo, hi) = self.visible(i);
                Query {
                    q: &self.q[at..at + self.hd],
                    row: i,
                    col: h * self.hd,
                    lo,
                    hi,
                }
            })
            .collect();
        all.chunks(BLOCK)
            .map(|c| Block {
                kvh,
                queries: c.to_vec(),
                lo: c.iter().map(|x| x.lo).min().unwrap_or(0),
                hi: c.iter().map(|x| x.hi).max().unwrap_or(0),
            })
            .collect()
    }

    /// The physical row of logical row `j` (position `j`).
    #[inline(always)]
    fn physical(&self, j: usize) -> usize {
        match &self.pages {
            None => j,
            Some(p) => p.table[j / p.block_size] as usize * p.block_size + j % p.block_size,
        }
    }

    /// Logical row `j` (position `j`) of a cache, every KV head's.
    #[inline(always)]
    pub(super) fn row<'c>(&self, cache: &'c [E], j: usize) -> &'c [E] {
        let at = self.physical(j) * self.kv_cols;
        &cache[at..at + self.kv_cols]
    }

    /// Logical row `j` (position `j`) of head `kvh` of a cache.
    #[inline(always)]
    pub(super) fn head_row<'c>(&self, cache: &'c [E], kvh: usize, j: usize) -> &'c [E] {
        let at = self.physical(j) * self.kv_cols + kvh * self.hd;
        &cache[at..at + self.hd]
    }

    /// Logical row `j` of head `kvh` of a block cache's keys (`values` false) or values,
    /// dequantized into `out` (`hd` values). Heads hold whole blocks (checked by the caller).
    #[inline(always)]
    pub(super) fn dequantize_head(
        &self,
        b: &BlockRows<'_>,
        values: bool,
        kvh: usize,
        j: usize,
        out: &mut [f32],
    ) {
        let head_bytes = b.ty.row_bytes(self.hd);
        let at = self.physical(j) * b.row_bytes + kvh * head_bytes;
        let cache = if values { b.v } else { b.k };
        crate::kv::dequantize_row(b.ty, &cache[at..at + head_bytes], out);
    }
}

/// One query vector: its values, where its output goes, the keys `[lo, hi)` it sees.
#[derive(Clone, Copy)]
pub(super) struct Query<'a> {
    pub(super) q: &'a [f32],
    pub(super) row: usize,
    pub(super) col: usize,
    pub(super) lo: usize,
    pub(super) hi: usize,
}

/// At most `BLOCK` query vectors of KV head `kvh`, and the union `[lo, hi)` of their keys.
pub(super) struct Block<'a> {
    pub(super) kvh: usize,
    pub(super) queries: Vec<Query<'a>>,
    pub(super) lo: usize,
    pub(super) hi: usize,
}

/// The online-softmax state of a block: per vector the running maximum of its scores, the sum
/// of `e^(score − max)`, and `Σ e^(score − max) · v` (vector `m` at `m · hd`).
pub(super) struct State {
    pub(super) max: [f32; BLOCK],
    pub(super) sum: [f32; BLOCK],
    pub(super) acc: Vec<f32>,
}

impl State {
    /// A fresh state for up to `vectors` vectors of `hd`.
    pub(super) fn new(vectors: usize, hd: usize) -> State {
        State {
            max: [f32::NEG_INFINITY; BLOCK],
            sum: [0.0; BLOCK],
            acc: vec![0.0; vectors * hd],
        }
    }
}
