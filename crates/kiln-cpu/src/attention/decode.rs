//! Decode: query rows that fit one block, split into parts of the keys (every KV head in each)
//! so that a long cache is read by all threads at once (flash-decoding); the parts are combined
//! in key order.

use std::ops::Range;

use super::flash::attend_keys;
use super::job::{Block, Job, State, PARALLEL_MIN_FLOPS};
use crate::context::{for_each_chunk, Context};
use crate::kernels::{read_rows, KvElem, BLOCK};
use crate::math;
use crate::sgemm::Isa;

/// Fewest key positions in a part of a decode split, and the grain of its length.
const PART_GRAIN: usize = 64;
/// Parts a cache is cut into where they would not be too large (see [`part_len`]).
const MAX_PARTS: usize = 16;
/// Cache bytes (keys and values) of a part, at most (unless one grain holds more): what a task
/// reads before it computes stays in L2 (1 MiB a core on the hosts measured) until its heads
/// have used it.
const PART_MAX_BYTES: usize = 512 << 10;

/// The length of the parts that cut `keys` key positions of a cache of `row_bytes` a position
/// (keys and values each): a multiple of [`PART_GRAIN`] that cuts them into [`MAX_PARTS`] or
/// fewer, within [`PART_MAX_BYTES`]. It depends on the number of keys and the shape alone (never
/// on the thread count), so the split, and with it every result, does too.
fn part_len(keys: usize, row_bytes: usize) -> usize {
    let by_bytes = (PART_MAX_BYTES / (2 * row_bytes).max(1)) / PART_GRAIN * PART_GRAIN;
    keys.div_ceil(MAX_PARTS)
        .next_multiple_of(PART_GRAIN)
        .min(by_bytes)
        .max(PART_GRAIN)
}

/// Decode: all `rows` query rows (at most one block per KV head, unless a GQA group is larger
/// than a block) over their keys, cut from the first into parts of [`part_len`] positions, one
/// task per part; then the parts of each vector are combined in key order into `out`.
///
/// A task first reads its part's whole cache rows in order, the keys' then the values'
/// ([`read_part`]), then runs every KV head's blocks over them, from its caches. A decode
/// step's rows come from memory (the step streams every weight between two visits of a layer's
/// cache), and a head's slices of them are few lines out of every row (256 bytes of each 2 KiB
/// on an 8-head cache of 128 in f16), a pattern the hardware prefetchers follow badly: with a
/// task per (KV head, part) reading its head's slices, qwen3-0.6b's shape read its cache at a
/// fraction of the memory's speed (docs/BENCHMARKS.md).
///
/// `parallel`: the tasks may run on the team (false inside a team task); the result is the same.
pub(super) fn decode<E: KvElem>(
    cpu: &Context,
    isa: Isa,
    job: &Job<'_, E>,
    n_kv_heads: usize,
    rows: usize,
    out: &mut [f32],
    parallel: bool,
) {
    let hd = job.hd;
    let (lo, hi) = (job.visible(0).0, job.visible(rows - 1).1);
    let part = part_len(hi - lo, job.kv_cols * size_of::<E>());
    let parts: Vec<(usize, usize)> = (lo..hi)
        .step_by(part)
        .map(|from| (from, (from + part).min(hi)))
        .collect();
    // Task p owns the states of part p's blocks: KV head by KV head, each head's blocks in order.
    let blocks: Vec<Block<'_>> = (0..n_kv_heads)
        .flat_map(|kvh| job.blocks(kvh, 0, rows))
        .collect();
    let per_task = blocks.len().max(1);
    let mut states: Vec<State> = (0..parts.len() * blocks.len())
        .map(|_| State::new(BLOCK.min(rows * job.group), hd))
        .collect();
    let flops = 4 * rows * n_kv_heads * job.group * (hi - lo) * hd;
    for_each_chunk(
        cpu,
        &mut states,
        per_task,
        parallel && flops >= PARALLEL_MIN_FLOPS,
        |p, states| {
            let (from, to) = parts[p];
            read_part(job, from..to);
            for (st, b) in states.iter_mut().zip(&blocks) {
                attend_keys(isa, job, b, from.max(b.lo)..to.min(b.hi), st);
            }
        },
    );
    for (bi, b) in blocks.iter().enumerate() {
        let of_block = || states.iter().skip(bi).step_by(per_task);
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

/// Reads the cache rows of positions `keys`, every KV head's (the keys', then the values'), one
/// load per cache line in order: a stream that the hardware prefetchers follow at the memory's
/// speed, which leaves the part's rows in the core's caches for its heads. A block cache's rows
/// are read in order by their dequantization instead.
fn read_part<E: KvElem>(job: &Job<'_, E>, keys: Range<usize>) {
    if job.blocks.is_some() {
        return;
    }
    for cache in [job.k, job.v] {
        std::hint::black_box(read_rows(keys.clone().map(|j| job.row(cache, j))));
    }
}
