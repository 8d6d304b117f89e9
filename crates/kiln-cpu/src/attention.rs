//! Causal attention over a KV cache: tiled, online-softmax ("flash") attention. The cache is
//! contiguous (row `j` at position `j`) or paged (`paged_attention`: row `j` where the block
//! table maps it); the kernels see rows only through `Job::head_row`, so both give the same bits.
//! Its rows hold f32 or f16 values (`crate::kv`); one generic kernel reads both, widening each
//! element exactly as it loads it (F16C's `vcvtph2ps` eight at a time, `half`'s conversion in the
//! portable code), so an f16 cache computes the same operations on the values it holds.
//!
//! The query vectors that share a KV head (the heads of a GQA group, for one or more query rows)
//! are taken [`BLOCK`] at a time; a block walks its keys [`TILE`] at a time. Per tile it computes
//! the block's scores (a `BLOCK × TILE` product in micro-kernels of 4 vectors × 3 keys, so each
//! key row loaded serves many dot products), masks each vector to the keys it sees (causality
//! and the sliding window differ per row), raises each vector's running maximum, rescales its
//! running sum and accumulator by `e^(old max − new max)` (online softmax), and adds the tile's
//! weighted value rows (micro-kernels of 4 vectors × 16 head dims). Neither the `[n, n_kv]`
//! score matrix nor a full score row is ever built: a block's state is its maxima, sums and
//! `BLOCK × head_dim` accumulators.
//!
//! Work is split one of two ways, both fixed by the shape alone:
//!
//! - **Prefill** (more query rows than one block holds): one task per [`rows_per_task`] query
//!   rows, computing every head of its rows over each vector's whole key range.
//! - **Decode** (the query rows fit one block): one task per (KV head, part of the keys), the
//!   positions cut on a fixed grid of [`PART`] (flash-decoding), so a long cache is read by all
//!   threads at once. Each part keeps its own maxima, sums and unnormalized outputs; the parts
//!   are combined in key order.
//!
//! Invariants:
//!
//! - Every output element is produced by one fixed sequence of operations that depends on the
//!   shape only, never on the thread count or on which thread runs a task: results are
//!   bit-identical across thread counts.
//! - The AVX2+FMA kernels (intrinsics, chosen at run time through `CpuBackend::avx2`) and the
//!   portable code perform the same operations in the same order (fused multiply-adds as
//!   `f32::mul_add`, the same lane reductions), and the rest of the tile loop is one source
//!   compiled both with and without the features: both give identical bits.
//! - Only rows below `n_kv` are read; a vector whose visible keys miss a tile is left untouched
//!   by it (no `−inf − −inf`), and a vector that sees no key at all (a window of 0) gets zeros,
//!   as the empty sum does.

use std::ops::Range;

use kiln_backend::{shape_err, AttentionParams, KvPages, Result};

use crate::kv::{CpuKv, KvData, KvElem};
use crate::math;
use crate::{CpuBackend, CpuTensor};

/// Query vectors processed together against each key tile: each K/V row brought from memory or
/// L3 serves this many of them (8 query rows of Gemma's 4-head groups).
const BLOCK: usize = 32;
/// Keys per tile: a tile's key and value rows (32 KiB at head_dim 256) and the block's scores stay
/// in L1/L2 while the block passes them. A power of two (the fixed summation tree of
/// `softmax_update`).
const TILE: usize = 16;
const _: () = assert!(TILE.is_power_of_two());
/// Key positions per part of a decode split. Parts are cut at multiples of `PART`, so the split
/// depends on `n_kv` (and the window) only.
const PART: usize = 256;
/// Tiles whose K/V rows decode reads in one sequential pass before computing them (see
/// [`attend_keys`]).
const STAGE: usize = 4;
/// Tiles ahead at which decode requests its K/V rows (see [`attend_keys`]).
const AHEAD: usize = 4;
/// Flops below which attention runs on the calling thread: handing it to the team costs more.
const PARALLEL_MIN_FLOPS: usize = 1 << 20;

pub(crate) fn attention(
    cpu: &CpuBackend,
    q: &CpuTensor,
    k_cache: &CpuKv,
    v_cache: &CpuKv,
    q_pos: usize,
    n_kv: usize,
    p: &AttentionParams,
) -> Result<CpuTensor> {
    attention_over(cpu, q, k_cache, v_cache, None, q_pos, n_kv, p)
}

/// [`attention`] over a paged cache: logical row `j` is the row `pages` maps it to in the pools.
/// Every tile reads the same logical rows in the same order as over a contiguous cache, so the
/// results are bit-identical to [`attention`] on a contiguous copy.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention(
    cpu: &CpuBackend,
    q: &CpuTensor,
    k_pool: &CpuKv,
    v_pool: &CpuKv,
    pages: &KvPages<'_>,
    q_pos: usize,
    n_kv: usize,
    p: &AttentionParams,
) -> Result<CpuTensor> {
    let pool_rows = k_pool.rows.min(v_pool.rows);
    pages
        .check(n_kv, pool_rows)
        .map_err(|e| shape_err("paged_attention", e))?;
    attention_over(cpu, q, k_pool, v_pool, Some(*pages), q_pos, n_kv, p)
}

#[allow(clippy::too_many_arguments)]
fn attention_over(
    cpu: &CpuBackend,
    q: &CpuTensor,
    k_cache: &CpuKv,
    v_cache: &CpuKv,
    pages: Option<KvPages<'_>>,
    q_pos: usize,
    n_kv: usize,
    p: &AttentionParams,
) -> Result<CpuTensor> {
    let hd = p.head_dim;
    // Paged: `paged_attention` checked that every logical row below `n_kv` maps into the pools.
    let rows_ok = pages.is_some() || (n_kv <= k_cache.rows && n_kv <= v_cache.rows);
    if p.n_kv_heads == 0
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
        || q.cols != p.n_heads * hd
        || k_cache.cols != p.n_kv_heads * hd
        || v_cache.cols != p.n_kv_heads * hd
        || !rows_ok
        || q_pos + q.rows > n_kv
    {
        return Err(shape_err(
            "attention",
            format!(
                "q [{}, {}] at {q_pos}, caches [{}, {}]/[{}, {}] with {n_kv} filled, {} heads / {} kv heads of {hd}",
                q.rows, q.cols, k_cache.rows, k_cache.cols, v_cache.rows, v_cache.cols, p.n_heads, p.n_kv_heads
            ),
        ));
    }
    let layout = Layout {
        q_pos,
        hd,
        group: p.n_heads / p.n_kv_heads,
        q_cols: q.cols,
        kv_cols: k_cache.cols,
        scale: p.scale,
        window: p.sliding_window,
        softcap: p.softcap,
        pages,
    };
    let data = &q.data;
    match (&k_cache.data, &v_cache.data) {
        (KvData::F32(k), KvData::F32(v)) => Ok(run(cpu, q, Job::new(data, k, v, layout), p)),
        (KvData::F16(k), KvData::F16(v)) => Ok(run(cpu, q, Job::new(data, k, v, layout), p)),
        _ => Err(shape_err(
            "attention",
            format!(
                "keys stored as {}, values as {}",
                k_cache.dtype(),
                v_cache.dtype()
            ),
        )),
    }
}

