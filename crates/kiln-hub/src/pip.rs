//! `pip download` of one package into an empty folder.
//!
//! pip's stdout (its "Collecting…" lines and progress bar) goes to our stderr, so that a caller's
//! stdout stays clean for results; pip's stderr is captured for the error message.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{HubError, Package};

/// Tried in order when no command is configured: `pip` alone is the fallback for systems without
/// a `python3` on the PATH.
const DEFAULT_COMMANDS: &[&[&str]] = &[&["python3", "-m", "pip"], &["pip"]];

/// How many lines of pip's stderr an error keeps.
const STDERR_TAIL_LINES: usize = 20;

/// Downloads `package` into the empty folder `dest` and returns the path of the wheel it saved.
/// `command` replaces the default `python3 -m pip` (then without fallback); `extra_args` are
/// appended to `pip download`.
pub(crate) fn download(
    command: Option<&[String]>,
    extra_args: &[String],
    package: &Package,
    dest: &Path,
) -> Result<PathBuf, HubError> {
    let candidates: Vec<Vec<String>> = match command {
        Some(command) => vec![command.to_vec()],
        None => DEFAULT_COMMANDS
            .iter()
            .map(|c| c.iter().map(|s| s.to_string()).collect())
            .collect(),
    };
    for candidate in &candidates {
        let Some((program, args)) = candidate.split_first() else {
            continue;
        };
        let output = Command::new(program)
            .args(args)
            .args(["download", "--no-deps", "--disable-pip-version-check"])
            .args(["--only-binary", ":all:", "--dest"])
            .arg(dest)
            .args(extra_args)
            .arg(package.requirement())
            .stdin(Stdio::null())
            .stdout(Stdio::from(io::stderr()))
            .stderr(Stdio::piped())
            .output();
        let output = match output {
            Ok(output) => output,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(HubError::Io {
                    path: PathBuf::from(program),
                    source,
                })
            }
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() {
            // Warnings (e.g. about the cache) would otherwise be swallowed with the pipe.
            let _ = io::stderr().write_all(stderr.as_bytes());
            return find_wheel(package, dest);
        }
        // `python3` exists but has no pip module: same situation as no pip at all.
        if stderr.contains("No module named pip") {
            continue;
        }
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n");
        return Err(HubError::PipFailed {
            package: package.name.to_string(),
            status: output.status,
            stderr_tail: tail,
        });
    }
    let tried = candidates
        .iter()
        .map(|c| format!("`{}`", c.join(" ")))
        .collect::<Vec<_>>();
    Err(HubError::PipNotFound {
        tried: tried.join(" and "),
    })
}

/// The one `.whl` pip saved in `dest` (which was empty before).
fn find_wheel(package: &Package, dest: &Path) -> Result<PathBuf, HubError> {
    let mut wheels = Vec::new();
    for entry in std::fs::read_dir(dest).map_err(HubError::io(dest))? {
        let path = entry.map_err(HubError::io(dest))?.path();
        if path.extension().is_some_and(|ext| ext == "whl") {
            wheels.push(path);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        n => Err(HubError::BadWheel {
            package: package.name.to_string(),
            reason: format!(
                "pip saved {n} wheels in {} (expected exactly one)",
                dest.display()
            ),
        }),
    }
}
