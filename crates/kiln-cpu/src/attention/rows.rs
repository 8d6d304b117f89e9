//! Prefill over f32 keys and values in row form: the register tiles of the encoders' packed
//! attention (`crate::packed_attention::attend_block`) on a decoder's causal, windowed, grouped
//! heads.
//!
//! 1. **Once per call**, every KV head's keys `[lo, hi)` (the union of what the call's queries
//!    see, on a grid of 16 positions from `lo / 16 · 16`) become key panels (16 keys, one row per
//!    head dim, scaled by the softmax scale) and value panels (16 dims, one row per key), in one
//!    task per KV head. Positions of the grid outside `[lo, hi)` are zero: rows below the first
//!    visible one may hold anything (a widened cache leaves them unwritten) and are never read.
//! 2. **Per task** (KV head, block of 12 query rows), each query head of the group takes the
//!    block's rows as the rows of `S = Q (scale · K)ᵀ`, 12 × 32 sums per call, the softmax along
//!    each row over the whole keys the row sees (two passes: the maximum, then `exp` and the
//!    sum), and `P V`, 12 × 32 sums per call. Blocks run from the last (most keys) to the first,
//!    so that the short ones fill the gaps at the end.
//!
//! Against the flash loop (`super::flash`: a dot product per score, reduced across lanes, and
//! an online softmax tile by tile) this does 24 FMAs per 14 loads in both products and no
//! horizontal sum per score: llama-3.2-1b's 512-row prefill attention takes 5.7-6.0 ms on one
//! Zen 5 thread instead of 10.5 (AVX2 level: 10.8-11.0 instead of 16.3-16.6;
//! `examples/attn_bench`, figures in docs/BENCHMARKS.md). Its sums run in another order, so its results are
//! not the flash loop's bits; they are still one fixed sequence of operations per output
//! element that depends on the element's own query row and keys only: the same for any thread
//! count, at every SIMD level (the products' chains and the softmax's trees are the same in
//! every build), whichever other rows share the call (a key outside a row's range weighs
//! exactly 0). A chunked prefill therefore gives the bits of a whole one.
//!
//! A whole score row per query needs `12 × keys` floats of scratch a thread: calls whose keys
//! span more than [`MAX_KEYS`] positions, or whose panels would take more than
//! [`MAX_PANEL_BYTES`], keep the flash loop.

use super::job::Job;
use super::rows_per_task;
use crate::context::{for_each_chunk, Context};
use crate::packed_attention::{attend_block, fill_panels, BlockScratch, Panels, QB};
use crate::sgemm::{Isa, PanelRow, NR};
use crate::team::Disjoint;

/// Most key positions (on the 16-key grid) a row-form prefill spans: a block's score rows then
/// take at most 12 × 8192 × 4 bytes (384 KiB) of scratch.
const MAX_KEYS: usize = 8192;
/// Most bytes of key and value panels a row-form prefill makes (all KV heads).
const MAX_PANEL_BYTES: usize = 64 << 20;

/// Panels of this many f32 values or more are filled by the team, one task per KV head.
const PARALLEL_MIN_VALUES: usize = 1 << 14;

