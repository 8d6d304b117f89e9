//! [`CpuBackend`]: the backend struct and its `kiln_backend::Backend` implementation, which
//! checks operands and hands each op to the module that implements it.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use kiln_backend::{
    shape_err, Activation, AttentionJob, AttentionParams, Backend, BackendError, GptqMatrix,
    KvDtype, KvPages, Linear, PackedAttentionParams, Result, RopeParams, WeightData,
};
use kiln_core::{GgmlType, SharedBytes};

use crate::context::{for_each_chunk, Context, PARALLEL_MIN_ELEMENTS};
use crate::kernels::{self, SimdLevel};
use crate::kv::CpuKv;
use crate::options::CpuOptions;
use crate::tensor::{check_rows_fit, CpuTensor};
use crate::weight::{Arena, CpuWeight, Interleaved};

/// The CPU backend: kernels chosen once for this machine, a private team of threads.
pub struct CpuBackend {
    /// The team, the SIMD level and the mode the ops run with.
    pub(crate) cx: Context,
    /// See [`CpuOptions::kv_dtype`].
    pub(crate) kv_dtype: KvDtype,
    /// The weight types to interleave (see [`CpuOptions::interleave`]); empty: none.
    pub(crate) interleave: Vec<GgmlType>,
    /// Where interleaved weights live.
    pub(crate) arena: Arena,
    /// The rope angles of the current step (see `ops::RopeTables`).
    pub(crate) rope_tables: crate::ops::RopeTables,
}

impl CpuBackend {
    /// A backend with the default [`CpuOptions`] and `threads` threads (0 = one per core).
    pub fn new(threads: usize) -> Result<Self> {
        Self::with_options(&CpuOptions::threads(threads))
    }

    /// A backend as `options` say; its team of threads is started here.
    pub fn with_options(options: &CpuOptions) -> Result<Self> {
        let threads = options.resolved_threads();
        let team =
            crate::team::Team::new(threads, "kiln-team").map_err(|e| BackendError::Device {
                backend: "cpu",
                detail: format!("worker threads: {e}"),
            })?;
        Ok(CpuBackend {
            cx: Context {
                team,
                threads,
                simd: options.simd_level(),
                batch_invariant: options.batch_invariant,
                bf16_dot: options.bf16_dot,
                amx_float: options.amx_float && amx_float_available(options.simd_level()),
            },
            kv_dtype: options.kv_dtype,
            interleave: options.interleave.clone(),
            arena: Arena::default(),
            rope_tables: Default::default(),
        })
    }

    /// The options this backend runs with (threads and SIMD level resolved).
    pub fn options(&self) -> CpuOptions {
        CpuOptions {
            threads: self.cx.threads,
            simd_cap: Some(self.cx.simd),
            interleave: self.interleave.clone(),
            batch_invariant: self.cx.batch_invariant,
            bf16_dot: self.cx.bf16_dot,
            amx_float: self.cx.amx_float,
            kv_dtype: self.kv_dtype,
        }
    }

    /// `data`'s matrix in the interleaved layout, when [`CpuOptions::interleave`] says so
    /// and the matrix is one it takes.
    fn interleave(
        &self,
        data: &WeightData,
        n_rows: usize,
        row_bytes: usize,
    ) -> std::io::Result<Option<Arc<Interleaved>>> {
        if !self.interleave.contains(&data.ty)
            || data.dims.len() != 2
            || n_rows == 0
            || !n_rows.is_multiple_of(kernels::INTERLEAVE_ROWS)
        {
            return Ok(None);
        }
        let Some(gemm) = kernels::interleaved_gemm_fn(data.ty, self.cx.simd) else {
            return Ok(None);
        };
        let cx = &self.cx;
        Interleaved::new(
            &self.arena,
            &cx.team,
            data,
            n_rows,
            row_bytes,
            cx.simd,
            gemm,
        )
        .map(|il| Some(Arc::new(il)))
    }

