//! Throughput probes: what a backend's own kernels sustain, measured through the `Backend`
//! trait so that every device is probed the same way.
//!
//! - [`matmul_rate`]: multiply-adds per second of `matmul` for one weight type at a given number
//!   of activation rows, over a matrix small enough to stay in cache (the arithmetic limit; the
//!   memory limit is the bandwidth probe's business).
//! - [`attention_rate`]: multiply-adds per second of causal attention over a prompt.
//! - [`op_latency`]: the fixed cost of one small op of a decode step (a norm over one row),
//!   which bounds how fast a model with many small layers can step however few bytes it reads.
//!
//! Each probe runs its op once to warm up, then repeats it for a few windows of at least
//! `min_secs` and keeps the best window (anything else running on the machine can only slow a
//! window down). Inputs are deterministic pseudo-random values; the results are discarded.

use std::time::Instant;

use kiln_backend::{AttentionParams, Backend, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};

use crate::EngineError;

/// Timed windows per probe; the best is kept.
const WINDOWS: usize = 3;

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
fn best_rate(
    min_secs: f64,
    work: f64,
    mut op: impl FnMut() -> Result<(), EngineError>,
) -> Result<f64, EngineError> {
    op()?;
    let mut best = 0f64;
    for _ in 0..WINDOWS {
        let t0 = Instant::now();
        let mut calls = 0u64;
        loop {
            op()?;
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

/// Multiply-adds per second of `b.matmul` with `rows` activation rows against a `[n, k]` matrix
/// of type `ty`, not counting `latency` seconds of fixed cost per call (see
/// [`product_latency`]).
pub fn matmul_rate<B: Backend>(
    b: &B,
    ty: GgmlType,
    rows: usize,
    k: usize,
    n: usize,
    min_secs: f64,
    latency: f64,
) -> Result<f64, EngineError> {
    let w = synthetic_linear(b, ty, k, n)?;
    let x = b
        .tensor_from_f32(&values(rows * k, 3), rows, k)
        .map_err(|e| probe_err("activations", e))?;
    let work = (rows * k * n) as f64;
    let calls_per_s = b.run(|| {
        best_rate(min_secs, 1.0, || {
            b.matmul(&x, &w)
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
        best_rate(min_secs, 1.0, || {
            b.matmul(&x, &w)
                .map(drop)
                .map_err(|e| probe_err("a tiny product", e))
        })
    })?;
    Ok(1.0 / per_s)
}

/// The shape of an attention probe.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Prompt length: queries at positions `0..tokens`, each attending to itself and before.
    pub tokens: usize,
}

impl AttentionShape {
    /// Multiply-adds of one causal pass (`q·k` and `p·v` over every visible position).
    pub fn macs(&self) -> f64 {
        let visible = (self.tokens * (self.tokens + 1) / 2) as f64;
        visible * (self.n_heads * self.head_dim * 2) as f64
    }
}

/// Multiply-adds per second of causal attention over a whole prompt of `shape`.
pub fn attention_rate<B: Backend>(
    b: &B,
    shape: AttentionShape,
    min_secs: f64,
) -> Result<f64, EngineError> {
    let s = shape;
    let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let err = |e| probe_err("attention", e);
    let q = b
        .tensor_from_f32(&values(s.tokens * qd, 11), s.tokens, qd)
        .map_err(err)?;
    let k = b
        .tensor_from_f32(&values(s.tokens * kvd, 12), s.tokens, kvd)
        .map_err(err)?;
    let v = b
        .tensor_from_f32(&values(s.tokens * kvd, 13), s.tokens, kvd)
        .map_err(err)?;
    let params = AttentionParams {
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        sliding_window: None,
        softcap: None,
    };
    b.run(|| {
        best_rate(min_secs, s.macs(), || {
            b.attention(&q, &k, &v, 0, s.tokens, &params)
                .map(drop)
                .map_err(err)
        })
    })
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
        best_rate(min_secs, 1.0, || {
            b.rms_norm(&x, &w, 1e-6).map(drop).map_err(err)
        })
    })?;
    Ok(1.0 / per_s)
}
