//! Bidirectional attention over a packed batch of variable-length sequences (encoders).
//!
//! Work is split into tasks of consecutive heads of one sequence (all of its heads when there
//! are enough sequences to keep the threads busy: [`TaskSplit`]), and a task computes each
//! head in blocks of [`QB`] queries, each block's two products as register tiles of the GEMM's
//! shape ([`crate::sgemm`]: rows broadcast from memory, 16-column panels loaded, one FMA chain per
//! sum). While it computes one head, a task requests the next head's key and value rows into L2,
//! a share per block: step 1 below reads pieces of rows a few KiB apart that the Q/K/V products
//! left in L3 or memory, and waited on them one after another.
//!
//! 1. **Once per task**, the keys become panels of 16 keys (`head_dim` rows, row `d` holding dim
//!    `d` of the 16 keys, scaled by the softmax scale: a transpose, in 16 × 16 or 8 × 8 register
//!    blocks where the head dim allows) and the values panels of 16 dims (row `j` holding key
//!    `j`'s 16 dims: a copy). Keys and dims past the sequence and the head are zero.
//! 2. **Per block**, `S = Q (scale · K)ᵀ` over the key panels that some query of the block sees,
//!    the query rows read in place: 12 rows × 32 keys per call (24 zmm sums). Each row of `S` is
//!    then one query's scores: -∞ off its window, its maximum (16 lanes, then a fixed tree),
//!    `exp`, and its sum (16 lane sums over the panels in order, then the same tree), in place,
//!    which leaves `P` in rows the second product reads in place.
//! 3. `P V` over the same keys, 12 rows × 32 dims per call, and each output row scaled by its
//!    query's `1 / Σ` on the way into `out`. A last block of 6 queries or fewer takes 6-row tiles.
//!
//! With the queries as rows (an earlier version held 16 queries in the lanes of each score
//! vector, so that the softmax ran down the columns), the tiles have the GEMM's 12 × 32 shape
//! (24 FMAs to 14 loads, against 12 to 13 for 6 keys × 16 queries), the head dim needs no
//! padding to a multiple of 6, and nothing is transposed on the way out; the price is a
//! horizontal reduction per query row for the maximum and the sum, which a short sequence feels
//! (docs/BENCHMARKS.md has the figures).
//!
//! Step 1 is [`fill_panels`], steps 2-3 [`attend_block`], which the decoders' prefill shares
//! with [`transpose_panel`] (`crate::attention`'s row form: causal rows, GQA, windows and soft
//! caps on the same tiles; it fills its panels itself, converting the cache's rows as it
//! copies them).
//!
//! Nothing is computed across sequences, so packing wastes no work on padding, and the score
//! buffer is `QB × keys`: long sequences never materialise an `L × L` matrix. Scratch buffers
//! live as long as a worker's run of tasks, and each task writes its rows of its head's columns
//! straight into the output (those rectangles are disjoint and cover it).
//!
//! Each output element is produced by one task with a fixed instruction sequence that depends
//! only on its sequence (the portable build uses `f32::mul_add` in the kernels' order, the AVX2
//! and AVX-512 builds the same chains in 8- or 16-lane registers, and the softmax is the same
//! element-wise code with the same 16-lane trees in every build), so results do not depend on
//! the thread count, the SIMD level or on what else is in the batch.

use std::ops::Range;

use kiln_backend::{shape_err, PackedAttentionParams, Result};

use crate::context::Context;
use crate::kernels::{prefetch_rows, prefetch_rows_l2};
use crate::sgemm::{Isa, PanelRow, MR, NR};
use crate::team::Disjoint;
use crate::tensor::CpuTensor;

pub(crate) fn packed_attention(
    cpu: &Context,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    seq_lens: &[usize],
    p: &PackedAttentionParams,
) -> Result<CpuTensor> {
    let (hd, cols) = (p.head_dim, p.n_heads * p.head_dim);
    let total: usize = seq_lens.iter().sum();
    if hd == 0 || [q, k, v].iter().any(|t| t.cols != cols || t.rows != total) {
        return Err(shape_err(
            "packed_attention",
            format!(
                "q [{}, {}], k [{}, {}], v [{}, {}] for {} heads of {} and {total} packed rows",
                q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, p.n_heads, p.head_dim
            ),
        ));
    }
    let isa = Isa::for_level(cpu.simd);
    let split = TaskSplit::new(seq_lens, p.n_heads, p.radius, cpu.team.threads());
    let mut tasks = Vec::new();
    let mut row0 = 0;
    for &len in seq_lens {
        let per_task = split.heads_per_task(len);
        for head0 in (0..p.n_heads).step_by(per_task) {
            tasks.push(Block {
                q: q.data(),
                k: k.data(),
                v: v.data(),
                cols,
                hd,
                heads: head0..(head0 + per_task).min(p.n_heads),
                row0,
                len,
                scale: p.scale,
                radius: p.radius,
                isa,
            });
        }
        row0 += len;
    }
    let mut data = crate::buffers::take(total * cols);
    // Debug builds (and so the tests) poison the recycled buffer, so that an element no task
    // wrote shows as NaN.
    #[cfg(debug_assertions)]
    data.fill(f32::NAN);
    let out = Disjoint::new(&mut data);
    cpu.team
        .for_each_with(tasks.len(), Scratch::default, |s, i| {
            attend(&tasks[i], s, &out)
        });
    // Every element is written: the tasks' rows and head columns cover the output.
    CpuTensor::new(data, total, cols)
}

