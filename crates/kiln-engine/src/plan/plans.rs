//! Candidate placements, whether each fits, what each will do, and the choice.
//!
//! Placements: `cpu` (everything on the CPU), `vulkan:N` (everything on one GPU) and `split` (the
//! embedding and the first N layers on a GPU, the other layers and the head on the CPU; the
//! hidden state crosses once per forward pass). A split takes the largest N that fits, or the
//! user's `--gpu-layers`.
//!
//! **Fit.** A device holds its weights, the KV cache of its layers for the requested context and
//! batch, and the activations of the largest pass; it fits when
//! `weights + 1.5 × (KV + activations) ≤ free memory`. Weight bytes are exact (from the file);
//! the 1.5 is headroom for what the estimates leave out (allocator slack, per-op temporaries,
//! a device's own context).
//!
//! **Prediction.** A step is the sum over its matrix products of the slower of reading the
//! weight (`bytes / bandwidth`) and computing with it (`multiply-adds / measured rate` of that
//! weight type at that many rows), plus the KV cache reads, the fixed cost of each op
//! (products and small ops, counted per layer as the decoder issues them) and, for a split, the
//! crossing. Decode tok/s is `batch / step seconds` at the middle of a 128-token generation;
//! prefill tok/s is a prompt chunk's tokens over its seconds, attention included. Encoders get
//! the largest batch each device holds and sentences/s at a given sentence length.

use kiln_core::GgmlType;
use serde::Serialize;

use super::cost::{ModelCost, ModelShape, Place, ProductShape};
use super::hardware::{Device, Hardware, Rates};

/// Headroom factor on the KV cache and activations.
pub const HEADROOM: f64 = 1.5;
/// Matrix-product calls per decoder layer in a forward pass (Q/K/V together, the output,
/// gate/up together, down: `Decoder::forward_inner`).
pub const PRODUCTS_PER_LAYER: f64 = 4.0;
/// Small ops per decoder layer (two input norms, QK norms, two ropes, attention, two residual
/// adds, the gated activation).
pub const OPS_PER_LAYER: f64 = 10.0;
/// Tokens of the generation a decode prediction describes (`kiln bench`'s tg128).
pub const DECODE_TOKENS: usize = 128;

/// Which backends the user allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cpu,
    /// A GPU (the devices the hardware lists: all of them, or the one the user named).
    Gpu,
}

/// What the plan is for.
#[derive(Clone, Copy, Debug)]
pub struct PlanRequest {
    /// Context positions per sequence.
    pub ctx: usize,
    /// Sequences decoded together (decoders) or sentences per pass (encoders).
    pub batch: usize,
    /// Prompt length the prefill prediction describes.
    pub prompt: usize,
    pub backend: BackendChoice,
    /// Force a split with this many layers on the GPU.
    pub gpu_layers: Option<usize>,
    /// A KV cache of this many bytes in all (a server's pool) instead of `ctx × batch`
    /// positions; split between devices by their share of the layers.
    pub kv_budget: Option<u64>,
    /// Whether the work can run split between a GPU and the CPU (generation can; scoring,
    /// serving and embedding cannot yet): without it no split is a candidate.
    pub split: bool,
}

/// Where the layers go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Placement {
    Cpu,
    /// Everything on the GPU whose Vulkan device index is `gpu`.
    Vulkan {
        gpu: usize,
    },
    Split {
        gpu: usize,
        gpu_layers: usize,
    },
}

impl Placement {
    pub fn name(&self) -> String {
        match self {
            Placement::Cpu => "cpu".into(),
            Placement::Vulkan { gpu } => format!("vulkan:{gpu}"),
            Placement::Split { gpu, gpu_layers } => {
                format!("split vulkan:{gpu} {gpu_layers} layers + cpu")
            }
        }
    }
}

/// One device's share of a plan.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceUse {
    pub device: String,
    pub layers: std::ops::Range<usize>,
    pub weights: u64,
    pub kv: u64,
    pub activations: u64,
    /// `weights + HEADROOM × (kv + activations)`.
    pub needed: u64,
    pub free: u64,
}

impl DeviceUse {
    pub fn fits(&self) -> bool {
        self.needed <= self.free
    }
}

/// Predicted speed.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    /// Decoders: generated tokens per second over the whole batch.
    pub decode_tps: Option<f64>,
    /// Decoders: bytes read per decode step.
    pub decode_bytes_per_step: Option<f64>,
    /// Prompt tokens per second (decoders) or embedded tokens per second (encoders).
    pub prefill_tps: f64,
    /// Encoders: sentences per second at the request's batch and sentence length.
    pub sentences_per_s: Option<f64>,
    /// Encoders: the largest batch of sentences of `ctx` tokens each device holds.
    pub max_batch: Option<Vec<(String, usize)>>,
}

