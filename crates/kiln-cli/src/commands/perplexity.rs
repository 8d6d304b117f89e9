use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::json;

use kiln_engine::DecoderUse;

use crate::load::{decoder, LoadArgs, ModelArg, ThreadsArg};
use crate::plan::{PlanArgs, Workload};

#[derive(clap::Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mmap: LoadArgs,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    /// The text file to score.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// Context (chunk) size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx: usize,
    /// Score only the first N chunks (as llama-perplexity's --chunks); all of them by default.
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Print {"ppl": X, "chunks": N} instead of the running values.
    #[arg(long)]
    json: bool,
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let work = Workload {
        ctx: a.ctx,
        batch: 1,
        kv_budget: None,
        kv_dtype: a.mmap.kv.kv_type,
    };
    let m = decoder(
        &a.model.model,
        &a.mmap,
        a.threads.threads,
        &a.placement,
        work,
        DecoderUse::Score,
        Some("perplexity"),
    )?;
    let mut ids = m.tokenizer.encode(&text, true, false)?;
    if let Some(n) = a.chunks {
        anyhow::ensure!(n > 0, "--chunks must be at least 1");
        ids.truncate(n.saturating_mul(a.ctx.max(1)));
    }
    eprintln!(
        "{} tokens, {} chunks of {}",
        ids.len(),
        ids.len() / a.ctx.max(1),
        a.ctx
    );
    let result = m
        .model
        .perplexity(&ids, m.tokenizer.bos(), a.ctx, &mut |i, n, ppl| {
            eprintln!("[{i}/{n}] running ppl {ppl:.4}");
        })?;
    if a.json {
        println!(
            "{}",
            json!({ "ppl": result.ppl, "chunks": result.chunks, "running": result.running })
        );
    } else {
        println!(
            "PPL = {:.4} over {} chunks ({} scored tokens)",
            result.ppl, result.chunks, result.scored_tokens
        );
    }
    Ok(())
}