/// Query rows per block: the rows of the AVX-512 tile (two of the GEMM's [`MR`]).
pub(crate) const QB: usize = 2 * MR;

/// Tasks wanted per thread: a task takes no more than its share of the work for this many tasks
/// a thread (and at least one head).
const TASKS_PER_THREAD: usize = 8;

/// How a call's (sequence, head) pairs are grouped into tasks: consecutive heads of one sequence
/// per task, as many as keep its work (the scores it computes) within the call's work divided
/// by [`TASKS_PER_THREAD`] tasks a thread. MiniLM's batches of 32 equal sequences on two threads
/// make one task of all 12 heads per sequence; one sequence makes a task per head; a long
/// sequence among short ones is split head by head while the short ones stay whole, so that it
/// is not one thread's alone.
///
/// A task requests the next head's keys and values into L2 while it computes one, so that
/// filling that head's panels finds them there instead of waiting for one row after another
/// from L3 or memory; the first head of a task fills without that help. (MiniLM's 128-token
/// batches on a Zen 5 host: attention alone 10-18 % faster on two threads with Q, K and V
/// evicted first, the whole forward about 5 %; requesting the rows into L1 instead measured the
/// same, and the next head's query rows too 2 % slower: docs/BENCHMARKS.md.)
struct TaskSplit {
    heads: usize,
    radius: Option<usize>,
    /// Most work (scores) per task, unless one head is more.
    target: usize,
}

impl TaskSplit {
    fn new(seq_lens: &[usize], heads: usize, radius: Option<usize>, threads: usize) -> TaskSplit {
        let mut split = TaskSplit {
            heads: heads.max(1),
            radius,
            target: 0,
        };
        let total = seq_lens
            .iter()
            .fold(0usize, |t, &len| t.saturating_add(split.head_work(len)));
        let tasks = TASKS_PER_THREAD.saturating_mul(threads.max(1));
        split.target = total.saturating_mul(split.heads).div_ceil(tasks);
        split
    }

    /// Scores of one head of a sequence of `len` tokens (each query against the keys it sees).
    fn head_work(&self, len: usize) -> usize {
        let seen = self
            .radius
            .map_or(len, |r| r.saturating_mul(2).saturating_add(1).min(len));
        len.saturating_mul(seen)
    }

    /// Heads per task of a sequence of `len` tokens: 1 to all.
    fn heads_per_task(&self, len: usize) -> usize {
        (self.target / self.head_work(len).max(1)).clamp(1, self.heads)
    }
}

/// One task: consecutive heads of one sequence of the packed tensors.
struct Block<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// Row length of q, k and v (all heads).
    cols: usize,
    hd: usize,
    /// The heads, one after the other.
    heads: Range<usize>,
    /// First row of the sequence.
    row0: usize,
    len: usize,
    scale: f32,
    radius: Option<usize>,
    isa: Isa,
}

/// A worker's buffers, reused from task to task (each task overwrites what it reads).
#[derive(Default)]
struct Scratch {
    /// Key panels: panel `p`, row `d` holds `scale · k[d]` of keys `16p .. 16p + 16`.
    keys: Vec<PanelRow>,
    /// Value panels: panel `c`, row `j` holds dims `16c .. 16c + 16` of key `j`.
    values: Vec<PanelRow>,
    /// The blocks' scores and sums.
    block: BlockScratch,
    /// A zero row, for the keys and dims of the last panels past the sequence or the head.
    zeros: Vec<f32>,
}

/// `v` with length `len`; its values are unspecified (callers overwrite what they read).
fn sized<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) -> &mut [T] {
    v.resize(len, fill);
    &mut v[..len]
}

/// [`attend_impl`], built for the block's instruction set (`Isa` values exist only where the CPU
/// has them). The softmax and the copies are element-wise, so 8 or 16 lanes give the same bits.
fn attend(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
            attend_impl(b, s, out)
        }
        #[target_feature(enable = "avx2,fma,avx512f")]
        unsafe fn avx512(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
            attend_impl(b, s, out)
        }
        match b.isa {
            // SAFETY: `Isa::Avx2` exists only where the CPU has AVX2 and FMA.
            Isa::Avx2 => return unsafe { avx2(b, s, out) },
            // SAFETY: `Isa::Avx512` exists only where the CPU has AVX-512 F, AVX2 and FMA.
            Isa::Avx512 => return unsafe { avx512(b, s, out) },
            Isa::Scalar => {}
        }
    }
    attend_impl(b, s, out)
}

