//! The GGUF reader (versions 2 and 3, little-endian).
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 kv count, the kv pairs (u64-length
//! key, u32 value type, value), the tensor infos (name, u32 n_dims, n_dims × u64 dims, u32 ggml
//! type, u64 offset), padding to `general.alignment`, then the data section.
//!
//! Invariants of a [`GgufFile`] (all checked in [`GgufFile::from_bytes`], so that later accessors
//! cannot fail):
//! - metadata keys and tensor names are unique, valid UTF-8;
//! - the alignment is a nonzero power of two; the data section starts at the header end rounded
//!   up to it;
//! - every tensor obeys the shape rules of `tensor` (at most [`MAX_DIMS`](super::MAX_DIMS)
//!   dims, none 0, an element count that fits an i64, rows of whole blocks), its offset is a
//!   multiple of the alignment, and its bytes lie inside the file and overlap no other tensor's
//!   (llama.cpp does not check overlap; a valid writer never produces it, and an overlapping
//!   offset is far more likely corruption than intent).
//!
//! Hostile input yields a [`GgufError`], never a panic (see `parse` for how).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use kiln_core::SharedBytes;

use super::error::GgufError;
use super::parse::parse;
use super::tensor::TensorInfo;
use super::value::{MetaArray, MetaValue};

/// A parsed GGUF file and the bytes it was parsed from (usually a memory map).
#[derive(Clone)]
pub struct GgufFile {
    bytes: SharedBytes,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// The file the bytes came from, when opened from a path.
    origin: Option<Origin>,
}

/// Where a [`GgufFile`] opened from a path came from, and how its bytes are held.
#[derive(Clone)]
struct Origin {
    path: std::path::PathBuf,
    /// The handle it was opened with: [`GgufFile::hold_as`] reads it again without an open.
    file: Arc<std::fs::File>,
    mode: LoadMode,
    /// A hash of the header bytes as parsed at open (see [`header_hash`]).
    header_hash: u64,
}

/// A hash of `bytes` (a file's header): [`GgufFile::hold_as`] compares the header it reads again
/// with the one parsed at open without parsing it a second time (a second copy of a large
/// vocabulary's metadata would raise the peak memory of a load).
/// The header is the bytes before `data_offset`, which a file without tensors may place past its
/// end (the data section's start is rounded up to the alignment): then the whole file.
fn header_hash(bytes: &[u8], data_offset: u64) -> u64 {
    use std::hash::Hasher;
    let end = usize::try_from(data_offset).map_or(bytes.len(), |d| d.min(bytes.len()));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(&bytes[..end]);
    h.finish()
}

/// The `len` bytes of `file` held as `mode` says.
fn hold(file: &std::fs::File, len: u64, mode: LoadMode) -> std::io::Result<SharedBytes> {
    let map = match mode {
        // SAFETY: the map is read-only and we never hand out mutable access. Soundness needs
        // the file not to be truncated or rewritten by another process while mapped; like
        // every mmap-based model loader we take model files to be immutable while in use.
        LoadMode::Map => unsafe { memmap2::Mmap::map(file) }?,
        LoadMode::Read => {
            let len = usize::try_from(len).map_err(|_| {
                std::io::Error::other(format!(
                    "{len} bytes do not fit this machine's address space"
                ))
            })?;
            let mut anon = memmap2::MmapOptions::new().len(len).map_anon()?;
            // A hint: without transparent huge pages the copy still works, on small pages.
            #[cfg(target_os = "linux")]
            let _ = anon.advise(memmap2::Advice::HugePage);
            // From offset 0 whatever the handle's position; a file that shrank since it was
            // opened fails here (unexpected end of file).
            read_exact_at(file, &mut anon[..])?;
            anon.make_read_only()?
        }
    };
    let map = Arc::new(map);
    let held = map.clone();
    let release: kiln_core::Release = match mode {
        LoadMode::Map => Arc::new(move |range| pages::drop_mapped(&held, range)),
        LoadMode::Read => {
            // A second handle on the same open file (dup), not a second open.
            let reopen = file.try_clone()?;
            Arc::new(move |range| pages::remap_from_file(&held, &reopen, range))
        }
    };
    Ok(SharedBytes::with_release(map, release))
}

/// Fills `buf` from the start of `file`.
#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, 0)
}

