//! `kiln bench` for decoders: llama.cpp's `llama-bench` tests, a memory-bandwidth roofline and
//! the process's peak memory.
//!
//! Tests (each runs once untimed as a warm-up, then `-r` timed repetitions; caches are made
//! before the clock starts and emptied before every run):
//! - `ppP`: P token ids prefilled on an empty KV cache in forward passes of `--ubatch` tokens
//!   (512 by default, as `kiln run` and `kiln serve` prefill and as llama-bench's `-ub`; 0 = the
//!   whole prompt in one pass), logits of the last token only; t/s = P / time. The ids are what
//!   llama-bench feeds: BOS first when the model adds one, then ids drawn with a fixed seed from
//!   the normal vocabulary (no control, unused or byte tokens), the same ids in every
//!   repetition.
//! - `tgN` at batch B: N decode steps from an empty cache, the first token BOS (llama-bench's tg
//!   starts from a BOS-only context). Each step is one forward pass of one token per sequence
//!   (B independent sequences with B caches, [`kiln_models::Decoder::forward_batch`]) and the
//!   logits of every row over the whole vocabulary, as decoding needs; the next token of each
//!   sequence is the argmax. t/s = B·N / time. Prompt tests run at batch 1 only. (llama-bench's
//!   `-b` is the prompt batch size; kiln's is the number of concurrent sequences.)
//!
//! Reported per test: mean ± sample standard deviation of the repetitions' t/s (llama-bench's
//! `avg_ts` and `stddev_ts`), and the samples.
//!
//! Roofline (decode tests): a decode step reads every weight the step uses once (all layer
//! weights and the output projection; the token embedding lookup reads one row per sequence,
//! so a tied embedding counts once, as the output; a mixture of experts reads the experts its
//! tokens are routed to, counted for uniform routing) plus the KV cache of every sequence at
//! each step's context, averaged over the test's steps (counted from the file's tensor table by
//! the planner's cost model, `kiln_engine::plan::ModelCost`, so both agree). Divided by the
//! machine's read bandwidth (measured by [`kiln_cpu::memory_bandwidth`] at the test's thread
//! count before the model is loaded and again after the tests, the better of the two taken, on
//! pages of the kind the weights will sit in: huge pages for a GGUF file read into memory, the
//! default, small ones with `--mmap`) that gives the fastest the step could be; the reached
//! fraction is `steps/s · bytes/step / bandwidth`.
//!
//! Beside the runs: a shared host's memory speed can move from one tenth of a second to the
//! next (the 2-core guest we develop on reads 30-36 GB/s most of the time and 45-65 in short
//! bursts), so the best pass of a probe is a moment that a whole decode run never sees. A short
//! probe ([`kiln_cpu::memory_bandwidth_quick`], tens of milliseconds) therefore also runs after
//! the warm-up and after every repetition of a decode test, and the test's share of what those probes gave on average (all their passes' bytes
//! over all their time) is reported too (`beside the runs` in the table; `beside_*` in the
//! JSON). Since the runs and the probes take turns, a burst of fast memory during a run is
//! caught by the probes about as often as by the runs. The headline fraction stays the one
//! against the best probe. These probes run only where the peak mark can be reset after each
//! (below), so that their buffers never count in the peak.
//!
//! Peak RSS: `VmHWM` of `/proc/self/status` after the last test, read before the second probe.
//! The first probe runs first and frees its buffer; the peak mark is then reset (`5` written to
//! `/proc/self/clear_refs`), so the figure is the model's and the tests', not the probe's (the
//! output says so when the reset was refused). Around each probe beside a run the mark is read
//! before and reset after; the figure is the highest of those readings and the last.
//!
//! `--json` prints one JSON array on stdout, one object per test, with `test`, `threads`,
//! `batch`, `tps_mean`, `tps_std`, `samples`, the model's fields and `peak_rss_bytes`; decode
//! tests carry a `roofline` object. Progress goes to stderr.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_backend::{Backend, KvDtype};
use kiln_cli::backends::{cpu_options, DeviceOptions};
use kiln_core::config::DecoderConfig;
use kiln_cpu::{Bandwidth, CpuBackend, CpuTensor, Pages};
use kiln_engine::plan::Placement;
use kiln_engine::{ModelFile, TextTokenizer};
use kiln_models::{Decoder, KvCache, NoTrace};
use kiln_vulkan::{VkTensor, VulkanBackend};
use serde_json::{json, Value};