/// Every head of the task, one after the other ([`attend_head`]).
#[inline(always)]
fn attend_impl(b: &Block<'_>, s: &mut Scratch, out: &Disjoint<'_, f32>) {
    for head in b.heads.clone() {
        let next = (head + 1 < b.heads.end).then(|| (head + 1) * b.hd);
        attend_head(b, head * b.hd, next, s, out);
    }
}

/// `softmax(scale · Q Kᵀ) V` for one (sequence, head), the head's columns starting at `col0`,
/// into its rows and columns of `out` (row-major, `b.cols` wide). See the module docs for the
/// steps; keys outside the visible window of a query (and the padding of the last key panel)
/// get weight 0. With `next` (the first column of the task's next head), the blocks request
/// that head's key and value rows a share at a time.
#[inline(always)]
fn attend_head(
    b: &Block<'_>,
    col0: usize,
    next: Option<usize>,
    s: &mut Scratch,
    out: &Disjoint<'_, f32>,
) {
    let (hd, n, isa) = (b.hd, b.len, b.isa);
    if n == 0 {
        return;
    }
    let key_panels = n.div_ceil(NR);
    let ld = key_panels * NR;
    let dim_panels = hd.div_ceil(NR);
    let row_at = |r: usize, col0: usize| {
        let at = (b.row0 + r) * b.cols + col0;
        at..at + hd
    };
    let row = |r: usize| row_at(r, col0);
    // The next head's rows requested per block: all of them over the blocks.
    let per_block = n.div_ceil(n.div_ceil(QB));
    let mut requested = 0;
    // Only ever grown with zeros, never written.
    let zeros = &*sized(&mut s.zeros, dim_panels * NR, 0.0);
    let keys = sized(&mut s.keys, key_panels * hd, PanelRow([0.0; NR]));
    let values = sized(&mut s.values, dim_panels * ld, PanelRow([0.0; NR]));
    let key = |j: usize| &b.k[row(j)];
    let value = |j: usize| &b.v[row(j)];
    let rows = (0..n, key, value);
    fill_panels(isa, hd, b.scale, zeros, rows, keys, values);
    let visible = |i: usize| match b.radius {
        Some(r) => (i.saturating_sub(r), (i + r + 1).min(n)),
        None => (0, n),
    };
    let panels = Panels {
        isa,
        hd,
        keys,
        values,
        ld,
        softcap: None,
    };
    let mut i0 = 0;
    while i0 < n {
        let nq = QB.min(n - i0);
        // The next block's query rows, read in place by the products.
        for i in (i0 + QB..n).take(QB) {
            prefetch_rows::<f32>(&[&b.q[row(i)]]);
        }
        if let Some(c) = next {
            for j in requested..(requested + per_block).min(n) {
                prefetch_rows_l2::<f32>(&[&b.k[row_at(j, c)], &b.v[row_at(j, c)]]);
            }
            requested += per_block;
        }
        // Rows past the sequence stand for its last query: computed, never stored.
        let mut queries: [&[f32]; QB] = [zeros; QB];
        for (i, q) in queries.iter_mut().enumerate() {
            *q = &b.q[row(i0 + i.min(nq - 1))];
        }
        let mut seen = [(0, 0); QB];
        for (i, v) in seen.iter_mut().enumerate() {
            *v = visible(i0 + i.min(nq - 1));
        }
        let totals = attend_block(&panels, &queries, nq, &seen, &mut s.block);
        for (i, &t) in totals.sum.iter().enumerate().take(nq) {
            let inv = 1.0 / t;
            // SAFETY: this task is the only one that writes the head's columns of the
            // sequence's rows.
            let dst = unsafe { out.slice(row(i0 + i)) };
            for (y, &x) in dst.iter_mut().zip(s.block.output(i, hd)) {
                *y = x * inv;
            }
        }
        i0 += nq;
    }
}

