//! `y[m, n] = x[m, k] · Wᵀ` on quantized weight rows.
//!
//! The activations are quantized once per call into the weight type's dot format (Q8_0, Q8_1 or
//! Q8_K, as llama.cpp does; f32 for float weights); then weight rows are split across the team in
//! contiguous blocks, and each task passes blocks of [`ACT_TILE`] activation rows over its weight
//! block through the tile kernels of `kernels::gemm_fn`, which unpack each weight block once for
//! several activation rows and write `y[m, n]` directly. The weights are read once per call
//! whatever `m` is, which is what makes batched decode and prompt processing cheaper per token
//! than single-token decode. One-row products (decode) dot each weight row straight from memory
//! instead (see [`TILED_MIN_ROWS`]): through the level's one-row kernel where it has one
//! (`kernels::gemv_fn`: VNNI Q4_0/Q5_0/Q8_0, which prepare the activation row once per task; at
//! the AVX2 level the tile-exact one, which is faster than the row-dot loop there too), in
//! batch-invariant mode the tile-exact one (`kernels::rows_exact_fn`), else the loop over the row
//! dot; [`gemv_many`] runs the one-row products that share an input (Q/K/V, gate/up) as one job,
//! and [`tiled_many`] those of a few rows (batched decode). A weight the backend holds in an
//! interleaved layout (`CpuOptions::interleave`) goes through its kernel at every number of
//! rows instead (a [`TiledJob`] of whole 16-row groups, whose values do not depend on the number
//! of rows: batch-invariant as it stands).
//!
//! Float weights (F32, F16, BF16) with at least [`DENSE_MIN_ROWS`] activation rows go through the
//! packed GEMM of `sgemm` instead (weight packed once, bias added in its last store): at encoder
//! batch sizes the product is bound by arithmetic, and a register-blocked kernel does several
//! times the flops of row-by-row dots. In batch-invariant mode every product of a float weight
//! goes through its panels, and the file's rows are handed back once packed (`panels_only`):
//! one resident copy of a 16-bit model, not two.

use kiln_backend::{shape_err, GptqMatrix, Linear, Result};

use kiln_core::GgmlType;

use crate::backend::CpuBackend;
use crate::context::Context;
use crate::kernels;
use crate::math;
use crate::sgemm::{self, Exec, Isa};
use crate::team::Disjoint;
use crate::tensor::CpuTensor;

/// Activation rows from which float weights go through the dense GEMM (packed panels, register
/// blocking); below it each weight row is dotted with the few activation rows directly.
const DENSE_MIN_ROWS: usize = 8;

/// Activation rows from which quantized weights go through the tile kernels ([`tiled`]). A
/// one-row product (decode) streams its weights from memory once and is bound by that: there the
/// row dots, which read each block straight into registers, beat the tile kernels, which unpack
/// 8-row panels into a scratch buffer first (measured on Gemma 3 270M decode: docs/BENCHMARKS.md).
const TILED_MIN_ROWS: usize = 2;

/// Activation rows per tile-kernel call, each of which unpacks its weight panels again. The
/// kernels take the panels' blocks in L1-sized slices (`kernels::x86::gemm`), so what must stay
/// in L2 is one slice of these rows (128 rows x 4 Q8_K blocks: 150 KB) and the panels being run:
/// 128 rows unpack the panels half as often as 64 did (llama-3.2-1b pp512 +3 %, Zen 3; 256: +1 %).
const ACT_TILE: usize = 128;

/// Activation rows up to which [`tiled_many`] fuses the products of one input (batched decode;
/// a prompt's products are long enough that a barrier between them costs little).
const FUSED_MAX_ROWS: usize = 16;

