//! Row-wise ops: RMS norm, layer norm and rotary embeddings.

use std::sync::{Arc, Mutex};

use kiln_backend::{shape_err, Result, RopeParams, RopeStyle};

use crate::context::{for_each_chunk, Context, PARALLEL_MIN_ELEMENTS};
use crate::tensor::CpuTensor;

/// The sines and cosines of the rope calls of the current step: a decode step ropes the same
/// positions with the same parameters in every layer (twice: queries and keys), and the
/// `sin`/`cos` of those angles (in f64) cost more than the rotations. The last [`ROPE_TABLES`]
/// (parameters, positions) are kept; a call with others computes them afresh. Entries are
/// computed exactly as an uncached call would, so the results are the same bits.
#[derive(Default)]
pub(crate) struct RopeTables(Mutex<Vec<Arc<RopeTable>>>);

/// Tables kept: enough for models that alternate two rope settings (Gemma's local and global
/// layers) with a few spares.
const ROPE_TABLES: usize = 4;

/// `sin` and `cos` (times `mscale`) of every frequency at each of `positions`.
pub(crate) struct RopeTable {
    key: RopeKey,
    positions: Vec<u32>,
    sin: Vec<f32>,
    cos: Vec<f32>,
}

/// What the angles depend on (f32s by their bits).
#[derive(PartialEq)]
struct RopeKey {
    rope_dim: usize,
    base: u32,
    freq_scale: u32,
    mscale: u32,
    freq_factors: Option<Vec<u32>>,
}

impl RopeKey {
    fn of(p: &RopeParams) -> RopeKey {
        RopeKey {
            rope_dim: p.rope_dim,
            base: p.base.to_bits(),
            freq_scale: p.freq_scale.to_bits(),
            mscale: p.mscale.to_bits(),
            freq_factors: p
                .freq_factors
                .as_ref()
                .map(|f| f.iter().map(|v| v.to_bits()).collect()),
        }
    }
}

impl RopeTable {
    /// Angles in f64, rounded once: as exact as f32 allows at any position.
    fn new(p: &RopeParams, key: RopeKey, positions: &[u32]) -> RopeTable {
        let half = p.rope_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| {
                let f = (p.freq_scale as f64)
                    * (p.base as f64).powf(-2.0 * i as f64 / p.rope_dim as f64);
                match &p.freq_factors {
                    Some(factors) => f / factors[i] as f64,
                    None => f,
                }
            })
            .collect();
        let mscale = p.mscale as f64;
        let (mut sin, mut cos) = (Vec::new(), Vec::new());
        for &pos in positions {
            for f in &inv_freq {
                let theta = pos as f64 * f;
                sin.push((mscale * theta.sin()) as f32);
                cos.push((mscale * theta.cos()) as f32);
            }
        }
        RopeTable {
            key,
            positions: positions.to_vec(),
            sin,
            cos,
        }
    }

    /// The sines and cosines of the `r`-th position.
    fn row(&self, r: usize) -> (&[f32], &[f32]) {
        let half = self.key.rope_dim / 2;
        let at = r * half..(r + 1) * half;
        (&self.sin[at.clone()], &self.cos[at])
    }
}

impl RopeTables {
    /// The table of `p` at `positions`: a kept one, or a new one (then kept, the oldest dropped).
    fn get(&self, p: &RopeParams, positions: &[u32]) -> Arc<RopeTable> {
        let key = RopeKey::of(p);
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = kept
            .iter()
            .find(|t| t.key == key && t.positions == positions)
        {
            return Arc::clone(t);
        }
        let table = Arc::new(RopeTable::new(p, key, positions));
        if kept.len() == ROPE_TABLES {
            kept.remove(0);
        }
        kept.push(Arc::clone(&table));
        table
    }
}

/// Rows per parallel task for cheap row-wise ops (small batches stay on one thread).
const ROWS_PER_TASK: usize = 16;

/// How many rows ahead [`layer_norm`] requests its inputs. MiniLM's 128-token batches (rows of
/// 384) on a Zen 5 host, 2 threads: the norm's samples in `perf` fell from 1,116-1,123 to 912-919
/// at 4 (893-997 at 8); the whole forward 0.7 % faster.
const NORM_PREFETCH_ROWS: usize = 4;

/// A new tensor of `x`'s shape whose row `i` is written by `f(i, x.row(i), out_row)`, with
/// [`ROWS_PER_TASK`] rows per pool task when the tensor is large enough to split.
fn map_rows(
    cpu: &Context,
    x: &CpuTensor,
    f: impl Fn(usize, &[f32], &mut [f32]) + Sync + Send,
) -> CpuTensor {
    // `f` writes every element of its row.
    let mut out = crate::buffers::take(x.data.len());
    let cols = x.cols.max(1);
    let parallel = x.data.len() >= PARALLEL_MIN_ELEMENTS;
    for_each_chunk(
        cpu,
        &mut out,
        cols * ROWS_PER_TASK,
        parallel,
        |task, chunk| {
            for (r, out_row) in chunk.chunks_mut(cols).enumerate() {
                let row = task * ROWS_PER_TASK + r;
                f(row, x.row(row), out_row);
            }
        },
    );
    CpuTensor {
        data: out,
        rows: x.rows,
        cols: x.cols,
    }
}

