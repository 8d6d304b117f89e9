//! kiln-formats: memory-mapped model file readers.
//!
//! - GGUF (versions 2 and 3): [`GgufFile`] parses the header of a memory-mapped file and hands out
//!   zero-copy views of tensor data; hostile input gives a [`GgufError`], never a panic.
//!   [`GgufWriter`] writes files (tests, fuzzing, synthetic models); [`write_dump`] prints one.
//! - safetensors: [`SafetensorsModel`] maps one file or a sharded checkpoint (index JSON) and hands
//!   out zero-copy tensor views; [`write_safetensors`] writes one (tests).

mod gguf;
pub mod safetensors;

pub use gguf::{
    put_str, put_value, write_dump, DumpOptions, GgufError, GgufFile, GgufWriteError, GgufWriter,
    LoadMode, MetaArray, MetaType, MetaValue, ShapeError, TensorInfo, ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_STRING_CHARS,
};
pub use safetensors::{write_safetensors, SafeTensor, SafetensorsError, SafetensorsModel};