thread_local! {
    /// Per-thread output tile of [`tiled`]'s tasks, grown to the largest task and reused.
    static TILE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Weight bytes below which a one-row product's task is not split further (see
/// [`rows_per_task`]).
const MIN_STREAM_BYTES: usize = 256 << 10;

/// Weight rows per parallel task: enough work to amortize scheduling, small enough to balance.
///
/// A one-row product (`m == 1`, decode) is bound by streaming its weight rows from memory, and
/// each task is a stream of its own: a thread whose next task does not follow its last one on
/// from where it ended pays the memory latency again before the hardware prefetcher catches up
/// (tasks are claimed in turn, so with several per thread they interleave). So its tasks are at
/// least [`MIN_STREAM_BYTES`] of weights (`row_bytes` a row), while every thread still gets one:
/// a small matrix as one long stream per thread beats several short ones (docs/BENCHMARKS.md),
/// and a large one still gets 8 tasks per thread, to balance.
fn rows_per_task(n: usize, m: usize, threads: usize, row_bytes: usize) -> usize {
    let target_tasks = threads * 8;
    let mut by_balance = n.div_ceil(target_tasks);
    if m == 1 {
        let streaming = MIN_STREAM_BYTES.div_ceil(row_bytes.max(1));
        by_balance = by_balance.max(streaming.min(n.div_ceil(threads.max(1))));
    }
    // With many activation rows a task of `rows × m` dots grows large: cap it near 16k dots so
    // the pool can still balance the load.
    by_balance.clamp(1, (16_384 / m.max(1)).max(4))
}

/// Tasks per thread at the end of a one-row job that [`taper`] splits into quarters.
const TAPER_TASKS: usize = 2;

/// The row ranges `(first, rows)` of a one-row product's tasks over `n` weight rows of
/// `row_bytes` bytes: [`rows_per_task`] rows each, in whole groups of `group` rows.
fn one_row_tasks(n: usize, threads: usize, row_bytes: usize, group: usize) -> Vec<(usize, usize)> {
    let chunk = grouped_task_rows(n, 1, threads, row_bytes, group);
    (0..n)
        .step_by(chunk)
        .map(|r| (r, chunk.min(n - r)))
        .collect()
}

/// Splits the last `TAPER_TASKS` per thread of a one-row job's tasks `(matrix, first row, rows)`
/// into quarters (in whole groups; `shape(matrix)` is its row bytes and group), where the job has
/// more than twice as many tasks and a task holds at least [`MIN_STREAM_BYTES`]. Tasks are
/// claimed in order, so a thread that finds none left waits for the others' last ones: with
/// quarters that wait is about a quarter of a task (on llama-3.2-1b's decode, 2 threads, the
/// share of the step spent waiting fell from about 5 % to 3 %, docs/BENCHMARKS.md). Short jobs
/// keep their few long streams (split, Gemma 3 270M's 1 MB matrices ran about 7 % slower).
fn taper(
    tasks: &mut Vec<(usize, usize, usize)>,
    threads: usize,
    shape: impl Fn(usize) -> (usize, usize),
) {
    let tail = TAPER_TASKS * threads;
    if threads < 2 || tasks.len() <= 2 * tail {
        return;
    }
    let split: Vec<(usize, usize, usize)> = tasks
        .drain(tasks.len() - tail..)
        .flat_map(|(i, r0, rows)| {
            let (row_bytes, group) = shape(i);
            let piece = if rows * row_bytes >= MIN_STREAM_BYTES {
                rows.div_ceil(4).next_multiple_of(group.max(1))
            } else {
                rows
            };
            (r0..r0 + rows)
                .step_by(piece)
                .map(move |r| (i, r, piece.min(r0 + rows - r)))
        })
        .collect();
    tasks.extend(split);
}

/// Whether `x · Wᵀ` goes through the dense GEMM (float weight, enough rows).
pub(crate) fn is_dense(cpu: &Context, x: &CpuTensor, lin: &Linear<CpuBackend>) -> bool {
    is_float(lin.weight.ty) && (x.rows >= DENSE_MIN_ROWS || panels_only(cpu, lin.weight.ty))
}

/// Whether every product of a float weight goes through its packed panels, whatever the number
/// of rows: in batch-invariant mode (one path for every batch; the AVX-512 kernel's narrow tiles
/// stream a one-row product's panels at one FMA per weight row). The rows of the file are then
/// never read again after packing, and their pages are handed back: a 16-bit model keeps one
/// copy of its weights, not the file's and the panels'.
///
/// Elsewhere one-row products (decode) dot the file's rows: through the panels they measured
/// about 30 % slower on a 16-bit qwen3-0.6b (the panels' k-blocks read each weight in runs of
/// a few KiB; docs/BENCHMARKS.md), so both copies stay once a prefill has packed the panels.
///
/// F32 weights split for the AMX tiles ([`CpuOptions::amx_float`](crate::CpuOptions::amx_float))
/// take the tiles at every number of rows too: their sums are not the row dots' (about 1e-5 of
/// the terms apart), and one path keeps a row's result the same alone or batched (an embedding
/// of a short text, a decode step against its prefill). A one-row product there streams the
/// split panels (the size of the file's rows) at about the speed of the row dots.
fn panels_only(cpu: &Context, ty: GgmlType) -> bool {
    cpu.batch_invariant || splits(cpu, ty)
}

/// Whether products of `ty` weights run on the AMX split tiles (F32 weights, with
/// [`CpuOptions::amx_float`](crate::CpuOptions::amx_float) resolved on for this backend).
fn splits(cpu: &Context, ty: GgmlType) -> bool {
    cpu.amx_float && ty == GgmlType::F32
}

/// `x · Wᵀ (+ bias)`; with `gelu` (dense products only, see [`is_dense`]) the exact GELU of
/// each result, applied in the GEMM's last store.
pub(crate) fn matmul(
    cpu: &Context,
    x: &CpuTensor,
    lin: &Linear<CpuBackend>,
    gelu: bool,
) -> Result<CpuTensor> {
    let w = &*lin.weight;
    let (m, k, n) = (x.rows, x.cols, lin.out_features);
    if k != lin.in_features || w.row_len != k || w.n_rows != n {
        return Err(shape_err(
            "matmul",
            format!(
                "x [{m}, {k}] · W [{}, {}] ({} declared as {n}×{})",
                w.n_rows, w.row_len, w.ty, lin.in_features
            ),
        ));
    }
    if let Some(g) = &w.gptq {
        if gelu {
            return Err(shape_err("matmul", "a fused GELU needs the dense product"));
        }
        let mut y = gptq_matmul(cpu, x, g);
        add_bias(&mut y, lin)?;
        return CpuTensor::new(y, m, n);
    }
    if is_dense(cpu, x, lin) {
        let isa = Isa::for_level(cpu.simd);
        let packed = w.dense_packed(
            &cpu.team,
            panels_only(cpu, w.ty),
            splits(cpu, w.ty).then_some(isa),
        )?;
        let bias = match &lin.bias {
            Some(b) => Some(b.vector("matmul bias")?),
            None => None,
        };
        let exec = Exec::new(isa, &cpu.team, cpu.bf16_dot);
        let y = sgemm::sgemm(exec, &x.data, m, packed, bias, gelu)?;
        return CpuTensor::new(y, m, n);
    }
    if gelu {
        return Err(shape_err("matmul", "a fused GELU needs the dense product"));
    }
    let qerr = |e: kiln_quant::QuantError| shape_err("matmul", e.to_string());
    let act_ty = kiln_quant::vec_dot_type(w.ty).map_err(qerr)?;
    let act_bytes = kiln_quant::activation_bytes(act_ty, k).map_err(qerr)?;
    let quantize = kernels::quantize_fn(act_ty, cpu.simd).map_err(qerr)?;

    let acts = quantize_rows(cpu, x, quantize, act_bytes);
    let wbytes: &[u8] = &w.bytes;
    let rb = w.row_bytes;
    let mut y = if let Some(il) = w.interleaved.as_ref().filter(|_| m == 1) {
        let terms = kernels::activation_terms(act_ty, &acts, m);
        let ilb = il.bytes();
        one_row_job(cpu, n, rb, kernels::INTERLEAVE_ROWS, |r0, rows, out| {
            let wb = &ilb[r0 * rb..(r0 + rows) * rb];
            // SAFETY: `out` is this task's own `rows` outputs of the one activation row, `rows`
            // whole groups.
            unsafe { (il.gemm)(k, wb, rows, &acts, &terms, 1, out.as_mut_ptr(), rows) };
        })
    } else if let Some(il) = &w.interleaved {
        let terms = interleaved_terms(cpu, w.ty, act_ty, &acts, m);
        let mut y = crate::buffers::take(m * n);
        let kernel = TileKernel::Interleaved {
            gemm: il.gemm,
            terms: &terms,
            amx: kernels::interleaved_uses_amx(w.ty, cpu.simd, m),
        };
        let job = TiledJob::new(
            cpu,
            il.bytes(),
            rb,
            &acts,
            act_bytes,
            m,
            n,
            k,
            kernel,
            &mut y,
        );
        cpu.team.run(job.tasks(), |task| job.run(task));
        y
    } else if let Some(rows_fn) = (m == 1).then(|| one_row_fn(cpu, w.ty)).flatten() {
        one_row_job(cpu, n, rb, 1, |r0, rows, out| {
            rows_fn(k, &wbytes[r0 * rb..(r0 + rows) * rb], rows, &acts, out)
        })
    } else if m >= TILED_MIN_ROWS || cpu.batch_invariant {
        let gemm = if cpu.batch_invariant {
            kernels::gemm_fn_invariant(w.ty, cpu.simd)
        } else {
            kernels::gemm_fn(w.ty, cpu.simd)
        }
        .map_err(qerr)?;
        let strided = if cpu.batch_invariant {
            None
        } else {
            kernels::strided_gemm_fn(w.ty, cpu.simd)
        };
        tiled(cpu, wbytes, rb, &acts, act_bytes, m, n, k, gemm, strided)
    } else {
        let dot = kernels::vec_dot_fn(w.ty, cpu.simd).map_err(qerr)?;
        by_weight_rows(cpu, n, m, rb, |_, j, out_r| {
            let wrow = &wbytes[j * rb..(j + 1) * rb];
            for (o, a) in out_r.iter_mut().zip(acts.chunks_exact(act_bytes)) {
                *o = dot(k, wrow, a);
            }
        })
    };
    add_bias(&mut y, lin)?;
    Ok(CpuTensor {
        data: y,
        rows: m,
        cols: n,
    })
}

/// Every row of `x` quantized by `quantize` into `row_bytes` bytes, on the team from 4 rows
/// (each row alone: the same bytes either way).
fn quantize_rows(
    cpu: &Context,
    x: &CpuTensor,
    quantize: kernels::QuantizeFn,
    row_bytes: usize,
) -> Vec<u8> {
    let mut bytes = vec![0u8; x.rows * row_bytes];
    crate::context::for_each_chunk(cpu, &mut bytes, row_bytes, x.rows >= 4, |t, row| {
        quantize(x.row(t), row)
    });
    bytes
}

/// A one-row product over `n` weight rows of `row_bytes` bytes as one parallel job: tasks of
/// whole groups of `group` rows ([`one_row_tasks`], [`taper`]ed), each running `task(first row,
/// rows, its outputs)`.
fn one_row_job(
    cpu: &Context,
    n: usize,
    row_bytes: usize,
    group: usize,
    task: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let mut y = vec![0.0f32; n];
    let mut tasks: Vec<(usize, usize, usize)> = one_row_tasks(n, cpu.threads, row_bytes, group)
        .into_iter()
        .map(|(r0, rows)| (0, r0, rows))
        .collect();
    taper(&mut tasks, cpu.threads, |_| (row_bytes, group));
    let sink = Disjoint::new(&mut y);
    cpu.team.run(tasks.len(), |t| {
        let (_, r0, rows) = tasks[t];
        // SAFETY: the tasks cover disjoint row ranges of the output.
        task(r0, rows, unsafe { sink.slice(r0..r0 + rows) });
    });
    y
}

/// The [`kernels::ActivationTerms`] of activation rows `acts` (`m` rows of `act_ty`) for the
/// product of an interleaved weight of `ty`: empty where that product does not read them
/// ([`kernels::interleaved_uses_terms`]).
fn interleaved_terms(
    cpu: &Context,
    ty: GgmlType,
    act_ty: GgmlType,
    acts: &[u8],
    m: usize,
) -> kernels::ActivationTerms {
    if kernels::interleaved_uses_terms(ty, cpu.simd, m) {
        kernels::activation_terms(act_ty, acts, m)
    } else {
        kernels::ActivationTerms::default()
    }
}

/// [`rows_per_task`] in whole groups of `group` rows (the interleaved layout's
/// [`kernels::INTERLEAVE_ROWS`], else 1).
fn grouped_task_rows(n: usize, m: usize, threads: usize, row_bytes: usize, group: usize) -> usize {
    rows_per_task(n, m, threads, row_bytes)
        .next_multiple_of(group.max(1))
        .min(n)
}

/// Whether the products of `lins` with an input of width `k` may run as one job: every weight a
/// quantized matrix (not float, not GPTQ) of `k` columns.
fn fusable(lins: &[&Linear<CpuBackend>], k: usize) -> bool {
    lins.iter().all(|l| {
        let w = &*l.weight;
        !is_float(w.ty)
            && w.gptq.is_none()
            && l.in_features == k
            && w.row_len == k
            && w.n_rows == l.out_features
    })
}

/// One dot format of an input's rows (see [`Activations`]).
struct ActFormat {
    ty: GgmlType,
    /// Bytes of one quantized row.
    row_bytes: usize,
    /// Every row, quantized.
    bytes: Vec<u8>,
    /// The interleaved products' terms, where a weight in an interleaved layout needs them.
    terms: Option<kernels::ActivationTerms>,
}

/// An input quantized once per activation format that several weights need (usually one), for
/// the fused products of [`gemv_many`] and [`tiled_many`]: each row as [`matmul`] quantizes it.
struct Activations {
    formats: Vec<ActFormat>,
    /// The format of each weight, in order.
    of: Vec<usize>,
}

impl Activations {
    fn new(cpu: &Context, x: &CpuTensor, lins: &[&Linear<CpuBackend>]) -> Result<Self> {
        let qerr = |e: kiln_quant::QuantError| shape_err("matmul", e.to_string());
        let mut acts = Activations {
            formats: Vec::new(),
            of: Vec::with_capacity(lins.len()),
        };
        for l in lins {
            let ty = kiln_quant::vec_dot_type(l.weight.ty).map_err(qerr)?;
            let f = match acts.formats.iter().position(|f| f.ty == ty) {
                Some(f) => f,
                None => {
                    let row_bytes = kiln_quant::activation_bytes(ty, x.cols).map_err(qerr)?;
                    let quantize = kernels::quantize_fn(ty, cpu.simd).map_err(qerr)?;
                    let bytes = quantize_rows(cpu, x, quantize, row_bytes);
                    acts.formats.push(ActFormat {
                        ty,
                        row_bytes,
                        bytes,
                        terms: None,
                    });
                    acts.formats.len() - 1
                }
            };
            let format = &mut acts.formats[f];
            if l.weight.interleaved.is_some() {
                // The terms where an interleaved product of this format reads them, else empty.
                let terms = format.terms.get_or_insert_with(Default::default);
                if terms.is_empty()
                    && kernels::interleaved_uses_terms(l.weight.ty, cpu.simd, x.rows)
                {
                    *terms = kernels::activation_terms(format.ty, &format.bytes, x.rows);
                }
            }
            acts.of.push(f);
        }
        Ok(acts)
    }

    /// The rows in the format of weight `i`.
    fn of(&self, i: usize) -> &ActFormat {
        &self.formats[self.of[i]]
    }
}

/// Decode-step products of one activation row with several quantized weights (Q/K/V, gate/up)
/// as ONE parallel job: the row is quantized once per activation type, and the tasks of all
/// matrices are claimed from one queue, so the threads stream the weights back to back instead
/// of meeting at a barrier after each small matrix. Each output value is computed exactly as
/// [`matmul`] computes it (same kernel, same row). `None` when the case is not one of these
/// (several rows, float or GPTQ weights): the caller then runs the products one by one.
pub(crate) fn gemv_many(
    cpu: &Context,
    x: &CpuTensor,
    lins: &[&Linear<CpuBackend>],
) -> Result<Option<Vec<CpuTensor>>> {
    let k = x.cols;
    if x.rows != 1 || !fusable(lins, k) {
        return Ok(None);
    }
    let qerr = |e: kiln_quant::QuantError| shape_err("matmul", e.to_string());
    let acts = Activations::new(cpu, x, lins)?;
    let mut plan = Vec::with_capacity(lins.len());
    for l in lins {
        let rows = one_row_fn(cpu, l.weight.ty);
        // Batch-invariant mode needs the tile-exact one-row kernel of every matrix.
        if cpu.batch_invariant && rows.is_none() {
            return Ok(None);
        }
        plan.push((
            kernels::vec_dot_fn(l.weight.ty, cpu.simd).map_err(qerr)?,
            rows,
        ));
    }
    let mut outs: Vec<Vec<f32>> = lins.iter().map(|l| vec![0.0f32; l.out_features]).collect();
    // (matrix, first row, rows) of every task, matrix after matrix.
    let mut tasks = Vec::new();
    let group = |l: &Linear<CpuBackend>| {
        if l.weight.interleaved.is_some() {
            kernels::INTERLEAVE_ROWS
        } else {
            1
        }
    };
    for (i, l) in lins.iter().enumerate() {
        let rows = one_row_tasks(l.out_features, cpu.threads, l.weight.row_bytes, group(l));
        tasks.extend(rows.into_iter().map(|(r0, rows)| (i, r0, rows)));
    }
    taper(&mut tasks, cpu.threads, |i| {
        (lins[i].weight.row_bytes, group(lins[i]))
    });
    {
        let sinks: Vec<Disjoint<'_, f32>> = outs.iter_mut().map(|o| Disjoint::new(o)).collect();
        cpu.team.run(tasks.len(), |t| {
            let (i, r0, rows) = tasks[t];
            let w = &*lins[i].weight;
            let (dot, rows_fn) = plan[i];
            let ActFormat {
                bytes: a, terms, ..
            } = acts.of(i);
            // SAFETY: tasks cover disjoint row ranges of matrix i's output.
            let out = unsafe { sinks[i].slice(r0..r0 + rows) };
            if let (Some(il), Some(terms)) = (&w.interleaved, terms) {
                let rb = w.row_bytes;
                let wb = &il.bytes()[r0 * rb..(r0 + rows) * rb];
                // SAFETY: `out` is this task's own `rows` outputs (one activation row); `rows`
                // is whole groups (see `grouped_task_rows`).
                unsafe { (il.gemm)(k, wb, rows, a, terms, 1, out.as_mut_ptr(), rows) };
                return;
            }
            if let Some(rows_fn) = rows_fn {
                let rb = w.row_bytes;
                rows_fn(k, &w.bytes[r0 * rb..(r0 + rows) * rb], rows, a, out);
                return;
            }
            for (o, r) in out.iter_mut().zip(r0..) {
                *o = dot(k, w.row_bytes_of(r), a);
            }
        });
    }
    let mut ys = Vec::with_capacity(lins.len());
    for (mut y, l) in outs.into_iter().zip(lins) {
        add_bias(&mut y, l)?;
        ys.push(CpuTensor::new(y, 1, l.out_features)?);
    }
    Ok(Some(ys))
}

/// The kernel of a one-row product over many weight rows of `ty`, where one beats the loop over
/// the row dot: in batch-invariant mode the tile-exact one (`kernels::rows_exact_fn`: the tile
/// kernels' arithmetic without their packing), else the fast one of the SIMD level
/// (`kernels::gemv_fn`).
fn one_row_fn(cpu: &Context, ty: GgmlType) -> Option<kernels::RowsFn> {
    if cpu.batch_invariant {
        kernels::rows_exact_fn(ty, cpu.simd)
    } else {
        kernels::gemv_fn(ty, cpu.simd)
    }
}

/// `y[m, n]` from quantized activation rows and weight rows through a tile kernel: each task
/// owns a block of weight rows (kept in L1/L2) and passes every block of [`ACT_TILE`] activation
/// rows over it; the kernel unpacks each weight block once per activation block instead of once
/// per activation row, and writes the task's `[cols, rows]` tile, which lands in `y`'s columns.
/// A `strided` kernel (batched decode's narrow kernels) that takes the shape writes the task's
/// columns of `y` directly instead: no tile and no copy (8 MB a step for Gemma's output
/// projection at 8 sequences).
#[allow(clippy::too_many_arguments)]
fn tiled(
    cpu: &Context,
    wbytes: &[u8],
    row_bytes: usize,
    acts: &[u8],
    act_bytes: usize,
    m: usize,
    n: usize,
    k: usize,
    gemm: kernels::GemmFn,
    strided: Option<kernels::StridedGemmFn>,
) -> Vec<f32> {
    let mut y = crate::buffers::take(m * n);
    let kernel = TileKernel::Tiles { gemm, strided };
    let job = TiledJob::new(
        cpu, wbytes, row_bytes, acts, act_bytes, m, n, k, kernel, &mut y,
    );
    cpu.team.run(job.tasks(), |task| job.run(task));
    y
}

/// What multiplies a [`TiledJob`]'s tasks.
#[derive(Clone, Copy)]
enum TileKernel<'a> {
    /// The tile kernel of the weight's type, and its narrow kernel where it has one.
    Tiles {
        gemm: kernels::GemmFn,
        strided: Option<kernels::StridedGemmFn>,
    },
    /// A weight in an interleaved layout (`wbytes` in that layout): its product and the
    /// activations' terms; it takes every task whole.
    Interleaved {
        gemm: kernels::InterleavedGemmFn,
        terms: &'a kernels::ActivationTerms,
        /// Whether the product runs on AMX tiles (`kernels::interleaved_uses_amx`).
        amx: bool,
    },
}