/// Keys `16·panels` as key and value panels (see [`Panels`]; `panels = keys.len() / hd`):
/// `rows = (seen, key, value)`: key `j`'s rows are `key(j)` and `value(j)`, `hd` values each,
/// for `j` in `seen`; the entries of the others are zero. The rows of the next panel are
/// requested while one is filled: rows of a head are pieces of rows a few KiB apart, rarely in
/// cache (MiniLM's batch of 32 x 256 tokens makes 12 MB of each), and the copies would wait
/// for one miss after another. `zeros` holds `16·⌈hd / 16⌉` zeros, `values` `⌈hd / 16⌉`
/// panels of `16·panels` rows.
#[inline(always)]
fn fill_panels<'a>(
    isa: Isa,
    hd: usize,
    scale: f32,
    zeros: &'a [f32],
    (seen, key, value): (
        Range<usize>,
        impl Fn(usize) -> &'a [f32],
        impl Fn(usize) -> &'a [f32],
    ),
    keys: &mut [PanelRow],
    values: &mut [PanelRow],
) {
    let panels = keys.len() / hd;
    let (ld, dim_panels) = (panels * NR, hd.div_ceil(NR));
    assert!(
        zeros.len() >= dim_panels * NR && values.len() >= dim_panels * ld,
        "fill_panels: short buffers"
    );
    for j in seen.start..seen.end.min(NR) {
        prefetch_rows::<f32>(&[key(j), value(j)]);
    }
    for p in 0..panels {
        for j in ((p + 1) * NR).max(seen.start)..((p + 2) * NR).min(seen.end) {
            prefetch_rows::<f32>(&[key(j), value(j)]);
        }
        // Plain loops, not `array::from_fn`: its closures stayed calls here.
        let mut srcs: [&[f32]; NR] = [zeros; NR];
        for (lane, src) in srcs.iter_mut().enumerate() {
            if seen.contains(&(p * NR + lane)) {
                *src = key(p * NR + lane);
            }
        }
        transpose_panel(isa, &srcs, scale, &mut keys[p * hd..(p + 1) * hd]);
        // Key by key (its row read once), each dim panel's row of it.
        for (lane, src) in srcs.iter_mut().enumerate() {
            let j = p * NR + lane;
            *src = if seen.contains(&j) { value(j) } else { zeros };
            for c in 0..dim_panels {
                let dst = &mut values[c * ld + j].0;
                match src.get(c * NR..(c + 1) * NR) {
                    // A fixed-size copy, not a `memcpy` call.
                    Some(full) => dst.copy_from_slice(full),
                    None => {
                        for (e, x) in dst.iter_mut().enumerate() {
                            *x = src.get(c * NR + e).copied().unwrap_or(0.0);
                        }
                    }
                }
            }
        }
    }
}

/// The keys and values that blocks of queries attend to, as panels on a grid of 16 keys (key
/// `j` of the grid in lane `j % 16` of key panel `j / 16`).
#[derive(Clone, Copy)]
pub(crate) struct Panels<'a> {
    pub(crate) isa: Isa,
    pub(crate) hd: usize,
    /// Key panel `p`: `hd` rows, row `d` holding dim `d` of keys `16p .. 16p + 16`, multiplied
    /// by the softmax scale.
    pub(crate) keys: &'a [PanelRow],
    /// Value panel `c`: `ld` rows, row `j` holding dims `16c .. 16c + 16` of key `j`.
    pub(crate) values: &'a [PanelRow],
    /// Keys on the grid (a multiple of 16): the rows of a value panel.
    pub(crate) ld: usize,
    /// `s = cap · tanh(s / cap)` on each (scaled) score before the softmax.
    pub(crate) softcap: Option<f32>,
}

/// The buffers of [`attend_block`], reused from block to block.
#[derive(Default)]
pub(crate) struct BlockScratch {
    /// The block's scores, then its probabilities: row `i` holds query `i`'s against the keys
    /// the block spans.
    scores: Vec<f32>,
    /// The block's `P V`: row `i` (`dl` apart) holds query `i`'s unnormalised output.
    sums: Vec<f32>,
    dl: usize,
}

impl BlockScratch {
    /// Row `i`'s unnormalised output (`hd` values) from the last [`attend_block`].
    #[inline(always)]
    pub(crate) fn output(&self, i: usize, hd: usize) -> &[f32] {
        &self.sums[i * self.dl..i * self.dl + hd]
    }
}

/// What [`attend_block`] returns: per row of the block, the largest score and the sum of the
/// weights `e^(s − max)` (rows past the block: unspecified).
pub(crate) struct Totals {
    pub(crate) max: [f32; QB],
    pub(crate) sum: [f32; QB],
}

/// Per row of a block, 16 lanes of its maximum, then of its sum: one cache line a row (aligned:
/// the stack does not guarantee it).
#[repr(C, align(64))]
struct Lanes([[f32; NR]; QB]);

