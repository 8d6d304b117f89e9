//! From a plan to running backends: the one place that names concrete backends and reads the
//! environment variables that tune them.
//!
//! A command opens its model once ([`kiln_engine::ModelFile`]), plans it, then hands the plan's
//! placement to [`place_decoder`] or [`place_embedding`], which build the backends of the devices
//! it names, load the weights onto them and return the model with the backends' types erased
//! (the engine boundary, see `kiln_engine::DecoderRunner`).
//!
//! Environment (read here only; a backend takes typed options):
//! - `KILN_SIMD=scalar|avx2|avx512|avx512vnni` caps the CPU kernels' SIMD level (to compare kernel paths
//!   on one machine; a level above the CPU's gives the CPU's);
//! - `KILN_INTERLEAVE=1|0|q8_0,q6_k,...` says which weight types the CPU backend stores in its
//!   interleaved layout (all by default);
//! - `KILN_BF16_DOT=1|0`: products of BF16 weights through `vdpbf16ps` (activations rounded to
//!   BF16) where the CPU has AVX512_BF16 (1, the default), or exact f32 products (0);
//! - `KILN_VULKAN_VALIDATION=1` turns on the Khronos validation layer on Vulkan devices (every
//!   message it reports becomes an error).

use anyhow::{anyhow, bail, Result};
use kiln_backend::KvDtype;
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_engine::plan::Placement;
use kiln_engine::{
    decoder_on, embedding_on, split_decoder_on, DecoderRunner, DecoderUse, EmbeddingRunner,
    ModelFile,
};
use kiln_vulkan::{VulkanBackend, VulkanOptions};

/// The CPU backend's options: `threads` (0 = one per core), the KV cache type, batch-invariant
/// mode, and what `KILN_SIMD`, `KILN_INTERLEAVE`, `KILN_BF16_DOT` and `KILN_AMX_FLOAT` say (an
/// unknown value of any is an error that names the variable).
pub fn cpu_options(threads: usize, kv_dtype: KvDtype, batch_invariant: bool) -> Result<CpuOptions> {
    let switch = |name: &str| match std::env::var(name).ok().as_deref() {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(anyhow!("{name}={other:?} is neither 1 nor 0")),
    };
    CpuOptions {
        kv_dtype,
        batch_invariant,
        bf16_dot: switch("KILN_BF16_DOT")?,
        amx_float: switch("KILN_AMX_FLOAT")?,
        ..CpuOptions::threads(threads)
    }
    .with_settings(
        std::env::var("KILN_SIMD").ok().as_deref(),
        std::env::var("KILN_INTERLEAVE").ok().as_deref(),
    )
    .map_err(|e| anyhow!(e))
}

/// The Vulkan backend's options for device `index` (`None`: the first usable one), with the KV
/// cache type, batch-invariant kernels or not (serving), and validation as
/// `KILN_VULKAN_VALIDATION` says.
pub fn vulkan_options(
    index: Option<usize>,
    kv_dtype: KvDtype,
    batch_invariant: bool,
) -> VulkanOptions {
    VulkanOptions {
        device: index,
        kv_dtype,
        validation: std::env::var("KILN_VULKAN_VALIDATION").is_ok_and(|v| v == "1"),
        batch_invariant,
    }
}

/// How to build the backend of one device.
#[derive(Clone, Debug)]
pub enum DeviceOptions {
    /// A CPU backend standing in for a GPU (tests of the split path on machines without one).
    Cpu(CpuOptions),
    Vulkan(VulkanOptions),
}

/// The devices a plan may place a model on: the CPU, and the GPUs by the device index a plan
/// names (`Placement::Vulkan { gpu }`).
#[derive(Clone, Debug)]
pub struct Devices {
    pub cpu: CpuOptions,
    /// `(device index, how to build its backend)`.
    pub gpus: Vec<(usize, DeviceOptions)>,
}