    /// See [`CpuOptions::batch_invariant`].
    pub fn batch_invariant(&self) -> bool {
        self.cx.batch_invariant
    }

    pub fn threads(&self) -> usize {
        self.cx.threads
    }

    pub fn simd(&self) -> SimdLevel {
        self.cx.simd
    }

    /// Layer norm of `x`, or of `residual + x`, with the weights as vectors.
    fn norm(
        &self,
        x: &CpuTensor,
        weight: &CpuWeight,
        bias: Option<&CpuWeight>,
        eps: f32,
        residual: Option<&CpuTensor>,
    ) -> Result<CpuTensor> {
        let b = bias.map(|b| b.vector("layer_norm bias")).transpose()?;
        crate::ops::layer_norm(&self.cx, x, weight.vector("layer_norm")?, b, eps, residual)
    }

    fn check_same(op: &'static str, a: &CpuTensor, b: &CpuTensor) -> Result<()> {
        if (a.rows, a.cols) != (b.rows, b.cols) {
            return Err(shape_err(
                op,
                format!("[{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols),
            ));
        }
        Ok(())
    }

    fn map(&self, x: &CpuTensor, f: impl Fn(f32) -> f32 + Sync) -> CpuTensor {
        let mut data = crate::buffers::take(x.data.len());
        for (o, &v) in data.iter_mut().zip(&x.data) {
            *o = f(v);
        }
        CpuTensor {
            data,
            rows: x.rows,
            cols: x.cols,
        }
    }

    fn zip(
        &self,
        op: &'static str,
        a: &CpuTensor,
        b: &CpuTensor,
        f: impl Fn(f32, f32) -> f32 + Sync + Send,
    ) -> Result<CpuTensor> {
        Self::check_same(op, a, b)?;
        let mut out = crate::buffers::take(a.data.len());
        const CHUNK: usize = 4096;
        let parallel = out.len() >= PARALLEL_MIN_ELEMENTS;
        for_each_chunk(&self.cx, &mut out, CHUNK, parallel, |i, o| {
            let (x, y) = (&a.data[i * CHUNK..], &b.data[i * CHUNK..]);
            for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                *o = f(x, y);
            }
        });
        Ok(CpuTensor {
            data: out,
            rows: a.rows,
            cols: a.cols,
        })
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Kv = CpuKv;

    fn name(&self) -> String {
        // AMX runs only under the VNNI kernels (`kernels::amx_granted`).
        let amx = if self.cx.simd == SimdLevel::Avx512Vnni && kernels::amx_granted() {
            "+AMX"
        } else {
            ""
        };
        format!("cpu ({} threads, {:?}{amx})", self.cx.threads, self.cx.simd)
    }

    fn host_threads(&self) -> usize {
        self.cx.threads
    }

    fn upload_weight(&self, data: &WeightData) -> Result<CpuWeight> {
        let werr = |detail: String| BackendError::Weight {
            name: data.name.clone(),
            detail,
        };
        if !data.ty.is_supported() {
            return Err(werr(format!("type {} is not supported", data.ty)));
        }
        let (row_len, n_rows) = (data.row_len(), data.n_rows());
        let row_bytes = data.checked_row_bytes()?;
        let interleaved = self
            .interleave(data, n_rows, row_bytes)
            .map_err(|e| werr(format!("interleaving: {e}")))?;
        let values = if data.dims.len() == 1 {
            let mut v = vec![0.0; row_len];
            kiln_quant::dequantize(data.ty, &data.bytes, &mut v)
                .map_err(|e| werr(e.to_string()))?;
            Some(v)
        } else {
            None
        };
        Ok(CpuWeight {
            ty: data.ty,
            row_len,
            n_rows,
            row_bytes,
            bytes: data.bytes.clone(),
            values,
            packed: OnceLock::new(),
            split: OnceLock::new(),
            gptq: None,
            interleaved,
        })
    }

    fn upload_gptq(&self, _name: &str, matrix: Arc<GptqMatrix>) -> Result<CpuWeight> {
        Ok(CpuWeight {
            ty: GgmlType::I32,
            row_len: matrix.in_features,
            n_rows: matrix.out_features,
            row_bytes: 0,
            bytes: SharedBytes::from_vec(Vec::new()),
            values: None,
            packed: OnceLock::new(),
            split: OnceLock::new(),
            gptq: Some(matrix),
            interleaved: None,
        })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CpuTensor> {
        // vec! of zeros allocates with calloc: pages of a large KV cache are only touched when used.
        Ok(CpuTensor {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        })
    }

    fn kv_zeros(&self, rows: usize, cols: usize) -> Result<CpuKv> {
        CpuKv::zeros(rows, cols, self.kv_dtype)
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    fn kv_shape(&self, x: &CpuKv) -> (usize, usize) {
        x.shape()
    }

    fn kv_to_f32(&self, x: &CpuKv) -> Result<Vec<f32>> {
        Ok(x.to_f32())
    }

    fn tensor_from_f32(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        CpuTensor::new(data.to_vec(), rows, cols)
    }

    fn to_f32(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn shape(&self, x: &CpuTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn rows(&self, x: &CpuTensor, range: Range<usize>) -> Result<CpuTensor> {
        if range.start > range.end || range.end > x.rows {
            return Err(shape_err("rows", format!("rows {range:?} of {}", x.rows)));
        }
        Ok(CpuTensor {
            data: x.data[range.start * x.cols..range.end * x.cols].to_vec(),
            rows: range.len(),
            cols: x.cols,
        })
    }

    fn write_rows(&self, dst: &mut CpuTensor, dst_row: usize, src: &CpuTensor) -> Result<()> {
        check_rows_fit("write_rows", src, dst_row, (dst.rows, dst.cols))?;
        dst.data[dst_row * dst.cols..(dst_row + src.rows) * dst.cols].copy_from_slice(&src.data);
        Ok(())
    }

    fn write_kv_rows(&self, dst: &mut CpuKv, dst_row: usize, src: &CpuTensor) -> Result<()> {
        crate::kv::write_rows(dst, dst_row, src)
    }

    fn gather_rows(&self, x: &CpuTensor, index: &[u32]) -> Result<CpuTensor> {
        if let Some(&bad) = index.iter().find(|&&r| r as usize >= x.rows) {
            return Err(shape_err("gather_rows", format!("row {bad} of {}", x.rows)));
        }
        let mut data = Vec::with_capacity(index.len() * x.cols);
        for &r in index {
            let r = r as usize;
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        Ok(CpuTensor {
            data,
            rows: index.len(),
            cols: x.cols,
        })
    }

    fn scatter_add_rows(
        &self,
        dst: &mut CpuTensor,
        index: &[u32],
        src: &CpuTensor,
        weights: &[f32],
    ) -> Result<()> {
        if src.cols != dst.cols
            || index.len() != src.rows
            || weights.len() != src.rows
            || index.iter().any(|&r| r as usize >= dst.rows)
        {
            return Err(shape_err(
                "scatter_add_rows",
                format!(
                    "[{}, {}] with {} indices and {} weights into [{}, {}]",
                    src.rows,
                    src.cols,
                    index.len(),
                    weights.len(),
                    dst.rows,
                    dst.cols
                ),
            ));
        }
        let cols = dst.cols;
        for ((&r, &w), row) in index
            .iter()
            .zip(weights)
            .zip(src.data.chunks_exact(cols.max(1)))
        {
            let r = r as usize;
            for (d, &s) in dst.data[r * cols..(r + 1) * cols].iter_mut().zip(row) {
                *d += s * w;
            }
        }
        Ok(())
    }

    fn embedding(&self, table: &CpuWeight, ids: &[u32]) -> Result<CpuTensor> {
        let d = table.row_len;
        // Every row is decoded in full below.
        let mut data = crate::buffers::take(ids.len() * d);
        // A row of an interleaved table, back in its file layout.
        let mut row_buf = Vec::new();
        for (out, &id) in data.chunks_mut(d.max(1)).zip(ids) {
            let id = id as usize;
            if id >= table.n_rows {
                return Err(shape_err(
                    "embedding",
                    format!("token {id} outside a table of {} rows", table.n_rows),
                ));
            }
            let row = match &table.interleaved {
                Some(il) => {
                    row_buf.resize(table.row_bytes, 0);
                    kernels::interleaved_row(table.ty, il.level, d, il.bytes(), id, &mut row_buf);
                    &row_buf[..]
                }
                None => table.row_bytes_of(id),
            };
            kiln_quant::dequantize(table.ty, row, out)
                .map_err(|e| shape_err("embedding", e.to_string()))?;
        }
        Ok(CpuTensor {
            data,
            rows: ids.len(),
            cols: d,
        })
    }

    fn matmul(&self, x: &CpuTensor, w: &Linear<Self>) -> Result<CpuTensor> {
        crate::matmul::matmul(&self.cx, x, w, false)
    }

    fn matmul_many(&self, x: &CpuTensor, ws: &[&Linear<Self>]) -> Result<Vec<CpuTensor>> {
        if let Some(ys) = crate::matmul::gemv_many(&self.cx, x, ws)? {
            return Ok(ys);
        }
        match crate::matmul::tiled_many(&self.cx, x, ws)? {
            Some(ys) => Ok(ys),
            None => ws.iter().map(|w| self.matmul(x, w)).collect(),
        }
    }

    /// Exact GELU after a dense (float-weight) product runs in the GEMM's last store, while the
    /// tile is in registers; other cases are the product, then the activation.
    fn matmul_activation(
        &self,
        x: &CpuTensor,
        w: &Linear<Self>,
        act: Activation,
    ) -> Result<CpuTensor> {
        if act == Activation::Gelu && crate::matmul::is_dense(&self.cx, x, w) {
            return crate::matmul::matmul(&self.cx, x, w, true);
        }
        self.activation(&self.matmul(x, w)?, act)
    }

    fn rms_norm(&self, x: &CpuTensor, weight: &CpuWeight, eps: f32) -> Result<CpuTensor> {
        crate::ops::rms_norm(&self.cx, x, weight.vector("rms_norm")?, eps, None)
    }

    fn layer_norm(
        &self,
        x: &CpuTensor,
        weight: &CpuWeight,
        bias: Option<&CpuWeight>,
        eps: f32,
    ) -> Result<CpuTensor> {
        self.norm(x, weight, bias, eps, None)
    }

    fn add_layer_norm(
        &self,
        residual: &CpuTensor,
        x: &CpuTensor,
        weight: &CpuWeight,
        bias: Option<&CpuWeight>,
        eps: f32,
    ) -> Result<CpuTensor> {
        self.norm(x, weight, bias, eps, Some(residual))
    }

    fn packed_attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        seq_lens: &[usize],
        params: &PackedAttentionParams,
    ) -> Result<CpuTensor> {
        crate::packed_attention::packed_attention(&self.cx, q, k, v, seq_lens, params)
    }

    fn rope(&self, x: &CpuTensor, positions: &[u32], params: &RopeParams) -> Result<CpuTensor> {
        crate::ops::rope(&self.cx, &self.rope_tables, x, positions, params)
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k_cache: &CpuKv,
        v_cache: &CpuKv,
        q_pos: usize,
        n_kv: usize,
        params: &AttentionParams,
    ) -> Result<CpuTensor> {
        crate::attention::attention(&self.cx, q, k_cache, v_cache, q_pos, n_kv, params)
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        k_pool: &CpuKv,
        v_pool: &CpuKv,
        pages: &KvPages<'_>,
        q_pos: usize,
        n_kv: usize,
        params: &AttentionParams,
    ) -> Result<CpuTensor> {
        crate::attention::paged_attention(&self.cx, q, k_pool, v_pool, pages, q_pos, n_kv, params)
    }

    /// The jobs as team tasks, one per sequence: a decode step's attention of one short sequence
    /// is too small to split, so a batch of them ran on one thread while the others waited. Each
    /// job runs the very code of a lone call (its own splits then run inline on its thread), so
    /// the results are the same.
    fn attention_many(
        &self,
        jobs: &[AttentionJob<'_, CpuTensor, CpuKv>],
        params: &AttentionParams,
    ) -> Result<Vec<CpuTensor>> {
        if jobs.len() < 2 || self.cx.threads < 2 {
            return jobs.iter().map(|j| j.run(self, params)).collect();
        }
        let mut slots: Vec<Option<Result<CpuTensor>>> = (0..jobs.len()).map(|_| None).collect();
        self.cx.team.for_each_chunk(&mut slots, 1, |i, slot| {
            slot[0] = Some(jobs[i].run(self, params))
        });
        slots
            .into_iter()
            .map(|s| s.unwrap_or_else(|| Err(shape_err("attention_many", "a job did not run"))))
            .collect()
    }

    fn activation(&self, x: &CpuTensor, act: Activation) -> Result<CpuTensor> {
        if act == Activation::Gelu {
            let mut out = crate::buffers::take(x.data.len());
            let avx2 = self.cx.avx2();
            const CHUNK: usize = 8192;
            let parallel = out.len() >= PARALLEL_MIN_ELEMENTS;
            for_each_chunk(&self.cx, &mut out, CHUNK, parallel, |i, o| {
                crate::math::gelu_into(avx2, &x.data[i * CHUNK..i * CHUNK + o.len()], o)
            });
            return CpuTensor::new(out, x.rows, x.cols);
        }
        Ok(self.map(x, |v| act.apply(v)))
    }

    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        self.zip("add", a, b, |x, y| x + y)
    }

    fn mul(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        self.zip("mul", a, b, |x, y| x * y)
    }

    fn scale(&self, x: &CpuTensor, s: f32) -> Result<CpuTensor> {
        Ok(self.map(x, |v| v * s))
    }

    fn gated_activation(
        &self,
        gate: &CpuTensor,
        up: &CpuTensor,
        act: Activation,
    ) -> Result<CpuTensor> {
        Self::check_same("gated_activation", gate, up)?;
        let mut out = crate::buffers::take(gate.data.len());
        let avx2 = self.cx.avx2();
        // The activation costs several times a norm's work per element (an `exp` and a
        // division): split from two chunks of 4096, where a norm waits for 32k elements.
        const CHUNK: usize = 4096;
        let parallel = out.len() >= 2 * CHUNK;
        for_each_chunk(&self.cx, &mut out, CHUNK, parallel, |i, o| {
            let r = i * CHUNK..i * CHUNK + o.len();
            crate::math::gated_into(avx2, act, &gate.data[r.clone()], &up.data[r], o)
        });
        CpuTensor::new(out, gate.rows, gate.cols)
    }

    fn add_rms_norm(
        &self,
        residual: &CpuTensor,
        x: &CpuTensor,
        weight: &CpuWeight,
        eps: f32,
    ) -> Result<CpuTensor> {
        Self::check_same("add_rms_norm", residual, x)?;
        crate::ops::rms_norm(
            &self.cx,
            x,
            weight.vector("add_rms_norm")?,
            eps,
            Some(residual),
        )
    }
}

/// Whether F32 products can run on the AMX split tiles at `level` (`sgemm::amx::available`).
fn amx_float_available(level: SimdLevel) -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::sgemm::amx::available(crate::sgemm::Isa::for_level(level));
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        false
    }
}
