//! Prefill in row form: the register tiles of the encoders' packed attention
//! (`crate::packed_attention::attend_block`) on a decoder's causal, windowed, grouped heads,
//! over a cache of any element type.
//!
//! The keys the call's queries see, `[lo, hi)`, are taken in chunks of [`CHUNK`] positions on a
//! fixed grid (multiples of `CHUNK`), so that the scratch stays bounded at any context length:
//!
//! 1. **Per chunk**, every KV head's keys in it become key panels (16 keys, one row per head dim,
//!    scaled by the softmax scale) and value panels (16 dims, one row per key), converted to f32
//!    from the cache as they are copied (f16 widened, Q8_0/Q4_0 dequantized: exact, so a cache
//!    gives the bits of an f32 cache holding its values), in one task per KV head. Positions of
//!    the panels' 16-key grid that no query sees are zero: the cache's rows there are never read.
//! 2. **Per (KV head, block of 12 query rows)** that sees keys of the chunk, each query head of
//!    the group takes the block's rows as the rows of `S = Q (scale · K)ᵀ`, 12 × 32 sums per call,
//!    the softmax along each row over its keys in the chunk (two passes: the maximum, then `exp`
//!    and the sum), and `P V`, 12 × 32 sums per call. Blocks run from the last (most keys) to the
//!    first, so that the short ones fill the gaps at the end.
//! 3. A row's chunks are merged in key order as flash attention merges tiles: the first chunk's
//!    maximum, sum and output are kept as they are, each later one rescales both sides to the
//!    larger maximum (`e^(m − m')`); in a row's last chunk its output is multiplied by `1 / Σ`.
//!    A row whose keys lie in one chunk is therefore `o · (1 / Σ)` of that chunk.
//!
//! Against the flash loop (`super::flash`: a dot product per score, reduced across lanes, and an
//! online softmax tile by tile) this does 24 FMAs per 14 loads in both products and no
//! horizontal sum per score: llama-3.2-1b's 512-row prefill attention takes 5.7-6.0 ms on one
//! Zen 5 thread instead of 10.5 (AVX2 level: 10.8-11.0 instead of 16.3-16.6;
//! `examples/attn_bench`, figures in docs/BENCHMARKS.md). Its sums run in another order, so its
//! results are not the flash loop's bits; they are one fixed sequence of operations per output
//! element that depends on the element's own query row and keys only (and the fixed grid): the
//! same for any thread count, at every SIMD level (the products' chains and the softmax's trees
//! are the same in every build, the merge is portable code), whichever other rows share the call
//! (a key outside a row's range weighs exactly 0). A prompt prefilled in chunks of rows
//! therefore gives the bits of a whole one.

use super::job::Job;
use super::max_decode_rows;
use crate::context::{for_each_chunk, Context};
use crate::math;
use crate::packed_attention::{attend_block, transpose_panel, BlockScratch, Panels, QB};
use crate::sgemm::{Isa, PanelRow, NR};
use crate::team::Disjoint;

/// Key positions per chunk (a multiple of 16). Per thread a block's score rows take
/// 12 × 4096 × 4 bytes (192 KiB, in L2); the panels of a chunk take `2 · CHUNK · kv_cols · 4`
/// bytes (llama-3.1-8b: 32 MiB).
const CHUNK: usize = 4096;

/// Panels of this many f32 values or more are filled by the team, one task per KV head.
const PARALLEL_MIN_VALUES: usize = 1 << 14;

/// Reads logical row `j` of KV head `kvh` of the keys (`values` false) or the values into the
/// `hd` values of `out`, as f32.
pub(super) type ReadRow<'r> = dyn Fn(usize, usize, bool, &mut [f32]) + Sync + 'r;

