//! Throughput probes: what a backend's own kernels sustain, measured through the `Backend`
//! trait so that every device is probed the same way.
//!
//! - [`matmul_rate`]: multiply-adds per second of `matmul` for one weight type at a given number
//!   of activation rows, over a set of matrices larger than the caches used in turn, as a
//!   forward pass streams its layers' weights from memory (so the rate includes what the memory
//!   costs the kernel at that row count).
//! - [`attention_rate`]: multiply-adds per second of attention over a prompt of a model's head
//!   shape (causal, or bidirectional over a packed batch for encoders).
//! - [`elementwise_secs`]: seconds per element of a gated activation over many rows (the
//!   norms, ropes and adds of a pass cost about as much per element).
//! - [`product_latency`], [`op_latency`]: the fixed cost of a product and of one small op of a
//!   decode step, which bound how fast a model with many small layers can step however few
//!   bytes it reads.
//!
//! Each probe runs its op once to warm up, then repeats it for a few windows of at least
//! `min_secs` and keeps the best window (anything else running on the machine can only slow a
//! window down). Inputs are deterministic pseudo-random values; the results are discarded.

use std::time::Instant;

use kiln_backend::{
    Activation, AttentionParams, Backend, Linear, PackedAttentionParams, WeightData,
};
use kiln_core::{GgmlType, SharedBytes};

use crate::EngineError;

/// Timed windows per probe; the best is kept.
const WINDOWS: usize = 5;

/// Deterministic values in [-1, 1) (a 64-bit LCG), so probes do not depend on a random source.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn probe_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Input(format!("probing {what}: {e}"))
}

/// Best operations per second over [`WINDOWS`] windows of at least `min_secs`, where one call of
/// `op` does `work` operations.
fn best_rate<B: Backend>(
    b: &B,
    min_secs: f64,
    work: f64,
    mut op: impl FnMut() -> Result<(), EngineError>,
) -> Result<f64, EngineError> {
    op()?;
    sync(b)?;
    let mut best = 0f64;
    for _ in 0..WINDOWS {
        let t0 = Instant::now();
        let mut calls = 0u64;
        loop {
            op()?;
            sync(b)?;
            calls += 1;
            let secs = t0.elapsed().as_secs_f64();
            if secs >= min_secs {
                best = best.max(calls as f64 * work / secs);
                break;
            }
        }
    }
    Ok(best)
}

/// Waits for a backend that queues work (a GPU) to finish it, so that a timed call is the
/// device's time and not only its recording.
fn sync<B: Backend>(b: &B) -> Result<(), EngineError> {
    b.synchronize()
        .map_err(|e| probe_err("waiting for the device", e))
}

/// A `[n, k]` weight of type `ty` filled with pseudo-random values, as `b` holds it.
pub fn synthetic_linear<B: Backend>(
    b: &B,
    ty: GgmlType,
    k: usize,
    n: usize,
) -> Result<Linear<B>, EngineError> {
    let what = format!("a {ty} matrix");
    let src = values(k * n, 7);
    let size = kiln_quant::quantized_size(ty, src.len()).map_err(|e| probe_err(&what, e))?;
    let mut bytes = vec![0u8; size];
    kiln_quant::quantize(ty, &src, &mut bytes).map_err(|e| probe_err(&what, e))?;
    let weight = b
        .upload_weight(&WeightData {
            name: format!("probe.{ty}"),
            ty,
            dims: vec![k, n],
            bytes: SharedBytes::from_vec(bytes),
        })
        .map_err(|e| probe_err(&what, e))?;
    Ok(Linear {
        weight: std::sync::Arc::new(weight),
        bias: None,
        in_features: k,
        out_features: n,
        ty,
    })
}

/// Multiply-adds per second of `b.matmul` with `rows` activation rows against `[n, k]` matrices
/// of type `ty`, used in turn from a set of about `stream_bytes` (copies of one matrix at
/// different addresses), not counting `latency` seconds of fixed cost per call (see
/// [`product_latency`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul_rate<B: Backend>(
    b: &B,
    ty: GgmlType,
    rows: usize,
    k: usize,
    n: usize,
    stream_bytes: usize,
    min_secs: f64,
    latency: f64,
) -> Result<f64, EngineError> {
    let first = synthetic_linear(b, ty, k, n)?;
    let what = format!("a {ty} matrix");
    let size = kiln_quant::quantized_size(ty, k * n).map_err(|e| probe_err(&what, e))?;
    let copies = (stream_bytes / size.max(1)).max(1);
    let mut ws = vec![first];
    if copies > 1 {
        let src = values(k * n, 7);
        let mut bytes = vec![0u8; size];
        kiln_quant::quantize(ty, &src, &mut bytes).map_err(|e| probe_err(&what, e))?;
        for _ in 1..copies {
            let weight = b
                .upload_weight(&WeightData {
                    name: format!("probe.{ty}"),
                    ty,
                    dims: vec![k, n],
                    bytes: SharedBytes::from_vec(bytes.clone()),
                })
                .map_err(|e| probe_err(&what, e))?;
            ws.push(Linear {
                weight: std::sync::Arc::new(weight),
                bias: None,
                in_features: k,
                out_features: n,
                ty,
            });
        }
    }
    let x = b
        .tensor_from_f32(&values(rows * k, 3), rows, k)
        .map_err(|e| probe_err("activations", e))?;
    let work = (rows * k * n) as f64;
    let mut next = 0;
    let calls_per_s = b.run(|| {
        best_rate(b, min_secs, 1.0, || {
            next = (next + 1) % ws.len();
            b.matmul(&x, &ws[next])
                .map(drop)
                .map_err(|e| probe_err(&format!("a {ty} product"), e))
        })
    })?;
    // A call's seconds less its fixed cost, floored at a tenth of the call.
    let secs = 1.0 / calls_per_s;
    Ok(work / (secs - latency).max(secs / 10.0))
}

