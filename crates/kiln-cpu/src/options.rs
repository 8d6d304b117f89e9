//! [`CpuOptions`]: how a [`CpuBackend`](crate::CpuBackend) runs, fixed when it is built.
//!
//! The backend reads no environment variable and no flag: the caller (the CLI, a test, an
//! example) builds this struct, so one backend's behaviour is stated in one place and two
//! backends in one process can differ.

use kiln_backend::KvDtype;
use kiln_core::GgmlType;

use crate::kernels::{self, SimdLevel};

/// The weight types that have an interleaved layout (see [`CpuOptions::interleave`]).
pub const INTERLEAVE_TYPES: [GgmlType; 4] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The options of a CPU backend. `CpuOptions::default()` is what kiln runs with: every core, the
/// best SIMD level of this CPU, interleaving on, batch invariance off, an f16 KV cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Threads of the backend's team, the calling thread included (0: one per available core).
    pub threads: usize,
    /// The highest SIMD level kernels may use (`None`: the best this CPU has). A cap above the
    /// CPU's level gives the CPU's, so a cap is always safe to run; tests and benchmarks set it
    /// to compare kernel paths on one machine.
    pub simd_cap: Option<SimdLevel>,
    /// The weight types stored in the backend's interleaved layout when uploaded, where the
    /// chosen SIMD level has a kernel for it (AVX-512 VNNI: Q8_0, Q5_0, Q4_K, Q6_K; AVX2 and
    /// AVX-512 without VNNI: Q4_K, Q5_0; matrices of a multiple of 16 rows). The copy does far
    /// less arithmetic per block in products; its source
    /// pages are handed back as they are copied, so only one copy stays resident. Default: all of
    /// [`INTERLEAVE_TYPES`]; empty turns it off.
    pub interleave: Vec<GgmlType>,
    /// Batch-invariant mode: every row of an op's result is computed by the same operations
    /// whatever the other rows of the call are, so a sequence gets bit-identical results alone
    /// or batched with others (what a server promises for greedy outputs). Quantized products
    /// then run the tile kernels at any number of rows (no row-dot path for one row, nor the
    /// fused decode products), float products run the packed GEMM at any number of rows, and
    /// attention computes each query row on its own, as a decode step would. One-row products
    /// take the tile-exact kernels (`kernels::rows_exact_fn`), which at the AVX2 level are the
    /// plain mode's too, so single-sequence decode costs about the same in both modes there
    /// (`kiln bench --batch-invariant` measures it).
    pub batch_invariant: bool,
    /// Products of BF16 weights with at least a few activation rows (prefill, encoders, and
    /// every product in batch-invariant mode) through `vdpbf16ps` where the CPU has AVX512_BF16
    /// and the SIMD level is AVX-512: each activation rounded to BF16 (at most 2⁻⁹ relative
    /// error, as llama.cpp's BF16 path rounds them), twice the products per instruction. Off,
    /// or on other CPUs: the weights are widened to f32 and the activations kept in f32 (the
    /// results of every other level, bit for bit). Default on; `KILN_BF16_DOT=0` turns it off in
    /// the CLI.
    pub bf16_dot: bool,
    /// Products of F32 weights with at least a few activation rows (prefill, encoders, and
    /// every product in batch-invariant mode) on Intel AMX BF16 tiles, where the CPU has
    /// AMX-BF16, the SIMD level is AVX-512 and the operating system grants the tiles: each
    /// operand split into two BF16 parts (`hi + lo`, 16 significant bits), three tile products
    /// per pair of parts, f32 sums (within 3·10⁻⁵ of the sum of the terms' magnitudes at worst,
    /// see `sgemm::amx`), several times the f32 kernels' speed. Off, or on other CPUs: the f32
    /// kernels (exact products). Default on; `KILN_AMX_FLOAT=0` turns it off in the CLI, as
    /// `KILN_AMX=0` turns off every tile product.
    pub amx_float: bool,
    /// The element type of the KV caches the backend makes (`Backend::kv_zeros`): f16 (half the
    /// memory, and half the bytes decode attention reads) or f32 (exactly the keys and values
    /// the model computed).
    pub kv_dtype: KvDtype,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: 0,
            simd_cap: None,
            interleave: INTERLEAVE_TYPES.to_vec(),
            batch_invariant: false,
            bf16_dot: true,
            amx_float: true,
            kv_dtype: KvDtype::default(),
        }
    }
}

impl CpuOptions {
    /// The defaults with `threads` threads (0: one per core).
    pub fn threads(threads: usize) -> Self {
        CpuOptions {
            threads,
            ..CpuOptions::default()
        }
    }

    /// These options with kernels capped at `level`.
    pub fn simd_cap(self, level: SimdLevel) -> Self {
        CpuOptions {
            simd_cap: Some(level),
            ..self
        }
    }