/// One product of [`tiled`] (or of an interleaved weight): its operands, its split into tasks of
/// `nb` weight rows, and its output.
struct TiledJob<'a> {
    wbytes: &'a [u8],
    row_bytes: usize,
    acts: &'a [u8],
    act_bytes: usize,
    m: usize,
    n: usize,
    k: usize,
    kernel: TileKernel<'a>,
    /// Weight rows per task.
    nb: usize,
    /// This product's activation panel key (see `kernels::StridedGemmFn`).
    panel: u64,
    out: Disjoint<'a, f32>,
}

impl<'a> TiledJob<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cpu: &Context,
        wbytes: &'a [u8],
        row_bytes: usize,
        acts: &'a [u8],
        act_bytes: usize,
        m: usize,
        n: usize,
        k: usize,
        kernel: TileKernel<'a>,
        y: &'a mut [f32],
    ) -> Self {
        // Weight rows per task: at least 4 tasks per thread to balance, at most 256 rows (a
        // block of 256 rows of K=2048 Q6_K weights is ~430 KB, within a 1 MB L2 beside the
        // activations), a multiple of 4. Against 64 rows: +10% at `kiln bench -b 8` (the
        // kernel's prefetch runs across fewer task boundaries, where the next tile's rows are
        // another task's) and +5% at pp512 on Gemma 3 270M.
        // An interleaved weight: tasks of whole groups; at the VNNI level split as a one-row
        // product's are, below it (where the product packs the tile kernel's panels and the
        // activations' factors per call, as a tile call does) as the tiles' are.
        let tiles_rows = |group: usize| {
            n.div_ceil(cpu.threads * 4)
                .next_multiple_of(group)
                .clamp(group, 256)
                .min(n)
        };
        // On AMX tiles, a task reads every activation row's tiles once for all its groups
        // (`kernels::x86::interleaved`): tasks as large as the tiles' (with the one-row split's
        // 32 rows at 512 activation rows, the tiles streamed from L3 for every 2 groups).
        let nb = match kernel {
            TileKernel::Tiles { .. } => tiles_rows(4),
            TileKernel::Interleaved { amx: true, .. } => tiles_rows(kernels::INTERLEAVE_ROWS),
            TileKernel::Interleaved { .. } if cpu.simd != kernels::SimdLevel::Avx512Vnni => {
                tiles_rows(kernels::INTERLEAVE_ROWS)
            }
            TileKernel::Interleaved { .. } => {
                grouped_task_rows(n, m, cpu.threads, row_bytes, kernels::INTERLEAVE_ROWS)
            }
        };
        TiledJob {
            wbytes,
            row_bytes,
            acts,
            act_bytes,
            m,
            n,
            k,
            kernel,
            nb,
            panel: kernels::panel_key(),
            out: Disjoint::new(y),
        }
    }

    fn tasks(&self) -> usize {
        self.n.div_ceil(self.nb.max(1))
    }

    /// Task `task`: weight rows `task * nb..` against every activation row, into their columns
    /// of `y`.
    fn run(&self, task: usize) {
        let TiledJob {
            wbytes,
            row_bytes,
            acts,
            act_bytes,
            m,
            n,
            k,
            kernel,
            nb,
            panel,
            ref out,
        } = *self;
        let j0 = task * nb;
        let rows = nb.min(n - j0);
        let wblk = &wbytes[j0 * row_bytes..(j0 + rows) * row_bytes];
        let (gemm, strided) = match kernel {
            TileKernel::Tiles { gemm, strided } => (gemm, strided),
            TileKernel::Interleaved { gemm, terms, .. } => {
                // SAFETY: this task alone writes columns j0..j0 + rows of y's m rows (row stride
                // n), all inside y, and nothing reads y until the job ends; `rows` is whole
                // groups (`n` and `nb` are multiples of the group).
                unsafe { gemm(k, wblk, rows, acts, terms, m, out.as_ptr().add(j0), n) };
                return;
            }
        };
        if let Some(strided) = strided.filter(|_| m <= ACT_TILE) {
            // SAFETY: this task alone writes columns j0..j0 + rows of y's m rows (row stride n),
            // all inside y, and nothing reads y until the job ends; every task passes this
            // product's fresh panel key with the same `k`, `acts` and `m`.
            if unsafe { strided(panel, k, wblk, rows, acts, m, out.as_ptr().add(j0), n) } {
                return;
            }
        }
        TILE.with_borrow_mut(|tile| {
            // The kernel writes every element it is given before the copy reads it, so the
            // buffer is reused as it is (a fresh zeroed one per task was 8 MB of memset per
            // batched decode step of Gemma's 262k-row output projection).
            let len = ACT_TILE.min(m) * rows;
            if tile.len() < len {
                tile.resize(len, 0.0);
            }
            let tile = &mut tile[..len];
            for t0 in (0..m).step_by(ACT_TILE) {
                let cols = ACT_TILE.min(m - t0);
                let a = &acts[t0 * act_bytes..(t0 + cols) * act_bytes];
                gemm(k, wblk, rows, a, cols, tile, rows);
                for (c, src) in tile.chunks_exact(rows).take(cols).enumerate() {
                    let at = (t0 + c) * n + j0;
                    // SAFETY: this task alone writes columns j0..j0 + rows of y.
                    unsafe { out.slice(at..at + rows) }.copy_from_slice(src);
                }
            }
        })
    }
}

