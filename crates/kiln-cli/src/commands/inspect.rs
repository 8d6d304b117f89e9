use anyhow::Result;
use kiln_formats::{write_dump, DumpOptions};

use crate::load::open_gguf;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// A GGUF file path or a known model alias.
    model: String,
    /// Items of each metadata array to show.
    #[arg(long, default_value_t = 8)]
    max_array_items: usize,
    /// Metadata only, no tensor table.
    #[arg(long)]
    no_tensors: bool,
}

pub fn run(a: InspectArgs) -> Result<()> {
    let file = open_gguf(&a.model)?;
    let opts = DumpOptions {
        max_array_items: a.max_array_items,
        show_tensors: !a.no_tensors,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match write_dump(&file, &mut out, &opts) {
        // A closed pipe (`kiln inspect x | head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