    /// The SIMD level the backend will run at: the cap, never above what this CPU has.
    pub fn simd_level(&self) -> SimdLevel {
        let best = kernels::simd_level();
        self.simd_cap.map_or(best, |cap| cap.min(best))
    }

    /// The thread count the backend will run with (0 resolved to the available cores).
    pub fn resolved_threads(&self) -> usize {
        if self.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.threads
        }
    }

    /// These options with the settings that tools take as text (the CLI from the environment
    /// variables `KILN_SIMD` and `KILN_INTERLEAVE`): a SIMD cap named as [`SimdLevel::parse`]
    /// takes it, and an interleave setting as [`CpuOptions::parse_interleave`] takes it. `None`
    /// leaves an option as it is; a bad value is an error that names the setting.
    pub fn with_settings(
        mut self,
        simd: Option<&str>,
        interleave: Option<&str>,
    ) -> Result<Self, String> {
        if let Some(name) = simd {
            let level = SimdLevel::parse(name).ok_or_else(|| {
                format!("KILN_SIMD={name:?} is not a SIMD level (scalar, avx2, avx512, avx512vnni)")
            })?;
            self.simd_cap = Some(level);
        }
        if let Some(setting) = interleave {
            self.interleave = CpuOptions::parse_interleave(setting)
                .map_err(|e| format!("KILN_INTERLEAVE={setting:?}: {e}"))?;
        }
        Ok(self)
    }

    /// The interleaved types named by a setting such as `KILN_INTERLEAVE`'s: `1` every type, `0`
    /// none, or a comma-separated list of type names (`q8_0,q6_k`, any case). A name that is not
    /// one of [`INTERLEAVE_TYPES`] is an error that lists them.
    pub fn parse_interleave(setting: &str) -> Result<Vec<GgmlType>, String> {
        match setting.trim() {
            "1" => return Ok(INTERLEAVE_TYPES.to_vec()),
            "0" | "" => return Ok(Vec::new()),
            _ => {}
        }
        let mut types = Vec::new();
        for name in setting.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let ty = INTERLEAVE_TYPES
                .into_iter()
                .find(|ty| name.eq_ignore_ascii_case(ty.name()))
                .ok_or_else(|| {
                    let known: Vec<&str> = INTERLEAVE_TYPES.iter().map(|t| t.name()).collect();
                    format!(
                        "{name:?} is not a type with an interleaved layout ({}; or 1 for all, 0 \
                         for none)",
                        known.join(", ")
                    )
                })?;
            if !types.contains(&ty) {
                types.push(ty);
            }
        }
        Ok(types)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_settings_name_the_types() {
        use GgmlType::*;
        let parse = CpuOptions::parse_interleave;
        assert_eq!(parse("1").unwrap(), [Q8_0, Q5_0, Q4_K, Q6_K]);
        assert!(parse("0").unwrap().is_empty());
        assert_eq!(parse("q6_k, Q8_0").unwrap(), [Q6_K, Q8_0]);
        let e = parse("q4_0,q8_0").unwrap_err();
        assert!(e.contains("\"q4_0\"") && e.contains("Q6_K"), "{e}");
        assert_eq!(CpuOptions::default().interleave, INTERLEAVE_TYPES);
    }

    #[test]
    fn text_settings_set_the_options_or_are_refused_by_name() {
        let o = CpuOptions::threads(1)
            .with_settings(Some("Scalar"), Some("0"))
            .unwrap();
        assert_eq!(o.simd_cap, Some(SimdLevel::Scalar));
        assert!(o.interleave.is_empty());
        let same = CpuOptions::threads(3).with_settings(None, None).unwrap();
        assert_eq!(same, CpuOptions::threads(3));
        let e = CpuOptions::default()
            .with_settings(Some("sse9"), None)
            .unwrap_err();
        assert!(e.starts_with("KILN_SIMD=\"sse9\""), "{e}");
        let e = CpuOptions::default()
            .with_settings(None, Some("q4_0"))
            .unwrap_err();
        assert!(e.starts_with("KILN_INTERLEAVE=\"q4_0\""), "{e}");
    }

    #[test]
    fn a_cap_never_rises_above_the_cpu() {
        let best = kernels::simd_level();
        assert_eq!(CpuOptions::default().simd_level(), best);
        assert_eq!(
            CpuOptions::threads(1)
                .simd_cap(SimdLevel::Scalar)
                .simd_level(),
            SimdLevel::Scalar
        );
        let top = CpuOptions::threads(1).simd_cap(SimdLevel::Avx512Vnni);
        assert_eq!(top.simd_level(), best.min(SimdLevel::Avx512Vnni));
    }
}