use crate::load::{open, LoadArgs, ModelArg};
use crate::plan::{choose, describe, PlanArgs, Workload};

/// The model on one backend (the CPU at one thread count, or a Vulkan device). `kiln bench`
/// times the backend's own passes (its timing loops run the generic model on it, not the erased
/// engine), so it refuses a plan split between two devices.
struct Loaded<B: Backend> {
    backend: B,
    model: Decoder<B>,
    tokenizer: TextTokenizer,
    load_ms: f64,
}

impl<B: Backend> Loaded<B> {
    /// Loads the decoder of `file` onto `backend`; `t0` is when building the backend began.
    fn new(file: &mut ModelFile, backend: B, t0: Instant) -> Result<Loaded<B>> {
        let model = file
            .load_decoder(&backend)
            .with_context(|| format!("loading the model in {}", file.path().display()))?;
        Ok(Loaded {
            backend,
            model,
            tokenizer: file.tokenizer()?,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// A backend `kiln bench` can time: the greedy pick of each logits row, read where the backend
/// keeps them (the CPU's own memory; a device's copy back, which a real step pays too).
trait Bench: Backend {
    fn argmax_rows(&self, logits: &Self::Tensor) -> Result<Vec<u32>>;
}

impl Bench for CpuBackend {
    fn argmax_rows(&self, logits: &CpuTensor) -> Result<Vec<u32>> {
        let (_, cols) = self.shape(logits);
        Ok(logits
            .data()
            .chunks_exact(cols.max(1))
            .map(kiln_engine::argmax)
            .collect())
    }
}

impl Bench for VulkanBackend {
    fn argmax_rows(&self, logits: &VkTensor) -> Result<Vec<u32>> {
        let (_, cols) = self.shape(logits);
        Ok(self
            .to_f32(logits)?
            .chunks_exact(cols.max(1))
            .map(kiln_engine::argmax)
            .collect())
    }
}

/// Where one configuration of the bench runs.
enum Target {
    Cpu(kiln_cpu::CpuOptions),
    Vulkan(kiln_vulkan::VulkanOptions),
}

/// Most concurrent sequences `-b` accepts.
const MAX_BATCH: u32 = 1024;
/// Seed of the random prompt ids.
const SEED: u64 = 0x6b69_6c6e;

/// Decoder benchmark flags (`kiln bench` without a subcommand).
#[derive(clap::Args)]
pub struct DecodeBenchArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mmap: LoadArgs,
    #[command(flatten)]
    placement: PlanArgs,
    /// Run as `kiln serve` does: batch-invariant kernels (a sequence's results do not depend on
    /// what it is batched with), to measure what that costs.
    #[arg(long)]
    batch_invariant: bool,
    /// Prompt lengths: test ppP prefills P tokens (0 = no prompt tests).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "P,..",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Prompt tokens per forward pass of the ppP tests, as the engine prefills (llama-bench's
    /// `-ub`); 0 = the whole prompt in one pass (its activations then grow with P).
    #[arg(long, value_name = "U", default_value_t = crate::PREFILL_CHUNK)]
    ubatch: usize,
    /// Decode lengths: test tgN is N one-token steps from an empty context (0 = no decode tests).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_name = "N,..",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Concurrent sequences of the decode tests: at B, each step decodes one token of each of
    /// B independent sequences in one batched forward pass (t/s counts all B). Not llama-bench's
    /// -b, which is its prompt batch size. Prompt tests run at batch 1.
    #[arg(short = 'b', long = "batch", value_name = "B,..", value_delimiter = ',',
          default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH as i64))]
    batch: Vec<u32>,
    /// Worker threads, one or more settings (0 = one per core).
    #[arg(
        short = 't',
        long = "threads",
        value_name = "T,..",
        value_delimiter = ',',
        default_value = "0"
    )]
    threads: Vec<usize>,
    /// Timed repetitions of each test (after one untimed warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    repetitions: u32,
    /// Print one JSON array (an object per test) instead of tables.
    #[arg(long)]
    json: bool,
}

/// One test's definition.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Test {
    Prompt(usize),
    Gen { n: usize, batch: usize },
}

