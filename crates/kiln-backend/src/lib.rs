//! kiln-backend: the `Backend` trait every device implements, and the weight types model code
//! holds.
//!
//! Model code (kiln-models) is generic over `B: Backend` and calls only these primitives; it never
//! names a device. The trait names math, not models: an op that only one architecture needs is
//! composed from primitives in the model, not added here.
//!
//! Shapes: activations are 2-D, row-major `[rows, cols]` where a row is one token. Weights keep
//! the GGUF convention: a matrix of `dims = [k, n]` has `n` rows of `k` contiguous elements, and
//! `matmul` computes `y[m, n] = x[m, k] · Wᵀ`.
//!
//! Errors: ops return `Result` because devices can fail (out of memory, a launch error); shape
//! mismatches are programming errors of the caller but are still reported as
//! [`BackendError::Shape`] rather than panics, so a malformed model file can never crash a server.

pub mod gptq;
mod ops;
mod weight;

pub use gptq::{GptqError, GptqMatrix, GptqTensors};
pub use ops::{
    Activation, AttentionJob, AttentionParams, KvDtype, KvPages, PackedAttentionParams, RopeParams,
    RopeStyle,
};
pub use weight::{Linear, WeightData};

use std::ops::Range;

/// Errors of backend operations.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("weight {name}: {detail}")]
    Weight { name: String, detail: String },
    /// A value the operation's storage cannot hold (a key too large for an f16 KV cache).
    #[error("value out of range in {op}: {detail}")]
    Range { op: &'static str, detail: String },
    #[error("{backend} backend: {detail}")]
    Device {
        backend: &'static str,
        detail: String,
    },
    /// The device cannot hold an allocation of `bytes` (for `what`); the backend stays usable,
    /// so a caller can free memory or ask for less.
    #[error(
        "{backend} backend: out of memory: {bytes} bytes ({:.1} MiB) for {what} on {device}: {detail}",
        *bytes as f64 / 1048576.0
    )]
    OutOfMemory {
        backend: &'static str,
        device: String,
        bytes: u64,
        what: String,
        detail: String,
    },
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// Build a [`BackendError::Shape`] (helper for backends).
pub fn shape_err(op: &'static str, detail: impl Into<String>) -> BackendError {
    BackendError::Shape {
        op,
        detail: detail.into(),
    }
}

