//! `kiln`: run, inspect, tokenize, score and measure GGUF models, and embed texts with encoder
//! models, from the command line.
//!
//! This is the edge of the program: arguments are parsed and validated here, errors get their
//! context here (anyhow), and this is the only crate that names a concrete backend.

mod commands;
mod load;
mod plan;

/// Tokens per prompt chunk of a forward pass (the engine's).
pub(crate) use kiln_engine::PREFILL_CHUNK;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// kiln — a Rust-native inference engine for transformer models.
#[derive(Parser)]
#[command(name = "kiln", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to the terminal.
    Run(commands::run::RunArgs),
    /// Download, verify and cache a known model (e.g. gemma3-270m).
    Pull(commands::pull::PullArgs),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(commands::inspect::InspectArgs),
    /// Tokenize text (JSON lines on stdin with --jsonl, or the arguments).
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Teacher-forced log-probabilities of texts or token ids (JSON lines).
    Score(commands::score::ScoreArgs),
    /// Perplexity of a text file, computed as llama.cpp's llama-perplexity does.
    Perplexity(commands::perplexity::PerplexityArgs),
    /// Sentence embeddings of texts (arguments, or JSON lines on stdin with --jsonl).
    Embed(commands::embed::EmbedArgs),
    /// Measure throughput: decoder prompt and decode tests as llama-bench runs them, or
    /// embeddings (`kiln bench embed -f FILE`).
    Bench(commands::bench::BenchArgs),
    /// Serve models over an OpenAI-compatible HTTP API (chat, completions, embeddings) with
    /// continuous batching over a paged KV cache.
    Serve(commands::serve::ServeArgs),
    /// Which devices would run a model, whether it fits, and how fast each plan is predicted to
    /// be.
    Plan(commands::plan::PlanCmdArgs),
    /// Convert a GGUF model to a quantization mix (q4_k_m, q8_0, ...), as llama-quantize does.
    Quantize(commands::quantize::QuantizeArgs),
    /// Write a GGUF with a real model's shapes and random weights (llama-3.2-1b, llama-3.1-8b,
    /// qwen3-0.6b), to measure speed and memory without the checkpoint.
    Synth(commands::synth::SynthArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => commands::run::run(a),
        Command::Pull(a) => commands::pull::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Score(a) => commands::score::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::Embed(a) => commands::embed::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Quantize(a) => commands::quantize::run(a),
        Command::Synth(a) => commands::synth::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Plan(a) => commands::plan::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
