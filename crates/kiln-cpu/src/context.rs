//! [`Context`]: what an op needs of the backend that runs it (the team of threads, the SIMD level,
//! batch-invariant mode), and [`for_each_chunk`], the split of the row-wise ops.
//!
//! The op modules (`attention`, `ops`, `packed_attention`, `matmul`) take a `&Context` rather
//! than the whole `CpuBackend`, so that `backend` depends on them and not the other way round.

use crate::kernels::{self, SimdLevel};
use crate::team::Team;

/// Elements below which a row-wise op runs on the calling thread: handing a few microseconds of
/// work to the pool costs more than it saves (decode steps are made of such ops).
pub(crate) const PARALLEL_MIN_ELEMENTS: usize = 32 * 1024;

/// The part of a `CpuBackend` that its ops run with, fixed when the backend is built.
pub(crate) struct Context {
    /// The fork-join team every parallel op runs on, the calling thread included (see `team`).
    pub(crate) team: Team,
    pub(crate) threads: usize,
    pub(crate) simd: SimdLevel,
    /// See [`CpuOptions::batch_invariant`](crate::CpuOptions::batch_invariant).
    pub(crate) batch_invariant: bool,
    /// See [`CpuOptions::bf16_dot`](crate::CpuOptions::bf16_dot).
    pub(crate) bf16_dot: bool,
    /// [`CpuOptions::amx_float`](crate::CpuOptions::amx_float), where this CPU and the SIMD
    /// level have the tiles (resolved when the backend is built).
    pub(crate) amx_float: bool,
}

impl Context {
    /// Whether AVX2 builds of the math loops may run (chosen level and CPU both allow it).
    pub(crate) fn avx2(&self) -> bool {
        self.simd.has_avx2() && kernels::simd_level().has_avx2()
    }
}

/// `f(index, chunk)` over `chunk`-sized pieces of `data`, on the pool when `parallel`, inline
/// otherwise. The split is the same either way, so results do not depend on the choice.
pub(crate) fn for_each_chunk<T: Send>(
    cpu: &Context,
    data: &mut [T],
    chunk: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    if parallel {
        cpu.team.for_each_chunk(data, chunk, f);
    } else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}