/// `y = x / sqrt(mean(x²) + eps) * w` over each group of `w.len()` elements of each row, plus
/// `residual` when given. The sum of squares is accumulated in f64 (as llama.cpp does) in a fixed
/// order (`math::sum_squares_f64`), so the result is the same bits in every build and at any
/// thread count.
pub(crate) fn rms_norm(
    cpu: &Context,
    x: &CpuTensor,
    w: &[f32],
    eps: f32,
    residual: Option<&CpuTensor>,
) -> Result<CpuTensor> {
    let group = w.len();
    if group == 0 || !x.cols.is_multiple_of(group) {
        return Err(shape_err(
            "rms_norm",
            format!("weight of {group} does not divide rows of {}", x.cols),
        ));
    }
    let avx2 = cpu.avx2();
    Ok(map_rows(cpu, x, |row, xr, out_row| {
        crate::math::rms_norm_into(avx2, xr, w, eps, residual.map(|r| r.row(row)), out_row)
    }))
}

/// Rotary embedding; angles are computed in f64 and rounded once, so they are as exact as f32
/// allows at any position.
pub(crate) fn rope(
    cpu: &Context,
    tables: &RopeTables,
    x: &CpuTensor,
    positions: &[u32],
    p: &RopeParams,
) -> Result<CpuTensor> {
    p.check(x.rows, x.cols, positions.len())?;
    let table = tables.get(p, positions);
    let mut out = crate::buffers::take(x.data.len());
    out.copy_from_slice(&x.data);
    let cols = x.cols.max(1);
    let parallel = x.data.len() >= PARALLEL_MIN_ELEMENTS;
    let (avx2, neox) = (cpu.avx2(), p.style == RopeStyle::Neox);
    for_each_chunk(cpu, &mut out, cols, parallel, |r, row| {
        let (sin, cos) = table.row(r);
        crate::math::rope_into(avx2, row, p.head_dim, neox, sin, cos)
    });
    Ok(CpuTensor {
        data: out,
        rows: x.rows,
        cols: x.cols,
    })
}

/// `y = (x − mean) / sqrt(var + eps) · w (+ b)` over each row, of `residual + x` when a
/// residual is given (in one pass: the same bits as adding first, without the intermediate
/// tensor). Mean and biased variance are accumulated in f64 (two passes), so the result does not
/// depend on summation order.
pub(crate) fn layer_norm(
    cpu: &Context,
    x: &CpuTensor,
    w: &[f32],
    b: Option<&[f32]>,
    eps: f32,
    residual: Option<&CpuTensor>,
) -> Result<CpuTensor> {
    if w.len() != x.cols
        || b.is_some_and(|b| b.len() != x.cols)
        || residual.is_some_and(|r| (r.rows, r.cols) != (x.rows, x.cols))
    {
        return Err(shape_err(
            "layer_norm",
            format!(
                "weight {} / bias {:?} / residual {:?} for [{}, {}]",
                w.len(),
                b.map(|b| b.len()),
                residual.map(|r| [r.rows, r.cols]),
                x.rows,
                x.cols
            ),
        ));
    }
    let avx2 = cpu.avx2();
    Ok(map_rows(cpu, x, |row, xr, out_row| {
        // The inputs' rows `NORM_PREFETCH_ROWS` further on, requested now: an encoder's norm
        // reads two tensors that have left L2 (the product just made and the residual), and
        // waited on them line by line.
        if row + NORM_PREFETCH_ROWS < x.rows {
            let ahead = row + NORM_PREFETCH_ROWS;
            crate::kernels::prefetch_rows::<f32>(&[x.row(ahead)]);
            if let Some(r) = residual {
                crate::kernels::prefetch_rows::<f32>(&[r.row(ahead)]);
            }
        }
        layer_norm_row(avx2, xr, residual.map(|r| r.row(row)), w, b, eps, out_row)
    }))
}

crate::math::avx2_dispatch!(
    /// [`layer_norm_row_impl`], vectorized when `avx2`.
    fn layer_norm_row(
        x: &[f32],
        residual: Option<&[f32]>,
        w: &[f32],
        b: Option<&[f32]>,
        eps: f32,
        out: &mut [f32]
    ) => layer_norm_row_impl
);

/// One row of [`layer_norm`] (all slices of one length).
#[inline(always)]
fn layer_norm_row_impl(
    x: &[f32],
    residual: Option<&[f32]>,
    w: &[f32],
    b: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) {
    let src = match residual {
        Some(res) => {
            for ((o, &r), &v) in out.iter_mut().zip(res).zip(x) {
                *o = r + v;
            }
            &*out
        }
        None => x,
    };
    let (mean, inv) = mean_inv_std(src, eps);
    match residual {
        Some(_) => {
            for (o, &g) in out.iter_mut().zip(w) {
                *o = (*o - mean) * inv * g;
            }
        }
        None => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
                *o = (v - mean) * inv * g;
            }
        }
    }
    if let Some(b) = b {
        for (o, &bv) in out.iter_mut().zip(b) {
            *o += bv;
        }
    }
}

/// Mean and `1 / sqrt(var + eps)` of a non-empty row (biased variance), both accumulated in f64
/// over eight running sums (element `i` into sum `i % 8`, then the sums in order), which
/// vectorizes and keeps the result independent of how rows are split across threads.
#[inline(always)]
fn mean_inv_std(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f64;
    let mean = lanes_sum(row, |v| v as f64) / n;
    let var = lanes_sum(row, |v| (v as f64 - mean) * (v as f64 - mean)) / n;
    (mean as f32, (1.0 / (var + eps as f64).sqrt()) as f32)
}

/// `Σ f(row[i])` in f64: element `i` into running sum `i % 8`, then the eight sums in order.
#[inline(always)]
fn lanes_sum(row: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let (chunks, tail) = row.split_at(row.len() / 8 * 8);
    let mut acc = [0.0f64; 8];
    for c in chunks.chunks_exact(8) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += f(v);
    }
    acc.iter().sum()
}