/// One block of `nq` (≤ [`QB`]) query rows against `panels`: `queries[i]` (≥ `hd` values; the
/// rows past `nq` repeat the last, computed and never stored) sees the grid's keys
/// `visible(i) = [l, h)` (not empty), which start and end no earlier than the previous row's.
/// Returns each row's largest score `m` and `Σ e^(s − m)` over its keys, and leaves its
/// unnormalised output `Σ e^(s − m) v` in `s` ([`BlockScratch::output`]).
///
/// `S = Q Kᵀ` over the whole key panels that some row sees (12 rows × 32 keys per call, or
/// 6-row tiles for a block of 6 rows or fewer); then along each row of `S`: the soft cap, -∞
/// off the row's keys, its maximum (16 lanes, then a fixed tree), `exp` and the sum (16 lane
/// sums over the panels in order, then the same tree), in place, which leaves `P` in rows that
/// `P V` (12 rows × 32 dims per call) reads in place. Each output depends on its row's values
/// and keys only, never on the other rows of the block: a key outside the row's range weighs 0
/// and adds an exact zero to each sum.
pub(crate) fn attend_block(
    panels: &Panels<'_>,
    queries: &[&[f32]; QB],
    nq: usize,
    visible: &[(usize, usize); QB],
    s: &mut BlockScratch,
) -> Totals {
    let args = (panels, queries, nq, visible, s);
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(args: BlockArgs<'_, '_>) -> Totals {
            block_impl(args)
        }
        #[target_feature(enable = "avx2,fma,avx512f")]
        unsafe fn avx512(args: BlockArgs<'_, '_>) -> Totals {
            block_impl(args)
        }
        match panels.isa {
            // SAFETY: `Isa::Avx2` exists only where the CPU has AVX2 and FMA.
            Isa::Avx2 => return unsafe { avx2(args) },
            // SAFETY: `Isa::Avx512` exists only where the CPU has AVX-512 F, AVX2 and FMA.
            Isa::Avx512 => return unsafe { avx512(args) },
            Isa::Scalar => {}
        }
    }
    block_impl(args)
}

/// The arguments of [`attend_block`].
type BlockArgs<'a, 'b> = (
    &'a Panels<'b>,
    &'a [&'b [f32]; QB],
    usize,
    &'a [(usize, usize); QB],
    &'a mut BlockScratch,
);

/// [`attend_block`] in the build of its caller (a standalone function per instruction set: the
/// same code for the encoders and the decoders).
#[inline(always)]
fn block_impl((panels, queries, nq, visible, s): BlockArgs<'_, '_>) -> Totals {
    let Panels {
        isa,
        hd,
        keys,
        values,
        ld,
        softcap,
    } = *panels;
    let rows = if nq <= MR { MR } else { QB };
    let dl = hd.div_ceil(NR) * NR;
    // The whole key panels that some query of the block sees: keys [c0, c1), `span` of them.
    let (lo, hi) = (visible[0].0, visible[nq - 1].1);
    let (c0, c1) = (lo / NR * NR, hi.div_ceil(NR) * NR);
    let span = c1 - c0;
    s.dl = dl;
    if s.sums.len() < QB * dl {
        s.sums.resize(QB * dl, 0.0);
    }
    let sums = &mut s.sums[..QB * dl];
    if s.scores.len() < QB * span {
        s.scores.resize(QB * span, 0.0);
    }
    let scores = &mut s.scores[..QB * span];
    let mut c = c0;
    while c < c1 {
        let np = if c + 2 * NR <= c1 { 2 } else { 1 };
        let panel = |j: usize| &keys[(c / NR + j.min(np - 1)) * hd..][..hd];
        let panels = [panel(0), panel(1)];
        block_products(
            isa,
            hd,
            rows,
            queries,
            panels,
            np,
            &mut scores[c - c0..],
            span,
        );
        c += np * NR;
    }
    // Softmax along each query's row: -∞ off its keys, the row's maximum, `exp`, and the sum of
    // the row in 16 lanes (panel after panel) reduced by a fixed tree. Step by step over the
    // block's rows: each row's steps form one chain of dependent instructions, and a short row
    // (a sentence) left the out-of-order window little else to run.
    let mut lanes = Lanes([[f32::NEG_INFINITY; NR]; QB]);
    let lanes = &mut lanes.0;
    for (i, lane_max) in lanes.iter_mut().enumerate().take(nq) {
        let (l, h) = visible[i];
        let r = &mut scores[i * span..(i + 1) * span];
        if let Some(cap) = softcap {
            for x in &mut r[l - c0..h - c0] {
                *x = cap * crate::math::tanh(*x / cap);
            }
        }
        for x in &mut r[..l - c0] {
            *x = f32::NEG_INFINITY;
        }
        for x in &mut r[h - c0..] {
            *x = f32::NEG_INFINITY;
        }
        let mut max = [f32::NEG_INFINITY; NR];
        for panel in r.chunks_exact(NR) {
            for (m, &x) in max.iter_mut().zip(panel) {
                *m = if x > *m { x } else { *m };
            }
        }
        *lane_max = max;
    }
    let maxima = lanes.map(|v| lane_reduce(v, |a, b| if b > a { b } else { a }));
    for (i, (lane_sums, &m)) in lanes.iter_mut().zip(&maxima).enumerate().take(nq) {
        // A row that sees no key: every weight `e^-∞ = 0` (not `e^(−∞ + ∞)`).
        // Summed in a local (in registers), not through the array.
        let mut sums = [0.0f32; NR];
        for panel in scores[i * span..(i + 1) * span].chunks_exact_mut(NR) {
            for (x, t) in panel.iter_mut().zip(sums.iter_mut()) {
                *x = crate::math::exp_nonpositive(*x - m);
                *t += *x;
            }
        }
        *lane_sums = sums;
    }
    // Rows past the block: a total of 1 (never used).
    let mut totals = [1.0f32; QB];
    for (t, sums) in totals.iter_mut().zip(lanes.iter()).take(nq) {
        *t = lane_reduce(*sums, |a, b| a + b);
    }
    // `P V` over the same keys, two dim panels per call.
    let mut probs: [&[f32]; QB] = [&scores[..span]; QB];
    for (i, p) in probs.iter_mut().enumerate() {
        let r = i.min(nq - 1) * span;
        *p = &scores[r..r + span];
    }
    let mut d = 0;
    while d < dl {
        let np = if d + 2 * NR <= dl { 2 } else { 1 };
        let panel = |j: usize| &values[(d / NR + j.min(np - 1)) * ld + c0..][..span];
        let panels = [panel(0), panel(1)];
        block_products(isa, span, rows, &probs, panels, np, &mut sums[d..], dl);
        d += np * NR;
    }
    Totals {
        max: maxima,
        sum: totals,
    }
}

