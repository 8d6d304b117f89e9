//! The backends kiln can build, and their options from the command line and the environment.
//!
//! This is the one place that reads the environment variables that tune a backend, so that a
//! backend's behaviour is fixed by the options struct it is built with:
//!
//! - `KILN_SIMD=scalar|avx2|avx512vnni` caps the CPU kernels' SIMD level (to compare kernel paths
//!   on one machine; a level above the CPU's gives the CPU's);
//! - `KILN_INTERLEAVE=1|0|q8_0,q6_k,...` says which weight types the CPU backend stores in its
//!   interleaved layout (all by default).

use anyhow::{anyhow, Result};
use kiln_backend::KvDtype;
use kiln_cpu::CpuOptions;

/// The CPU backend's options: `threads` (0 = one per core), the KV cache type, batch-invariant
/// mode, and what `KILN_SIMD` and `KILN_INTERLEAVE` say (an unknown value of either is an error
/// that names the variable).
pub fn cpu_options(threads: usize, kv_dtype: KvDtype, batch_invariant: bool) -> Result<CpuOptions> {
    CpuOptions {
        kv_dtype,
        batch_invariant,
        ..CpuOptions::threads(threads)
    }
    .with_settings(
        std::env::var("KILN_SIMD").ok().as_deref(),
        std::env::var("KILN_INTERLEAVE").ok().as_deref(),
    )
    .map_err(|e| anyhow!(e))
}