impl Test {
    fn name(self) -> String {
        match self {
            Test::Prompt(p) => format!("pp{p}"),
            Test::Gen { n, .. } => format!("tg{n}"),
        }
    }
    fn batch(self) -> usize {
        match self {
            Test::Prompt(_) => 1,
            Test::Gen { batch, .. } => batch,
        }
    }
    /// Tokens one run processes.
    fn tokens(self) -> usize {
        match self {
            Test::Prompt(p) => p,
            Test::Gen { n, batch } => n * batch,
        }
    }
}

/// A measured test.
struct Row {
    test: Test,
    threads: usize,
    backend: String,
    /// What the KV cache stored (`--kv-type`).
    kv_type: KvDtype,
    samples: Vec<f64>,
    roofline: Option<Roofline>,
}

/// What a decode test reads per step, and how close it came to the bandwidth bound.
struct Roofline {
    weight_bytes: f64,
    kv_bytes: f64,
    bandwidth: Bandwidth,
    /// Steps per second reached (t/s / batch).
    steps_per_s: f64,
    /// The sustained bandwidth of each short probe beside the repetitions (after the warm-up
    /// and after each repetition). Empty when none ran.
    beside: Vec<f64>,
}

impl Roofline {
    fn bytes_per_step(&self) -> f64 {
        self.weight_bytes + self.kv_bytes
    }
    /// t/s if every step ran at the probe's bandwidth.
    fn bound_tps(&self, batch: usize) -> f64 {
        batch as f64 * self.bandwidth.bytes_per_s / self.bytes_per_step()
    }
    fn fraction(&self) -> f64 {
        self.steps_per_s * self.bytes_per_step() / self.bandwidth.bytes_per_s
    }
    /// The bandwidth the probes beside the runs saw on average: all their passes' bytes over
    /// all their time (the harmonic mean of their sustained rates, each probe reading the same
    /// bytes). `None` without such probes.
    fn beside_bandwidth(&self) -> Option<f64> {
        if self.beside.is_empty() {
            return None;
        }
        let inv: f64 = self.beside.iter().map(|b| 1.0 / b).sum();
        Some(self.beside.len() as f64 / inv)
    }
    /// The share of [`Roofline::beside_bandwidth`] the test reached.
    fn beside_fraction(&self) -> Option<f64> {
        self.beside_bandwidth()
            .map(|bw| self.steps_per_s * self.bytes_per_step() / bw)
    }
}

/// Short bandwidth probes beside a decode test's repetitions (see the module docs), and the
/// peak-RSS mark kept across them: before each probe the mark is read, after it the mark is
/// reset, so no probe's buffer counts in the reported peak.
struct SideProbes {
    threads: usize,
    pages: Pages,
    /// The highest `VmHWM` read before a probe.
    peak: Option<u64>,
    /// A probe failed (it could not map its buffer or start its threads): the test goes on
    /// without the figure.
    failed: bool,
}

impl SideProbes {
    fn new(threads: usize, pages: Pages) -> Self {
        SideProbes {
            threads,
            pages,
            peak: None,
            failed: false,
        }
    }

    /// Bytes per second now, on average over the probe's passes; `None` once a probe has
    /// failed (said once on stderr).
    fn probe(&mut self) -> Option<f64> {
        if self.failed {
            return None;
        }
        self.peak = self.peak.max(peak_rss_bytes());
        let bw = kiln_cpu::memory_bandwidth_quick(self.threads, self.pages);
        // The reset worked before the tests (or no probe would run beside them).
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        match bw {
            Ok(bw) => Some(bw.sustained_bytes_per_s),
            Err(e) => {
                eprintln!(
                    "[bench] warning: the memory-bandwidth probe beside the runs failed ({e}); \
                     the share beside the runs is left out"
                );
                self.failed = true;
                None
            }
        }
    }
}

