//! Decode: query rows that fit one block, split over (KV head, part of the keys) so that a long
//! cache is read by all threads at once (flash-decoding); the parts are combined in key order.

use super::flash::attend_keys;
use super::job::{Job, State, PARALLEL_MIN_FLOPS};
use crate::context::{for_each_chunk, Context};
use std::ops::Range;

use crate::kernels::{read_rows, KvElem, BLOCK};
use crate::math;
use crate::sgemm::Isa;

/// Cache bytes (keys and values) up to which a decode first reads its whole rows in one stream
/// (see [`read_whole_rows`]): half of a core's L2 on the hosts measured.
const WHOLE_ROWS_MAX_BYTES: usize = 512 << 10;

/// Key positions per part of a decode split. Parts are cut at multiples of `PART`, so the split
/// depends on `n_kv` (and the window) only.
const PART: usize = 256;

/// Decode: all `rows` query rows (at most one block per KV head, unless a GQA group is larger
/// than a block) over their keys, cut into parts on the [`PART`] grid, one task per (KV head,
/// part); then the parts of each vector are combined in key order into `out`.
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
    read_whole_rows(job, lo..hi);
    for_each_chunk(
        cpu,
        &mut states,
        per_task,
        parallel && flops >= PARALLEL_MIN_FLOPS,
        |t, states| {
            let (kvh, (from, to)) = (t / parts.len(), parts[t % parts.len()]);
            for (st, b) in states.iter_mut().zip(job.blocks(kvh, 0, rows)) {
                let keys = from.max(b.lo)..to.min(b.hi);
                attend_keys(isa, job, &b, keys, st);
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

/// Reads the cache rows of positions `keys`, every KV head's (keys, then values), one load per
/// cache line in order, where they hold at most [`WHOLE_ROWS_MAX_BYTES`] (an f32 or f16 cache).
///
/// A task reads its own head's slices of the rows ([`attend_keys`]'s stage reads): 256 bytes of
/// every 2 KiB row on an 8-head cache of 128 in f16, a pattern the hardware prefetchers follow
/// badly. A decode step's rows come from memory (the step streams every weight between two
/// visits of a layer's cache), so on qwen3-0.6b's shape at 64 positions its attention took
/// about 22 µs a layer, most of it waiting on those reads; one stream of the whole rows first,
/// on the calling thread, leaves them in its caches for the tasks (−25 % of the attention's
/// time, `examples/decode_segments`). Larger spans keep the per-task reads, which all threads
/// issue at once: one thread's stream of them measured no faster.
fn read_whole_rows<E: KvElem>(job: &Job<'_, E>, keys: Range<usize>) {
    let bytes = 2 * keys.len() * job.kv_cols * size_of::<E>();
    if job.blocks.is_some() || bytes > WHOLE_ROWS_MAX_BYTES {
        return;
    }
    for cache in [job.k, job.v] {
        std::hint::black_box(read_rows(keys.clone().map(|j| job.row(cache, j))));
    }
}
