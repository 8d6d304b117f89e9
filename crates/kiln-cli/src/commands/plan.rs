//! `kiln plan`: the placements a model could run with on this machine, whether each fits (bytes
//! needed against free), what each is predicted to do, and the one `--backend auto` picks.

use anyhow::{Context, Result};
use kiln_engine::plan::{self, Candidate, ModelCost, Place, PlanRequest};
use serde_json::json;

use kiln_cli::backends::cpu_options;
use kiln_formats::LoadMode;

use crate::load::{open, KvTypeArg, ModelArg, ThreadsArg};
use crate::plan::{hardware, PlanArgs, Probe};

#[derive(clap::Args)]
pub struct PlanCmdArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    /// Context positions per sequence (capped at the model's); for embedding models, tokens per
    /// sentence.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Sequences decoded together; for embedding models, sentences per forward pass.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Prompt length of the prefill prediction (capped at the context).
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    #[command(flatten)]
    kv: KvTypeArg,
    /// Measure the machine again instead of using the cached rates.
    #[arg(long)]
    reprobe: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1u64 << 20) as f64)
}

pub fn run(a: PlanCmdArgs) -> Result<()> {
    if a.batch == 0 || a.ctx == 0 || a.prompt == 0 {
        anyhow::bail!("--ctx, --batch and --prompt must be at least 1");
    }
    let file = open(&a.model.model, LoadMode::Map)?;
    let path = file.path().to_owned();
    let mut cost = file
        .cost()
        .with_context(|| format!("reading {}", path.display()))?;
    cost.kv_dtype = a.kv.kv_type;
    let probe = if a.reprobe {
        Probe::Again
    } else {
        Probe::Missing
    };
    let cpu = cpu_options(a.threads.threads, a.kv.kv_type, false)?;
    let (gpus, notes) = crate::plan::vulkan_devices(&a.placement)?;
    let hw = hardware(&a.placement, &cpu, &gpus, &cost, probe)?;
    let ctx = cost
        .decoder()
        .map_or(a.ctx, |c| a.ctx.min(c.context_length));
    let req = PlanRequest {
        ctx,
        batch: a.batch,
        prompt: a.prompt.min(ctx),
        backend: a.placement.choice(),
        gpu_layers: a.placement.gpu_layers,
        kv_budget: None,
        split: cost.decoder().is_some(),
    };
    let p = plan::plan(&cost, &hw, &req)?;
    if !a.json {
        for n in &notes {
            eprintln!("[plan] {n}");
        }
    }
    if a.json {
        let v = json!({
            "model": path.display().to_string(),
            "hardware": {
                "cpu": hw.cpu_model,
                "cores": hw.cores,
                "simd": hw.simd,
                "ram_free_bytes": hw.cpu.memory_free,
                "ram_total_bytes": hw.cpu.memory_total,
                "bandwidth_bytes_per_s": hw.cpu.rates.bandwidth,
                "gpus": hw.gpus.iter().map(|g| g.name.clone()).collect::<Vec<_>>(),
            },
            "model_cost": cost_json(&cost, &req),
            "request": {"ctx": req.ctx, "batch": req.batch, "prompt": req.prompt},
            "candidates": p.candidates,
            "chosen": p.chosen().map(|c| c.placement.name()),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(
            &hw,
            &cost,
            &req,
            &p.candidates,
            p.chosen().map(|c| c.placement.name()),
        );
    }
    p.require().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

fn cost_json(cost: &ModelCost, req: &PlanRequest) -> serde_json::Value {
    let layers: Vec<u64> = (0..cost.n_layers())
        .map(|l| cost.bytes_at(Place::Layer(l)))
        .collect();
    json!({
        "total_bytes": cost.total_bytes(),
        "embedding_bytes": cost.bytes_at(Place::Embedding),
        "head_bytes": cost.bytes_at(Place::Head),
        "tied_output": cost.tied_output,
        "layer_bytes": layers,
        "bytes_by_type": cost.bytes_by_type().iter().map(|(t, b)| json!({"type": t.to_string(), "bytes": b})).collect::<Vec<_>>(),
        "kv_dtype": cost.kv_dtype.name(),
        "kv_bytes_per_token": cost.decoder().map(|c| plan::cost::kv_bytes_per_token(c, cost.kv_dtype)),
        "kv_bytes": cost.kv_cache_bytes(0..cost.n_layers(), req.ctx, req.batch),
        "activation_bytes": cost.activation_bytes(cost.pass_rows(req.batch), req.batch),
    })
}

fn print_report(
    hw: &plan::Hardware,
    cost: &ModelCost,
    req: &PlanRequest,
    candidates: &[Candidate],
    chosen: Option<String>,
) {
    let r = &hw.cpu.rates;
    println!(
        "machine: {} — {} cores, {}, {} of {} RAM free, {:.1} GB/s read bandwidth; GPUs: {}",
        hw.cpu_model,
        hw.cores,
        hw.simd,
        mib(hw.cpu.memory_free as f64),
        mib(hw.cpu.memory_total as f64),
        r.bandwidth / 1e9,
        if hw.gpus.is_empty() {
            "none".into()
        } else {
            hw.gpus
                .iter()
                .map(|g| g.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let types: Vec<String> = cost
        .bytes_by_type()
        .iter()
        .map(|(t, b)| format!("{t} {}", mib(*b as f64)))
        .collect();
    let layer0 = cost.bytes_at(Place::Layer(0)) as f64;
    println!(
        "model: {} in all ({}); embedding {}, {} layers of about {}, head {}{}",
        mib(cost.total_bytes() as f64),
        types.join(", "),
        mib(cost.bytes_at(Place::Embedding) as f64),
        cost.n_layers(),
        mib(layer0),
        mib(cost.bytes_at(Place::Head) as f64),
        if cost.tied_output {
            " (output tied to the embedding)"
        } else {
            ""
        }
    );
    if let Some(c) = cost.decoder() {
        let windowed = c.windowed_layers();
        let rings = if windowed > 0 {
            format!(" ({windowed} sliding-window layers keep only their window)")
        } else {
            String::new()
        };
        println!(
            "KV cache: {:.1} KiB per token ({}, {} layers); {} for {} sequence(s) of {} \
             positions{rings}",
            plan::cost::kv_bytes_per_token(c, cost.kv_dtype) as f64 / 1024.0,
            cost.kv_dtype,
            c.n_layers,
            mib(cost.kv_cache_bytes(0..c.n_layers, req.ctx, req.batch) as f64),
            req.batch,
            req.ctx
        );
    }
    println!();
    let decoder = cost.decoder().is_some();
    if decoder {
        println!(
            "| plan | fits | decode t/s (batch {}) | prefill t/s ({} tokens) | memory |",
            req.batch,
            req.prompt.min(crate::PREFILL_CHUNK)
        );
    } else {
        println!("| plan | fits | sentences/s (batch {}, {} tokens) | tokens/s | largest batch | memory |", req.batch, req.ctx);
    }
    println!(
        "| --- | --- | ---: | ---: | {}--- |",
        if decoder { "" } else { "---: | " }
    );
    for c in candidates {
        let fmt = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{v:.1}"));
        let p = c.prediction.as_ref();
        let fits = if c.fits { "yes" } else { "no" };
        if decoder {
            println!(
                "| {} | {fits} | {} | {} | {} |",
                c.placement.name(),
                fmt(p.and_then(|p| p.decode_tps)),
                fmt(p.map(|p| p.prefill_tps)),
                c.reason
            );
        } else {
            let maxb = p
                .and_then(|p| p.max_batch.as_ref())
                .map(|m| {
                    m.iter()
                        .map(|(d, n)| format!("{d}: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_else(|| "—".into());
            println!(
                "| {} | {fits} | {} | {} | {maxb} | {} |",
                c.placement.name(),
                fmt(p.and_then(|p| p.sentences_per_s)),
                fmt(p.map(|p| p.prefill_tps)),
                c.reason
            );
        }
    }
    println!();
    match chosen {
        Some(name) => println!("chosen: {name}"),
        None => println!("chosen: none — the model fits on no device"),
    }
}
