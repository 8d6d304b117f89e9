use std::io::Write;

use anyhow::{Context, Result};
use kiln_formats::{write_dump, DumpOptions};
use kiln_models::Support;

use crate::load::resolve;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// A GGUF file, a Hugging Face model folder (config.json + safetensors), or a known alias.
    model: String,
    /// Items of each metadata array to show.
    #[arg(long, default_value_t = 8)]
    max_array_items: usize,
    /// Metadata only, no tensor table.
    #[arg(long)]
    no_tensors: bool,
}

/// The closing lines: the architecture and whether kiln runs it, or why not.
fn verdict(out: &mut impl Write, s: &Support) -> std::io::Result<()> {
    writeln!(out)?;
    match &s.verdict {
        Ok(summary) => writeln!(
            out,
            "kiln: architecture {} ({}): supported — {summary}",
            s.architecture, s.kind
        ),
        Err(e) => writeln!(
            out,
            "kiln: architecture {} ({}): NOT supported — {e}",
            s.architecture, s.kind
        ),
    }
}

pub fn run(a: InspectArgs) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Not a `ModelFile`: inspect reports on files kiln does not run too, and why.
    let path = resolve(&a.model)?;
    let written = if path.is_dir() {
        verdict(&mut out, &kiln_models::check_hf_dir(&path))
    } else {
        let file = kiln_formats::GgufFile::open(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let opts = DumpOptions {
            max_array_items: a.max_array_items,
            show_tensors: !a.no_tensors,
        };
        write_dump(&file, &mut out, &opts).and_then(|()| {
            let mut s = kiln_models::check_gguf(&file);
            if s.verdict.is_ok() {
                if let Err(e) = kiln_tokenizer::Tokenizer::from_gguf(&file) {
                    s.verdict = Err(kiln_models::ModelError::Metadata {
                        key: "tokenizer.ggml.*".into(),
                        detail: e.to_string(),
                    });
                }
            }
            verdict(&mut out, &s)
        })
    };
    match written {
        // A closed pipe (`kiln inspect x | head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