/// [`attention_over`] once the operands are checked, over a cache of `E`.
fn run<E: KvElem>(
    cpu: &CpuBackend,
    q: &CpuTensor,
    job: Job<'_, E>,
    p: &AttentionParams,
) -> CpuTensor {
    let avx2 = cpu.avx2();
    // Every element is written below: each (row, head) belongs to exactly one block. (Empty:
    // no rows, no heads or empty heads, when `group` may be 0.)
    let mut out = crate::buffers::take(q.rows * q.cols);
    if out.is_empty() {
        return CpuTensor {
            data: out,
            rows: q.rows,
            cols: q.cols,
        };
    }
    let rows = rows_per_task(job.group);
    if cpu.batch_invariant && q.rows > 1 {
        // Each query row alone, exactly as a one-row (decode) call computes it: its result
        // does not depend on the other rows of the call (see `CpuOptions::batch_invariant`).
        let (lo, hi) = (job.visible(0).0, job.visible(q.rows - 1).1);
        let flops = 4 * q.rows * p.n_heads * (hi - lo) * p.head_dim;
        crate::for_each_chunk(
            cpu,
            &mut out,
            q.cols,
            flops >= PARALLEL_MIN_FLOPS,
            |i, row_out| {
                let one = Job {
                    q: &job.q[i * job.q_cols..(i + 1) * job.q_cols],
                    layout: Layout {
                        q_pos: job.q_pos + i,
                        ..job.layout
                    },
                    ..job
                };
                decode(cpu, avx2, &one, p.n_kv_heads, 1, row_out, false);
            },
        );
    } else if q.rows <= rows {
        decode(cpu, avx2, &job, p.n_kv_heads, q.rows, &mut out, true);
    } else {
        let (lo, hi) = (job.visible(0).0, job.visible(q.rows - 1).1);
        let flops = 4 * q.rows * p.n_heads * (hi - lo) * p.head_dim;
        crate::for_each_chunk(
            cpu,
            &mut out,
            rows * q.cols,
            flops >= PARALLEL_MIN_FLOPS,
            |t, chunk| rows_task(avx2, &job, p.n_kv_heads, t * rows, chunk),
        );
    }
    CpuTensor {
        data: out,
        rows: q.rows,
        cols: q.cols,
    }
}

/// Query rows per prefill task: as many as fill one block with their GQA groups (at least one).
fn rows_per_task(group: usize) -> usize {
    (BLOCK / group).max(1)
}

/// The operands and shape of one call, over a cache of `E`.
struct Job<'a, E> {
    /// `[rows, q_cols]`, row `i` at position `q_pos + i`.
    q: &'a [f32],
    /// `[capacity, kv_cols]` each; row `j` at position `j`.
    k: &'a [E],
    v: &'a [E],
    layout: Layout<'a>,
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
struct Layout<'a> {
    q_pos: usize,
    hd: usize,
    /// Query heads per KV head.
    group: usize,
    q_cols: usize,
    kv_cols: usize,
    scale: f32,
    window: Option<usize>,
    softcap: Option<f32>,
    /// The block table of a paged cache (checked to map every row read); `None`: contiguous.
    pages: Option<KvPages<'a>>,
}

impl<'a, E> Job<'a, E> {
    fn new(q: &'a [f32], k: &'a [E], v: &'a [E], layout: Layout<'a>) -> Self {
        Job { q, k, v, layout }
    }

    /// The keys `[lo, hi)` query row `i` sees.
    fn visible(&self, i: usize) -> (usize, usize) {
        let hi = self.q_pos + i + 1;
        (self.window.map_or(0, |w| hi.saturating_sub(w)), hi)
    }

    /// The query vectors of KV head `kvh` for rows `[r0, r0 + rows)`, row-major (row, then head
    /// of the group), `BLOCK` per block.
    fn blocks(&self, kvh: usize, r0: usize, rows: usize) -> Vec<Block<'_>> {
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

    /// Logical row `j` (position `j`) of head `kvh` of a cache.
    #[inline(always)]
    fn head_row<'c>(&self, cache: &'c [E], kvh: usize, j: usize) -> &'c [E] {
        let row = match &self.pages {
            None => j,
            Some(p) => p.table[j / p.block_size] as usize * p.block_size + j % p.block_size,
        };
        let at = row * self.kv_cols + kvh * self.hd;
        &cache[at..at + self.hd]
    }
}

/// One query vector: its values, where its output goes, the keys `[lo, hi)` it sees.
#[derive(Clone, Copy)]
struct Query<'a> {
    q: &'a [f32],
    row: usize,
    col: usize,
    lo: usize,
    hi: usize,
}

/// At most [`BLOCK`] query vectors of KV head `kvh`, and the union `[lo, hi)` of their keys.
struct Block<'a> {
    kvh: usize,
    queries: Vec<Query<'a>>,
    lo: usize,
    hi: usize,
}

/// The online-softmax state of a block: per vector the running maximum of its scores, the sum
/// of `e^(score − max)`, and `Σ e^(score − max) · v` (vector `m` at `m · hd`).
struct State {
    max: [f32; BLOCK],
    sum: [f32; BLOCK],
    acc: Vec<f32>,
}

impl State {
    /// A fresh state for up to `vectors` vectors of `hd`.
    fn new(vectors: usize, hd: usize) -> State {
        State {
            max: [f32::NEG_INFINITY; BLOCK],
            sum: [0.0; BLOCK],
            acc: vec![0.0; vectors * hd],
        }
    }