pub fn run(a: DecodeBenchArgs) -> Result<()> {
    let tests = plan(&a)?;
    let file = open(&a.model.model, a.mmap.load_mode())?;
    let info = super::bench_report::ModelInfo::of(&file);
    let threads: Vec<usize> = a.threads.iter().map(|&t| resolve_threads(t)).collect();

    // The probe first, then its buffer is gone and the peak mark reset: the reported peak RSS
    // is the model's.
    let mut bandwidths = Vec::new();
    // From the pages the weights will sit in: their bound, not another kind's.
    let pages = a.mmap.weight_pages(file.kind());
    if tests.iter().any(|t| matches!(t, Test::Gen { .. })) {
        for &t in &threads {
            if bandwidths.iter().any(|b: &Bandwidth| b.threads == t) {
                continue;
            }
            let bw =
                kiln_cpu::memory_bandwidth(t, pages).context("measuring the memory bandwidth")?;
            eprintln!(
                "[bench] memory read bandwidth, {t} threads: {:.1} GB/s (best of {} passes over {} MiB of {} pages, {})",
                bw.bytes_per_s / 1e9,
                bw.passes,
                bw.buffer_bytes >> 20,
                bw.pages.name(),
                if bw.avx2 { "AVX2" } else { "scalar" }
            );
            bandwidths.push(bw);
        }
    }
    let peak_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();

    let work = Workload {
        ctx: tests
            .iter()
            .map(|&t| match t {
                Test::Prompt(p) => p,
                Test::Gen { n, .. } => n + 1,
            })
            .max()
            .unwrap_or(1),
        batch: tests.iter().map(|t| t.batch()).max().unwrap_or(1),
        kv_budget: None,
        kv_dtype: a.mmap.kv.kv_type,
    };
    let mut options = Vec::new();
    for &t in &threads {
        let cpu = cpu_options(t, a.mmap.kv.kv_type, a.batch_invariant)?;
        let (chosen, devices, _) = choose(&file, &a.placement, &cpu, work, false)?;
        eprintln!("[bench] {t} threads: {}", describe(&chosen));
        let target = match chosen.placement {
            Placement::Cpu => Target::Cpu(cpu),
            Placement::Vulkan { gpu } => match devices.gpus.iter().find(|(i, _)| *i == gpu) {
                Some((_, DeviceOptions::Vulkan(o))) => Target::Vulkan(o.clone()),
                _ => bail!(
                    "plan {}: no such device was listed",
                    chosen.placement.name()
                ),
            },
            Placement::Split { .. } => bail!(
                "plan {}: kiln bench measures one device (use --backend cpu or vulkan)",
                chosen.placement.name()
            ),
        };
        let on_device = matches!(target, Target::Vulkan(_));
        options.push(target);
        if on_device {
            // The thread count does not change a device's run: once is enough.
            break;
        }
    }
    // The roofline's bytes per step, from the file as the planner counts them.
    let mut cost = file.cost()?;
    cost.kv_dtype = a.mmap.kv.kv_type;
    let mut rows = Vec::new();
    let mut side_peak = None;
    // Dropped after the last load: its parsed header (a large vocabulary's strings) would
    // count in the tests' peak memory.
    let mut file = Some(file);
    let configs = options.len();
    for (i, (&t, options)) in threads.iter().zip(&options).enumerate() {
        let Some(f) = file.as_mut() else {
            bail!("the model file was closed before its last load");
        };
        let last = i + 1 == configs;
        let t0 = Instant::now();
        let ctx = RunContext {
            tests: &tests,
            info: &info,
            cost: &cost,
            reps: a.repetitions,
            ubatch: a.ubatch,
            threads: t,
            pages,
            peak_reset,
        };
        match options {
            Target::Cpu(o) => {
                let m = Loaded::new(f, CpuBackend::with_options(o)?, t0)?;
                if last {
                    file = None;
                }
                // The CPU's roofline: its bandwidth at this thread count.
                let bandwidth = bandwidths.iter().find(|b| b.threads == t).copied();
                rows.extend(run_tests(&m, &ctx, bandwidth, &mut side_peak)?);
            }
            Target::Vulkan(o) => {
                let m = Loaded::new(f, VulkanBackend::new(o)?, t0)?;
                if last {
                    file = None;
                }
                rows.extend(run_tests(&m, &ctx, None, &mut side_peak)?);
            }
        }
    }
    let peak = peak_rss_bytes().max(side_peak);
    // The probe once more, the tests done and the model freed: on a shared host the bandwidth
    // moves between seconds (the 2-core guest we develop on gives 33-37 GB/s for a while, then
    // 50-62), and the bound is the best the machine gave while the tests ran around it.
    for bw in &mut bandwidths {
        let again = kiln_cpu::memory_bandwidth(bw.threads, pages)
            .context("measuring the memory bandwidth")?;
        eprintln!(
            "[bench] memory read bandwidth, {} threads, after the tests: {:.1} GB/s (before: {:.1})",
            bw.threads,
            again.bytes_per_s / 1e9,
            bw.bytes_per_s / 1e9
        );
        if again.bytes_per_s > bw.bytes_per_s {
            *bw = again;
        }
    }
    for row in &mut rows {
        if let (Some(rl), Some(bw)) = (
            row.roofline.as_mut(),
            bandwidths.iter().find(|b| b.threads == row.threads),
        ) {
            rl.bandwidth = *bw;
        }
    }
    if a.json {
        let out: Vec<Value> = rows
            .iter()
            .map(|r| row_json(r, &a.model.model, &info, peak, a.repetitions, a.ubatch))
            .collect();
        println!("{}", Value::Array(out));
    } else {
        print_tables(&rows, &info, peak, peak_reset);
    }
    Ok(())
}

