//! Writing a GGUF file tensor by tensor (`kiln quantize`, `kiln synth`): the layout and header
//! are computed first from names, shapes and types alone, then each tensor's bytes are streamed
//! after them, so memory stays near one slab of one tensor whatever the model's size.
//!
//! The header is laid out as `kiln_formats::GgufWriter` lays it out (the quantize CLI test
//! compares the two byte for byte); it is built here because the writer holds all tensor data in
//! memory. The file goes to a [`TempFile`] next to the output, renamed over it only when
//! complete and removed on failure.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_core::GgmlType;
use kiln_formats::{put_str, put_value, MetaValue, GGUF_MAGIC};

/// Elements of f32 converted at a time: bounds memory for the largest embedding tables.
pub const SLAB_ELEMENTS: usize = 1 << 24;

/// One tensor of the output and where its bytes go.
pub struct OutTensor<'a> {
    pub name: &'a str,
    /// ggml order: `dims[0]` is the row length.
    pub dims: &'a [u64],
    pub ty: GgmlType,
    /// Relative to the data section; a multiple of the alignment.
    pub offset: u64,
    /// Without the padding that aligns the next tensor.
    pub n_bytes: u64,
}

/// Offsets and sizes of `(name, dims, type)` tensors, in the order given, each at the next
/// multiple of `alignment`.
pub fn lay_out<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a [u64], GgmlType)>,
    alignment: u64,
) -> Result<Vec<OutTensor<'a>>> {
    let mut offset = 0u64;
    let mut out = Vec::new();
    for (name, dims, ty) in tensors {
        let row_len = dims.first().copied().unwrap_or(1);
        let n_elements: u64 = dims.iter().product();
        let n_bytes = ty
            .row_bytes(row_len)
            .and_then(|row| row.checked_mul(n_elements / row_len.max(1)))
            .with_context(|| format!("{name}: {ty} does not fit {dims:?}"))?;
        out.push(OutTensor {
            name,
            dims,
            ty,
            offset,
            n_bytes,
        });
        offset = offset
            .checked_add(n_bytes)
            .map(|end| end.next_multiple_of(alignment))
            .context("the output would be larger than 2^64 bytes")?;
    }
    Ok(out)
}

/// The GGUF v3 header (everything before the data section, padding included).
pub fn header<'a>(
    meta: &[(String, MetaValue)],
    tensors: impl ExactSizeIterator<Item = &'a OutTensor<'a>>,
    alignment: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        put_str(&mut out, key);
        out.extend_from_slice(&value.meta_type().id().to_le_bytes());
        put_value(&mut out, value);
    }
    for t in tensors {
        put_str(&mut out, t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    let padded = (out.len() as u64).next_multiple_of(alignment);
    out.resize(padded as usize, 0);
    out
}

/// Writes the zeros after a tensor of `n_bytes` that align the next one (offsets are aligned, so
/// padding each tensor's end aligns the next).
pub fn write_padding(out: &mut impl Write, n_bytes: u64, alignment: u64) -> std::io::Result<()> {
    let padding = n_bytes.next_multiple_of(alignment) - n_bytes;
    out.write_all(&vec![0u8; padding as usize])
}

/// A progress bar on stderr over `total` elements; the message names the current tensor.
pub fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}%  eta {eta}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// A file next to the output that becomes the output only when complete.
pub struct TempFile {
    pub path: PathBuf,
    pub writer: BufWriter<File>,
    committed: bool,
}

impl TempFile {
    pub fn create(output: &Path) -> Result<TempFile> {
        let name = output
            .file_name()
            .with_context(|| format!("{} is not a file path", output.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let path = output.with_file_name(tmp_name);
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempFile {
            path,
            writer: BufWriter::with_capacity(1 << 20, file),
            committed: false,
        })
    }

    /// Flushes, syncs and renames the file over `output`.
    pub fn commit(mut self, output: &Path) -> Result<()> {
        let write_err = || format!("writing {}", self.path.display());
        self.writer.flush().with_context(write_err)?;
        self.writer.get_ref().sync_all().with_context(write_err)?;
        std::fs::rename(&self.path, output)
            .with_context(|| format!("renaming {} to {}", self.path.display(), output.display()))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the error that got us here is what the user needs to see.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