/// One candidate plan.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub placement: Placement,
    pub uses: Vec<DeviceUse>,
    pub fits: bool,
    /// Why it fits or not, with the numbers.
    pub reason: String,
    pub prediction: Option<Prediction>,
}

/// Every candidate and the chosen one.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub candidates: Vec<Candidate>,
    pub chosen: Option<usize>,
}

impl Plan {
    pub fn chosen(&self) -> Option<&Candidate> {
        self.chosen.map(|i| &self.candidates[i])
    }
}

/// Why no plan was chosen.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the model fits on no device:\n{0}")]
    FitsNowhere(String),
    #[error("{0}")]
    Unavailable(String),
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// Layers of a device's part and whether it holds the embedding and the head.
#[derive(Clone, Debug)]
struct Part {
    layers: std::ops::Range<usize>,
    embedding: bool,
    head: bool,
}

fn device_use(cost: &ModelCost, dev: &Device, part: &Part, req: &PlanRequest) -> DeviceUse {
    let mut weights: u64 = part
        .layers
        .clone()
        .map(|l| cost.bytes_at(Place::Layer(l)))
        .sum();
    if part.embedding {
        weights += cost.bytes_at(Place::Embedding);
    }
    if part.head {
        weights += cost.bytes_at(Place::Head);
        if cost.tied_output && !part.embedding {
            weights += cost.output().map_or(0, |t| t.bytes);
        }
    }
    let (kv, activations) = match cost.shape {
        ModelShape::Decoder(_) => (
            match req.kv_budget {
                Some(total) => total * part.layers.len() as u64 / cost.n_layers().max(1) as u64,
                None => cost.kv_cache_bytes(part.layers.clone(), req.ctx, req.batch),
            },
            cost.activation_bytes(
                cost.pass_rows(req.batch),
                if part.head { req.batch } else { 0 },
            ),
        ),
        ModelShape::Encoder(_) => (0, cost.activation_bytes(req.batch * req.ctx, 0)),
    };
    let needed = weights + (HEADROOM * (kv + activations) as f64).ceil() as u64;
    DeviceUse {
        device: dev.name.clone(),
        layers: part.layers.clone(),
        weights,
        kv,
        activations,
        needed,
        free: dev.memory_free,
    }
}

/// Multiply-adds per second of a product of weight type `ty` at `rows` activation rows: the rate
/// probed on that type's shape among `shapes` (`ModelCost::probe_shapes`, computed once per
/// prediction), or unbounded when there is none (the product's bytes bound it then).
fn product_rate(shapes: &[ProductShape], r: &Rates, ty: GgmlType, rows: usize) -> f64 {
    shapes
        .iter()
        .find(|s| s.ty == ty)
        .and_then(|shape| r.matmul_rate(shape, rows))
        .unwrap_or(f64::INFINITY)
}

/// Seconds of one decode step of `batch` sequences at `position` over a device's part.
fn decode_secs(cost: &ModelCost, dev: &Device, part: &Part, batch: usize, position: usize) -> f64 {
    let r = &dev.rates;
    let mut places: Vec<Place> = part.layers.clone().map(Place::Layer).collect();
    if part.head {
        places.push(Place::Head);
    }
    let shapes = cost.probe_shapes();
    let mut secs = 0.0;
    for &place in &places {
        for p in cost.products(place, batch) {
            let rate = product_rate(&shapes, r, p.tensor.ty, batch);
            let compute = batch as f64 * p.macs_per_token / rate;
            secs += (p.bytes / r.bandwidth).max(compute);
        }
        secs += cost.vector_bytes(place) / r.bandwidth;
    }
    let layers = part.layers.len() as f64;
    secs += batch as f64 * cost.kv_read_bytes(part.layers.clone(), position) / r.bandwidth;
    secs += layers * (PRODUCTS_PER_LAYER * r.product_latency + OPS_PER_LAYER * r.op_latency);
    secs += layers * batch as f64 * cost.elementwise_per_token() * r.elementwise;
    if part.head {
        // The logits' copy to the host and the sampler's pass over them.
        let vocab = cost.decoder().map_or(0, |c| c.vocab_size) as f64;
        secs += r.product_latency + 2.0 * 4.0 * vocab * batch as f64 / r.bandwidth;
    }
    secs
}