/// The prefill of `rows` query rows in row form, or `None` where it does not apply: in
/// batch-invariant mode (rows run one by one as decodes), for calls that the flash loop takes
/// as a decode (no more rows than one block holds), over a block cache, with a window of 0
/// (rows that see no key), or when the keys span more than [`MAX_KEYS`] or
/// [`MAX_PANEL_BYTES`].
pub(super) fn prefill(
    cpu: &Context,
    isa: Isa,
    job: &Job<'_, f32>,
    n_kv_heads: usize,
    rows: usize,
) -> Option<Vec<f32>> {
    let (hd, group) = (job.hd, job.group);
    // (A window of 0 leaves rows without keys, which the whole-row softmax does not take.)
    if cpu.batch_invariant
        || job.blocks.is_some()
        || job.window == Some(0)
        || hd == 0
        || group == 0
        || rows <= rows_per_task(group)
    {
        return None;
    }
    let (lo, hi) = (job.visible(0).0, job.visible(rows - 1).1);
    let g0 = lo / NR * NR;
    let ld = hi.div_ceil(NR) * NR - g0;
    let dim_panels = hd.div_ceil(NR);
    // Per KV head: `ld / 16` key panels of `hd` rows, then `dim_panels` value panels of `ld`.
    let key_rows = ld / NR * hd;
    let per_head = key_rows + dim_panels * ld;
    if ld > MAX_KEYS || n_kv_heads * per_head * size_of::<PanelRow>() > MAX_PANEL_BYTES {
        return None;
    }
    let zeros = vec![0.0f32; dim_panels * NR];
    let mut panels = vec![PanelRow([0.0; NR]); n_kv_heads * per_head];
    let parallel = panels.len() * NR >= PARALLEL_MIN_VALUES;
    for_each_chunk(cpu, &mut panels, per_head, parallel, |kvh, head| {
        let (keys, values) = head.split_at_mut(key_rows);
        let key = |j: usize| job.head_row(job.k, kvh, g0 + j);
        let value = |j: usize| job.head_row(job.v, kvh, g0 + j);
        let rows = (lo - g0..hi - g0, key, value);
        fill_panels(isa, hd, job.scale, &zeros, rows, keys, values);
    });

    let mut data = crate::buffers::take(rows * job.q_cols);
    // Debug builds (and so the tests) poison the recycled buffer, so that an element no task
    // wrote shows as NaN.
    #[cfg(debug_assertions)]
    data.fill(f32::NAN);
    let out = Disjoint::new(&mut data);
    let blocks = rows.div_ceil(QB);
    let task = Task {
        isa,
        job,
        panels: &panels,
        per_head,
        key_rows,
        ld,
        g0,
        rows,
        zeros: &zeros,
        out: &out,
    };
    cpu.team
        .for_each_with(n_kv_heads * blocks, BlockScratch::default, |s, t| {
            // The last blocks (the longest rows) first.
            let (b, kvh) = (blocks - 1 - t / n_kv_heads, t % n_kv_heads);
            attend(&task, kvh, b * QB, s);
        });
    // Every element is written: the tasks' (KV head, block) pairs cover every row and head.
    Some(data)
}

/// What every task of a call shares.
struct Task<'a, 'j> {
    isa: Isa,
    job: &'a Job<'j, f32>,
    /// Per KV head, `per_head` rows: `key_rows` of key panels, then the value panels.
    panels: &'a [PanelRow],
    per_head: usize,
    key_rows: usize,
    /// Keys on the grid, which starts at position `g0`.
    ld: usize,
    g0: usize,
    rows: usize,
    zeros: &'a [f32],
    out: &'a Disjoint<'a, f32>,
}

/// Every query head of KV head `kvh` for the block of rows from `i0`, into `task.out` (the
/// block's products and softmax run in `attend_block`'s build for the instruction set).
fn attend(task: &Task<'_, '_>, kvh: usize, i0: usize, s: &mut BlockScratch) {
    let job = task.job;
    let (hd, g0) = (job.hd, task.g0);
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
    let nq = QB.min(task.rows - i0);
    // Row `i` of the block sees the grid's keys `[l, h)`.
    let mut visible = [(0, 0); QB];
    for (i, v) in visible.iter_mut().enumerate() {
        let (l, h) = job.visible(i0 + i.min(nq - 1));
        *v = (l - g0, h - g0);
    }
    for h in kvh * job.group..(kvh + 1) * job.group {
        let col = h * hd;
        // Rows past the call stand for its last one: computed, never stored.
        let mut queries: [&[f32]; QB] = [task.zeros; QB];
        for (i, q) in queries.iter_mut().enumerate() {
            let at = (i0 + i.min(nq - 1)) * job.q_cols + col;
            *q = &job.q[at..at + hd];
        }
        let inv = attend_block(&panels, &queries, nq, &visible, s);
        for (i, &inv) in inv.iter().enumerate().take(nq) {
            let at = (i0 + i) * job.q_cols + col;
            // SAFETY: the task of (KV head, block) is the only one that writes the columns
            // of the group's heads in the block's rows.
            let dst = unsafe { task.out.slice(at..at + hd) };
            for (y, &x) in dst.iter_mut().zip(s.output(i, hd)) {
                *y = x * inv;
            }
        }
    }
}
