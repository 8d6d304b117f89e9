use anyhow::{bail, Result};
use serde_json::json;

use super::{for_each_jsonl, text_field};
use kiln_formats::LoadMode;

use crate::load::{open, ModelArg};

#[derive(clap::Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Parse control tokens written in the text (e.g. `<start_of_turn>`). A Hugging Face
    /// folder's tokenizer.json always does.
    #[arg(long)]
    special: bool,
    /// Add BOS/EOS as the model's metadata says (off by default).
    #[arg(long)]
    add_special: bool,
    /// Read `{"text": ...}` lines on stdin; write `{"text": ..., "ids": [...]}` lines.
    #[arg(long)]
    jsonl: bool,
    /// Texts to tokenize (without --jsonl): prints one line of ids per text.
    texts: Vec<String>,
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    let tok = open(&a.model.model, LoadMode::Map)?.tokenizer()?;
    if a.jsonl {
        return for_each_jsonl(|line_no, obj, out| {
            let text = text_field(line_no, obj)?;
            let ids = tok.encode(text, a.add_special, a.special)?;
            writeln!(out, "{}", json!({ "text": text, "ids": ids }))?;
            Ok(())
        });
    }
    if a.texts.is_empty() {
        bail!("give texts to tokenize, or --jsonl to read JSON lines from stdin");
    }
    for text in &a.texts {
        let ids = tok.encode(text, a.add_special, a.special)?;
        let pieces: Vec<String> = ids.iter().map(|&id| tok.piece(id)).collect();
        println!("{}", json!({ "ids": ids, "pieces": pieces }));
    }
    Ok(())
}