/// The tests `a` asks for, in llama-bench's order: prompt tests, then decode tests by batch.
fn plan(a: &DecodeBenchArgs) -> Result<Vec<Test>> {
    let mut tests: Vec<Test> = a
        .n_prompt
        .iter()
        .filter(|&&p| p > 0)
        .map(|&p| Test::Prompt(p))
        .collect();
    for &batch in &a.batch {
        for &n in a.n_gen.iter().filter(|&&n| n > 0) {
            tests.push(Test::Gen {
                n,
                batch: batch as usize,
            });
        }
    }
    if tests.is_empty() {
        bail!("nothing to measure: -p and -n are both 0");
    }
    Ok(tests)
}

fn resolve_threads(t: usize) -> usize {
    if t == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        t
    }
}

fn check_context(c: &DecoderConfig, tests: &[Test]) -> Result<()> {
    for t in tests {
        let len = match *t {
            Test::Prompt(p) => p,
            Test::Gen { n, .. } => n,
        };
        if len > c.context_length {
            bail!(
                "test {} needs {len} positions; the model's context holds {}",
                t.name(),
                c.context_length
            );
        }
    }
    Ok(())
}

/// The token ids the tests feed.
struct TestIds {
    /// What the tokenizer puts before a text (BOS), possibly nothing.
    prefix: Vec<u32>,
    /// The normal vocabulary, to draw prompt ids from.
    normal: Vec<u32>,
}

impl TestIds {
    fn new<B: Backend>(m: &Loaded<B>, info: &super::bench_report::ModelInfo) -> TestIds {
        let prefix = m.tokenizer.encode("", true, false).unwrap_or_default();
        let vocab = m.model.config.vocab_size as u32;
        // Without GGUF token types (a Hugging Face folder): every id but BOS and the
        // end-of-generation tokens.
        let mut normal: Vec<u32> = match &info.normal_ids {
            Some(ids) => ids.iter().copied().filter(|&i| i < vocab).collect(),
            None => (0..vocab)
                .filter(|&i| Some(i) != m.tokenizer.bos() && !m.tokenizer.is_end_of_generation(i))
                .collect(),
        };
        if normal.is_empty() {
            normal = (0..vocab).collect();
        }
        TestIds { prefix, normal }
    }

    /// `len` ids: the prefix, then ids drawn from the normal vocabulary (seeded by `len`).
    fn prompt(&self, len: usize) -> Vec<u32> {
        let mut rng = SplitMix64(SEED ^ len as u64);
        let mut ids: Vec<u32> = self.prefix.iter().copied().take(len).collect();
        while ids.len() < len {
            let i = (rng.next() % self.normal.len().max(1) as u64) as usize;
            ids.push(self.normal.get(i).copied().unwrap_or(0));
        }
        ids
    }

    /// The first token of a decode test.
    fn first(&self) -> u32 {
        self.prompt(1).first().copied().unwrap_or(0)
    }
}

/// SplitMix64: a fixed, dependency-free generator for reproducible prompt ids.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// What every configuration's tests share.
struct RunContext<'a> {
    tests: &'a [Test],
    info: &'a super::bench_report::ModelInfo,
    cost: &'a kiln_engine::plan::ModelCost,
    reps: u32,
    /// Prompt tokens per forward pass (0: all).
    ubatch: usize,
    threads: usize,
    pages: Pages,
    peak_reset: bool,
}

