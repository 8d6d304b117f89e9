//! Causal attention over a KV cache: tiled, online-softmax ("flash") attention. The cache is
//! contiguous (row `j` at position `j`) or paged (`paged_attention`: row `j` where the block
//! table maps it); the kernels see rows only through `Job::head_row`, so both give the same bits.
//! Its rows hold f32 or f16 values (`crate::kv`); one generic kernel reads both, widening each
//! element exactly as it loads it (F16C's `vcvtph2ps` eight at a time, `half`'s conversion in the
//! portable code), so an f16 cache computes the same operations on the values it holds. A
//! prefill over an f16 or Q8_0/Q4_0 cache first converts the rows its queries see to f32 once
//! (`widened`) and runs over those: the same values, so the bits of an f32 cache holding them.
//!
//! The query vectors that share a KV head (the heads of a GQA group, for one or more query rows)
//! are taken `BLOCK` at a time; a block walks its keys `TILE` at a time (the tile shape of
//! `crate::kernels`' attention kernels). Per tile it computes the block's scores (a
//! `BLOCK × TILE` product in micro-kernels of 4 vectors × 3 keys, or 4 × 8 in 512-bit
//! registers, so each key row loaded serves many dot products), masks each vector to the keys
//! it sees (causality and the sliding window differ per row), raises each vector's running
//! maximum, rescales its running sum and accumulator by `e^(old max − new max)` (online
//! softmax), and adds the tile's weighted value rows (micro-kernels of 4 vectors × 16 head dims,
//! or 8 × 32 in 512-bit registers). Neither the `[n, n_kv]` score matrix nor a full score row
//! is ever built: a block's state is its maxima, sums and `BLOCK × head_dim` accumulators.
//!
//! Work is split one of three ways, each fixed by the shape alone:
//!
//! - **Prefill in row form** (more query rows than one block holds, over f32 keys and values:
//!   an f32 cache, or the rows `widened` made; not in batch-invariant mode; `rows`): the key and
//!   value panels of the encoders' packed attention, made once per call, and one task per (KV
//!   head, 12 query rows) with the queries as the rows of 12 × 32 register tiles and a whole
//!   score row per query. 1.5-1.8× the flash loop's speed; each row's result depends on its
//!   own query and keys only, so a prompt prefilled in chunks gives the bits of a whole one.
//!   Calls whose keys span more than 8192 positions keep the flash loop below.
//! - **Prefill** (the same calls otherwise; `prefill`): one task per [`rows_per_task`] query
//!   rows, computing every head of its rows over each vector's whole key range.
//! - **Decode** (the query rows fit one block; `decode`): one task per (KV head, part of the
//!   keys), the positions cut on a fixed grid of `decode::PART` (flash-decoding), so a long
//!   cache is read by all threads at once. Each part keeps its own maxima, sums and
//!   unnormalized outputs; the parts are combined in key order.
//!
//! Invariants:
//!
//! - Every output element is produced by one fixed sequence of operations that depends on the
//!   shape only, never on the thread count or on which thread runs a task: results are
//!   bit-identical across thread counts.
//! - The AVX-512 and AVX2+FMA kernels (`crate::kernels`' attention kernels, chosen at run time
//!   through `sgemm::Isa::for_level`) and the portable code perform the same operations in the
//!   same order (fused multiply-adds as `f32::mul_add`, the same lane reductions), and the rest
//!   of the tile loop (`flash`) is one source compiled with each set of features: all give
//!   identical bits.
//! - Only rows below `n_kv` are read; a vector whose visible keys miss a tile is left untouched
//!   by it (no `−inf − −inf`), and a vector that sees no key at all (a window of 0) gets zeros,
//!   as the empty sum does.
//!
//! The row form sums in another order than the flash loop, so a prefill's rows are not the bits
//! of the same rows run as decodes; batch-invariant mode, which promises those, runs each row as
//! a decode.
//!
//! Files: `job` holds the operands and shape of a call and a block's online-softmax state,
//! `flash` the tile loop of one block over its keys, `prefill` and `decode` its two splits into
//! tasks, `rows` the row-form prefill; this module the entry points, which check the operands
//! and pick the split.