    fn reset(&mut self) {
        self.max = [f32::NEG_INFINITY; BLOCK];
        self.sum = [0.0; BLOCK];
        self.acc.fill(0.0);
    }
}

/// A prefill task: every head of query rows `[r0, r0 + rows)` into `out` (those rows).
fn rows_task<E: KvElem>(
    avx2: bool,
    job: &Job<'_, E>,
    n_kv_heads: usize,
    r0: usize,
    out: &mut [f32],
) {
    let rows = out.len() / job.q_cols;
    let mut st = State::new(BLOCK, job.hd);
    for kvh in 0..n_kv_heads {
        for b in job.blocks(kvh, r0, rows) {
            st.reset();
            attend_keys(avx2, job, &b, b.lo..b.hi, false, &mut st);
            for (m, x) in b.queries.iter().enumerate() {
                let at = (x.row - r0) * job.q_cols + x.col;
                let inv = if st.sum[m] > 0.0 {
                    1.0 / st.sum[m]
                } else {
                    0.0
                };
                let acc = &st.acc[m * job.hd..(m + 1) * job.hd];
                for (o, &a) in out[at..at + job.hd].iter_mut().zip(acc) {
                    *o = a * inv;
                }
            }
        }
    }
}

/// Decode: all `rows` query rows (at most one block per KV head, unless a GQA group is larger
/// than a block) over their keys, cut into parts on the [`PART`] grid, one task per (KV head,
/// part); then the parts of each vector are combined in key order into `out`.
///
/// `parallel`: the tasks may run on the team (false inside a team task); the result is the same.
fn decode<E: KvElem>(
    cpu: &CpuBackend,
    avx2: bool,
    job: &Job<'_, E>,
    n_kv_heads: usize,
    rows: usize,
    out: &mut [f32],
    parallel: bool,
) {
    let hd = job.hd;
    let (lo, hi) = (job.visible(0).0, job.visible(rows - 1).1);
    let parts: Vec<(usize, usize)> = (lo / PART..hi.div_ceil(PART))
        .map(|p| ((p * PART).max(lo), ((p + 1) * PART).min(hi)))
        .collect();
    // Every KV head has the same number of blocks; task t = (KV head t / parts, part t % parts)
    // owns the states of its blocks.
    let per_task = job.blocks(0, 0, rows).len();
    let mut states: Vec<State> = (0..n_kv_heads * parts.len() * per_task)
        .map(|_| State::new(BLOCK.min(rows * job.group), hd))
        .collect();
    let flops = 4 * rows * n_kv_heads * job.group * (hi - lo) * hd;
    crate::for_each_chunk(
        cpu,
        &mut states,
        per_task,
        parallel && flops >= PARALLEL_MIN_FLOPS,
        |t, states| {
            let (kvh, (from, to)) = (t / parts.len(), parts[t % parts.len()]);
            for (st, b) in states.iter_mut().zip(job.blocks(kvh, 0, rows)) {
                let keys = from.max(b.lo)..to.min(b.hi);
                attend_keys(avx2, job, &b, keys, true, st);
            }
        },
    );
    for kvh in 0..n_kv_heads {
        let head = &states[kvh * parts.len() * per_task..(kvh + 1) * parts.len() * per_task];
        for (bi, b) in job.blocks(kvh, 0, rows).iter().enumerate() {
            let of_block = || head.iter().skip(bi).step_by(per_task);
            for (m, x) in b.queries.iter().enumerate() {
                // e^(max_p − max) rescales part p to the overall maximum; a part the vector
                // cannot see (sum 0, max −inf) is skipped.
                let max = of_block()
                    .map(|st| st.max[m])
                    .fold(f32::NEG_INFINITY, f32::max);
                let o = &mut out[x.row * job.q_cols + x.col..][..hd];
                o.fill(0.0);
                let mut sum = 0.0f32;
                for st in of_block().filter(|st| st.sum[m] > 0.0) {
                    let w = math::exp(st.max[m] - max);
                    sum += st.sum[m] * w;
                    for (o, &a) in o.iter_mut().zip(&st.acc[m * hd..(m + 1) * hd]) {
                        *o += a * w;
                    }
                }
                let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                for o in o.iter_mut() {
                    *o *= inv;
                }
            }
        }
    }
}

/// Runs block `b` over the positions `keys`, each vector limited to the keys it sees, updating
/// `st`; with the AVX2+FMA kernels when `avx2` (the caller checked the CPU). `stream`: these K/V
/// rows are read by this block alone (decode), so they come from memory, not from cache (a
/// decode step streams every weight between two visits of a layer's cache). Two things then
/// bring them in:
///
/// - **A sequential read of each stage.** Before the tiles of each stage of [`STAGE`] tiles are
///   computed, one load per cache line walks the stage's key and value rows in order, which the
///   hardware prefetchers follow at stream speed. The kernels' own order (three key rows at a
///   time, then the value rows chunk by chunk across the tile) is not a stream they follow, and
///   software prefetches alone left a cold cache at about 3× the in-cache time (one sequence's
///   64 keys, 4 heads of 256: 18 against 6 µs).
/// - **Prefetch requests [`AHEAD`] tiles on** at each tile (the first tiles' at the start), so
///   that rows that the reads brought into L2 are in L1 when the kernels use them, and the next
///   stage's rows are on their way.
///
/// Gemma 3 270M decode (`examples/decode_segments`, three runs each alternated with the
/// prefetches alone): the attention stretch 1.48-2.03 → 1.01-1.20 ms a step at a mean context of
/// 512 positions, 326-422 → 291-309 µs at 64, and 1.28-1.35 → 1.00-1.46 ms at 8 sequences of 32.
/// (Prefill blocks share their rows through the cache, and measured slower with the prefetches.)
fn attend_keys<E: KvElem>(
    avx2: bool,
    job: &Job<'_, E>,
    b: &Block<'_>,
    keys: Range<usize>,
    stream: bool,
    st: &mut State,
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only true where the CPU reports AVX2, FMA and F16C
        // (`CpuBackend::avx2`).
        unsafe { attend_keys_avx2(job, b, keys, stream, st) };
        return;
    }
    let _ = avx2;
    attend_keys_impl::<false, E>(job, b, keys, stream, st)
}

