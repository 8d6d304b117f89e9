//! kiln-core: the vocabulary every other kiln crate shares.
//!
//! - [`GgmlType`]: the tensor element types of the GGUF format (type ids, block sizes, byte sizes).
//! - [`SharedBytes`]: a cheap, clonable view into an owned byte buffer (usually a memory map), so that
//!   weights travel from the file to a backend without a copy.
//! - [`config`]: typed model configurations.

mod bytes;
pub mod config;
mod dtype;

pub use bytes::{Release, SharedBytes};
pub use dtype::{GgmlType, UnknownGgmlType, QK_K};