/// A compute device: primitives over its own tensors and weights.
///
/// Implementations must be deterministic for a given thread count and, for the ops marked so,
/// independent of it (the CPU backend computes every output element with the same instruction
/// sequence whatever the split).
pub trait Backend: Send + Sync + Sized + 'static {
    /// A 2-D f32 activation tensor resident on the device.
    type Tensor: Send + Sync;
    /// An immutable weight resident on the device (quantized blocks stay quantized).
    type Weight: Send + Sync;
    /// One layer's keys or values: a `[rows, cols]` cache in the backend's [`KvDtype`], written
    /// by [`Backend::write_kv_rows`] and read by the attention ops only.
    type Kv: Send + Sync;

    /// Short name for logs ("cpu", "vulkan:0 (NVIDIA H100)").
    fn name(&self) -> String;

    /// The CPU threads a forward pass keeps busy: the CPU backend's team; a backend that runs
    /// on a device, the one thread that records its work and waits (the default). The
    /// scheduler overlaps its own CPU work (grammar masks) with a forward pass only on the
    /// cores this leaves free: on an oversubscribed CPU a fork-join team waits for its slowest
    /// member.
    fn host_threads(&self) -> usize {
        1
    }

    /// Run a whole computation (a forward pass) in the backend's execution context; a backend
    /// with nothing to set up just calls `f` (the default). The CPU backend has nothing to set
    /// up: its ops take the calling thread into their team of workers.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Waits until every op called so far has run. Ops of a backend that queues work for a
    /// device (a GPU) return once recorded; reading a result back waits anyway, so only timing
    /// needs this. The default (a backend that computes in the call) returns at once.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Make a weight usable by this device. The CPU keeps a zero-copy view of the file; a GPU
    /// copies it once. Fails with [`BackendError::Weight`] for a type the device cannot compute.
    fn upload_weight(&self, data: &WeightData) -> Result<Self::Weight>;

    /// Make a GPTQ 4-bit matrix usable by this device, kept packed. Devices without a GPTQ
    /// kernel refuse it by name.
    fn upload_gptq(&self, name: &str, matrix: std::sync::Arc<GptqMatrix>) -> Result<Self::Weight> {
        let _ = matrix;
        Err(BackendError::Weight {
            name: name.to_string(),
            detail: format!("the {} backend has no GPTQ kernel", self.name()),
        })
    }

    // ---- tensors -------------------------------------------------------------------------
    /// A `[rows, cols]` tensor of zeros.
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// A `[rows, cols]` KV cache of zeros, in [`Backend::kv_dtype`].
    fn kv_zeros(&self, rows: usize, cols: usize) -> Result<Self::Kv>;
    /// The element type [`Backend::kv_zeros`] stores keys and values in.
    fn kv_dtype(&self) -> KvDtype;
    /// `(rows, cols)` of a KV cache.
    fn kv_shape(&self, x: &Self::Kv) -> (usize, usize);
    /// A KV cache's values (as stored: rounded to its element type) back on the host,
    /// row-major.
    fn kv_to_f32(&self, x: &Self::Kv) -> Result<Vec<f32>>;
    /// Copy host data (`rows * cols` values, row-major) to the device.
    fn tensor_from_f32(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// Copy a tensor back to the host, row-major.
    fn to_f32(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// `(rows, cols)`.
    fn shape(&self, x: &Self::Tensor) -> (usize, usize);
    /// A copy of rows `range` of `x`.
    fn rows(&self, x: &Self::Tensor, range: Range<usize>) -> Result<Self::Tensor>;
    /// Overwrite rows `dst_row..dst_row + src.rows` of `dst` with `src`.
    fn write_rows(&self, dst: &mut Self::Tensor, dst_row: usize, src: &Self::Tensor) -> Result<()>;
    /// Overwrite rows `dst_row..dst_row + src.rows` of the cache `dst` with `src` (KV-cache
    /// append), rounded to the cache's element type. A finite value the element type cannot hold
    /// (65520 or more in f16) is refused with [`BackendError::Range`] and the cache keeps its
    /// rows; a backend that records work for the device to run later (a GPU) may report that
    /// error at its next read back (`to_f32`, `kv_to_f32`) instead of here.
    fn write_kv_rows(&self, dst: &mut Self::Kv, dst_row: usize, src: &Self::Tensor) -> Result<()>;
    /// Rows `index[0], index[1], …` of `x`, in that order (the tokens routed to one expert).
    fn gather_rows(&self, x: &Self::Tensor, index: &[u32]) -> Result<Self::Tensor>;
    /// `dst[index[i]] += weights[i] · src[i]` for every row `i` of `src`, in order of `i`.
    fn scatter_add_rows(
        &self,
        dst: &mut Self::Tensor,
        index: &[u32],
        src: &Self::Tensor,
        weights: &[f32],
    ) -> Result<()>;

    // ---- primitives ----------------------------------------------------------------------
    /// Rows of an embedding table `[vocab, d]` (any supported weight type), dequantized to f32.
    fn embedding(&self, table: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor>;
    /// `y[m, n] = x[m, k] · Wᵀ (+ bias)`.
    fn matmul(&self, x: &Self::Tensor, w: &Linear<Self>) -> Result<Self::Tensor>;
    /// `x · Wᵢᵀ` for several weights that share the input (Q/K/V, gate/up), in order. Same values
    /// as one `matmul` per weight; one call lets a backend prepare `x` once and run the products
    /// as one parallel job (a decode step's products are small enough for the per-job cost to
    /// show).
    fn matmul_many(&self, x: &Self::Tensor, ws: &[&Linear<Self>]) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|w| self.matmul(x, w)).collect()
    }
    /// RMS norm over every group of `weight.len()` consecutive elements of each row:
    /// `y = x / sqrt(mean(x²) + eps) * weight`. With the group equal to the row this is the usual
    /// norm; with a group of `head_dim` it is a per-head (QK) norm.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Weight, eps: f32) -> Result<Self::Tensor>;
    /// Layer norm of each row: `y = (x − mean) / sqrt(var + eps) · weight (+ bias)`, with the
    /// biased variance (PyTorch's `LayerNorm`).
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Weight,
        bias: Option<&Self::Weight>,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// Rotary position embedding on every head of every row; row `i` is at `positions[i]`.
    fn rope(
        &self,
        x: &Self::Tensor,
        positions: &[u32],
        params: &RopeParams,
    ) -> Result<Self::Tensor>;
    /// Causal attention of `q` (`[n, n_heads * head_dim]`, row `i` at position `q_pos + i`)
    /// over the first `n_kv` rows of the caches (`[capacity, n_kv_heads * head_dim]`, row `j`
    /// at position `j`), with grouped-query heads, optional sliding window and soft-capping.
    fn attention(
        &self,
        q: &Self::Tensor,
        k_cache: &Self::Kv,
        v_cache: &Self::Kv,
        q_pos: usize,
        n_kv: usize,
        params: &AttentionParams,
    ) -> Result<Self::Tensor>;
    /// [`Backend::attention`] over a paged cache: logical row `j` of the caches is the row
    /// `pages` maps it to in `k_pool`/`v_pool` (`[n_blocks * block_size, kv_cols]`); otherwise
    /// the same operation, with the same results as over a contiguous copy of those rows. Only
    /// the rows the queries see are read and checked (from
    /// [`AttentionParams::first_key`]`(q_pos)` on): a windowed table may hold anything below.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention(
        &self,
        q: &Self::Tensor,
        k_pool: &Self::Kv,
        v_pool: &Self::Kv,
        pages: &KvPages<'_>,
        q_pos: usize,
        n_kv: usize,
        params: &AttentionParams,
    ) -> Result<Self::Tensor>;
    /// The attention of several sequences (a batched decode step), each job computed exactly as
    /// [`Backend::attention`] or [`Backend::paged_attention`] computes it alone, results in job
    /// order. A backend may run the jobs concurrently; the default runs them one by one.
    fn attention_many(
        &self,
        jobs: &[AttentionJob<'_, Self::Tensor, Self::Kv>],
        params: &AttentionParams,
    ) -> Result<Vec<Self::Tensor>> {
        jobs.iter().map(|j| j.run(self, params)).collect()
    }
    /// Writes row `i` of `src` at logical row `first + i` of the paged `pool` (KV-cache append
    /// into a sequence's blocks): one [`Backend::write_kv_rows`] per run of rows inside a block.
    fn write_paged_rows(
        &self,
        pool: &mut Self::Kv,
        pages: &KvPages<'_>,
        first: usize,
        src: &Self::Tensor,
    ) -> Result<()> {
        let (n, _) = self.shape(src);
        let (pool_rows, _) = self.kv_shape(pool);
        pages
            .check(first..first + n, pool_rows)
            .map_err(|e| shape_err("write_paged_rows", e))?;
        let mut i = 0;
        while i < n {
            let j = first + i;
            let run = (pages.block_size - j % pages.block_size).min(n - i);
            let row = pages
                .physical_row(j, pool_rows)
                .ok_or_else(|| shape_err("write_paged_rows", format!("row {j} unmapped")))?;
            let part = self.rows(src, i..i + run)?;
            self.write_kv_rows(pool, row, &part)?;
            i += run;
        }
        Ok(())
    }
    /// Bidirectional attention of a packed batch: `q`, `k` and `v` are `[total, n_heads ·
    /// head_dim]` holding the sequences of `seq_lens` one after another (no padding); each row
    /// attends only to rows of its own sequence (within `params.radius` when set). Row `i` of
    /// the output belongs to row `i` of `q`.
    fn packed_attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        seq_lens: &[usize],
        params: &PackedAttentionParams,
    ) -> Result<Self::Tensor>;
    /// Element-wise activation.
    fn activation(&self, x: &Self::Tensor, act: Activation) -> Result<Self::Tensor>;
    /// Element-wise `a + b`.
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// Element-wise `a * b`.
    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// `x * s`.
    fn scale(&self, x: &Self::Tensor, s: f32) -> Result<Self::Tensor>;

    // ---- fused ops (defaults built from primitives; override only with a real kernel) ---
    /// `act(gate) * up`, the gated FFN non-linearity.
    fn gated_activation(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        act: Activation,
    ) -> Result<Self::Tensor> {
        let g = self.activation(gate, act)?;
        self.mul(&g, up)
    }
    /// `act(x · Wᵀ + bias)`: a linear layer and its activation (an encoder FFN's first half).
    fn matmul_activation(
        &self,
        x: &Self::Tensor,
        w: &Linear<Self>,
        act: Activation,
    ) -> Result<Self::Tensor> {
        self.activation(&self.matmul(x, w)?, act)
    }
    /// `layer_norm(residual + x)`: BERT's post-norm residual connection.
    fn add_layer_norm(
        &self,
        residual: &Self::Tensor,
        x: &Self::Tensor,
        weight: &Self::Weight,
        bias: Option<&Self::Weight>,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let sum = self.add(residual, x)?;
        self.layer_norm(&sum, weight, bias, eps)
    }
    /// `residual + rms_norm(x, weight)`: Gemma's post-norms feeding the residual stream.
    fn add_rms_norm(
        &self,
        residual: &Self::Tensor,
        x: &Self::Tensor,
        weight: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let n = self.rms_norm(x, weight, eps)?;
        self.add(residual, &n)
    }
}
