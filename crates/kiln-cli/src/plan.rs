//! The planner at the command line: the flags every model command shares (`--backend`,
//! `--gpu-layers`, memory caps), the machine's profile (probed with the CPU backend, cached under
//! `$KILN_HOME/probe/`), a model's costs read from its file, and the plan every command logs
//! before it loads anything. A model that fits on no device is refused here, with the numbers.

use anyhow::{Context, Result};
use kiln_backend::Backend;
use kiln_backend::{Activation, KvDtype};
use kiln_cli::backends::{vulkan_options, DeviceOptions, Devices};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_engine::plan::{
    self, probe, BackendChoice, Candidate, Device, DeviceKind, Hardware, ModelCost, ModelShape,
    PlanRequest, ProductShape, ProfileCache, Rates, PROBE_ROWS, PROBE_STREAM_BYTES,
};
use kiln_engine::ModelFile;
use kiln_hub::Hub;
use kiln_vulkan::{DeviceInfo, VulkanBackend};

/// Seconds per timed window of a throughput probe.
const PROBE_WINDOW_SECS: f64 = 0.15;

/// `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendArg {
    /// The fastest plan that fits (see `kiln plan`), on the CPU or a hardware GPU.
    Auto,
    Cpu,
    /// A Vulkan device: the one of this index, or (`None`) the first usable one, a software
    /// device (lavapipe) included.
    Vulkan(Option<usize>),
}

fn parse_backend(s: &str) -> std::result::Result<BackendArg, String> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(BackendArg::Auto),
        "cpu" => Ok(BackendArg::Cpu),
        "vulkan" | "gpu" => Ok(BackendArg::Vulkan(None)),
        other => match other.strip_prefix("vulkan:") {
            Some(n) => n.parse().map(|n| BackendArg::Vulkan(Some(n))).map_err(|_| {
                format!("{s:?}: the device after vulkan: is a number (see `kiln plan`)")
            }),
            None => Err(format!(
                "{s:?} is not a backend (auto, cpu, vulkan, vulkan:N)"
            )),
        },
    }
}

/// The placement flags of every command that loads a model.
#[derive(clap::Args, Clone, Debug)]
pub struct PlanArgs {
    /// Where the model runs: `auto` plans it (see `kiln plan`; a software Vulkan device is never
    /// picked), `cpu` forces the CPU, `vulkan` the first usable Vulkan device, `vulkan:N` device
    /// N (the numbers `kiln plan` lists).
    #[arg(long, value_name = "auto|cpu|vulkan[:N]", default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendArg,
    /// Put the first N layers on the GPU and the rest on the CPU.
    #[arg(long, value_name = "N")]
    pub gpu_layers: Option<usize>,
    /// Use at most this much RAM (MiB) for the plan's check (default: what the system has
    /// available).
    #[arg(long, value_name = "MiB")]
    pub cpu_memory: Option<u64>,
    /// Use at most this much GPU memory (MiB) on each GPU.
    #[arg(long, value_name = "MiB")]
    pub gpu_memory: Option<u64>,
}

impl PlanArgs {
    pub fn choice(&self) -> BackendChoice {
        match self.backend {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Cpu => BackendChoice::Cpu,
            BackendArg::Vulkan(_) => BackendChoice::Gpu,
        }
    }
}

/// How much measuring the machine may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Use cached rates where there are some; measure nothing.
    CachedOnly,
    /// Measure what is missing for these types (and cache it).
    Missing,
    /// Measure everything again.
    Again,
}

fn simd_name(cpu: &CpuOptions) -> String {
    format!("{:?}", cpu.simd_level()).to_uppercase()
}

