use std::io::Write;

use anyhow::{Context, Result};
use kiln_engine::{DecoderUse, GenerateOptions, SamplingParams, StopReason};
use serde_json::json;

use crate::load::{decoder, LoadArgs, ModelArg, ThreadsArg};
use crate::plan::{PlanArgs, Workload};

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mmap: LoadArgs,
    /// The prompt (control tokens such as `<start_of_turn>` are parsed; BOS is added when the
    /// model asks for it).
    #[arg(short = 'p', long)]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Don't stop at end-of-generation tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON line {"prompt_ids", "ids", "text", "timings"} instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Sampling flags shared by generating commands.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    temperature: f32,
    /// Top-k filter (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus) filter (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p filter (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Tokens the penalties look back over (0 = all).
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    penalty_last_n: usize,
    /// Random seed (the same seed and settings give the same text).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed,
            logit_bias: Vec::new(),
        }
    }
}

pub fn run(a: RunArgs) -> Result<()> {
    let sampling = a.sampling.params();
    sampling.validate()?;
    // Positions: the prompt has at most one token per byte, plus special tokens.
    let work = Workload {
        ctx: a.prompt.len() + 8 + a.n_predict,
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
        DecoderUse::Generate,
        Some("run"),
    )?;
    let tok = &m.tokenizer;
    let prompt_ids = tok.encode(&a.prompt, true, true)?;
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        sampling,
        ignore_eos: a.ignore_eos,
    };

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut stream = tok.stream();
    let streaming = !a.json;
    let mut write_failed = None;
    let generation = m
        .model
        .generate(
            &prompt_ids,
            &opts,
            &|id| tok.is_end_of_generation(id),
            &mut |id| {
                if streaming && (a.ignore_eos || !tok.is_end_of_generation(id)) {
                    let piece = stream.push(id);
                    if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                        write_failed = Some(e);
                        return false;
                    }
                }
                true
            },
        )
        .context("generating")?;
    if let Some(e) = write_failed {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(());
        }
        return Err(e.into());
    }
    let prompt_tps = generation.prompt_tps(prompt_ids.len());
    let gen_tps = generation.decode_tps();
    if a.json {
        // Text without a trailing end-of-generation token, like llama.cpp's detokenization.
        let text_ids: Vec<u32> = match (generation.stop, generation.ids.split_last()) {
            (StopReason::EndOfGeneration, Some((_, rest))) => rest.to_vec(),
            _ => generation.ids.clone(),
        };
        let line = json!({
            "prompt_ids": prompt_ids,
            "ids": generation.ids,
            "text": tok.decode(&text_ids, false),
            "timings": { "load_ms": m.load_ms, "prompt_tps": prompt_tps, "gen_tps": gen_tps },
        });
        writeln!(out, "{line}")?;
    } else {
        let rest = stream.finish();
        write!(out, "{rest}")?;
        writeln!(out)?;
        eprintln!(
            "\n[{}] load {:.0} ms | prompt {} tokens, {:.1} tok/s | generation {} tokens, {:.1} tok/s | {}",
            m.model.config().arch,
            m.load_ms,
            prompt_ids.len(),
            prompt_tps,
            generation.ids.len(),
            gen_tps,
            match generation.stop {
                StopReason::EndOfGeneration => "stopped at end of generation",
                StopReason::Length => "stopped at -n",
                StopReason::Callback => "stopped",
            }
        );
    }
    Ok(())
}