/// [`attend_keys_impl`] built with AVX2+FMA (and F16C, which widens an f16 cache's rows): its
/// kernels use the intrinsics, and the loops of the softmax compile to 8-lane code.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_keys_avx2<E: KvElem>(
    job: &Job<'_, E>,
    b: &Block<'_>,
    keys: Range<usize>,
    stream: bool,
    st: &mut State,
) {
    attend_keys_impl::<true, E>(job, b, keys, stream, st)
}

/// See [`attend_keys`]. `AVX2` selects the intrinsic kernels: only true when called from
/// [`attend_keys_avx2`].
#[inline(always)]
fn attend_keys_impl<const AVX2: bool, E: KvElem>(
    job: &Job<'_, E>,
    b: &Block<'_>,
    Range {
        start: from,
        end: to,
    }: Range<usize>,
    stream: bool,
    st: &mut State,
) {
    let (hd, kvh) = (job.hd, b.kvh);
    let n = b.queries.len();
    let mut qs: [&[f32]; BLOCK] = [&[]; BLOCK];
    for (d, x) in qs.iter_mut().zip(&b.queries) {
        *d = x.q;
    }
    let mut s = [[0.0f32; TILE]; BLOCK];
    let mut t0 = from;
    while t0 < to {
        let t1 = (t0 + TILE).min(to);
        let nk = t1 - t0;
        let mut keys: [&[E]; TILE] = [&[]; TILE];
        let mut values: [&[E]; TILE] = [&[]; TILE];
        for j in 0..nk {
            keys[j] = job.head_row(job.k, kvh, t0 + j);
            values[j] = job.head_row(job.v, kvh, t0 + j);
        }
        if stream {
            // A new stage's rows, read in order.
            if (t0 - from).is_multiple_of(STAGE * TILE) {
                let rows = (t0..(t0 + STAGE * TILE).min(to))
                    .flat_map(|j| [job.head_row(job.k, kvh, j), job.head_row(job.v, kvh, j)]);
                std::hint::black_box(read_rows(rows));
            }
            // The rows AHEAD tiles on (and, at the start, those up to there).
            let first = if t0 == from { t0 } else { t0 + AHEAD * TILE };
            for j in first..(t0 + (AHEAD + 1) * TILE).min(to) {
                prefetch_rows(&[job.head_row(job.k, kvh, j), job.head_row(job.v, kvh, j)]);
            }
        }
        scores::<AVX2, E>(&qs[..n], &keys[..nk], &mut s);
        let mut alpha = [1.0f32; BLOCK];
        for (m, x) in b.queries.iter().enumerate() {
            let (a, z) = (x.lo.max(t0), x.hi.min(t1));
            if a >= z {
                s[m] = [0.0; TILE];
            } else {
                alpha[m] = softmax_update(
                    job,
                    &mut s[m],
                    a - t0,
                    z - t0,
                    &mut st.max[m],
                    &mut st.sum[m],
                );
            }
        }
        weighted_values::<AVX2, E>(&mut st.acc[..n * hd], &alpha, &s, &values[..nk], hd);
        t0 = t1;
    }
}

/// Hints the CPU to bring each cache line of `rows` into L1 (a no-op off x86-64).
#[inline(always)]
fn prefetch_rows<E: KvElem>(rows: &[&[E]]) {
    #[cfg(target_arch = "x86_64")]
    for row in rows {
        for line in row.chunks(E::PER_LINE) {
            // SAFETY: a prefetch is a hint: it never faults and changes no memory (and `line`
            // is a live slice anyway).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    line.as_ptr().cast(),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}

/// Loads one value of every 64-byte line of `rows`, one row after the other, and returns a value
/// that depends on all of them (for `black_box`, so that the loads are not optimised away):
/// brings the rows into the core's caches at the speed of a sequential stream (see
/// [`attend_keys`]).
#[inline(always)]
fn read_rows<'a, E: KvElem>(rows: impl Iterator<Item = &'a [E]>) -> u32 {
    let mut acc = 0u32;
    for row in rows {
        for x in row.iter().step_by(E::PER_LINE) {
            acc = acc.wrapping_add(x.bits());
        }
    }
    acc
}

/// Turns one vector's raw scores `s` of a tile into weights, given that it sees tile keys
/// `[a, z)` (non-empty): scale and soft-cap, raise its running maximum, `s = e^(s − max)` inside
/// `[a, z)` and 0 outside, and rescale its sum. Returns the factor `e^(old max − new max)` by
/// which its accumulator must be multiplied.
#[inline(always)]
fn softmax_update<E>(
    job: &Job<'_, E>,
    s: &mut [f32; TILE],
    a: usize,
    z: usize,
    max: &mut f32,
    sum: &mut f32,
) -> f32 {
    for v in s.iter_mut() {
        *v *= job.scale;
    }
    if let Some(cap) = job.softcap {
        for v in s.iter_mut() {
            *v = cap * math::tanh(*v / cap);
        }
    }
    let mut tile_max = f32::NEG_INFINITY;
    for (j, &v) in s.iter().enumerate() {
        let inside = j >= a && j < z;
        tile_max = if inside && v > tile_max { v } else { tile_max };
    }
    let new_max = if tile_max > *max { tile_max } else { *max };
    let alpha = math::exp(*max - new_max);
    let mut tile_sum = [0.0f32; TILE];
    for (j, (v, t)) in s.iter_mut().zip(&mut tile_sum).enumerate() {
        let e = math::exp(*v - new_max);
        *v = if j >= a && j < z { e } else { 0.0 };
        *t = *v;
    }
    // A fixed pairwise tree over the tile (halves, then quarters, ...).
    let mut width = TILE;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            tile_sum[j] += tile_sum[j + width];
        }
    }
    *max = new_max;
    *sum = sum.mul_add(alpha, tile_sum[0]);
    alpha
}