/// Several-row products of one input with several quantized weights (Q/K/V, gate/up in batched
/// decode) as ONE parallel job, as [`gemv_many`] does for one row: the input is quantized once
/// per activation type, and the tasks of every matrix, split exactly as [`tiled`] splits them,
/// are claimed from one queue, so that the threads do not meet at a barrier after each matrix
/// (where the one that finished early waits for the other). Each output value is computed
/// exactly as [`matmul`] computes it. `None` outside `2..=`[`FUSED_MAX_ROWS`] rows, in
/// batch-invariant mode, or for float or GPTQ weights: the caller then runs the products one by
/// one.
pub(crate) fn tiled_many(
    cpu: &Context,
    x: &CpuTensor,
    lins: &[&Linear<CpuBackend>],
) -> Result<Option<Vec<CpuTensor>>> {
    let (m, k) = (x.rows, x.cols);
    if !(TILED_MIN_ROWS..=FUSED_MAX_ROWS).contains(&m) || cpu.batch_invariant || !fusable(lins, k) {
        return Ok(None);
    }
    let qerr = |e: kiln_quant::QuantError| shape_err("matmul", e.to_string());
    let acts = Activations::new(cpu, x, lins)?;
    let mut plan = Vec::with_capacity(lins.len());
    for l in lins {
        let ty = l.weight.ty;
        let gemm = kernels::gemm_fn(ty, cpu.simd).map_err(qerr)?;
        plan.push((gemm, kernels::strided_gemm_fn(ty, cpu.simd)));
    }
    let mut outs: Vec<Vec<f32>> = lins
        .iter()
        .map(|l| crate::buffers::take(m * l.out_features))
        .collect();
    {
        let jobs: Vec<TiledJob<'_>> = lins
            .iter()
            .zip(&plan)
            .zip(outs.iter_mut())
            .enumerate()
            .map(|(i, ((l, &(gemm, strided)), y))| {
                let w = &*l.weight;
                let ActFormat {
                    row_bytes: act_bytes,
                    bytes: ref a,
                    ref terms,
                    ..
                } = *acts.of(i);
                let n = l.out_features;
                let (wbytes, kernel) = match (&w.interleaved, terms) {
                    (Some(il), Some(terms)) => (
                        il.bytes(),
                        TileKernel::Interleaved {
                            gemm: il.gemm,
                            terms,
                            amx: kernels::interleaved_uses_amx(w.ty, cpu.simd, m),
                        },
                    ),
                    _ => (&w.bytes[..], TileKernel::Tiles { gemm, strided }),
                };
                TiledJob::new(cpu, wbytes, w.row_bytes, a, act_bytes, m, n, k, kernel, y)
            })
            .collect();
        // (job, task) of every task, job after job.
        let tasks: Vec<(usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(i, job)| (0..job.tasks()).map(move |t| (i, t)))
            .collect();
        cpu.team.run(tasks.len(), |t| {
            let (i, task) = tasks[t];
            jobs[i].run(task);
        });
    }
    let mut ys = Vec::with_capacity(lins.len());
    for (mut y, l) in outs.into_iter().zip(lins) {
        add_bias(&mut y, l)?;
        ys.push(CpuTensor::new(y, m, l.out_features)?);
    }
    Ok(Some(ys))
}