/// Seconds of one forward pass over `tokens` prompt tokens (the logits of the last only) on a
/// device's part; for encoders, `tokens` tokens in sentences of `seq` tokens.
fn prefill_secs(cost: &ModelCost, dev: &Device, part: &Part, tokens: usize, seq: usize) -> f64 {
    let r = &dev.rates;
    let shapes = cost.probe_shapes();
    let mut secs = 0.0;
    for l in part.layers.clone() {
        for p in cost.products(Place::Layer(l), tokens) {
            let rate = product_rate(&shapes, r, p.tensor.ty, tokens);
            secs += (p.bytes / r.bandwidth).max(tokens as f64 * p.macs_per_token / rate);
        }
    }
    let attention = match cost.shape {
        ModelShape::Decoder(_) => cost.attention_macs(part.layers.clone(), tokens),
        ModelShape::Encoder(_) => {
            (tokens / seq.max(1)) as f64 * cost.attention_macs(part.layers.clone(), seq)
        }
    };
    let attention_rate = r
        .attention
        .get(&cost.attention_shape().key())
        .copied()
        .unwrap_or(f64::INFINITY);
    secs += attention / attention_rate;
    let layers = part.layers.len() as f64;
    secs += layers * tokens as f64 * cost.elementwise_per_token() * r.elementwise;
    secs += layers * (PRODUCTS_PER_LAYER * r.product_latency + OPS_PER_LAYER * r.op_latency);
    if part.head && cost.decoder().is_some() {
        secs += decode_secs(
            cost,
            dev,
            &Part {
                layers: 0..0,
                embedding: false,
                head: true,
            },
            1,
            0,
        );
    }
    secs
}

/// Seconds of moving `rows` hidden states between two devices (both ways' latency: out of one,
/// into the other).
fn crossing_secs(cost: &ModelCost, gpu: &Device, rows: usize) -> f64 {
    let bytes = (rows * cost.d_model() * 4) as f64;
    2.0 * gpu.link_latency + bytes / gpu.link_bandwidth.max(1.0)
}

fn predict(cost: &ModelCost, parts: &[(&Device, Part)], req: &PlanRequest) -> Prediction {
    let crossings = parts.len().saturating_sub(1);
    let gpu = parts.first().map(|p| p.0);
    match cost.shape {
        ModelShape::Decoder(_) => {
            // A 128-token generation from an empty context, as `kiln bench`'s tg128.
            let position = (DECODE_TOKENS / 2).min(req.ctx);
            let mut step: f64 = parts
                .iter()
                .map(|(d, p)| decode_secs(cost, d, p, req.batch, position))
                .sum();
            let tokens = req.prompt.clamp(1, crate::PREFILL_CHUNK);
            let mut prompt: f64 = parts
                .iter()
                .map(|(d, p)| prefill_secs(cost, d, p, tokens, tokens))
                .sum();
            if let (true, Some(g)) = (crossings > 0, gpu) {
                step += crossing_secs(cost, g, req.batch);
                prompt += crossing_secs(cost, g, tokens);
            }
            let bytes: f64 = parts
                .iter()
                .map(|(_, p)| cost.step_weight_bytes(p.layers.clone(), p.head, req.batch))
                .sum();
            Prediction {
                decode_tps: Some(req.batch as f64 / step),
                decode_bytes_per_step: Some(bytes),
                prefill_tps: tokens as f64 / prompt,
                sentences_per_s: None,
                max_batch: None,
            }
        }
        ModelShape::Encoder(_) => {
            let seq = req.ctx.max(1);
            let tokens = req.batch * seq;
            let mut secs: f64 = parts
                .iter()
                .map(|(d, p)| prefill_secs(cost, d, p, tokens, seq))
                .sum();
            if let (true, Some(g)) = (crossings > 0, gpu) {
                secs += crossing_secs(cost, g, tokens);
            }
            let max_batch = parts
                .iter()
                .map(|(d, p)| {
                    let weights = device_use(cost, d, p, &PlanRequest { batch: 1, ..*req }).weights;
                    let per = HEADROOM * cost.activation_bytes(seq, 0) as f64;
                    let room = d.memory_free.saturating_sub(weights) as f64;
                    (d.name.clone(), (room / per).floor() as usize)
                })
                .collect();
            Prediction {
                decode_tps: None,
                decode_bytes_per_step: None,
                prefill_tps: tokens as f64 / secs,
                sentences_per_s: Some(req.batch as f64 / secs),
                max_batch: Some(max_batch),
            }
        }
    }
}