/// `s[m][j] = q[m] · keys[j]` for the block's vectors and the tile's keys (all rows of one
/// length). Each dot product is eight lanes of fused multiply-adds over the whole chunks, the
/// lanes reduced as `((a₀ + a₄) + (a₂ + a₆)) + ((a₁ + a₅) + (a₃ + a₇))`, then the tail one product
/// at a time: the AVX2 kernel performs exactly the operations of [`dot`].
#[inline(always)]
fn scores<const AVX2: bool, E: KvElem>(q: &[&[f32]], keys: &[&[E]], s: &mut [[f32; TILE]; BLOCK]) {
    let len = q.first().map_or(0, |r| r.len());
    assert!(
        q.len() <= BLOCK
            && keys.len() <= TILE
            && q.iter().all(|r| r.len() == len)
            && keys.iter().all(|r| r.len() == len),
        "scores: bad operands"
    );
    let n8 = len / 8;
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        let mut qp = [std::ptr::null(); BLOCK];
        for (p, r) in qp.iter_mut().zip(q) {
            *p = r.as_ptr();
        }
        let mut kp = [std::ptr::null(); TILE];
        for (p, r) in kp.iter_mut().zip(keys) {
            *p = r.as_ptr();
        }
        // SAFETY: `AVX2` instances run only inside `attend_keys_avx2` (the CPU has AVX2, FMA
        // and F16C); the assert proves every row holds `len ≥ 8·n8` values.
        unsafe { avx2::scores(&qp[..q.len()], &kp[..keys.len()], n8, s) };
        if n8 * 8 < len {
            for (row, qm) in s.iter_mut().zip(q) {
                for (o, kj) in row.iter_mut().zip(keys) {
                    for d in n8 * 8..len {
                        *o = qm[d].mul_add(kj[d].get(), *o);
                    }
                }
            }
        }
        return;
    }
    for (row, qm) in s.iter_mut().zip(q) {
        for (o, kj) in row.iter_mut().zip(keys) {
            *o = dot(qm, kj);
        }
    }
}

/// One dot product in the operation order of [`scores`].
#[inline(always)]
fn dot<E: KvElem>(q: &[f32], k: &[E]) -> f32 {
    let (qc, qt) = q.as_chunks::<8>();
    let (kc, kt) = k.as_chunks::<8>();
    let mut acc = [0.0f32; 8];
    for (qv, kv) in qc.iter().zip(kc) {
        for l in 0..8 {
            acc[l] = qv[l].mul_add(kv[l].get(), acc[l]);
        }
    }
    let h: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    let mut sum = (h[0] + h[2]) + (h[1] + h[3]);
    for (&x, &y) in qt.iter().zip(kt) {
        sum = x.mul_add(y.get(), sum);
    }
    sum
}

/// `acc[m] = alpha[m] · acc[m] + Σ_j p[m][j] · values[j]` for the block's vectors (`acc` holds
/// their rows of `hd`), the sum in key order with fused multiply-adds. The AVX2 kernel takes
/// sixteen head dims of four vectors at a time (the tail of a head one at a time), with the
/// same operations per element.
#[inline(always)]
fn weighted_values<const AVX2: bool, E: KvElem>(
    acc: &mut [f32],
    alpha: &[f32; BLOCK],
    p: &[[f32; TILE]; BLOCK],
    values: &[&[E]],
    hd: usize,
) {
    let n = acc.len() / hd.max(1);
    assert!(
        n <= BLOCK && values.len() <= TILE && values.iter().all(|r| r.len() == hd),
        "weighted_values: bad operands"
    );
    let mut tail = 0;
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        let mut vp = [std::ptr::null(); TILE];
        for (p, r) in vp.iter_mut().zip(values) {
            *p = r.as_ptr();
        }
        // SAFETY: `AVX2` instances run only inside `attend_keys_avx2` (the CPU has AVX2, FMA
        // and F16C); the assert proves `acc` holds `n ≤ BLOCK` rows of `hd` and each value row `hd`
        // values, and `p` rows hold `TILE ≥ values.len()` weights.
        unsafe { avx2::weighted_values(acc.as_mut_ptr(), n, hd, alpha, p, &vp[..values.len()]) };
        tail = hd / 16 * 16;
    }
    for ((row, &alpha), p) in acc.chunks_exact_mut(hd.max(1)).zip(alpha).zip(p) {
        for (d, o) in row.iter_mut().enumerate().skip(tail) {
            let mut sum = *o * alpha;
            for (&w, v) in p.iter().zip(values) {
                sum = w.mul_add(v[d].get(), sum);
            }
            *o = sum;
        }
    }
}