/// `x · Wᵀ` for a GPTQ matrix, on its 4-bit codes: the activations are gathered once in the
/// matrix's packed input order; each task unpacks one weight row's `q − zero` to f32 and dots it
/// group by group with every activation row, scaling each group's sum by its scale.
fn gptq_matmul(cpu: &Context, x: &CpuTensor, g: &GptqMatrix) -> Vec<f32> {
    let (m, k, n) = (x.rows, g.in_features, g.out_features);
    let permuted;
    let xp: &[f32] = match &g.perm {
        Some(perm) => {
            permuted = (0..m)
                .flat_map(|t| perm.iter().map(move |&i| x.data[t * k + i as usize]))
                .collect::<Vec<f32>>();
            &permuted
        }
        None => &x.data,
    };
    let (gs, groups, half_k) = (g.group_size, g.n_groups(), k / 2);
    // A row's codes (two a byte), and a zero (u8) and a scale (f32) per group.
    by_weight_rows(
        cpu,
        n,
        m,
        half_k + groups * 5,
        |row: &mut Vec<f32>, j, out_r| {
            row.resize(k, 0.0);
            let codes = &g.codes[j * half_k..(j + 1) * half_k];
            let zeros = &g.zeros[j * groups..(j + 1) * groups];
            for (p, v) in row.iter_mut().enumerate() {
                let q = (codes[p / 2] >> (4 * (p % 2))) & 15;
                *v = (i32::from(q) - i32::from(zeros[p / gs])) as f32;
            }
            let scales = &g.scales[j * groups..(j + 1) * groups];
            for (o, xr) in out_r.iter_mut().zip(xp.chunks_exact(k)) {
                let mut y = 0.0f32;
                for ((wg, xg), &s) in row.chunks_exact(gs).zip(xr.chunks_exact(gs)).zip(scales) {
                    y += s * math::dot(wg, xg);
                }
                *o = y;
            }
        },
    )
}

