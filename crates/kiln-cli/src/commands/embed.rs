//! `kiln embed`: sentence embeddings of texts given as arguments or as JSON lines on stdin.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::Value;

use crate::load::{embedding, ThreadsArg};
use crate::plan::PlanArgs;

/// The embedding model commands use when `-m` is not given.
pub const DEFAULT_EMBEDDING_MODEL: &str = "minilm";

/// Inputs from which a progress bar is worth drawing.
const PROGRESS_MIN_TEXTS: usize = 64;

/// `-m MODEL` for embedding commands.
#[derive(clap::Args, Clone, Debug)]
pub struct EmbedModelArg {
    /// Embedding model: a known alias (fetched on first use; see `kiln pull --list`) or a folder
    /// with config.json, model.safetensors and tokenizer.json (sentence-transformers layout).
    #[arg(short = 'm', long = "model", default_value = DEFAULT_EMBEDDING_MODEL)]
    pub model: String,
}

#[derive(clap::Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    model: EmbedModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    placement: PlanArgs,
    /// Read `{"text": ...}` lines on stdin (instead of texts as arguments).
    #[arg(long)]
    jsonl: bool,
    /// Also write the token ids the model saw (`"input_ids"`).
    #[arg(long)]
    ids: bool,
    /// Texts per forward pass (they are packed: no padding is computed).
    #[arg(short = 'b', long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch_size: u32,
    /// Fail on a text longer than the model's max_seq_length instead of truncating it (which is
    /// what sentence-transformers does).
    #[arg(long)]
    no_truncate: bool,
    /// Texts to embed (without --jsonl). Output: one JSON line per text.
    texts: Vec<String>,
}

#[derive(Serialize)]
struct OutLine<'a> {
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_ids: Option<&'a [u32]>,
    /// serde_json writes f32 as the shortest decimal that reads back as the same f32.
    embedding: &'a [f32],
}

/// Texts of `{"text": ...}` lines; blank lines are skipped; errors name the line.
fn read_jsonl_texts(input: impl BufRead) -> Result<Vec<String>> {
    let mut texts = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("reading stdin line {n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("stdin line {n} is not valid JSON"))?;
        match v.get("text") {
            Some(Value::String(s)) => texts.push(s.clone()),
            Some(_) => bail!("stdin line {n}: \"text\" must be a string"),
            None => bail!("stdin line {n}: expected an object with a \"text\" string"),
        }
    }
    Ok(texts)
}

pub fn run(a: EmbedArgs) -> Result<()> {
    let texts = if a.jsonl {
        if !a.texts.is_empty() {
            bail!("give texts either as arguments or with --jsonl on stdin, not both");
        }
        read_jsonl_texts(std::io::stdin().lock())?
    } else {
        if a.texts.is_empty() {
            bail!("nothing to embed: give texts as arguments, or --jsonl with JSON lines on stdin");
        }
        a.texts.clone()
    };
    let loaded = embedding(
        &a.model.model,
        a.threads.threads,
        &a.placement,
        a.batch_size as usize,
        !a.no_truncate,
        Some("embed"),
    )?;
    let model = &loaded.model;

    let bar = if texts.len() >= PROGRESS_MIN_TEXTS {
        let bar = ProgressBar::new(texts.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} texts  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let written = model.embed_texts(&refs, a.batch_size as usize, &mut |first, batch| {
        for (text, e) in refs[first..].iter().zip(&batch) {
            let line = OutLine {
                text,
                input_ids: a.ids.then_some(e.ids.as_slice()),
                embedding: &e.vector,
            };
            serde_json::to_writer(&mut out, &line).map_err(std::io::Error::from)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        bar.inc(batch.len() as u64);
        Ok(())
    });
    match written {
        // A closed pipe (`kiln embed ... | head`) is not an error.
        Err(kiln_engine::EngineError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    bar.finish_and_clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_input_errors_name_the_line() {
        let ok = read_jsonl_texts(&b"{\"text\": \"a\"}\n\n{\"text\": \"\"}\n"[..]).unwrap();
        assert_eq!(ok, vec!["a".to_string(), String::new()]);
        for (input, want) in [
            (&b"{\"text\": 1}\n"[..], "line 1"),
            (&b"{\"text\": \"a\"}\nnot json\n"[..], "line 2"),
            (&b"[1]\n"[..], "line 1"),
        ] {
            let e = format!("{:#}", read_jsonl_texts(input).unwrap_err());
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn floats_are_written_shortest() {
        let line = OutLine {
            text: "x",
            input_ids: None,
            embedding: &[0.1, -1.5e-8],
        };
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"text":"x","embedding":[0.1,-1.5e-8]}"#
        );
    }
}