/// The Vulkan devices `args` lets a plan use, and notes on those it leaves out: none for
/// `--backend cpu`; for `auto`, the usable hardware GPUs (a software device is slower than
/// kiln's CPU backend, and a machine without a Vulkan loader has none); for `vulkan`, every
/// usable device; for `vulkan:N`, device N. Naming a device that cannot be used is an error.
pub fn vulkan_devices(args: &PlanArgs) -> Result<(Vec<DeviceInfo>, Vec<String>)> {
    let usable = |d: &DeviceInfo| d.unusable.is_none();
    match args.backend {
        BackendArg::Cpu => Ok((Vec::new(), Vec::new())),
        BackendArg::Auto => match kiln_vulkan::list_devices() {
            Ok(list) => {
                let mut notes = Vec::new();
                let mut gpus = Vec::new();
                for d in list {
                    match (&d.unusable, d.kind) {
                        (Some(why), _) => {
                            notes.push(format!("vulkan:{} ({}) {why}", d.index, d.name))
                        }
                        (None, kiln_vulkan::DeviceKind::Cpu) => notes.push(format!(
                            "vulkan:{} ({}) is a software device, slower than the CPU backend; not planned (use --backend vulkan:{} to run on it anyway)",
                            d.index, d.name, d.index
                        )),
                        (None, _) => gpus.push(d),
                    }
                }
                Ok((gpus, notes))
            }
            Err(e) => Ok((Vec::new(), vec![format!("no GPU: {e}")])),
        },
        BackendArg::Vulkan(None) => {
            let list = kiln_vulkan::list_devices()?;
            let (ok, bad): (Vec<_>, Vec<_>) = list.into_iter().partition(usable);
            if ok.is_empty() {
                let why: Vec<String> = bad
                    .iter()
                    .map(|d| {
                        format!(
                            "vulkan:{} ({}) {}",
                            d.index,
                            d.name,
                            d.unusable.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                anyhow::bail!(
                    "--backend vulkan: no usable Vulkan device{}",
                    if why.is_empty() {
                        " (the loader lists none; Debian: apt-get install mesa-vulkan-drivers, or a GPU driver)".to_string()
                    } else {
                        format!(": {}", why.join("; "))
                    }
                );
            }
            Ok((ok, Vec::new()))
        }
        BackendArg::Vulkan(Some(n)) => {
            let list = kiln_vulkan::list_devices()?;
            let Some(d) = list.iter().find(|d| d.index == n) else {
                anyhow::bail!(
                    "--backend vulkan:{n}: this machine has {} Vulkan device(s){}",
                    list.len(),
                    list.iter()
                        .map(|d| format!("; vulkan:{} is {}", d.index, d.name))
                        .collect::<String>()
                );
            };
            if let Some(why) = &d.unusable {
                anyhow::bail!("--backend vulkan:{n} ({}) {why}", d.name);
            }
            Ok((vec![d.clone()], Vec::new()))
        }
    }
}

/// The backends a plan over `gpus` may build: the CPU as `cpu` says, each GPU with the KV
/// cache type `kv` and batch-invariant as the CPU is (serving).
pub fn devices(cpu: &CpuOptions, gpus: &[DeviceInfo], kv: KvDtype) -> Devices {
    Devices {
        cpu: cpu.clone(),
        gpus: gpus
            .iter()
            .map(|d| {
                (
                    d.index,
                    DeviceOptions::Vulkan(vulkan_options(Some(d.index), kv, cpu.batch_invariant)),
                )
            })
            .collect(),
    }
}

/// The machine: the CPU as `cpu` will run it (rates cached or measured as `probe` says, for
/// what `cost` needs: its weight types and attention shape; a CPU backend is built only to
/// measure), RAM available (capped by `--cpu-memory`), and the GPUs `gpus` (memory capped by
/// `--gpu-memory`; rates cached, or measured as `probe` says, a hardware GPU's missing ones
/// always, which takes it about a second).
pub fn hardware(
    args: &PlanArgs,
    cpu: &CpuOptions,
    gpus: &[DeviceInfo],
    cost: &ModelCost,
    probe: Probe,
) -> Result<Hardware> {
    let threads = cpu.resolved_threads();
    let simd = simd_name(cpu);
    let cpu_model = plan::hardware::cpu_model();
    let (total, available) = plan::hardware::meminfo().unwrap_or((0, 0));
    let cap = args.cpu_memory.map(|m| m << 20);
    let free = match (cap, available) {
        (Some(c), 0) => c,
        (Some(c), a) => c.min(a),
        (None, a) => a,
    };
    let cache = ProfileCache::new(Hub::from_env().home());
    let key = ProfileCache::key("cpu", &cpu_model, threads, &simd);
    let mut rates = match probe {
        Probe::Again => Rates::default(),
        _ => cache.load(&key).unwrap_or_default(),
    };
    if probe != Probe::CachedOnly {
        let missing = rates.missing(&cost.probe_shapes());
        let shape = cost.attention_shape();
        let attention = (!rates.attention.contains_key(&shape.key())).then_some(shape);
        if !rates.measured() || !missing.is_empty() || attention.is_some() {
            let backend = CpuBackend::with_options(cpu)?;
            let bandwidth = |b: &CpuBackend| {
                // A prediction wants the rate kiln's decode kernels stream weights at, not the
                // bound (`kiln bench` reports the bound, on huge pages): the small-page probe is
                // that rate within the planner's tolerance on the machines measured
                // (`scripts/plan-vs-bench`), where the huge-page one runs up to 1.9× above it.
                kiln_cpu::memory_bandwidth(b.threads(), kiln_cpu::Pages::Small)
                    .map(|bw| bw.bytes_per_s)
                    .context("measuring the memory bandwidth")
            };
            measure(&backend, &mut rates, &missing, attention, bandwidth)?;
            match cache.store(&key, &rates) {
                Ok(p) => eprintln!("[plan] measured rates cached in {}", p.display()),
                Err(e) => eprintln!("[plan] could not cache the measured rates: {e}"),
            }
        }
    }
    Ok(Hardware {
        cpu: Device {
            kind: DeviceKind::Cpu,
            name: format!("cpu ({threads} threads, {simd})"),
            memory_free: free,
            memory_total: total,
            rates,
            link_bandwidth: 0.0,
            link_latency: 0.0,
        },
        cpu_model,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        simd,
        gpus: gpus
            .iter()
            .map(|d| gpu(args, d, cpu.kv_dtype, cost, probe, &cache))
            .collect::<Result<_>>()?,
    })
}

/// One Vulkan device for the planner.
fn gpu(
    args: &PlanArgs,
    d: &DeviceInfo,
    kv: KvDtype,
    cost: &ModelCost,
    probe: Probe,
    cache: &ProfileCache,
) -> Result<Device> {
    // Rates with and without matrix units differ (KILN_VULKAN_COOPMAT=1 turns them on).
    let units = if d.uses_matrix_units() {
        " coopmat"
    } else {
        ""
    };
    let key = ProfileCache::key("vulkan", &d.name, 0, &format!("{}{units}", d.api_version));
    let mut rates = match probe {
        Probe::Again => Rates::default(),
        _ => cache.load(&key).unwrap_or_default(),
    };
    let hardware_gpu = d.kind != kiln_vulkan::DeviceKind::Cpu;
    if probe != Probe::CachedOnly || hardware_gpu {
        let missing = rates.missing(&cost.probe_shapes());
        let shape = cost.attention_shape();
        let attention = (!rates.attention.contains_key(&shape.key())).then_some(shape);
        if !rates.measured() || !missing.is_empty() || attention.is_some() {
            eprintln!("[plan] measuring vulkan:{} ({})...", d.index, d.name);
            let backend = VulkanBackend::new(&vulkan_options(Some(d.index), kv, false))?;
            let bandwidth = |b: &VulkanBackend| {
                probe::copy_bandwidth(b, 256 << 20, PROBE_WINDOW_SECS)
                    .context("measuring the device's copy bandwidth")
            };
            measure(&backend, &mut rates, &missing, attention, bandwidth)?;
            match cache.store(&key, &rates) {
                Ok(p) => eprintln!("[plan] measured rates cached in {}", p.display()),
                Err(e) => eprintln!("[plan] could not cache the measured rates: {e}"),
            }
        }
    }
    let total = d.memory_bytes;
    let free = args.gpu_memory.map_or(total, |m| (m << 20).min(total));
    // Host <-> device: a PCIe link for a discrete GPU, shared memory otherwise (figures of the
    // order of what such links give; the hidden state of one step is a few KiB).
    let (link_bandwidth, link_latency) = match d.kind {
        kiln_vulkan::DeviceKind::Discrete => (12e9, 20e-6),
        _ => (20e9, 10e-6),
    };
    Ok(Device {
        kind: DeviceKind::Vulkan { index: d.index },
        name: format!(
            "vulkan:{} ({}, {}{})",
            d.index,
            d.name,
            d.kind.describe(),
            if d.uses_matrix_units() {
                ", matrix units"
            } else {
                ""
            }
        ),
        memory_free: free,
        memory_total: total,
        rates,
        link_bandwidth,
        link_latency,
    })
}

/// Measures a device's rates: bandwidth (by `bandwidth`) and fixed costs when not known,
/// products of `types`.
fn measure<B: Backend>(
    b: &B,
    rates: &mut Rates,
    shapes: &[ProductShape],
    attention: Option<probe::AttentionShape>,
    bandwidth: impl FnOnce(&B) -> Result<f64>,
) -> Result<()> {
    if let Some(busy) = cpu_busy(std::time::Duration::from_millis(250)) {
        if busy > 0.25 {
            eprintln!(
                "[plan] warning: other processes are using {:.0}% of the CPU; the measured rates \
                 will be low (run `kiln plan --reprobe` again on an idle machine)",
                busy * 100.0
            );
        }
    }
    if !rates.measured() {
        eprintln!("[plan] measuring this machine (once; cached under $KILN_HOME/probe)...");
        rates.bandwidth = bandwidth(b)?;
        rates.product_latency = probe::product_latency(b, PROBE_WINDOW_SECS)?;
        rates.op_latency = probe::op_latency(b, 1024, PROBE_WINDOW_SECS)?;
        rates.elementwise =
            probe::elementwise_secs(b, Activation::GeluTanh, 128, 4096, PROBE_WINDOW_SECS)?;
        eprintln!(
            "[plan]   bandwidth {:.1} GB/s, product latency {:.1} µs, op latency {:.2} µs, \
             element-wise {:.2} ns/element",
            rates.bandwidth / 1e9,
            rates.product_latency * 1e6,
            rates.op_latency * 1e6,
            rates.elementwise * 1e9
        );
    }
    if let Some(shape) = attention {
        let rate = probe::attention_rate(b, shape, PROBE_WINDOW_SECS)?;
        eprintln!(
            "[plan]   attention ({}): {:.1} GMAC/s",
            shape.key(),
            rate / 1e9
        );
        rates.attention.insert(shape.key(), rate);
    }
    for shape in shapes {
        let mut per_rows = Vec::new();
        for rows in PROBE_ROWS {
            per_rows.push(probe::matmul_rate(
                b,
                shape.ty,
                rows,
                shape.k,
                shape.n,
                PROBE_STREAM_BYTES,
                PROBE_WINDOW_SECS,
                rates.product_latency,
            )?);
        }
        eprintln!(
            "[plan]   {} products: {} GMAC/s at {} rows",
            shape.key(),
            per_rows
                .iter()
                .map(|r| format!("{:.1}", r / 1e9))
                .collect::<Vec<_>>()
                .join(" / "),
            PROBE_ROWS.map(|r| r.to_string()).join(" / ")
        );
        rates.matmul.insert(shape.key(), per_rows);
    }
    Ok(())
}

/// The share of the machine's CPU time spent busy over `window` (`/proc/stat`), before any
/// probe runs: what others are using.
fn cpu_busy(window: std::time::Duration) -> Option<f64> {
    fn sample() -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let idle = fields.get(3)? + fields.get(4).unwrap_or(&0);
        Some((fields.iter().sum(), idle))
    }
    let (t0, i0) = sample()?;
    std::thread::sleep(window);
    let (t1, i1) = sample()?;
    let total = t1.checked_sub(t0).filter(|&t| t > 0)?;
    Some(1.0 - (i1.saturating_sub(i0)) as f64 / total as f64)
}

/// What a command will run: context positions per sequence (capped at the model's; tokens per
/// sentence for encoders), sequences or sentences per pass, and a server's fixed KV pool.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub ctx: usize,
    pub batch: usize,
    pub kv_budget: Option<u64>,
    /// What the KV cache will store (`--kv-type`): its bytes count in the plan's memory check.
    pub kv_dtype: KvDtype,
}

/// Plans the model in `file` for a command (`split`: whether the work may run split between a
/// GPU and the CPU): reads its costs, profiles the machine as `cpu` will
/// run it (cached rates only: a command does not stop to measure), and returns the chosen plan,
/// or refuses with the numbers. Nothing is loaded.
pub fn choose(
    file: &ModelFile,
    args: &PlanArgs,
    cpu: &CpuOptions,
    work: Workload,
    split: bool,
) -> Result<(Candidate, Devices, Vec<String>)> {
    let mut cost = file.cost()?;
    cost.kv_dtype = work.kv_dtype;
    let ctx = match &cost.shape {
        ModelShape::Decoder(c) => work.ctx.min(c.context_length),
        ModelShape::Encoder(c) => work.ctx.min(c.max_positions),
    };
    let (gpus, notes) = vulkan_devices(args)?;
    let hw = hardware(args, cpu, &gpus, &cost, Probe::CachedOnly)?;
    let req = PlanRequest {
        ctx,
        batch: work.batch.max(1),
        prompt: ctx.min(crate::PREFILL_CHUNK),
        backend: args.choice(),
        gpu_layers: args.gpu_layers,
        kv_budget: work.kv_budget,
        split,
    };
    let p = plan::plan(&cost, &hw, &req)?;
    let chosen = p
        .require()
        .map_err(|e| anyhow::anyhow!("{e}\n(the model was not loaded; see `kiln plan`)"))?;
    Ok((chosen.clone(), devices(cpu, &gpus, work.kv_dtype), notes))
}

/// One line for logs: the placement, the memory it needs, the prediction when rates are known.
pub fn describe(c: &Candidate) -> String {
    let predicted = c
        .prediction
        .as_ref()
        .map(|p| match (p.decode_tps, p.sentences_per_s) {
            (Some(d), _) => format!(
                ", predicted {d:.0} tok/s decode, {:.0} tok/s prefill",
                p.prefill_tps
            ),
            (None, Some(s)) => format!(", predicted {s:.0} sentences/s"),
            _ => String::new(),
        })
        .unwrap_or_default();
    format!("plan: {} ({}{predicted})", c.placement.name(), c.reason)
}