/// Runs every test on the loaded model: one row each. `bandwidth` (the CPU's) gives decode tests
/// their roofline and the probes beside the runs.
fn run_tests<B: Bench>(
    m: &Loaded<B>,
    c: &RunContext<'_>,
    bandwidth: Option<Bandwidth>,
    side_peak: &mut Option<u64>,
) -> Result<Vec<Row>> {
    let t = c.threads;
    eprintln!(
        "[bench] {} loaded in {:.0} ms on {}",
        c.info.desc,
        m.load_ms,
        m.backend.name()
    );
    check_context(&m.model.config, c.tests)?;
    let ids = TestIds::new(m, c.info);
    let mut rows = Vec::new();
    for &test in c.tests {
        // Probes beside the runs only where the peak mark can be kept clear of them.
        let mut side = (c.peak_reset && bandwidth.is_some()).then(|| SideProbes::new(t, c.pages));
        let (samples, beside_bw) = measure(m, &ids, test, c, side.as_mut())?;
        *side_peak = (*side_peak).max(side.and_then(|s| s.peak));
        let (mean, sd) = mean_sd(&samples);
        eprintln!(
            "[bench] {} batch {} threads {t}: {mean:.2} ± {sd:.2} t/s",
            test.name(),
            test.batch()
        );
        let roofline = match (test, bandwidth) {
            (Test::Gen { n, batch }, Some(bandwidth)) => Some(Roofline {
                weight_bytes: c.cost.step_weight_bytes(0..c.cost.n_layers(), true, batch),
                kv_bytes: batch as f64 * c.cost.mean_kv_read_bytes(n),
                bandwidth,
                steps_per_s: mean / batch as f64,
                beside: beside_bw,
            }),
            _ => None,
        };
        rows.push(Row {
            test,
            threads: t,
            backend: m.backend.name(),
            kv_type: m.backend.kv_dtype(),
            samples,
            roofline,
        });
    }
    Ok(rows)
}

/// t/s of `c.reps` timed runs of `test`, after one untimed run; with `side` (decode tests), the
/// bandwidth before the first timed run and after each (`reps + 1` figures).
fn measure<B: Bench>(
    m: &Loaded<B>,
    ids: &TestIds,
    test: Test,
    c: &RunContext<'_>,
    mut side: Option<&mut SideProbes>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (b, model, reps) = (&m.backend, &m.model, c.reps);
    let what = || format!("running {}", test.name());
    let mut samples = Vec::with_capacity(reps as usize);
    let mut beside = Vec::new();
    match test {
        Test::Prompt(p) => {
            let prompt = ids.prompt(p);
            let mut cache = model.new_cache(b, p).with_context(what)?;
            for rep in 0..=reps {
                let secs =
                    time_prompt(b, model, &prompt, c.ubatch, &mut cache).with_context(what)?;
                if rep > 0 {
                    samples.push(p as f64 / secs.max(1e-9));
                }
            }
        }
        Test::Gen { n, batch } => {
            let mut caches = (0..batch)
                .map(|_| model.new_cache(b, n))
                .collect::<Result<Vec<_>, _>>()
                .with_context(what)?;
            for rep in 0..=reps {
                let secs = time_gen(b, model, ids.first(), n, &mut caches).with_context(what)?;
                if rep > 0 {
                    samples.push((n * batch) as f64 / secs.max(1e-9));
                }
                if let Some(side) = side.as_deref_mut() {
                    beside.extend(side.probe());
                }
            }
            if side.is_some_and(|s| s.failed) {
                beside.clear();
            }
        }
    }
    Ok((samples, beside))
}

/// Seconds of prefilling `prompt` on the emptied `cache` in passes of `ubatch` tokens (0: one
/// pass), and the last token's logits.
fn time_prompt<B: Bench>(
    b: &B,
    model: &Decoder<B>,
    prompt: &[u32],
    ubatch: usize,
    cache: &mut KvCache<B>,
) -> Result<f64> {
    cache.clear();
    let t0 = Instant::now();
    let mut last = None;
    for part in prompt.chunks(pass_tokens(ubatch, prompt.len()).max(1)) {
        let hidden = model.forward(b, part, cache)?;
        let n = part.len();
        last = Some(b.rows(&hidden, n - 1..n)?);
    }
    let Some(last) = last else {
        bail!("a prompt test needs at least one token");
    };
    let logits = model.logits(b, &last)?;
    std::hint::black_box(b.argmax_rows(&logits)?);
    Ok(t0.elapsed().as_secs_f64())
}