/// `op` over 16 lanes by a fixed tree (halves combined lane by lane), the same in every build.
#[inline(always)]
fn lane_reduce(mut v: [f32; NR], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut w = NR / 2;
    while w > 0 {
        for e in 0..w {
            v[e] = op(v[e], v[e + w]);
        }
        w /= 2;
    }
    v[0]
}

/// `out[i·ld + 16j + c] = Σ_p a[i][p] · b[j][p].0[c]` for the first `rows` ([`QB`] or [`MR`])
/// rows `i`, the `np` (1 or 2) weight panels `j` and their 16 columns `c`, over `p < kc`: one
/// fused multiply-add per step in order of `p`, from zero, for every sum and at every level
/// (identical bits). The
/// AVX-512 kernel holds all `QB × 16·np` sums in registers (24 zmm at two panels: per step two
/// panel loads and twelve broadcasts from the rows in place feed 24 FMAs); the AVX2 one runs 6 ×
/// 16 sub-tiles (12 ymm); the portable one `f32::mul_add` loops. Panics when a row holds fewer
/// than `kc` values, a used panel fewer than `kc` rows, or `out` is too short.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block_products(
    isa: Isa,
    kc: usize,
    rows: usize,
    a: &[&[f32]; QB],
    b: [&[PanelRow]; 2],
    np: usize,
    out: &mut [f32],
    ld: usize,
) {
    assert!(
        (rows == MR || rows == QB)
            && (1..=2).contains(&np)
            && a[..rows].iter().all(|r| r.len() >= kc)
            && b[..np].iter().all(|p| p.len() >= kc)
            && out.len() >= (rows - 1) * ld + np * NR,
        "block_products out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let src: [*const f32; QB] = std::array::from_fn(|i| a[i].as_ptr());
        let panels = [b[0].as_ptr(), b[np - 1].as_ptr()];
        let out = out.as_mut_ptr();
        // SAFETY: the levels exist only where the CPU has them (and the callers are built with
        // their features, `attend`); the assert proves every row holds `kc` values, the panels
        // `kc` rows, and `out` every stored row's `16·np` values at `ld` apart.
        unsafe {
            match (isa, rows, np) {
                (Isa::Avx512, MR, 1) => return x86::block512::<MR, 1>(kc, &src, panels, out, ld),
                (Isa::Avx512, MR, _) => return x86::block512::<MR, 2>(kc, &src, panels, out, ld),
                (Isa::Avx512, _, 1) => return x86::block512::<QB, 1>(kc, &src, panels, out, ld),
                (Isa::Avx512, _, _) => return x86::block512::<QB, 2>(kc, &src, panels, out, ld),
                (Isa::Avx2, _, _) => return x86::block256(kc, rows, &src, panels, np, out, ld),
                (Isa::Scalar, _, _) => {}
            }
        }
    }
    for (i, r) in a.iter().enumerate().take(rows) {
        for (j, panel) in b[..np].iter().enumerate() {
            let mut acc = [0.0f32; NR];
            for (&x, w) in r[..kc].iter().zip(&panel[..kc]) {
                for (s, &w) in acc.iter_mut().zip(&w.0) {
                    *s = x.mul_add(w, *s);
                }
            }
            out[i * ld + j * NR..][..NR].copy_from_slice(&acc);
        }
    }
}