impl Devices {
    /// The CPU alone.
    pub fn cpu(options: CpuOptions) -> Devices {
        Devices {
            cpu: options,
            gpus: Vec::new(),
        }
    }

    fn gpu(&self, index: usize) -> Result<&DeviceOptions> {
        self.gpus
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, o)| o)
            .ok_or_else(|| {
                anyhow!("the plan names GPU {index}, and no GPU backend was opened for it")
            })
    }
}

/// Builds the devices of `placement`, loads the decoder of `file` onto them, and returns it
/// erased; refuses, before loading, a placement that cannot serve `usage`.
pub fn place_decoder(
    file: &mut ModelFile,
    placement: &Placement,
    devices: &Devices,
    usage: DecoderUse,
) -> Result<Box<dyn DecoderRunner>> {
    let placed = match placement {
        Placement::Cpu => decoder_on_cpu(file, &devices.cpu)?,
        Placement::Vulkan { gpu } => match devices.gpu(*gpu)? {
            DeviceOptions::Cpu(options) => decoder_on_cpu(file, options)?,
            DeviceOptions::Vulkan(options) => {
                let backend = VulkanBackend::new(options)?;
                let model = file.load_decoder(&backend)?;
                decoder_on(backend, model)
            }
        },
        Placement::Split { gpu, gpu_layers } => {
            if !usage.runs_split() {
                // Before the weights are loaded (the runner's `check` says the same after).
                bail!(
                    "plan {}: a split model only generates (no scoring or serving yet); run it \
                     on one device (--backend cpu)",
                    placement.name()
                );
            }
            let back = CpuBackend::with_options(&devices.cpu)?;
            match devices.gpu(*gpu)? {
                DeviceOptions::Cpu(options) => {
                    let front = CpuBackend::with_options(options)?;
                    let model = file.load_decoder_split(&front, &back, *gpu_layers)?;
                    split_decoder_on(front, back, model)
                }
                DeviceOptions::Vulkan(options) => {
                    let front = VulkanBackend::new(options)?;
                    let model = file.load_decoder_split(&front, &back, *gpu_layers)?;
                    split_decoder_on(front, back, model)
                }
            }
        }
    };
    placed.check(usage)?;
    Ok(placed)
}

/// The decoder of `file` on a CPU backend built with `options`.
fn decoder_on_cpu(file: &mut ModelFile, options: &CpuOptions) -> Result<Box<dyn DecoderRunner>> {
    let backend = CpuBackend::with_options(options)?;
    let model = file.load_decoder(&backend)?;
    Ok(decoder_on(backend, model))
}

/// Builds the device of `placement`, loads the embedding model of `file` onto it (`truncate` as
/// `kiln embed --no-truncate` says), and returns it erased.
pub fn place_embedding(
    file: &ModelFile,
    placement: &Placement,
    devices: &Devices,
    truncate: bool,
) -> Result<Box<dyn EmbeddingRunner>> {
    let load = |e: kiln_engine::EngineError| {
        anyhow::Error::from(e).context(format!(
            "loading the embedding model in {}",
            file.path().display()
        ))
    };
    let cpu = |options: &CpuOptions| -> Result<Box<dyn EmbeddingRunner>> {
        let backend = CpuBackend::with_options(options)?;
        let model = file.load_embedding(&backend, truncate).map_err(load)?;
        Ok(embedding_on(backend, model))
    };
    match placement {
        Placement::Cpu => cpu(&devices.cpu),
        Placement::Vulkan { gpu } => match devices.gpu(*gpu)? {
            DeviceOptions::Cpu(options) => cpu(options),
            DeviceOptions::Vulkan(options) => {
                let backend = VulkanBackend::new(options)?;
                let model = file.load_embedding(&backend, truncate).map_err(load)?;
                Ok(embedding_on(backend, model))
            }
        },
        Placement::Split { .. } => bail!(
            "plan {}: an embedding model runs on one device",
            placement.name()
        ),
    }
}
