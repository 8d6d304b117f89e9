use anyhow::{bail, Result};
use kiln_hub::Hub;

#[derive(clap::Args)]
pub struct PullArgs {
    /// Model alias (see --list).
    alias: Option<String>,
    /// Download again even when cached.
    #[arg(long)]
    force: bool,
    /// List the known models and whether they are cached.
    #[arg(long)]
    list: bool,
}

pub fn run(a: PullArgs) -> Result<()> {
    let hub = Hub::from_env();
    if a.list {
        for spec in Hub::models() {
            let state = match hub.cached(spec.alias) {
                Some(p) => format!("cached at {}", p.display()),
                None => "not downloaded".to_string(),
            };
            println!("{:<14} {}", spec.alias, state);
        }
        return Ok(());
    }
    let Some(alias) = a.alias else {
        bail!("name a model to pull (kiln pull --list shows them)");
    };
    let path = hub.pull(&alias, a.force)?;
    println!("{}", path.display());
    Ok(())
}