fn candidate(
    cost: &ModelCost,
    placement: Placement,
    parts: Vec<(&Device, Part)>,
    req: &PlanRequest,
) -> Candidate {
    let uses: Vec<DeviceUse> = parts
        .iter()
        .map(|(d, p)| device_use(cost, d, p, req))
        .collect();
    let fits = uses.iter().all(DeviceUse::fits);
    let reason = uses
        .iter()
        .map(|u| {
            format!(
                "{}: needs {} (weights {} + {HEADROOM} × (KV {} + activations {})) of {} free{}",
                u.device,
                mib(u.needed),
                mib(u.weights),
                mib(u.kv),
                mib(u.activations),
                mib(u.free),
                if u.fits() { "" } else { " — does not fit" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    // Predictions need every device's measured rates.
    let measured = parts.iter().all(|(d, _)| {
        d.rates.measured()
            && d.rates
                .attention
                .contains_key(&cost.attention_shape().key())
    });
    Candidate {
        placement,
        prediction: measured.then(|| predict(cost, &parts, req)),
        uses,
        fits,
        reason,
    }
}

/// Every candidate plan for `cost` on `hw`, and the chosen one: the fitting candidate with the
/// highest predicted decode tok/s (sentences/s for encoders) among those `req` allows.
pub fn plan(cost: &ModelCost, hw: &Hardware, req: &PlanRequest) -> Result<Plan, PlanError> {
    let n = cost.n_layers();
    if req.backend == BackendChoice::Gpu && hw.gpus.is_empty() {
        return Err(PlanError::Unavailable(
            "--backend vulkan: no usable Vulkan device (see `kiln plan`)".into(),
        ));
    }
    if let Some(g) = req.gpu_layers {
        if hw.gpus.is_empty() {
            return Err(PlanError::Unavailable(format!(
                "--gpu-layers {g}: no GPU to put layers on (no usable Vulkan device; see `kiln plan`)"
            )));
        }
        if g > n {
            return Err(PlanError::Unavailable(format!(
                "--gpu-layers {g}: the model has {n} layers"
            )));
        }
        if req.backend == BackendChoice::Cpu {
            return Err(PlanError::Unavailable(
                "--gpu-layers with --backend cpu".into(),
            ));
        }
        if !req.split {
            return Err(PlanError::Unavailable(format!(
                "--gpu-layers {g}: a model split between a GPU and the CPU only generates (no \
                 scoring, serving or embedding yet)"
            )));
        }
    }
    let whole = |layers| Part {
        layers,
        embedding: true,
        head: true,
    };
    let mut candidates = Vec::new();
    let allow_cpu = req.backend != BackendChoice::Gpu && req.gpu_layers.is_none();
    let allow_gpu = req.backend != BackendChoice::Cpu;
    if allow_cpu {
        candidates.push(candidate(
            cost,
            Placement::Cpu,
            vec![(&hw.cpu, whole(0..n))],
            req,
        ));
    }
    if allow_gpu {
        for g in &hw.gpus {
            let i = g.kind.gpu_index().unwrap_or(0);
            if req.gpu_layers.is_none() {
                candidates.push(candidate(
                    cost,
                    Placement::Vulkan { gpu: i },
                    vec![(g, whole(0..n))],
                    req,
                ));
            }
            let split = |k: usize| {
                let parts = vec![
                    (
                        g,
                        Part {
                            layers: 0..k,
                            embedding: true,
                            head: false,
                        },
                    ),
                    (
                        &hw.cpu,
                        Part {
                            layers: k..n,
                            embedding: false,
                            head: true,
                        },
                    ),
                ];
                candidate(
                    cost,
                    Placement::Split {
                        gpu: i,
                        gpu_layers: k,
                    },
                    parts,
                    req,
                )
            };
            match req.gpu_layers {
                _ if !req.split => {}
                Some(k) => candidates.push(split(k)),
                // `--backend vulkan` alone asks for the whole model on the device.
                None if req.backend == BackendChoice::Gpu => {}
                None => {
                    // The most layers whose GPU share fits (the GPU part grows with k).
                    let fits_gpu = |k: usize| split(k).uses[0].fits();
                    if n > 1 && fits_gpu(1) {
                        let (mut lo, mut hi) = (1, n - 1);
                        while lo < hi {
                            let mid = (lo + hi).div_ceil(2);
                            if fits_gpu(mid) {
                                lo = mid
                            } else {
                                hi = mid - 1
                            }
                        }
                        candidates.push(split(lo));
                    }
                }
            }
        }
    }
    let score = |c: &Candidate| {
        c.prediction.as_ref().map_or(0.0, |p| {
            p.decode_tps.or(p.sentences_per_s).unwrap_or(p.prefill_tps)
        })
    };
    // The first of the fastest: without predictions (rates not measured) the order of the list
    // decides (the CPU, then a whole GPU, then a split).
    let chosen = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.fits)
        .fold(None::<(usize, f64)>, |best, (i, c)| match best {
            Some((_, s)) if score(c) <= s => best,
            _ => Some((i, score(c))),
        })
        .map(|(i, _)| i);
    Ok(Plan { candidates, chosen })
}

impl Plan {
    /// The chosen candidate, or why there is none: every candidate's bytes needed and free.
    pub fn require(&self) -> Result<&Candidate, PlanError> {
        self.chosen().ok_or_else(|| {
            let lines: Vec<String> = self
                .candidates
                .iter()
                .map(|c| format!("  {}: {}", c.placement.name(), c.reason))
                .collect();
            PlanError::FitsNowhere(lines.join("\n"))
        })
    }
}
