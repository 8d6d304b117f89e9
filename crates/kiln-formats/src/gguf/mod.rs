//! GGUF: the reader ([`GgufFile`]), the metadata values ([`MetaValue`]), a writer for tests and
//! synthetic models ([`GgufWriter`]) and a human-readable dump ([`write_dump`]).
//!
//! Each submodule's doc states its invariants; the format itself is summarised in `reader`.

mod dump;
mod error;
mod parse;
mod reader;
mod tensor;
mod value;
mod writer;

pub use dump::{write_dump, DumpOptions, MAX_STRING_CHARS};
pub use error::{GgufError, GgufWriteError, ShapeError};
pub use reader::{GgufFile, LoadMode};
pub use tensor::TensorInfo;
pub use value::{MetaArray, MetaType, MetaValue};
pub use writer::{put_str, put_value, GgufWriter};

/// The first four bytes of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor may have.
pub const MAX_DIMS: usize = 4;
/// Most levels of arrays a metadata value may nest (an array of arrays is 2); bounds the
/// reader's recursion.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