/// A panel from 16 rows: `panel[d].0[lane] = scale · srcs[lane][d]` for every
/// `d < panel.len()` (each source at least that long). One multiply per element in every build,
/// so the bits do not depend on the level; the SIMD builds transpose 16 × 16 (AVX-512) or 8 × 8
/// (AVX2) blocks in registers where the head dim is a multiple of the block, instead of
/// gathering one value per row for each lane.
#[inline(always)]
pub(crate) fn transpose_panel(isa: Isa, srcs: &[&[f32]; NR], scale: f32, panel: &mut [PanelRow]) {
    let hd = panel.len();
    assert!(srcs.iter().all(|r| r.len() >= hd), "short key row");
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the levels exist only where the CPU has them; the assert proves every source
        // holds `hd` values, and `panel` has `hd` rows.
        if isa == Isa::Avx512 && hd.is_multiple_of(16) {
            return unsafe { x86::panel16(srcs, scale, panel) };
        }
        if matches!(isa, Isa::Avx2 | Isa::Avx512) && hd.is_multiple_of(8) {
            return unsafe { x86::panel8(srcs, scale, panel) };
        }
    }
    let _ = isa;
    // Dim by dim, so that each row is written whole (lane by lane, each store went to another
    // cache line).
    for (d, step) in panel.iter_mut().enumerate() {
        for (x, src) in step.0.iter_mut().zip(srcs) {
            *x = src[d] * scale;
        }
    }
}