/// Prompt tokens per forward pass of a `prompt`-token test at `--ubatch` `ubatch` (0: all).
fn pass_tokens(ubatch: usize, prompt: usize) -> usize {
    if ubatch == 0 {
        prompt
    } else {
        ubatch.min(prompt)
    }
}

/// Seconds of `n` decode steps of `caches.len()` sequences starting from `first`, each step one
/// batched forward pass and the logits of every sequence.
fn time_gen<B: Bench>(
    b: &B,
    model: &Decoder<B>,
    first: u32,
    n: usize,
    caches: &mut [KvCache<B>],
) -> Result<f64> {
    caches.iter_mut().for_each(KvCache::clear);
    let mut next = vec![first; caches.len()];
    let t0 = Instant::now();
    for _ in 0..n {
        let logits = {
            let seqs: Vec<&[u32]> = next.iter().map(std::slice::from_ref).collect();
            let mut refs: Vec<&mut KvCache<B>> = caches.iter_mut().collect();
            let hidden = model.forward_batch(b, &seqs, &mut refs, &NoTrace)?;
            model.logits(b, &hidden)?
        };
        next = b.argmax_rows(&logits)?;
    }
    std::hint::black_box(&next);
    Ok(t0.elapsed().as_secs_f64())
}

/// Mean and sample standard deviation (0 for one sample).
fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// `81.3% of 36.1 GB/s (34-52)`: the test's share of the average bandwidth beside its runs,
/// and the range of the probes' averages; `-` without probes beside the runs.
fn beside_cell(rl: &Roofline) -> String {
    let (Some(bw), Some(fraction)) = (rl.beside_bandwidth(), rl.beside_fraction()) else {
        return "-".into();
    };
    let lo = rl.beside.iter().fold(f64::INFINITY, |a, &b| a.min(b)) / 1e9;
    let hi = rl.beside.iter().fold(0.0f64, |a, &b| a.max(b)) / 1e9;
    format!(
        "{:.1}% of {:.1} GB/s ({lo:.0}-{hi:.0})",
        100.0 * fraction,
        bw / 1e9
    )
}

// ---- roofline ---------------------------------------------------------------------------

/// The process's peak resident set (`VmHWM`), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kiln_engine::plan::hardware::proc_kib_field(&status, "VmHWM:")
}

// ---- output -----------------------------------------------------------------------------

fn row_json(
    r: &Row,
    model: &str,
    info: &super::bench_report::ModelInfo,
    peak: Option<u64>,
    reps: u32,
    ubatch: usize,
) -> Value {
    let (mean, sd) = mean_sd(&r.samples);
    let (n_prompt, n_gen, n_ubatch) = match r.test {
        Test::Prompt(p) => (p, 0, pass_tokens(ubatch, p)),
        Test::Gen { n, .. } => (0, n, 1),
    };
    let mut v = json!({
        "test": r.test.name(),
        "threads": r.threads,
        "batch": r.test.batch(),
        "tps_mean": mean,
        "tps_std": sd,
        "samples": r.samples,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_ubatch": n_ubatch,
        "tokens": r.test.tokens(),
        "repetitions": reps,
        "model": model,
        "model_desc": info.desc,
        "model_bytes": info.bytes,
        "model_params": info.params,
        "backend": r.backend,
        "kv_type": r.kv_type.name(),
        "peak_rss_bytes": peak,
    });
    if let (Some(rl), Value::Object(obj)) = (&r.roofline, &mut v) {
        obj.insert(
            "roofline".into(),
            json!({
                "weight_bytes_per_step": rl.weight_bytes,
                "kv_bytes_per_step": rl.kv_bytes,
                "bytes_per_step": rl.bytes_per_step(),
                "bytes_per_token": rl.bytes_per_step() / r.test.batch() as f64,
                "bandwidth_bytes_per_s": rl.bandwidth.bytes_per_s,
                "bandwidth_probe_bytes": rl.bandwidth.buffer_bytes,
                "bandwidth_probe_pages": rl.bandwidth.pages.name(),
                "bound_tps": rl.bound_tps(r.test.batch()),
                "bandwidth_fraction": rl.fraction(),
                "beside_probes_bytes_per_s": rl.beside,
                "beside_bandwidth_bytes_per_s": rl.beside_bandwidth(),
                "beside_fraction": rl.beside_fraction(),
            }),
        );
    }
    v
}