/// `y[m, n]` computed one weight row at a time: weight rows are split across the pool in
/// contiguous runs; `row(scratch, j, out)` fills `out[t]` for every activation row `t` of weight
/// row `j` (`scratch` is a buffer of the task's own, reused across its rows); a weight row is
/// about `row_bytes` bytes.
fn by_weight_rows(
    cpu: &Context,
    n: usize,
    m: usize,
    row_bytes: usize,
    row: impl Fn(&mut Vec<f32>, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let mut out_t = vec![0.0f32; n * m]; // [n, m]: each task owns a contiguous run of weight rows
    let chunk = rows_per_task(n, m, cpu.threads, row_bytes);
    cpu.team.for_each_chunk(&mut out_t, chunk * m, |task, out| {
        let mut scratch = Vec::new();
        for (r, out_r) in out.chunks_mut(m).enumerate() {
            row(&mut scratch, task * chunk + r, out_r);
        }
    });
    if m == 1 {
        out_t
    } else {
        transpose(&out_t, n, m)
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// `y[r] += bias` for every row of `y` (`[m, out_features]`).
fn add_bias(y: &mut [f32], lin: &Linear<CpuBackend>) -> Result<()> {
    let n = lin.out_features;
    if let Some(bias) = &lin.bias {
        let b = bias.vector("matmul bias")?;
        if b.len() != n {
            return Err(shape_err(
                "matmul",
                format!("bias of {} for {n} outputs", b.len()),
            ));
        }
        for row in y.chunks_mut(n.max(1)) {
            for (v, &bv) in row.iter_mut().zip(b) {
                *v += bv;
            }
        }
    }
    Ok(())
}

/// `[rows, cols]` → `[cols, rows]`, in cache-friendly tiles.
fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const T: usize = 32;
    let mut dst = vec![0.0f32; src.len()];
    for r0 in (0..rows).step_by(T) {
        for c0 in (0..cols).step_by(T) {
            for r in r0..(r0 + T).min(rows) {
                for c in c0..(c0 + T).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
    dst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_jobs_cover_every_row_once_and_long_ones_end_in_quarters() {
        for (n, threads, row_bytes, group) in [
            (8192, 2, 1152, 1),
            (262_144, 2, 680, 1),
            (256, 2, 440, 1),
            (2048, 2, 440, 1),
            (1000, 3, 1152, 16),
            (8192, 3, 1152, 16),
            (7, 4, 1152, 1),
            (1, 2, 1152, 1),
            (4096, 1, 1152, 1),
        ] {
            let plain = one_row_tasks(n, threads, row_bytes, group);
            let mut tasks: Vec<_> = plain.iter().map(|&(r0, rows)| (0, r0, rows)).collect();
            taper(&mut tasks, threads, |_| (row_bytes, group));
            let mut next = 0;
            for &(_, r0, rows) in &tasks {
                assert_eq!(r0, next, "{n} rows: tasks in order, no gap or overlap");
                assert!(rows > 0 && r0 % group == 0, "{n} rows: whole groups");
                next = r0 + rows;
            }
            assert_eq!(next, n);
            let full = plain[0].1;
            let long = threads > 1
                && plain.len() > 4 * threads
                && full * row_bytes >= MIN_STREAM_BYTES
                && full >= 4 * group;
            if long {
                // Quarters, but for a last task too short to split.
                let quarter = full.div_ceil(4).next_multiple_of(group);
                let bound = quarter.max(plain[plain.len() - 1].1);
                let last = &tasks[tasks.len() - 2 * threads..];
                assert!(last.iter().all(|t| t.2 <= bound), "{n}: {last:?} of {full}");
                assert!(
                    tasks.len() >= plain.len() + 3 * (2 * threads - 1),
                    "{n}: quarters"
                );
            } else {
                assert_eq!(
                    tasks.len(),
                    plain.len(),
                    "{n}: short job or one thread, no split"
                );
            }
        }
    }

    #[test]
    fn one_row_tasks_are_long_streams_but_every_thread_gets_one() {
        // Gemma 3 270M, 2 threads: K projection (256 rows of 440 bytes, 112 KB) one task per
        // thread; FFN up (2048 rows, 901 KB) tasks of >= 256 KiB; the 262144-row output
        // projection 8 tasks per thread.
        assert_eq!(rows_per_task(256, 1, 2, 440), 128);
        let up = rows_per_task(2048, 1, 2, 440);
        assert!(up * 440 >= MIN_STREAM_BYTES && up < 1024, "{up}");
        assert_eq!(rows_per_task(262_144, 1, 2, 680), 262_144 / 16);
        // A tiny matrix on many threads still splits, one task per thread at most.
        assert_eq!(rows_per_task(64, 1, 16, 34), 4);
        // Several activation rows: compute-bound tiles, split for balance as before.
        assert_eq!(rows_per_task(256, 8, 2, 440), 16);
    }

    #[test]
    fn transpose_round_trips() {
        let src: Vec<f32> = (0..35 * 70).map(|v| v as f32).collect();
        let t = transpose(&src, 35, 70);
        assert_eq!(t[0], 0.0);
        assert_eq!(t[35], 1.0); // src[0][1] -> dst[1][0]
        assert_eq!(transpose(&t, 70, 35), src);
    }
}