/// The products' kernels and the register transposes of [`transpose_panel`].
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::QB;
    use crate::sgemm::{PanelRow, MR, NR};

    /// Rows `r[i]` of an 8 × 8 block as columns: `out[c][i] = r[i][c]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // Pairs of rows interleaved, then quads (within each 128-bit half), then the halves.
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4h + j]: rows 4h..4h + 4 of columns j (low half) and j + 4 (high half).
        let mut u = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            let (lo, hi) = (t[4 * h], t[4 * h + 1]);
            let (lo2, hi2) = (t[4 * h + 2], t[4 * h + 3]);
            u[4 * h] = _mm256_shuffle_ps::<0x44>(lo, lo2);
            u[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(lo, lo2);
            u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(hi, hi2);
            u[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(hi, hi2);
        }
        let mut out = [_mm256_setzero_ps(); 8];
        for j in 0..4 {
            out[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
            out[j + 4] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
        }
        out
    }

    /// Rows `r[i]` of a 16 × 16 block as columns: `out[c][i] = r[i][c]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4q + j]: in 128-bit lane `l`, rows 4q..4q + 4 of column 4l + j.
        let mut u = [_mm512_setzero_ps(); 16];
        for q in 0..4 {
            let (lo, hi) = (t[4 * q], t[4 * q + 1]);
            let (lo2, hi2) = (t[4 * q + 2], t[4 * q + 3]);
            u[4 * q] = _mm512_shuffle_ps::<0x44>(lo, lo2);
            u[4 * q + 1] = _mm512_shuffle_ps::<0xEE>(lo, lo2);
            u[4 * q + 2] = _mm512_shuffle_ps::<0x44>(hi, hi2);
            u[4 * q + 3] = _mm512_shuffle_ps::<0xEE>(hi, hi2);
        }
        let mut out = [_mm512_setzero_ps(); 16];
        for j in 0..4 {
            // Lanes 0 and 2 / 1 and 3 of rows 0..8, then of rows 8..16.
            let v = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
            let w = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
            let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
            let w2 = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_f32x4::<0x88>(v, v2);
            out[8 + j] = _mm512_shuffle_f32x4::<0xDD>(v, v2);
            out[4 + j] = _mm512_shuffle_f32x4::<0x88>(w, w2);
            out[12 + j] = _mm512_shuffle_f32x4::<0xDD>(w, w2);
        }
        out
    }

    /// `super::transpose_panel` in 8 × 8 blocks.
    ///
    /// # Safety
    /// AVX2 and FMA; every source holds `panel.len()` values, a multiple of 8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel8(srcs: &[&[f32]; NR], scale: f32, panel: &mut [PanelRow]) {
        let s = _mm256_set1_ps(scale);
        for d0 in (0..panel.len()).step_by(8) {
            for l0 in [0, 8] {
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, r) in r.iter_mut().enumerate() {
                    *r = _mm256_mul_ps(_mm256_loadu_ps(srcs[l0 + i].as_ptr().add(d0)), s);
                }
                for (i, c) in transpose8(r).into_iter().enumerate() {
                    _mm256_store_ps(panel[d0 + i].0.as_mut_ptr().add(l0), c);
                }
            }
        }
    }

    /// `super::transpose_panel` in 16 × 16 blocks.
    ///
    /// # Safety
    /// AVX-512 F; every source holds `panel.len()` values, a multiple of 16.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn panel16(srcs: &[&[f32]; NR], scale: f32, panel: &mut [PanelRow]) {
        let s = _mm512_set1_ps(scale);
        for d0 in (0..panel.len()).step_by(16) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (r, src) in r.iter_mut().zip(srcs) {
                *r = _mm512_mul_ps(_mm512_loadu_ps(src.as_ptr().add(d0)), s);
            }
            for (i, c) in transpose16(r).into_iter().enumerate() {
                _mm512_store_ps(panel[d0 + i].0.as_mut_ptr(), c);
            }
        }
    }

    /// `super::block_products` on AVX-512 with `R` rows and `NP` panels: the `R × 16·NP` sums
    /// in registers.
    ///
    /// # Safety
    /// AVX-512 F and FMA, and the caller built with them (this is inlined); `a[i]` points to
    /// `kc` readable values for `i < R`, `b[j]` to `kc` rows for `j < NP`, and `out` holds the
    /// rows `i·ld .. i·ld + 16·NP` for `i < R`.
    #[inline(always)]
    pub(super) unsafe fn block512<const R: usize, const NP: usize>(
        kc: usize,
        a: &[*const f32; QB],
        b: [*const PanelRow; 2],
        out: *mut f32,
        ld: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NP]; R];
        for p in 0..kc {
            let mut w = [_mm512_setzero_ps(); NP];
            for (j, w) in w.iter_mut().enumerate() {
                *w = _mm512_load_ps(b[j].add(p).cast());
            }
            for (sums, row) in acc.iter_mut().zip(a) {
                let x = _mm512_set1_ps(*row.add(p));
                for (s, w) in sums.iter_mut().zip(&w) {
                    *s = _mm512_fmadd_ps(x, *w, *s);
                }
            }
        }
        for (i, sums) in acc.iter().enumerate() {
            for (j, s) in sums.iter().enumerate() {
                _mm512_storeu_ps(out.add(i * ld + j * NR), *s);
            }
        }
    }

    /// `super::block_products` on AVX2: 6 × 16 sub-tiles, each sum the same FMA chain as on
    /// AVX-512.
    ///
    /// # Safety
    /// As [`block512`]'s, with AVX2 and FMA, `rows` (a multiple of 6) rows and `np` (1 or 2)
    /// panels.
    #[inline(always)]
    pub(super) unsafe fn block256(
        kc: usize,
        rows: usize,
        a: &[*const f32; QB],
        b: [*const PanelRow; 2],
        np: usize,
        out: *mut f32,
        ld: usize,
    ) {
        for (j, panel) in b.iter().enumerate().take(np) {
            let panel = panel.cast::<f32>();
            for (h, rows) in a[..rows].chunks_exact(MR).enumerate() {
                let mut acc = [[_mm256_setzero_ps(); 2]; MR];
                for p in 0..kc {
                    let w = [
                        _mm256_load_ps(panel.add(p * NR)),
                        _mm256_load_ps(panel.add(p * NR + 8)),
                    ];
                    for (sums, row) in acc.iter_mut().zip(rows) {
                        let x = _mm256_broadcast_ss(&*row.add(p));
                        sums[0] = _mm256_fmadd_ps(x, w[0], sums[0]);
                        sums[1] = _mm256_fmadd_ps(x, w[1], sums[1]);
                    }
                }
                for (i, sums) in acc.iter().enumerate() {
                    let at = out.add((h * MR + i) * ld + j * NR);
                    _mm256_storeu_ps(at, sums[0]);
                    _mm256_storeu_ps(at.add(8), sums[1]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TaskSplit;

    /// Heads per task of each sequence.
    fn split(lens: &[usize], heads: usize, radius: Option<usize>, threads: usize) -> Vec<usize> {
        let s = TaskSplit::new(lens, heads, radius, threads);
        lens.iter().map(|&l| s.heads_per_task(l)).collect()
    }

    #[test]
    fn tasks_hold_a_share_of_the_work() {
        // MiniLM's batch of 32 equal sequences on two threads: one task per sequence.
        assert_eq!(split(&[128; 32], 12, None, 2), vec![12; 32]);
        // One sequence: a head per task.
        assert_eq!(split(&[128], 12, None, 2), vec![1]);
        // 4 sequences on 2 threads want 16 tasks: 4 per sequence, 3 heads each.
        assert_eq!(split(&[50; 4], 12, None, 2), vec![3; 4]);
        // A long sequence among short ones goes head by head; the short ones stay whole.
        let mut lens = vec![10; 31];
        lens.push(256);
        let per = split(&lens, 12, None, 2);
        assert_eq!(per[31], 1);
        assert!(per[..31].iter().all(|&p| p == 12));
        // A window bounds a row's keys: long windowed sequences count as their window.
        assert_eq!(split(&[4096; 32], 12, Some(64), 2), vec![12; 32]);
        // Degenerate shapes never give 0 (the tasks' `step_by`).
        assert_eq!(split(&[0, 0], 0, None, 0), vec![1, 1]);
        assert_eq!(split(&[], 12, None, 2), Vec::<usize>::new());
        for (lens, heads, threads) in [
            (vec![3, 70, 5, 1], 7, 2),
            (vec![40; 5], 16, 3),
            (vec![1000, 2, 2, 900], 4, 8),
        ] {
            let s = TaskSplit::new(&lens, heads, None, threads);
            for &len in &lens {
                let per = s.heads_per_task(len);
                assert!((1..=heads).contains(&per));
                // No task holds more than its share, unless it is a single head.
                assert!(
                    per == 1 || per * s.head_work(len) <= s.target,
                    "{lens:?} {len}"
                );
            }
        }
    }
}