fn print_tables(
    rows: &[Row],
    info: &super::bench_report::ModelInfo,
    peak: Option<u64>,
    peak_reset: bool,
) {
    use super::bench_report::{human_bytes, human_count, Table};
    let mut t = Table::new(&[
        ("model", false),
        ("size", true),
        ("params", true),
        ("backend", false),
        ("threads", true),
        ("batch", true),
        ("test", true),
        ("t/s", true),
    ]);
    for r in rows {
        let (mean, sd) = mean_sd(&r.samples);
        t.row(vec![
            info.desc.clone(),
            human_bytes(info.bytes as f64),
            human_count(info.params as f64),
            r.backend.clone(),
            r.threads.to_string(),
            r.test.batch().to_string(),
            r.test.name(),
            format!("{mean:.2} ± {sd:.2}"),
        ]);
    }
    println!("{t}");

    let decode: Vec<&Row> = rows.iter().filter(|r| r.roofline.is_some()).collect();
    if !decode.is_empty() {
        println!(
            "roofline: a decode step reads every weight it uses once, plus the KV cache at the \
             test's mean context; bound = bandwidth / bytes per step, the bandwidth the best \
             pass of the probes before and after the tests; beside the runs: the share of what \
             short probes after the warm-up and after each repetition gave on average (their \
             range in brackets)"
        );
        let mut t = Table::new(&[
            ("threads", true),
            ("batch", true),
            ("test", true),
            ("weights/step", true),
            ("KV/step", true),
            ("bandwidth", true),
            ("bound t/s", true),
            ("t/s", true),
            ("of bandwidth", true),
            ("of bandwidth beside the runs", true),
        ]);
        for r in decode {
            let Some(rl) = &r.roofline else { continue };
            let batch = r.test.batch();
            t.row(vec![
                r.threads.to_string(),
                batch.to_string(),
                r.test.name(),
                human_bytes(rl.weight_bytes),
                human_bytes(rl.kv_bytes),
                format!("{:.1} GB/s", rl.bandwidth.bytes_per_s / 1e9),
                format!("{:.1}", rl.bound_tps(batch)),
                format!("{:.2}", rl.steps_per_s * batch as f64),
                format!("{:.1}%", 100.0 * rl.fraction()),
                beside_cell(rl),
            ]);
        }
        println!("{t}");
    }
    match peak {
        Some(p) => println!(
            "peak RSS {}{}",
            human_bytes(p as f64),
            if peak_reset {
                " (VmHWM; the bandwidth probes are not counted)"
            } else {
                " (VmHWM; /proc/self/clear_refs refused the reset, so it includes the probe's buffer)"
            }
        ),
        None => println!("peak RSS unavailable (no /proc/self/status)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_statistics_are_llama_bench_s() {
        let (m, s) = mean_sd(&[10.0, 12.0, 14.0]);
        assert!((m - 12.0).abs() < 1e-12);
        assert!((s - 2.0).abs() < 1e-12);
        assert_eq!(mean_sd(&[5.0]), (5.0, 0.0));
    }

    #[test]
    fn prompt_ids_start_with_the_prefix_and_come_from_the_normal_vocabulary() {
        let ids = TestIds {
            prefix: vec![2],
            normal: vec![10, 11, 12, 13],
        };
        let p = ids.prompt(64);
        assert_eq!(p.len(), 64);
        assert_eq!(p[0], 2);
        assert!(p[1..].iter().all(|i| (10..=13).contains(i)), "{p:?}");
        assert_eq!(p, ids.prompt(64), "fixed seed");
        assert_eq!(ids.prompt(1), [2]);
        assert_eq!(ids.first(), 2);
        let no_bos = TestIds {
            prefix: vec![],
            normal: vec![7],
        };
        assert_eq!(no_bos.prompt(3), [7, 7, 7]);
    }

    #[test]
    fn argmax_takes_the_first_largest_of_each_row() {
        let logits =
            CpuTensor::new(vec![0.0, 3.0, 3.0, 1.0, f32::NAN, -1.0, 0.5, -2.0], 2, 4).unwrap();
        let b = CpuBackend::new(1).unwrap();
        assert_eq!(b.argmax_rows(&logits).unwrap(), [1, 2]);
    }
}