use kiln_backend::{shape_err, AttentionParams, KvPages, Result};

use crate::context::{for_each_chunk, Context};
use crate::kernels::{KvElem, BLOCK};
use crate::kv::{word_bytes, CpuKv, KvData};
use crate::sgemm::Isa;
use crate::tensor::CpuTensor;

use decode::decode;
use job::{BlockRows, Job, Layout, PARALLEL_MIN_FLOPS};
use prefill::rows_task;

mod decode;
mod flash;
mod job;
mod prefill;
mod rows;
#[cfg(test)]
mod tests;

pub(crate) fn attention(
    cpu: &Context,
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
    cpu: &Context,
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
        .check(p.first_key(q_pos)..n_kv, pool_rows)
        .map_err(|e| shape_err("paged_attention", e))?;
    attention_over(cpu, q, k_pool, v_pool, Some(*pages), q_pos, n_kv, p)
}

#[allow(clippy::too_many_arguments)]
fn attention_over(
    cpu: &Context,
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
    p.check(
        "attention",
        (q.rows, q.cols),
        (k_cache.rows, k_cache.cols),
        (v_cache.rows, v_cache.cols),
        q_pos,
        n_kv,
        pages.is_some(),
    )?;
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
        blocks: None,
    };
    let data = &q.data;
    match (&k_cache.data, &v_cache.data) {
        (KvData::F32(k), KvData::F32(v)) => Ok(run_f32(cpu, q, Job::new(data, k, v, layout), p)),
        (KvData::F16(k), KvData::F16(v)) => {
            use half::slice::HalfFloatSliceExt;
            let job = Job::new(data, k, v, layout);
            let widen = |j: usize, k: &mut [f32], v: &mut [f32]| {
                job.cache_row(job.k, j).convert_to_f32_slice(k);
                job.cache_row(job.v, j).convert_to_f32_slice(v);
            };
            Ok(match widened(cpu, &job, q.rows, widen) {
                Some(wide) => wide.run(cpu, q, layout, p),
                None => run(cpu, q, job, p),
            })
        }
        (KvData::Blocks { ty, words: k }, KvData::Blocks { ty: tv, words: v }) if ty == tv => {
            ty.check_whole_blocks("attention", "heads", hd)?;
            let blocks = BlockRows {
                ty: *ty,
                k: word_bytes(k),
                v: word_bytes(v),
                row_bytes: ty.row_bytes(k_cache.cols),
            };
            let job = Job::<f32>::new(
                data,
                &[],
                &[],
                Layout {
                    blocks: Some(blocks),
                    ..layout
                },
            );
            let dequantize = |j: usize, k: &mut [f32], v: &mut [f32]| {
                let heads = k.chunks_exact_mut(hd).zip(v.chunks_exact_mut(hd));
                for (kvh, (k, v)) in heads.enumerate() {
                    job.dequantize_head(&blocks, false, kvh, j, k);
                    job.dequantize_head(&blocks, true, kvh, j, v);
                }
            };
            Ok(match widened(cpu, &job, q.rows, dequantize) {
                Some(wide) => wide.run(cpu, q, layout, p),
                None => run(cpu, q, job, p),
            })
        }
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

/// [`run`] over f32 keys and values: a prefill in row form (`rows`) where it applies.
fn run_f32(cpu: &Context, q: &CpuTensor, job: Job<'_, f32>, p: &AttentionParams) -> CpuTensor {
    let isa = Isa::for_level(cpu.simd);
    match rows::prefill(cpu, isa, &job, p.n_kv_heads, q.rows) {
        Some(data) => CpuTensor {
            data,
            rows: q.rows,
            cols: q.cols,
        },
        None => run(cpu, q, job, p),
    }
}

/// [`attention_over`] once the operands are checked, over a cache of `E`.
fn run<E: KvElem>(cpu: &Context, q: &CpuTensor, job: Job<'_, E>, p: &AttentionParams) -> CpuTensor {
    let isa = Isa::for_level(cpu.simd);
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
        for_each_chunk(
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
                decode(cpu, isa, &one, p.n_kv_heads, 1, row_out, false);
            },
        );
    } else if q.rows <= rows {
        decode(cpu, isa, &job, p.n_kv_heads, q.rows, &mut out, true);
    } else {
        let (lo, hi) = (job.visible(0).0, job.visible(q.rows - 1).1);
        let flops = 4 * q.rows * p.n_heads * (hi - lo) * p.head_dim;
        for_each_chunk(
            cpu,
            &mut out,
            rows * q.cols,
            flops >= PARALLEL_MIN_FLOPS,
            |t, chunk| rows_task(isa, &job, p.n_kv_heads, t * rows, chunk),
        );
    }
    CpuTensor {
        data: out,
        rows: q.rows,
        cols: q.cols,
    }
}