/// Fills `buf` from the start of `file`.
#[cfg(not(unix))]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::{Read, Seek};
    let mut f = file;
    f.seek(std::io::SeekFrom::Start(0))?;
    f.read_exact(buf)
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// How [`GgufFile::open_with`] holds a file's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMode {
    /// Memory-map the file: instant, and the pages are the kernel's page cache, shared with
    /// every other process that maps the same file.
    #[default]
    Map,
    /// Read the whole file into private anonymous memory that Linux is asked to back with
    /// transparent huge pages (`MADV_HUGEPAGE`). A copy, so opening costs a pass over the file,
    /// but a CPU decode step streams every weight once per token, and with 2 MiB pages instead
    /// of 4 KiB ones those reads miss the TLB far less (measure with `kiln bench`). The
    /// resident size is the same as a fully
    /// touched map's (page cache is not counted in a process's RSS; this copy is). Pages handed
    /// back with `SharedBytes::release_pages` (a backend that keeps a weight in a layout of its
    /// own) become a map of the file again, so the file must not change while in use, as with
    /// [`LoadMode::Map`].
    Read,
}

impl GgufFile {
    /// Memory-maps `path` and parses it. The map lives as long as any [`SharedBytes`] taken
    /// from [`GgufFile::tensor_data`].
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        GgufFile::open_with(path, LoadMode::Map)
    }

    /// Opens and parses `path`, its bytes held as `mode` says. The memory lives as long as any
    /// [`SharedBytes`] taken from [`GgufFile::tensor_data`].
    pub fn open_with(path: &Path, mode: LoadMode) -> Result<GgufFile, GgufError> {
        let io_error = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_error)?;
        let len = file.metadata().map_err(io_error)?.len();
        if len == 0 {
            // Some platforms refuse to map an empty file; parsing reports the truncation.
            return GgufFile::from_bytes(SharedBytes::from_vec(Vec::new()));
        }
        let bytes = hold(&file, len, mode).map_err(io_error)?;
        let mut parsed = GgufFile::from_bytes(bytes)?;
        let header_hash = header_hash(&parsed.bytes, parsed.data_offset);
        parsed.origin = Some(Origin {
            path: path.to_owned(),
            file: Arc::new(file),
            mode,
            header_hash,
        });
        Ok(parsed)
    }

    /// Holds this file's bytes as `mode` says from now on, read from the file handle it was
    /// opened with (the file is not opened again): a file opened as [`LoadMode::Map`] to read its
    /// header cheaply (a planner deciding whether it fits) is then copied into private memory
    /// with [`LoadMode::Read`] before its weights are used. [`SharedBytes`] taken before keep
    /// the old bytes alive. Nothing to do for a file parsed from bytes, or one held so already.
    /// If the file changed since it was opened (another length, another header), this is an
    /// error and nothing changes.
    pub fn hold_as(&mut self, mode: LoadMode) -> Result<(), GgufError> {
        let Some(origin) = &self.origin else {
            return Ok(());
        };
        if origin.mode == mode {
            return Ok(());
        }
        let io_error = |source| GgufError::Io {
            path: origin.path.clone(),
            source,
        };
        let bytes = hold(&origin.file, self.bytes.len() as u64, mode).map_err(io_error)?;
        // A map shows later writes to the file, so compare with the header parsed at open.
        if bytes.len() != self.bytes.len()
            || header_hash(&bytes, self.data_offset) != origin.header_hash
        {
            return Err(io_error(std::io::Error::other(
                "the file changed on disk while it was open (another header)",
            )));
        }
        self.bytes = bytes;
        if let Some(origin) = &mut self.origin {
            origin.mode = mode;
        }
        Ok(())
    }

    /// How this file's bytes are held (`None`: parsed from bytes given by the caller).
    pub fn load_mode(&self) -> Option<LoadMode> {
        self.origin.as_ref().map(|o| o.mode)
    }

    /// Parses a whole GGUF file held in `bytes`.
    pub fn from_bytes(bytes: SharedBytes) -> Result<GgufFile, GgufError> {
        let parsed = parse(&bytes)?;
        Ok(GgufFile {
            bytes,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            metadata_index: parsed.metadata_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            origin: None,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_size(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// All kv pairs, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let &i = self.metadata_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    fn get_as<'s, T>(
        &'s self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'s MetaValue) -> Option<T>,
    ) -> Result<T, GgufError> {
        let value = self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })?;
        convert(value).ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: value.meta_type(),
        })
    }

    /// Any unsigned (or non-negative signed) integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_as(key, "an unsigned integer", MetaValue::as_u64)
    }

    /// Any float or integer value.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.get_as(key, "a number", MetaValue::as_f64)
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.get_as(key, "a string", MetaValue::as_str)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.get_as(key, "a bool", MetaValue::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        self.get_as(key, "an array", MetaValue::as_array)
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let &i = self.tensor_index.get(name)?;
        self.tensors.get(i)
    }

    /// Zero-copy view of a tensor's bytes. Ranges were validated at parse time, so for an
    /// `info` from this file's [`GgufFile::tensors`] this cannot fail; an `info` from another
    /// file whose range does not fit this one gets an empty view.
    pub fn tensor_data(&self, info: &TensorInfo) -> SharedBytes {
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|start| Some(start..start.checked_add(info.n_bytes)?))
            .and_then(|r| Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?));
        range
            .and_then(|r| self.bytes.slice(r))
            .unwrap_or_else(|| SharedBytes::from_vec(Vec::new()))
    }

    /// `general.architecture` when present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture")?.as_str()
    }
}

