use std::ops::Range;
use std::sync::{Arc, OnceLock};

use kiln_backend::{
    shape_err, Activation, AttentionJob, AttentionParams, Backend, BackendError, GptqMatrix,
    KvDtype, KvPages, Linear, PackedAttentionParams, Result, RopeParams, WeightData,
};
use kiln_core::{GgmlType, SharedBytes};

use crate::kernels::{self, SimdLevel};
use crate::kv::CpuKv;
use crate::options::CpuOptions;
use crate::sgemm::PackedWeight;

/// A row-major `[rows, cols]` f32 tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub(crate) data: Vec<f32>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl CpuTensor {
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Result<Self> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "tensor",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        Ok(CpuTensor { data, rows, cols })
    }
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
}

/// Large tensors give their storage back for reuse (see `buffers`).
impl Drop for CpuTensor {
    fn drop(&mut self) {
        crate::buffers::give(std::mem::take(&mut self.data));
    }
}

/// Checks that `src`'s rows fit at row `dst_row` of a `[rows, cols]` destination (same width).
pub(crate) fn check_rows_fit(
    op: &'static str,
    src: &CpuTensor,
    dst_row: usize,
    (rows, cols): (usize, usize),
) -> Result<()> {
    let end = dst_row.checked_add(src.rows);
    if src.cols != cols || end.is_none_or(|end| end > rows) {
        return Err(shape_err(
            op,
            format!(
                "[{}, {}] at row {dst_row} into [{rows}, {cols}]",
                src.rows, src.cols
            ),
        ));
    }
    Ok(())
}

/// A weight on the CPU: a zero-copy view of the file's bytes (quantized blocks stay quantized).
/// One-dimensional f32 weights (norms, biases) are also decoded once into `values`.
#[derive(Clone, Debug)]
pub struct CpuWeight {
    pub(crate) ty: GgmlType,
    pub(crate) row_len: usize,
    pub(crate) n_rows: usize,
    pub(crate) row_bytes: usize,
    pub(crate) bytes: SharedBytes,
    pub(crate) values: Option<Vec<f32>>,
    /// A float matrix packed for the dense GEMM (`sgemm`), made on first dense use (F16 and
    /// BF16 converted while packing); the error is kept so every later call reports it.
    pub(crate) packed: OnceLock<std::result::Result<PackedWeight, String>>,
    /// A GPTQ 4-bit matrix (then `ty` is I32, the checkpoint's word type, and `bytes` empty).
    pub(crate) gptq: Option<Arc<GptqMatrix>>,
    /// The matrix in an interleaved layout (`kernels::interleave`), which every product and
    /// embedding lookup then reads instead of `bytes`, whose pages were handed back (see
    /// [`CpuOptions::interleave`]).
    pub(crate) interleaved: Option<Arc<Interleaved>>,
}

/// A matrix in an interleaved layout (`kernels::interleave`), in memory of the backend's own
/// (see [`Arena`]).
#[derive(Debug)]
pub(crate) struct Interleaved {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
    /// The layout's product (`kernels::interleaved_gemm_fn` of the weight's type and the
    /// backend's level, which the backend checked before interleaving).
    pub(crate) gemm: kernels::InterleavedGemmFn,
}

impl Interleaved {
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the region lies inside the chunk (`Arena::alloc`), was written before this
        // value existed, and is never written again.
        unsafe { std::slice::from_raw_parts(self.chunk.base.add(self.offset), self.len) }
    }
}

/// One anonymous map of the [`Arena`], advised to transparent huge pages.
#[derive(Debug)]
struct Chunk {
    /// The map's first byte: regions are written through it, each once, before any reader
    /// holds them.
    base: *mut u8,
    _map: memmap2::MmapMut,
}

// SAFETY: `base` points into `_map`, owned here; every region is written once by its allocator
// before it is shared, and only read after (see `Arena::alloc`).
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

/// Memory for the interleaved weights: matrices smaller than a chunk are cut (64-byte aligned)
/// from anonymous maps of [`Arena::CHUNK`] bytes advised to huge pages, so that small matrices
/// also sit on 2 MiB pages (a map of its own per matrix of a few hundred KB gets 4 KiB pages,
/// and Gemma 3 270M's Q/K/V and gate/up products ran 20-25% slower on them than in the GGUF
/// loader's copy); larger matrices get a map of their own.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    /// The chunk being filled and its first free byte.
    current: std::sync::Mutex<Option<(Arc<Chunk>, usize)>>,
}

impl Arena {
    const CHUNK: usize = 32 << 20;

