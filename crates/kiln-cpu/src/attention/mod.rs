//! Causal attention over a KV cache, in two forms: a prefill (more query rows than one block
//! of the flash loop holds) takes the row form of the encoders' packed attention (`rows`), a
//! decode the tiled, online-softmax ("flash") loop (`flash`, `decode`). The cache is contiguous
//! (row `j` at position `j`) or paged (`paged_attention`: row `j` where the block table maps
//! it); both forms see rows only through `Job::head_row` (or `Job::dequantize_head`), so both
//! layouts give the same bits. Its rows hold f32, f16 or Q8_0/Q4_0 values (`crate::kv`), made
//! f32 exactly as they are read, so a cache computes the same operations on the values it holds
//! as an f32 cache holding them.
//!
//! **Prefill** (`rows`): per chunk of 4096 key positions, the keys and values of every KV head
//! become panels of 16 keys and of 16 dims (converted from the cache once), and one task per
//! (KV head, 12 query rows) runs each query head of the group as 12 × 32 register tiles (the
//! queries as the tiles' rows), a whole score row per query and chunk, and the chunks merged in
//! key order. 1.5-1.8× the flash loop's speed on llama-3.2-1b's prefill; each row's result
//! depends on its own query and keys only, so a prompt prefilled in chunks gives the bits of a
//! whole one.
//!
//! **Decode** (the query rows fit one block; `decode`): the query vectors that share a KV head
//! (the heads of a GQA group) are taken `BLOCK` at a time; a block walks its keys `TILE` at a
//! time (the tile shape of `crate::kernels`' attention kernels). Per tile it computes the
//! block's scores (a `BLOCK × TILE` product in micro-kernels of 4 vectors × 3 keys, or 4 × 8 in
//! 512-bit registers, so each key row loaded serves many dot products), masks each vector to
//! the keys it sees (causality and the sliding window differ per row), raises each vector's
//! running maximum, rescales its running sum and accumulator by `e^(old max − new max)` (online
//! softmax), and adds the tile's weighted value rows (micro-kernels of 4 vectors × 16 head dims,
//! or 8 × 32 in 512-bit registers). Elements of an f16 cache are widened as they load (F16C's
//! `vcvtph2ps` eight at a time, `half`'s conversion in the portable code). Work is one task per
//! part of the keys, every KV head in it, the parts of a length that depends on the number of
//! keys and the shape only (`decode::part_len`; flash-decoding), so a long cache is read by all
//! threads at once; a task first reads its part's whole rows in one stream, since a head's
//! slices of them are a pattern the hardware prefetchers follow badly. Each part keeps its own
//! maxima, sums and unnormalized outputs; the parts are combined in key order.
//!
//! Invariants:
//!
//! - Every output element is produced by one fixed sequence of operations that depends on the
//!   shape only, never on the thread count or on which thread runs a task: results are
//!   bit-identical across thread counts.
//! - The AVX-512 and AVX2+FMA kernels (`crate::kernels`' attention kernels and packed
//!   attention's tiles, chosen at run time through `sgemm::Isa::for_level`) and the portable
//!   code perform the same operations in the same order (fused multiply-adds as `f32::mul_add`,
//!   the same lane reductions), and the rest of each loop is one source compiled with each set
//!   of features: all give identical bits.
//! - Only rows below `n_kv` are read; a vector that sees no key at all (a window of 0) gets
//!   zeros, as the empty sum does.
//! - The two forms sum in different orders, so a prefill's rows are not the bits of the same
//!   rows run as decodes. Batch-invariant mode, which promises that a sequence's results do not
//!   depend on what it is batched with, runs every row of a prefill as a decode.
//!
//! Files: `job` holds the operands and shape of a call and a block's online-softmax state,
//! `flash` the tile loop of one block over its keys, `decode` its split into tasks, `rows` the
//! row-form prefill; this module the entry points, which check the operands and pick the form.

use kiln_backend::{shape_err, AttentionParams, KvPages, Result};

use crate::context::{for_each_chunk, Context};
use crate::kernels::{KvElem, BLOCK};
use crate::kv::{word_bytes, CpuKv, KvData};
use crate::sgemm::Isa;
use crate::tensor::CpuTensor;

use decode::decode;
use job::{BlockRows, Job, Layout, PARALLEL_MIN_FLOPS};

mod decode;
mod flash;
mod job;
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
        (KvData::F32(k), KvData::F32(v)) => {
            let job = Job::new(data, k, v, layout);
            let read = |kvh: usize, j: usize, values: bool, row: &mut [f32]| {
                row.copy_from_slice(job.head_row(if values { job.v } else { job.k }, kvh, j));
            };
            Ok(prefill_or_run(cpu, q, job, p, &read))
        }
        (KvData::F16(k), KvData::F16(v)) => {
            use half::slice::HalfFloatSliceExt;
            let job = Job::new(data, k, v, layout);
            let read = |kvh: usize, j: usize, values: bool, row: &mut [f32]| {
                let cache = if values { job.v } else { job.k };
                job.head_row(cache, kvh, j).convert_to_f32_slice(row);
            };
            Ok(prefill_or_run(cpu, q, job, p, &read))
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
            let read = |kvh: usize, j: usize, values: bool, row: &mut [f32]| {
                job.dequantize_head(&blocks, values, kvh, j, row);
            };
            Ok(prefill_or_run(cpu, q, job, p, &read))
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

/// A prefill in row form (reading the cache through `read`) where it applies, else [`run`].
fn prefill_or_run<E: KvElem + Sync>(
    cpu: &Context,
    q: &CpuTensor,
    job: Job<'_, E>,
    p: &AttentionParams,
    read: &rows::ReadRow<'_>,
) -> CpuTensor {
    let isa = Isa::for_level(cpu.simd);
    match rows::prefill(cpu, isa, &job, p.n_kv_heads, q.rows, read) {
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
    } else {
        // (A prefill, more rows than one block holds, took the row form before this: see
        // `attention_over`.)
        decode(cpu, isa, &job, p.n_kv_heads, q.rows, &mut out, true);
    }
    CpuTensor {
        data: out,
        rows: q.rows,
        cols: q.cols,
    }
}

/// The most query rows a decode takes: as many as fill one block with their GQA groups (at
/// least one). More rows are a prefill, which takes the row form (`rows`).
fn max_decode_rows(group: usize) -> usize {
    (BLOCK / group).max(1)
}
