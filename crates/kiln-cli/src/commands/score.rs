use anyhow::{bail, Result};
use serde_json::{json, Value};

use kiln_engine::DecoderUse;

use super::for_each_jsonl;
use crate::load::{decoder, LoadArgs, ModelArg, ThreadsArg};
use crate::plan::{PlanArgs, Workload};

#[derive(clap::Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mmap: LoadArgs,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    /// Most likely tokens to report at each position.
    #[arg(long, default_value_t = 10)]
    top_k: usize,
    /// Read `{"text": ...}` or `{"ids": [...]}` lines on stdin (required: the only mode).
    #[arg(long, required = true)]
    jsonl: bool,
}

/// Logprobs are printed rounded to 1e-6 (the golden files use 5 decimals).
fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

pub fn run(a: ScoreArgs) -> Result<()> {
    // A line may be as long as the model's context.
    let work = Workload {
        ctx: usize::MAX,
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
        Some("score"),
    )?;
    let vocab = m.model.config().vocab_size;
    for_each_jsonl(|line_no, obj, out| {
        let ids: Vec<u32> = match (obj.get("ids"), obj.get("text")) {
            (Some(Value::Array(items)), _) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .filter(|&id| id < vocab as u64)
                        .map(|id| id as u32)
                })
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    anyhow::anyhow!("stdin line {line_no}: \"ids\" must be token ids below {vocab}")
                })?,
            (None, Some(Value::String(text))) => m.tokenizer.encode(text, true, true)?,
            _ => bail!("stdin line {line_no}: expected {{\"text\": string}} or {{\"ids\": [ids]}}"),
        };
        let scores = m.model.score(&ids, a.top_k)?;
        let positions: Vec<Value> = scores
            .iter()
            .map(|s| json!({ "top": s.top.iter().map(|&(id, lp)| json!([id, round6(lp)])).collect::<Vec<_>>() }))
            .collect();
        let next: Vec<f64> = scores.iter().map(|s| round6(s.logprob_next)).collect();
        let mut line = json!({ "ids": ids, "positions": positions, "logprob_next": next });
        if let Some(text) = obj.get("text") {
            line["text"] = text.clone();
        }
        writeln!(out, "{line}")?;
        Ok(())
    })
}