/// The prefill of `rows` query rows in row form, reading the cache through `read`, or `None`
/// where it does not apply: in batch-invariant mode (rows run one by one as decodes) and for
/// calls that the flash loop takes as a decode (no more rows than one block holds).
pub(super) fn prefill<E: Sync>(
    cpu: &Context,
    isa: Isa,
    job: &Job<'_, E>,
    n_kv_heads: usize,
    rows: usize,
    read: &ReadRow<'_>,
) -> Option<Vec<f32>> {
    let (hd, group) = (job.hd, job.group);
    if cpu.batch_invariant || hd == 0 || group == 0 || rows <= max_decode_rows(group) {
        return None;
    }
    let mut data = crate::buffers::take(rows * job.q_cols);
    if job.window == Some(0) {
        // No row sees a key: zeros, as the empty sum.
        data.fill(0.0);
        return Some(data);
    }
    // Debug builds (and so the tests) poison the recycled buffer, so that an element no task
    // wrote shows as NaN.
    #[cfg(debug_assertions)]
    data.fill(f32::NAN);
    let n_heads = n_kv_heads * group;
    let (lo, hi) = (job.visible(0).0, job.visible(rows - 1).1);
    let dim_panels = hd.div_ceil(NR);
    let largest = CHUNK.min(hi.div_ceil(NR) * NR - lo / NR * NR);
    let mut panels =
        vec![PanelRow([0.0; NR]); n_kv_heads * (largest / NR * hd + dim_panels * largest)];
    // Per (row, head): the running maximum and sum; the running output is in `data`.
    let mut max = vec![f32::NEG_INFINITY; rows * n_heads];
    let mut sum = vec![0.0f32; rows * n_heads];
    let blocks = rows.div_ceil(QB);
    let zeros = vec![0.0f32; dim_panels * NR];
    for c in lo / CHUNK..hi.div_ceil(CHUNK) {
        // The chunk's keys that some query sees, on the 16-key grid from `g0`.
        let (k0, k1) = ((c * CHUNK).max(lo), ((c + 1) * CHUNK).min(hi));
        let g0 = k0 / NR * NR;
        let ld = k1.div_ceil(NR) * NR - g0;
        let key_rows = ld / NR * hd;
        let per_head = key_rows + dim_panels * ld;
        let panels = &mut panels[..n_kv_heads * per_head];
        let parallel = panels.len() * NR >= PARALLEL_MIN_VALUES;
        for_each_chunk(cpu, panels, per_head, parallel, |kvh, head| {
            let (keys, values) = head.split_at_mut(key_rows);
            fill(isa, job.scale, hd, (kvh, g0, k0..k1), read, keys, values);
        });
        let (out, max, sum) = (
            Disjoint::new(&mut data),
            Disjoint::new(&mut max),
            Disjoint::new(&mut sum),
        );
        let task = Task {
            isa,
            job,
            panels,
            per_head,
            key_rows,
            ld,
            g0,
            keys: (k0, k1),
            rows,
            n_heads,
            zeros: &zeros,
            out: (&out, &max, &sum),
        };
        cpu.team
            .for_each_with(n_kv_heads * blocks, BlockScratch::default, |s, t| {
                // The last blocks (the longest rows) first.
                let (b, kvh) = (blocks - 1 - t / n_kv_heads, t % n_kv_heads);
                attend(&task, kvh, b * QB, s);
            });
    }
    // Every output was normalized in its row's last chunk (every row sees its own position).
    Some(data)
}

/// The key and value panels of KV head `kvh` for grid positions from `g0` (`keys.len() / hd /
/// 16` panels), the keys in `seen` read through `read` and the others zero.
fn fill(
    isa: Isa,
    scale: f32,
    hd: usize,
    (kvh, g0, seen): (usize, usize, std::ops::Range<usize>),
    read: &ReadRow<'_>,
    keys: &mut [PanelRow],
    values: &mut [PanelRow],
) {
    let panels = keys.len() / hd;
    let ld = panels * NR;
    let mut rows = vec![0.0f32; NR * hd];
    let mut value = vec![0.0f32; hd.div_ceil(NR) * NR];
    for p in 0..panels {
        let at = |lane: usize| g0 + p * NR + lane;
        for (lane, row) in rows.chunks_exact_mut(hd).enumerate() {
            if seen.contains(&at(lane)) {
                read(kvh, at(lane), false, row);
            } else {
                row.fill(0.0);
            }
        }
        let mut srcs: [&[f32]; NR] = [&rows[..hd]; NR];
        for (lane, src) in srcs.iter_mut().enumerate() {
            *src = &rows[lane * hd..(lane + 1) * hd];
        }
        transpose_panel(isa, &srcs, scale, &mut keys[p * hd..(p + 1) * hd]);
        for lane in 0..NR {
            if seen.contains(&at(lane)) {
                read(kvh, at(lane), true, &mut value[..hd]);
            } else {
                value[..hd].fill(0.0);
            }
            for (c, dims) in value.chunks_exact(NR).enumerate() {
                values[c * ld + p * NR + lane].0.copy_from_slice(dims);
            }
        }
    }
}