/// The two products as AVX2+FMA intrinsics, with the operations of the portable code.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{KvElem, BLOCK, TILE};

    /// Query vectors per micro-kernel call (one ymm accumulator per vector and key).
    const MQ: usize = 4;
    /// Keys per micro-kernel call: `MQ × KEYS` accumulators, `KEYS` key loads, `MQ` query
    /// loads per chunk.
    const KEYS: usize = 3;

    /// `s[m][j] = Σ_c q[m][8c..8c+8] · k[j][8c..8c+8]` over `c < n8`, reduced as in
    /// [`super::dot`]. Keys outer, query groups inner, so that the few key rows in use stay in L1
    /// while the block's queries pass them.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; each pointer addresses `8·n8` readable values; `q.len()
    /// ≤ BLOCK`, `k.len() ≤ TILE`. Only called (inlined) from functions built with those
    /// features.
    #[inline(always)]
    pub(super) unsafe fn scores<E: KvElem>(
        q: &[*const f32],
        k: &[*const E],
        n8: usize,
        s: &mut [[f32; TILE]; BLOCK],
    ) {
        let mut j = 0;
        while j < k.len() {
            let nj = KEYS.min(k.len() - j);
            let mut m = 0;
            while m < q.len() {
                let nm = MQ.min(q.len() - m);
                match (nm, nj) {
                    (4, 3) => tile::<4, 3, E>(q, k, m, j, n8, s),
                    (4, 2) => tile::<4, 2, E>(q, k, m, j, n8, s),
                    (4, _) => tile::<4, 1, E>(q, k, m, j, n8, s),
                    (3, 3) => tile::<3, 3, E>(q, k, m, j, n8, s),
                    (3, 2) => tile::<3, 2, E>(q, k, m, j, n8, s),
                    (3, _) => tile::<3, 1, E>(q, k, m, j, n8, s),
                    (2, 3) => tile::<2, 3, E>(q, k, m, j, n8, s),
                    (2, 2) => tile::<2, 2, E>(q, k, m, j, n8, s),
                    (2, _) => tile::<2, 1, E>(q, k, m, j, n8, s),
                    (_, 3) => tile::<1, 3, E>(q, k, m, j, n8, s),
                    (_, 2) => tile::<1, 2, E>(q, k, m, j, n8, s),
                    (_, _) => tile::<1, 1, E>(q, k, m, j, n8, s),
                }
                m += nm;
            }
            j += nj;
        }
    }

    /// The `M × J` dots of queries `m0..m0 + M` and keys `j0..j0 + J` into `s`.
    ///
    /// # Safety
    /// As [`scores`], and `m0 + M ≤ q.len()`, `j0 + J ≤ k.len()`.
    #[inline(always)]
    unsafe fn tile<const M: usize, const J: usize, E: KvElem>(
        q: &[*const f32],
        k: &[*const E],
        m0: usize,
        j0: usize,
        n8: usize,
        s: &mut [[f32; TILE]; BLOCK],
    ) {
        let qp: [*const f32; M] = std::array::from_fn(|m| q[m0 + m]);
        let kp: [*const E; J] = std::array::from_fn(|j| k[j0 + j]);
        let mut acc = [[_mm256_setzero_ps(); J]; M];
        for c in 0..n8 {
            // SAFETY (loop): `c < n8`: each load reads values `[8c, 8c + 8)` of its row.
            let mut kv = [_mm256_setzero_ps(); J];
            for j in 0..J {
                kv[j] = E::load8(kp[j].add(8 * c));
            }
            for m in 0..M {
                let qv = _mm256_loadu_ps(qp[m].add(8 * c));
                for j in 0..J {
                    acc[m][j] = _mm256_fmadd_ps(qv, kv[j], acc[m][j]);
                }
            }
        }
        for m in 0..M {
            for j in 0..J {
                let a = acc[m][j];
                // h = a₀₋₃ + a₄₋₇; then (h₀ + h₂, h₁ + h₃); then their sum.
                let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                s[m0 + m][j0 + j] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
            }
        }
    }

    /// For the `n` rows of `hd` at `acc` and the 16-value chunks of a head: `acc = alpha[m] ·
    /// acc + Σ_j p[m][j] · v[j]` over `j < v.len()` in order. Chunks outer, groups of four
    /// vectors inner: the chunk of each value row in use stays in L1 while the block passes it.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `acc` addresses `n ≤ BLOCK` rows of `hd` writable
    /// values that nothing else accesses; each `v[j]` addresses `hd` readable values; `v.len() ≤
    /// TILE`. Only called (inlined) from functions built with those features.
    #[inline(always)]
    pub(super) unsafe fn weighted_values<E: KvElem>(
        acc: *mut f32,
        n: usize,
        hd: usize,
        alpha: &[f32; BLOCK],
        p: &[[f32; TILE]; BLOCK],
        v: &[*const E],
    ) {
        for c in 0..hd / 16 {
            let mut m = 0;
            while m < n {
                let nm = MQ.min(n - m);
                match nm {
                    4 => chunk::<4, E>(acc, hd, m, c, alpha, p, v),
                    3 => chunk::<3, E>(acc, hd, m, c, alpha, p, v),
                    2 => chunk::<2, E>(acc, hd, m, c, alpha, p, v),
                    _ => chunk::<1, E>(acc, hd, m, c, alpha, p, v),
                }
                m += nm;
            }
        }
    }

    /// Chunk `c` (values `[16c, 16c + 16)`) of rows `m0..m0 + M`.
    ///
    /// # Safety
    /// As [`weighted_values`], and `m0 + M ≤ n`, `16c + 16 ≤ hd`.
    #[inline(always)]
    unsafe fn chunk<const M: usize, E: KvElem>(
        acc: *mut f32,
        hd: usize,
        m0: usize,
        c: usize,
        alpha: &[f32; BLOCK],
        p: &[[f32; TILE]; BLOCK],
        v: &[*const E],
    ) {
        let mut s = [[_mm256_setzero_ps(); 2]; M];
        for m in 0..M {
            let o = acc.add((m0 + m) * hd + 16 * c);
            let a = _mm256_set1_ps(alpha[m0 + m]);
            s[m][0] = _mm256_mul_ps(_mm256_loadu_ps(o), a);
            s[m][1] = _mm256_mul_ps(_mm256_loadu_ps(o.add(8)), a);
        }
        for (j, &row) in v.iter().enumerate() {
            let v0 = E::load8(row.add(16 * c));
            let v1 = E::load8(row.add(16 * c + 8));
            for m in 0..M {
                let w = _mm256_set1_ps(p[m0 + m][j]);
                s[m][0] = _mm256_fmadd_ps(w, v0, s[m][0]);
                s[m][1] = _mm256_fmadd_ps(w, v1, s[m][1]);
            }
        }
        for (m, sm) in s.iter().enumerate() {
            let o = acc.add((m0 + m) * hd + 16 * c);
            _mm256_storeu_ps(o, sm[0]);
            _mm256_storeu_ps(o.add(8), sm[1]);
        }
    }
}

/// The row-at-a-time kernel this module replaced, kept as the reference: scores of one query
/// row and head against all its visible keys, softmax, weighted sum of values.
#[cfg(test)]
fn reference(q: &CpuTensor, k: &CpuKv, v: &CpuKv, q_pos: usize, p: &AttentionParams) -> Vec<f32> {
    reference_over(q, &k.to_f32(), &v.to_f32(), q_pos, p)
}

