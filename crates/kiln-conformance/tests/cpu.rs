//! The conformance suite on the CPU backend: every SIMD level kiln-cpu has (a level this CPU
//! lacks is skipped, with a message), on one thread and on three (more threads than this
//! machine may have cores: the split must not change results), and in batch-invariant mode
//! (on one and three threads: the mode's kernels differ from the plain ones at any thread
//! count). Each configuration is one line; each case a test named `<configuration>::<case>`.
//! The KV element type is the factory's argument: cases that make caches ask for each one.

use kiln_backend::KvDtype;
use kiln_conformance::{suite, Claims};
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuOptions};

/// A CPU backend at SIMD `level` with `threads` threads and `kv` caches; `None` when this CPU
/// lacks the level (`CpuOptions` would clamp it to a lower one, which another configuration
/// already runs). Products of BF16 weights are exact f32 ones (`bf16_dot` off), as the suite's
/// f64 bounds assume; the `vdpbf16ps` path, which rounds activations to BF16, is checked
/// against its own bound in `kiln-cpu`'s `sgemm` tests and on the fixtures. F32 products are
/// the f32 kernels' (`amx_float` off) but in the `amx_*` configurations, which claim the split
/// BF16 products of the AMX tiles (on a host without them they run the f32 kernels, which the
/// claim's cases accept too).
fn cpu(level: SimdLevel, threads: usize, kv: KvDtype) -> Option<CpuBackend> {
    cpu_with(CpuOptions {
        kv_dtype: kv,
        bf16_dot: false,
        amx_float: false,
        ..CpuOptions::threads(threads).simd_cap(level)
    })
}

/// The defaults at this CPU's best level with `threads` threads and `kv` caches, batch-invariant
/// or not: F32 products on the AMX tiles where this host grants them.
fn amx(threads: usize, batch_invariant: bool, kv: KvDtype) -> Option<CpuBackend> {
    cpu_with(CpuOptions {
        kv_dtype: kv,
        bf16_dot: false,
        batch_invariant,
        ..CpuOptions::threads(threads)
    })
}

fn cpu_with(options: CpuOptions) -> Option<CpuBackend> {
    let level = options.simd_cap.unwrap_or_else(simd_level);
    if level > simd_level() {
        return None;
    }
    Some(CpuBackend::with_options(&options).expect("a CPU backend"))
}

/// Batch-invariant mode at this CPU's best level.
fn invariant(threads: usize, kv: KvDtype) -> Option<CpuBackend> {
    cpu_with(CpuOptions {
        kv_dtype: kv,
        batch_invariant: true,
        bf16_dot: false,
        amx_float: false,
        ..CpuOptions::threads(threads)
    })
}

suite!(scalar_1t, |kv| cpu(SimdLevel::Scalar, 1, kv));
suite!(scalar_3t, |kv| cpu(SimdLevel::Scalar, 3, kv));
suite!(avx2_1t, |kv| cpu(SimdLevel::Avx2, 1, kv));
suite!(avx2_3t, |kv| cpu(SimdLevel::Avx2, 3, kv));
suite!(avx512_1t, |kv| cpu(SimdLevel::Avx512, 1, kv));
suite!(avx512vnni_1t, |kv| cpu(SimdLevel::Avx512Vnni, 1, kv));
suite!(avx512vnni_3t, |kv| cpu(SimdLevel::Avx512Vnni, 3, kv));
suite!(
    batch_invariant_1t,
    |kv| invariant(1, kv),
    Claims::default().batch_invariant()
);
suite!(
    batch_invariant_3t,
    |kv| invariant(3, kv),
    Claims::default().batch_invariant()
);
suite!(
    amx_3t,
    |kv| amx(3, false, kv),
    Claims::default().split_products()
);
suite!(
    amx_batch_invariant_3t,
    |kv| amx(3, true, kv),
    Claims::default().split_products().batch_invariant()
);
