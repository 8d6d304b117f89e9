pub mod bench;
pub mod bench_decode;
pub mod bench_report;
pub mod embed;
pub mod gguf_out;
pub mod inspect;
pub mod perplexity;
pub mod plan;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod score;
pub mod serve;
pub mod synth;
pub mod tokenize;

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Read JSON-object lines from stdin; blank lines are skipped; `f(line_no, object)` handles each
/// and its output is flushed line by line so pipelines see results as they come.
pub fn for_each_jsonl(
    mut f: impl FnMut(usize, &serde_json::Map<String, Value>, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (i, line) in stdin.lock().lines().enumerate() {
        let line_no = i + 1;
        let line = line.with_context(|| format!("reading stdin line {line_no}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("stdin line {line_no} is not valid JSON"))?;
        let Value::Object(obj) = v else {
            bail!("stdin line {line_no}: expected a JSON object like {{\"text\": \"...\"}}");
        };
        f(line_no, &obj, &mut out)?;
        out.flush()?;
    }
    Ok(())
}

/// The `"text"` string field of a JSONL object.
pub fn text_field(line_no: usize, obj: &serde_json::Map<String, Value>) -> Result<&str> {
    match obj.get("text") {
        Some(Value::String(s)) => Ok(s),
        Some(_) => bail!("stdin line {line_no}: \"text\" must be a string"),
        None => bail!("stdin line {line_no}: missing \"text\""),
    }
}