/// How [`GgufFile::open_with`]'s bytes hand back their pages (`SharedBytes::release_pages`)
/// without changing a byte: only whole pages inside the range, on Linux (elsewhere nothing is
/// released). Failures are ignored: the pages then stay resident, which changes nothing else.
mod pages {
    use std::ops::Range;

    /// The whole pages inside `range`: `(offset, len)`, `len` 0 when there are none.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn inner_pages(range: Range<usize>) -> (usize, usize) {
        // SAFETY: sysconf has no preconditions.
        #[cfg(target_os = "linux")]
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        #[cfg(not(target_os = "linux"))]
        let page = 4096;
        let start = range.start.next_multiple_of(page);
        let end = range.end / page * page;
        (start, end.saturating_sub(start))
    }

    /// A map of the file: its pages are the page cache's, read again from the file when touched
    /// next, so dropping them from this process changes no byte.
    pub(super) fn drop_mapped(map: &memmap2::Mmap, range: Range<usize>) {
        #[cfg(target_os = "linux")]
        {
            let (at, len) = inner_pages(range);
            if len > 0 {
                // SAFETY: `map` is a read-only private map of an unchanged file (the loader's
                // premise, see `open_with`): after MADV_DONTNEED a read faults the same bytes
                // back in from the file.
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, len)
                };
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (map, range);
    }

    /// The private copy of [`super::LoadMode::Read`]: the copy's pages in `range` are replaced by
    /// a private read-only map of the same bytes of the file (the copy was read from offset 0,
    /// so offsets match and page-aligned offsets are page-aligned addresses). The bytes seen
    /// there stay the same; the anonymous pages are freed, and the file's are only read in again
    /// if something reads them.
    pub(super) fn remap_from_file(map: &memmap2::Mmap, file: &std::fs::File, range: Range<usize>) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (at, len) = inner_pages(range);
            let Ok(offset) = libc::off_t::try_from(at) else {
                return;
            };
            if len == 0 || at + len > map.len() {
                return;
            }
            // SAFETY: the target lies inside `map` (checked), page-aligned; MAP_FIXED swaps the
            // pages atomically for a private read-only map of the same file bytes (the loader's
            // premise: the file does not change while in use), so every reader, before or
            // after, sees the same values. `map`'s own munmap later unmaps the whole range,
            // this part included.
            unsafe {
                libc::mmap(
                    map.as_ptr().add(at).cast_mut().cast(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    file.as_raw_fd(),
                    offset,
                );
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (map, file, range);
    }
}