    /// A fresh region of `len` bytes, 64-byte aligned, and where to write it (once, before
    /// the region is read).
    fn alloc(&self, len: usize) -> std::io::Result<(Arc<Chunk>, usize)> {
        let new_chunk = |size: usize| -> std::io::Result<Arc<Chunk>> {
            let mut map = memmap2::MmapOptions::new().len(size.max(1)).map_anon()?;
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            Ok(Arc::new(Chunk {
                base: map.as_mut_ptr(),
                _map: map,
            }))
        };
        if len > Self::CHUNK / 2 {
            return Ok((new_chunk(len)?, 0));
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |(_, used): &(Arc<Chunk>, usize)| used.next_multiple_of(64) + len <= Self::CHUNK;
        if !current.as_ref().is_some_and(fits) {
            *current = Some((new_chunk(Self::CHUNK)?, 0));
        }
        let (chunk, used) = current.as_mut().expect("a chunk with room");
        let offset = used.next_multiple_of(64);
        *used = offset + len;
        Ok((chunk.clone(), offset))
    }
}

impl CpuWeight {
    pub(crate) fn row_bytes_of(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
    /// The weight packed for the dense GEMM, for float types: packed on first use (on `team`),
    /// then shared by every call.
    pub(crate) fn dense_packed(&self, team: &crate::team::Team) -> Result<&PackedWeight> {
        self.packed
            .get_or_init(|| {
                PackedWeight::pack(
                    team,
                    self.ty,
                    &self.bytes,
                    self.n_rows,
                    self.row_len,
                    self.row_bytes,
                )
            })
            .as_ref()
            .map_err(|e| shape_err("dense matmul", e.clone()))
    }

    /// Whether this weight is held in an interleaved layout (see
    /// [`CpuOptions::interleave`]).
    pub fn is_interleaved(&self) -> bool {
        self.interleaved.is_some()
    }

    /// f32 values of a small vector weight.
    pub(crate) fn vector(&self, op: &'static str) -> Result<&[f32]> {
        self.values
            .as_deref()
            .ok_or_else(|| shape_err(op, "expected a one-dimensional weight"))
    }
}

/// The CPU backend: kernels chosen once for this machine, a private team of threads.
pub struct CpuBackend {
    /// The fork-join team every parallel op runs on, the calling thread included (see `team`).
    pub(crate) team: crate::team::Team,
    pub(crate) threads: usize,
    pub(crate) simd: SimdLevel,
    /// See [`CpuOptions::batch_invariant`].
    pub(crate) batch_invariant: bool,
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
            team,
            threads,
            simd: options.simd_level(),
            batch_invariant: options.batch_invariant,
            kv_dtype: options.kv_dtype,
            interleave: options.interleave.clone(),
            arena: Arena::default(),
            rope_tables: Default::default(),
        })
    }

    /// The options this backend runs with (threads and SIMD level resolved).
    pub fn options(&self) -> CpuOptions {
        CpuOptions {
            threads: self.threads,
            simd_cap: Some(self.simd),
            interleave: self.interleave.clone(),
            batch_invariant: self.batch_invariant,
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
        let rows = kernels::INTERLEAVE_ROWS;
        if !self.interleave.contains(&data.ty)
            || data.dims.len() != 2
            || n_rows == 0
            || !n_rows.is_multiple_of(rows)
        {
            return Ok(None);
        }
        let Some(gemm) = kernels::interleaved_gemm_fn(data.ty, self.simd) else {
            return Ok(None);
        };
        let len = n_rows * row_bytes;
        let (chunk, offset) = self.arena.alloc(len)?;
        // SAFETY: the region is this call's alone (fresh from the arena) and inside the chunk;
        // nothing reads it before it is filled below.
        let dst = unsafe { std::slice::from_raw_parts_mut(chunk.base.add(offset), len) };
        // Pieces of whole groups, at most about 2 MiB and at least one per thread, in parallel;
        // each piece's source pages are released once it is copied (so that a large matrix is
        // never resident twice), and the whole matrix's at the end (the pages that straddle
        // two pieces).
        let group = rows * row_bytes;
        let piece = (len / self.threads).clamp(group, (2 << 20).max(group)) / group * group;
        let k = data.row_len();
        self.team.for_each_chunk(dst, piece, |i, dst| {
            let src = &data.bytes[i * piece..i * piece + dst.len()];
            kernels::interleave(data.ty, k, src, dst);
            if let Some(done) = data.bytes.slice(i * piece..i * piece + dst.len()) {
                done.release_pages();
            }
        });
        data.bytes.release_pages();
        Ok(Some(Arc::new(Interleaved {
            chunk,
            offset,
            len,
            gemm,
        })))
    }

    /// See [`CpuOptions::batch_invariant`].
    pub fn batch_invariant(&self) -> bool {
        self.batch_invariant
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    /// Whether AVX2 builds of the math loops may run (chosen level and CPU both allow it).
    pub(crate) fn avx2(&self) -> bool {
        self.simd.has_avx2() && kernels::simd_level().has_avx2()
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
        crate::ops::layer_norm(self, x, weight.vector("layer_norm")?, b, eps, residual)
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
        let parallel = out.len() >= crate::PARALLEL_MIN_ELEMENTS;
        crate::for_each_chunk(self, &mut out, CHUNK, parallel, |i, o| {
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
        format!("cpu ({} threads, {:?})", self.threads, self.simd)
    }

    fn upload_weight(&self, data: &WeightData) -> Result<CpuWeight> {
        let werr = |detail: String| BackendError::Weight {
            name: data.name.clone(),
            detail,
        };
        if !data.ty.is_supported() {
            return Err(werr(format!("type {} is not supported", data.ty)));
        }
        let row_len = data.row_len();
        let n_rows = data.n_rows();
        let row_bytes = data.ty.row_bytes(row_len as u64).ok_or_else(|| {
            werr(format!(
                "row of {row_len} is not a whole number of {} blocks",
                data.ty
            ))
        })? as usize;
        if row_bytes.checked_mul(n_rows) != Some(data.bytes.len()) {
            return Err(werr(format!(
                "{} bytes for {n_rows} rows of {row_bytes}",
                data.bytes.len()
            )));
        }
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
                    kernels::interleaved_row(table.ty, d, il.bytes(), id, &mut row_buf);
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
        crate::matmul::matmul(self, x, w, false)
    }

    fn matmul_many(&self, x: &CpuTensor, ws: &[&Linear<Self>]) -> Result<Vec<CpuTensor>> {
        if let Some(ys) = crate::matmul::gemv_many(self, x, ws)? {
            return Ok(ys);
        }
        match crate::matmul::tiled_many(self, x, ws)? {
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
        if act == Activation::Gelu && crate::matmul::is_dense(self, x, w) {
            return crate::matmul::matmul(self, x, w, true);
        }
        self.activation(&self.matmul(x, w)?, act)
    }

    fn rms_norm(&self, x: &CpuTensor, weight: &CpuWeight, eps: f32) -> Result<CpuTensor> {
        crate::ops::rms_norm(self, x, weight.vector("rms_norm")?, eps, None)
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
        crate::packed_attention::packed_attention(self, q, k, v, seq_lens, params)
    }

    fn rope(&self, x: &CpuTensor, positions: &[u32], params: &RopeParams) -> Result<CpuTensor> {
        crate::ops::rope(self, x, positions, params)
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
        crate::attention::attention(self, q, k_cache, v_cache, q_pos, n_kv, params)
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
        crate::attention::paged_attention(self, q, k_pool, v_pool, pages, q_pos, n_kv, params)
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
        if jobs.len() < 2 || self.threads < 2 {
            return jobs.iter().map(|j| j.run(self, params)).collect();
        }
        let mut slots: Vec<Option<Result<CpuTensor>>> = (0..jobs.len()).map(|_| None).collect();
        self.team.for_each_chunk(&mut slots, 1, |i, slot| {
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
            let avx2 = self.avx2();
            const CHUNK: usize = 8192;
            let parallel = out.len() >= crate::PARALLEL_MIN_ELEMENTS;
            crate::for_each_chunk(self, &mut out, CHUNK, parallel, |i, o| {
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
        let avx2 = self.avx2();
        // The activation costs about 0.8 ns an element (an `exp` and a division), eight times a
        // norm's: split from two chunks of 4096 (Gemma 3 270M's 8 × 2048 at 8 sequences took
        // 13 µs a layer on one thread), where a norm waits for 32k elements.
        const CHUNK: usize = 4096;
        let parallel = out.len() >= 2 * CHUNK;
        crate::for_each_chunk(self, &mut out, CHUNK, parallel, |i, o| {
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
        crate::ops::rms_norm(self, x, weight.vector("add_rms_norm")?, eps, Some(residual))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_regions_are_aligned_disjoint_and_large_ones_stand_alone() {
        let arena = Arena::default();
        let mut regions: Vec<(Arc<Chunk>, usize, usize)> = Vec::new();
        for len in [
            100,
            64,
            1,
            5000,
            Arena::CHUNK / 3,
            Arena::CHUNK / 3,
            Arena::CHUNK / 3,
            77,
        ] {
            let (chunk, offset) = arena.alloc(len).unwrap();
            assert_eq!(offset % 64, 0, "{len}");
            assert!(offset + len <= Arena::CHUNK);
            for (other, o, l) in &regions {
                if Arc::ptr_eq(other, &chunk) {
                    assert!(offset >= o + l || offset + len <= *o, "{len} overlaps");
                }
            }
            regions.push((chunk, offset, len));
        }
        // Three thirds of a chunk and what came before do not all fit in one chunk; the small
        // region after the third comes from the same (new) chunk.
        assert!(Arc::ptr_eq(&regions[0].0, &regions[5].0));
        assert!(!Arc::ptr_eq(&regions[0].0, &regions[6].0));
        assert!(Arc::ptr_eq(&regions[6].0, &regions[7].0));
        let (big, offset) = arena.alloc(Arena::CHUNK).unwrap();
        assert_eq!(offset, 0);
        assert!(regions.iter().all(|(c, _, _)| !Arc::ptr_eq(c, &big)));
        // The next small region still comes from the current shared chunk.
        let (next, _) = arena.alloc(10).unwrap();
        assert!(Arc::ptr_eq(&next, &regions[7].0));
    }
}