/// Seconds of a matrix product's fixed cost: one row against a tiny Q8_0 matrix (one block
/// per row, 64 rows), whose arithmetic is negligible.
pub fn product_latency<B: Backend>(b: &B, min_secs: f64) -> Result<f64, EngineError> {
    let w = synthetic_linear(b, GgmlType::Q8_0, 32, 64)?;
    let x = b
        .tensor_from_f32(&values(32, 4), 1, 32)
        .map_err(|e| probe_err("activations", e))?;
    let per_s = b.run(|| {
        best_rate(b, min_secs, 1.0, || {
            b.matmul(&x, &w)
                .map(drop)
                .map_err(|e| probe_err("a tiny product", e))
        })
    })?;
    Ok(1.0 / per_s)
}

/// The shape of an attention probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Prompt length: queries at positions `0..tokens`.
    pub tokens: usize,
    /// Causal (a decoder's prompt) or bidirectional (an encoder's sentence, packed).
    pub causal: bool,
}

impl AttentionShape {
    /// Multiply-adds of one pass (`q·k` and `p·v` over every visible position).
    pub fn macs(&self) -> f64 {
        let t = self.tokens;
        let visible = if self.causal { t * (t + 1) / 2 } else { t * t } as f64;
        visible * (self.n_heads * self.head_dim * 2) as f64
    }

    /// The cache key of its rate.
    pub fn key(&self) -> String {
        format!(
            "{} heads / {} kv of {}{}",
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            if self.causal { ", causal" } else { ", packed" }
        )
    }
}

/// Multiply-adds per second of attention over a whole prompt of `shape`.
pub fn attention_rate<B: Backend>(
    b: &B,
    shape: AttentionShape,
    min_secs: f64,
) -> Result<f64, EngineError> {
    let s = shape;
    let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let err = |e| probe_err("attention", e);
    let tensor = |seed, cols| b.tensor_from_f32(&values(s.tokens * cols, seed), s.tokens, cols);
    let q = tensor(11, qd).map_err(err)?;
    let k = tensor(12, kvd).map_err(err)?;
    let v = tensor(13, kvd).map_err(err)?;
    // Causal attention reads a KV cache, in the element type the backend stores it in.
    let cache = |x: &B::Tensor| -> kiln_backend::Result<B::Kv> {
        let mut c = b.kv_zeros(s.tokens, kvd)?;
        b.write_kv_rows(&mut c, 0, x)?;
        Ok(c)
    };
    let caches = if s.causal {
        Some((cache(&k).map_err(err)?, cache(&v).map_err(err)?))
    } else {
        None
    };
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let params = AttentionParams {
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        scale,
        sliding_window: None,
        softcap: None,
    };
    let packed = PackedAttentionParams {
        n_heads: s.n_heads,
        head_dim: s.head_dim,
        scale,
        radius: None,
    };
    b.run(|| {
        best_rate(b, min_secs, s.macs(), || {
            if let Some((kc, vc)) = &caches {
                b.attention(&q, kc, vc, 0, s.tokens, &params)
            } else {
                b.packed_attention(&q, &k, &v, &[s.tokens], &packed)
            }
            .map(drop)
            .map_err(err)
        })
    })
}

/// Seconds per element of a gated activation (`act(g) · u`) over `[rows, cols]`.
pub fn elementwise_secs<B: Backend>(
    b: &B,
    act: Activation,
    rows: usize,
    cols: usize,
    min_secs: f64,
) -> Result<f64, EngineError> {
    let err = |e| probe_err("an element-wise op", e);
    let g = b
        .tensor_from_f32(&values(rows * cols, 8), rows, cols)
        .map_err(err)?;
    let u = b
        .tensor_from_f32(&values(rows * cols, 9), rows, cols)
        .map_err(err)?;
    let per_s = b.run(|| {
        best_rate(b, min_secs, (rows * cols) as f64, || {
            b.gated_activation(&g, &u, act).map(drop).map_err(err)
        })
    })?;
    Ok(1.0 / per_s)
}

/// Seconds of one small op of a decode step: an RMS norm over one row of `d` values.
pub fn op_latency<B: Backend>(b: &B, d: usize, min_secs: f64) -> Result<f64, EngineError> {
    let err = |e| probe_err("a small op", e);
    let x = b.tensor_from_f32(&values(d, 5), 1, d).map_err(err)?;
    let w = b
        .upload_weight(&WeightData {
            name: "probe.norm".into(),
            ty: GgmlType::F32,
            dims: vec![d],
            bytes: SharedBytes::from_vec(
                values(d, 6).iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        })
        .map_err(err)?;
    let per_s = b.run(|| {
        best_rate(b, min_secs, 1.0, || {
            b.rms_norm(&x, &w, 1e-6).map(drop).map_err(err)
        })
    })?;
    Ok(1.0 / per_s)
}

/// Bytes per second a device moves copying a tensor of `bytes` within its own memory (reads
/// and writes counted): the bandwidth a GPU's kernels stream weights at, roughly.
pub fn copy_bandwidth<B: Backend>(b: &B, bytes: usize, min_secs: f64) -> Result<f64, EngineError> {
    let cols = 1024;
    let rows = (bytes / 4 / cols).max(1);
    let err = |e| probe_err("a copy", e);
    let x = b.zeros(rows, cols).map_err(err)?;
    let moved = (2 * rows * cols * 4) as f64;
    best_rate(b, min_secs, moved, || {
        b.rows(&x, 0..rows).map(drop).map_err(err)
    })
}
