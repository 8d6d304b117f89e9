//! kiln-formats: memory-mapped model file readers.
//!
//! - GGUF (versions 2 and 3): [`GgufFile`] parses the header of a memory-mapped file and hands out
//!   zero-copy views of tensor data; hostile input gives a [`GgufError`], never a panic.
//!   [`GgufWriter`] writes files (tests, fuzzing, synthetic models); [`write_dump`] prints one.

mod gguf;

pub use gguf::{
    write_dump, DumpOptions, GgufError, GgufFile, GgufWriteError, GgufWriter, MetaArray, MetaType,
    MetaValue, ShapeError, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC,
    MAX_ARRAY_DEPTH, MAX_DIMS, MAX_STRING_CHARS,
};