/// [`reference`] over the caches' values as f32.
#[cfg(test)]
fn reference_over(
    q: &CpuTensor,
    k: &[f32],
    v: &[f32],
    q_pos: usize,
    p: &AttentionParams,
) -> Vec<f32> {
    let hd = p.head_dim;
    let kv_cols = p.n_kv_heads * hd;
    let group = p.n_heads / p.n_kv_heads;
    let mut out = vec![0.0f32; q.rows * q.cols];
    for (i, out_row) in out.chunks_mut(q.cols).enumerate() {
        let pos = q_pos + i;
        let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let hi = pos + 1;
        let mut scores = vec![0.0f32; hi - lo];
        for h in 0..p.n_heads {
            let kvh = h / group;
            let qh = &q.row(i)[h * hd..(h + 1) * hd];
            let mut max = f32::NEG_INFINITY;
            for (s, j) in scores.iter_mut().zip(lo..hi) {
                let kj = &k[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
                let mut v = math::dot(qh, kj) * p.scale;
                if let Some(cap) = p.softcap {
                    v = cap * (v / cap).tanh();
                }
                *s = v;
                max = max.max(v);
            }
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            let oh = &mut out_row[h * hd..(h + 1) * hd];
            for (s, j) in scores.iter().zip(lo..hi) {
                let vj = &v[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
                let weight = s * inv;
                for (o, &v) in oh.iter_mut().zip(vj) {
                    *o += weight * v;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{simd_level, SimdLevel};
    use crate::CpuOptions;
    use kiln_backend::KvDtype;

    /// Deterministic values in [-1, 1) (xorshift64).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn tensor(data: Vec<f32>, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor::new(data, rows, cols).unwrap()
    }

    fn cache(data: &[f32], rows: usize, cols: usize, dtype: KvDtype) -> CpuKv {
        CpuKv::from_f32(data, rows, cols, dtype).unwrap()
    }

    const DTYPES: [KvDtype; 2] = [KvDtype::F32, KvDtype::F16];

    /// The scalar build on one thread, and the CPU's SIMD level on one and three threads.
    fn backends() -> Vec<CpuBackend> {
        let mut v =
            vec![
                CpuBackend::with_options(&CpuOptions::threads(1).simd_cap(SimdLevel::Scalar))
                    .unwrap(),
            ];
        if simd_level() != SimdLevel::Scalar {
            v.push(CpuBackend::new(1).unwrap());
            v.push(CpuBackend::new(3).unwrap());
        }
        v
    }

    /// Runs `rows` query rows at `q_pos` on every backend, over caches of each type, and checks
    /// each against the reference over the cache's (rounded) values: the largest error at most
    /// 1e-5 of the largest output (softmax weights are within a few ulp of the reference's; the
    /// outputs are sums of up to a thousand such products), and all backends bit-identical (the
    /// same operations on any thread count and in both builds).
    fn check(b: &[CpuBackend], p: &AttentionParams, q_pos: usize, rows: usize, seed: u64) {
        for dtype in DTYPES {
            check_one(b, p, q_pos, rows, seed, dtype);
        }
    }

    fn check_one(
        b: &[CpuBackend],
        p: &AttentionParams,
        q_pos: usize,
        rows: usize,
        seed: u64,
        dtype: KvDtype,
    ) {
        let hd = p.head_dim;
        let n_kv = q_pos + rows;
        // Queries scaled up so that the softmax is far from uniform.
        let q: Vec<f32> = values(rows * p.n_heads * hd, seed)
            .iter()
            .map(|x| x * 3.0)
            .collect();
        let q = tensor(q, rows, p.n_heads * hd);
        // A cache longer than the filled part, with NaN past it: never read.
        let cap = n_kv + 3;
        let mut k = values(cap * p.n_kv_heads * hd, seed + 1);
        let mut v = values(cap * p.n_kv_heads * hd, seed + 2);
        k[n_kv * p.n_kv_heads * hd..].fill(f32::NAN);
        v[n_kv * p.n_kv_heads * hd..].fill(f32::NAN);
        let (k, v) = (
            cache(&k, cap, p.n_kv_heads * hd, dtype),
            cache(&v, cap, p.n_kv_heads * hd, dtype),
        );
        let want = reference(&q, &k, &v, q_pos, p);
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let mut first: Option<Vec<f32>> = None;
        for be in b {
            let got = attention(be, &q, &k, &v, q_pos, n_kv, p).unwrap();
            assert_eq!((got.rows, got.cols), (q.rows, q.cols));
            let err = got
                .data
                .iter()
                .zip(&want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-5 * scale,
                "{p:?} q_pos {q_pos} rows {rows} {dtype} on {:?}/{}: error {err:e} of {scale}",
                be.simd,
                be.threads
            );
            match &first {
                None => first = Some(got.data.clone()),
                Some(f) => assert!(
                    f.iter()
                        .zip(&got.data)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{p:?} q_pos {q_pos} rows {rows} {dtype}: {:?}/{} differs from the first backend",
                    be.simd,
                    be.threads
                ),
            }
        }
    }

    fn params(
        (n_heads, n_kv_heads): (usize, usize),
        head_dim: usize,
        sliding_window: Option<usize>,
        softcap: Option<f32>,
    ) -> AttentionParams {
        AttentionParams {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window,
            softcap,
        }
    }

    #[test]
    fn matches_the_reference_on_gqa_windows_and_softcaps() {
        let b = backends();
        let mut seed = 0;
        for heads in [(4, 1), (8, 2), (2, 2)] {
            for hd in [64, 256] {
                for window in [None, Some(5), Some(512)] {
                    for softcap in [None, Some(50.0)] {
                        let p = params(heads, hd, window, softcap);
                        for q_pos in [0, 37] {
                            for rows in (1..=13).chain([70]) {
                                seed += 3;
                                check(&b, &p, q_pos, rows, seed);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A paged cache gives the bits of the contiguous one, whatever the block size (tiles
    /// crossing blocks included) and the order of the blocks in the pool; rows the table does
    /// not map (NaN here) are never read.
    #[test]
    fn paged_caches_give_the_bits_of_contiguous_ones() {
        use kiln_backend::Backend;
        let b = backends();
        let mut seed = 1000;
        for (heads, hd, window) in [
            ((4, 1), 64, None),
            ((8, 2), 32, Some(40)),
            ((2, 2), 8, None),
        ] {
            let p = params(heads, hd, window, Some(30.0));
            let kv_cols = p.n_kv_heads * hd;
            for (block_size, dtype) in [1, 3, 16, 32].into_iter().zip(DTYPES.iter().cycle()) {
                for (q_pos, rows) in [(0, 5), (37, 1), (300, 1), (250, 20)] {
                    seed += 7;
                    let n_kv = q_pos + rows;
                    let q = tensor(values(rows * p.n_heads * hd, seed), rows, p.n_heads * hd);
                    let (k, v) = (
                        values(n_kv * kv_cols, seed + 1),
                        values(n_kv * kv_cols, seed + 2),
                    );
                    let k_cache = cache(&k, n_kv, kv_cols, *dtype);
                    let v_cache = cache(&v, n_kv, kv_cols, *dtype);
                    let (k, v) = (tensor(k, n_kv, kv_cols), tensor(v, n_kv, kv_cols));
                    // The sequence's blocks, scattered through a larger pool in a shuffled order.
                    let blocks = n_kv.div_ceil(block_size);
                    let pool_blocks = 2 * blocks + 3;
                    let mut ids: Vec<u32> = (0..pool_blocks as u32).collect();
                    let mut s = seed;
                    for i in (1..ids.len()).rev() {
                        s = s
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ids.swap(i, (s >> 33) as usize % (i + 1));
                    }
                    let table = &ids[..blocks];
                    let pages = KvPages { table, block_size };
                    let nan = vec![f32::NAN; pool_blocks * block_size * kv_cols];
                    for be in &b {
                        let mut kp = cache(&nan, pool_blocks * block_size, kv_cols, *dtype);
                        let mut vp = cache(&nan, pool_blocks * block_size, kv_cols, *dtype);
                        // Written in two appends, the second starting inside a block.
                        let cut = n_kv / 2;
                        for (pool, src) in [(&mut kp, &k), (&mut vp, &v)] {
                            be.write_paged_rows(pool, &pages, 0, &be.rows(src, 0..cut).unwrap())
                                .unwrap();
                            be.write_paged_rows(
                                pool,
                                &pages,
                                cut,
                                &be.rows(src, cut..n_kv).unwrap(),
                            )
                            .unwrap();
                        }
                        let want = attention(be, &q, &k_cache, &v_cache, q_pos, n_kv, &p).unwrap();
                        let got =
                            paged_attention(be, &q, &kp, &vp, &pages, q_pos, n_kv, &p).unwrap();
                        assert!(
                            want.data
                                .iter()
                                .zip(&got.data)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{p:?} block {block_size} q_pos {q_pos} rows {rows} {dtype} on {:?}/{}",
                            be.simd,
                            be.threads
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_table_that_does_not_cover_the_rows_is_an_error() {
        use kiln_backend::Backend;
        let be = CpuBackend::new(1).unwrap();
        let p = params((2, 1), 4, None, None);
        let q = tensor(values(8, 1), 1, 8);
        let pool = cache(&values(16, 2), 4, 4, KvDtype::F16); // 2 blocks of 2 rows
        let short = KvPages {
            table: &[1],
            block_size: 2,
        };
        let err = paged_attention(&be, &q, &pool, &pool, &short, 2, 3, &p).unwrap_err();
        assert!(err.to_string().contains("need 2 blocks"), "{err}");
        let outside = KvPages {
            table: &[0, 2],
            block_size: 2,
        };
        let err = paged_attention(&be, &q, &pool, &pool, &outside, 2, 3, &p).unwrap_err();
        assert!(err.to_string().contains("block 2"), "{err}");
        let zero = KvPages {
            table: &[0, 1],
            block_size: 0,
        };
        assert!(paged_attention(&be, &q, &pool, &pool, &zero, 0, 1, &p).is_err());
        let mut dst = cache(&values(16, 2), 4, 4, KvDtype::F16);
        let err = be
            .write_paged_rows(&mut dst, &outside, 1, &tensor(values(8, 3), 2, 4))
            .unwrap_err();
        assert!(err.to_string().contains("block 2"), "{err}");
        assert_eq!(
            dst.to_f32(),
            pool.to_f32(),
            "a failed write changes nothing"
        );
        let f32_pool = cache(&values(16, 2), 4, 4, KvDtype::F32);
        let err = attention(&be, &q, &pool, &f32_pool, 2, 3, &p).unwrap_err();
        assert!(
            err.to_string()
                .contains("keys stored as f16, values as f32"),
            "{err}"
        );
    }

    /// Long caches: decode splits the keys into parts (and prefill tasks walk many tiles).
    #[test]
    fn long_caches_split_into_parts_match_the_reference() {
        let b = backends();
        for heads in [(4, 1), (8, 2), (2, 2)] {
            for window in [None, Some(5), Some(300)] {
                for softcap in [None, Some(50.0)] {
                    let p = params(heads, 64, window, softcap);
                    for (q_pos, rows) in [(255, 1), (256, 1), (700, 1), (1000, 2), (600, 9)] {
                        check(&b, &p, q_pos, rows, (q_pos + rows) as u64);
                    }
                }
            }
        }
    }

    /// Head sizes that are not a multiple of the lanes take the tail paths; groups of 3 and 16
    /// heads per KV head make partial and multiple blocks.
    #[test]
    fn odd_head_sizes_and_groups_match_the_reference() {
        let b = backends();
        for (heads, hd) in [
            ((4, 1), 8),
            ((6, 2), 20),
            ((3, 1), 72),
            ((16, 1), 32),
            ((1, 1), 1),
        ] {
            let p = params(heads, hd, None, None);
            for (q_pos, rows) in [(0, 1), (0, 5), (11, 17), (300, 1)] {
                check(&b, &p, q_pos, rows, 9);
            }
        }
    }

    /// No query rows, or no query heads: empty outputs of the right shape, no work.
    #[test]
    fn empty_shapes_give_empty_outputs() {
        let be = CpuBackend::new(2).unwrap();
        let kv = cache(&values(4 * 16, 1), 4, 16, KvDtype::F16);
        let q = tensor(Vec::new(), 0, 64);
        let got = attention(&be, &q, &kv, &kv, 2, 2, &params((4, 1), 16, None, None)).unwrap();
        assert_eq!((got.rows, got.cols), (0, 64));
        let q = tensor(Vec::new(), 3, 0);
        let got = attention(&be, &q, &kv, &kv, 0, 3, &params((0, 1), 16, None, None)).unwrap();
        assert_eq!((got.rows, got.cols), (3, 0));
    }

    /// A window of 0 leaves every query without keys: zeros, as the reference gives.
    #[test]
    fn an_empty_window_gives_zeros() {
        let be = CpuBackend::new(2).unwrap();
        let p = params((4, 1), 16, Some(0), None);
        for (q_pos, rows) in [(0, 1), (0, 6), (400, 1)] {
            let n_kv = q_pos + rows;
            let q = tensor(values(rows * 64, 1), rows, 64);
            let kv = cache(&values(n_kv * 16, 2), n_kv, 16, KvDtype::F16);
            let got = attention(&be, &q, &kv, &kv, q_pos, n_kv, &p).unwrap();
            assert!(got.data.iter().all(|&x| x == 0.0));
        }
    }
}