/// Most bytes of f32 keys and values that a prefill makes of a 16-bit or block cache up front
/// (see [`widened`]): llama-3.1-8b's 4096 positions; longer ones keep the tile-by-tile
/// conversion rather than add more to the peak memory.
const WIDEN_MAX_BYTES: usize = 32 << 20;

/// The keys and values a prefill's queries see, as f32 logical rows `[0, hi)` of every head
/// (rows below the first visible one are left unspecified and never read).
struct Widened {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Widened {
    /// The prefill as an f32 job over these rows (contiguous: no block table), the buffers then
    /// given back to the pool.
    fn run(
        self,
        cpu: &Context,
        q: &CpuTensor,
        layout: Layout<'_>,
        p: &AttentionParams,
    ) -> CpuTensor {
        let layout = Layout {
            pages: None,
            blocks: None,
            ..layout
        };
        let out = run_f32(cpu, q, Job::new(&q.data, &self.k, &self.v, layout), p);
        crate::buffers::give(self.k);
        crate::buffers::give(self.v);
        out
    }
}

/// For a prefill (not batch-invariant mode, whose rows run one by one) over an f16 or block
/// cache: the rows its queries see, each filled once by `fill(j, keys, values)` (logical row `j`,
/// every head); `None` for a decode, or when both would take more than [`WIDEN_MAX_BYTES`].
///
/// Otherwise each block of query vectors widens (f16, `flash`'s `WIDEN_MIN_VECTORS`) or
/// dequantizes each tile it visits, so a prefill converted every key as many times as there are
/// blocks that see it: llama-3.2-1b's 512-row prefill attention took 7-9 % longer over an f16
/// cache than over an f32 one (`examples/attn_bench`), and takes the same time now; in its
/// 2048-token prefill attention's share of the samples fell from 26.7 to 24.7 %. Widening is
/// exact, so the results are those of a prefill over an f32 cache of the same values (tested):
/// the row form (`rows`) where it applies, else the flash loop, which computes the same bits
/// from a widened or dequantized tile as from these rows.
fn widened<E>(
    cpu: &Context,
    job: &Job<'_, E>,
    rows: usize,
    fill: impl Fn(usize, &mut [f32], &mut [f32]),
) -> Option<Widened> {
    // (No heads or no rows: `run` returns the empty output before any block.)
    if cpu.batch_invariant || job.group == 0 || rows <= rows_per_task(job.group) {
        return None;
    }
    let (lo, hi) = (job.visible(0).0, job.visible(rows - 1).1);
    let len = hi * job.kv_cols;
    if 2 * len * size_of::<f32>() > WIDEN_MAX_BYTES {
        return None;
    }
    let (mut k, mut v) = (crate::buffers::take(len), crate::buffers::take(len));
    for j in lo..hi {
        let at = j * job.kv_cols..(j + 1) * job.kv_cols;
        fill(j, &mut k[at.clone()], &mut v[at]);
    }
    Some(Widened { k, v })
}

/// Query rows per prefill task: as many as fill one block with their GQA groups (at least one).
fn rows_per_task(group: usize) -> usize {
    (BLOCK / group).max(1)
}
