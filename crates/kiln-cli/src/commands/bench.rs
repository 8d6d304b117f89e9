//! `kiln bench`: throughput measurements.
//!
//! - `kiln bench [-m MODEL] [-p 512] [-n 128] [-b 1] [-t 0] [-r 5] [--json]` measures a decoder
//!   as llama.cpp's `llama-bench` does, test for test (see [`super::bench_decode`]).
//! - `kiln bench embed` times sentence embedding of a text file end to end (tokenization
//!   included), as a user running `kiln embed` would see it.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::bench_decode::DecodeBenchArgs;
use super::embed::EmbedModelArg;
use crate::load::{embedding, ThreadsArg};
use crate::plan::PlanArgs;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: Option<BenchWhat>,
    #[command(flatten)]
    decode: DecodeBenchArgs,
}

#[derive(clap::Subcommand)]
enum BenchWhat {
    /// Sentences/s and tokens/s of `kiln embed` on a file of texts (one per line).
    Embed(BenchEmbedArgs),
}

#[derive(clap::Args)]
pub struct BenchEmbedArgs {
    #[command(flatten)]
    model: EmbedModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    /// Text file, one text per line (blank lines are skipped).
    #[arg(short = 'f', long)]
    file: std::path::PathBuf,
    /// Texts per forward pass.
    #[arg(short = 'b', long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch_size: u32,
    /// Timed passes over the whole file (the best is reported, after one untimed warm-up pass).
    #[arg(short = 'r', long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.what {
        Some(BenchWhat::Embed(e)) => embed(e),
        None => super::bench_decode::run(a.decode),
    }
}

fn embed(a: BenchEmbedArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        bail!("{}: no texts (one per line)", a.file.display());
    }
    let threads = kiln_cpu::CpuOptions::threads(a.threads.threads).resolved_threads();
    let loaded = embedding(
        &a.model.model,
        a.threads.threads,
        &a.placement,
        a.batch_size as usize,
        true,
        Some("bench"),
    )?;
    let model = &loaded.model;
    let batch = a.batch_size as usize;
    let pass = || -> Result<(f64, usize)> {
        let t0 = Instant::now();
        let mut tokens = 0;
        model.embed_texts(&lines, batch, &mut |_, out| {
            tokens += out.iter().map(|e| e.ids.len()).sum::<usize>();
            Ok(())
        })?;
        Ok((t0.elapsed().as_secs_f64(), tokens))
    };
    let (_, tokens) = pass()?; // warm-up: page in the weights, size the allocator
    let mut times = Vec::new();
    for _ in 0..a.repeats {
        times.push(pass()?.0);
    }
    let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let sps = lines.len() as f64 / best;
    let tps = tokens as f64 / best;
    if a.json {
        println!(
            "{}",
            json!({
                "sentences_per_s": sps,
                "tokens_per_s": tps,
                "texts": lines.len(),
                "tokens": tokens,
                "threads": threads,
                "batch_size": batch,
                "best_s": best,
                "mean_s": mean,
                "passes": times.len(),
            })
        );
    } else {
        println!(
            "model {} (loaded in {:.0} ms)  file {}  {} texts, {} tokens (mean {:.1})  {} threads, batch {}",
            a.model.model,
            loaded.load_ms,
            a.file.display(),
            lines.len(),
            tokens,
            tokens as f64 / lines.len() as f64,
            threads,
            batch
        );
        println!(
            "{:>10.1} sentences/s  {:>10.0} tokens/s  (best of {}; mean pass {:.3} s)",
            sps,
            tps,
            times.len(),
            mean
        );
    }
    Ok(())
}