/// What every task of a chunk shares.
struct Task<'a, 'j, E> {
    isa: Isa,
    job: &'a Job<'j, E>,
    /// Per KV head, `per_head` rows: `key_rows` of key panels, then the value panels.
    panels: &'a [PanelRow],
    per_head: usize,
    key_rows: usize,
    /// Keys on the grid, which starts at position `g0`.
    ld: usize,
    g0: usize,
    /// The chunk's keys that some query sees.
    keys: (usize, usize),
    rows: usize,
    n_heads: usize,
    zeros: &'a [f32],
    /// The running outputs, maxima and sums.
    out: (
        &'a Disjoint<'a, f32>,
        &'a Disjoint<'a, f32>,
        &'a Disjoint<'a, f32>,
    ),
}

/// Every query head of KV head `kvh` for the rows of the block from `i0` that see keys of the
/// chunk, merged into the running state (the block's products and softmax run in
/// `attend_block`'s build for the instruction set).
fn attend<E: Sync>(task: &Task<'_, '_, E>, kvh: usize, i0: usize, s: &mut BlockScratch) {
    let job = task.job;
    let (hd, g0, (k0, k1)) = (job.hd, task.g0, task.keys);
    let n = QB.min(task.rows - i0);
    // Row `i`'s keys in the chunk; those that see some form one run `[a, b)` of the block (the
    // ranges move forward with the rows).
    let seen = |i: usize| {
        let (l, h) = job.visible(i0 + i);
        (l.max(k0), h.min(k1))
    };
    let Some(a) = (0..n).find(|&i| seen(i).0 < seen(i).1) else {
        return;
    };
    let b = (a..n).find(|&i| seen(i).0 >= seen(i).1).unwrap_or(n);
    let nq = b - a;
    let mut visible = [(0, 0); QB];
    for (i, v) in visible.iter_mut().enumerate() {
        let (l, h) = seen(a + i.min(nq - 1));
        *v = (l - g0, h - g0);
    }
    let head = &task.panels[kvh * task.per_head..(kvh + 1) * task.per_head];
    let (keys, values) = head.split_at(task.key_rows);
    let panels = Panels {
        isa: task.isa,
        hd,
        keys,
        values,
        ld: task.ld,
        softcap: job.softcap,
    };
    let (out, max, sum) = task.out;
    for h in kvh * job.group..(kvh + 1) * job.group {
        let col = h * hd;
        // Rows past the run stand for its last one: computed, never stored.
        let mut queries: [&[f32]; QB] = [task.zeros; QB];
        for (i, q) in queries.iter_mut().enumerate() {
            let at = (i0 + a + i.min(nq - 1)) * job.q_cols + col;
            *q = &job.q[at..at + hd];
        }
        let totals = attend_block(&panels, &queries, nq, &visible, s);
        for i in 0..nq {
            let (row, state) = (i0 + a + i, (i0 + a + i) * task.n_heads + h);
            let at = row * job.q_cols + col;
            // SAFETY: the task of (KV head, block) is the only one that touches the group's
            // heads in the block's rows, in its output columns and its maxima and sums.
            let (dst, m, t) = unsafe {
                (
                    out.slice(at..at + hd),
                    &mut max.slice(state..state + 1)[0],
                    &mut sum.slice(state..state + 1)[0],
                )
            };
            let (mc, tc, oc) = (totals.max[i], totals.sum[i], s.output(i, hd));
            if *t == 0.0 {
                // The row's first chunk (its sum is at least 1: the largest weight is e^0).
                (*m, *t) = (mc, tc);
                dst.copy_from_slice(oc);
            } else {
                let top = if mc > *m { mc } else { *m };
                let (old, new) = (math::exp(*m - top), math::exp(mc - top));
                (*m, *t) = (top, *t * old + tc * new);
                for (y, &x) in dst.iter_mut().zip(oc) {
                    *y = *y * old + x * new;
                }
            }
            if job.visible(row).1 <= k1 {
                // The row's last chunk.
                let inv = 1.0 / *t;
                for y in dst.iter_mut() {
                    *y *= inv;
                }
            }
        }
    }
}
