//! Errors of the GGUF reader and writer.
//!
//! Every reader error says what is wrong and where: a byte offset into the file and, when one
//! applies, the metadata key or tensor name (clipped, so that a hostile 1 GB key cannot make an
//! error message 1 GB long).

use std::path::PathBuf;

use kiln_core::GgmlType;

use super::value::MetaType;

/// Why a tensor shape cannot describe a ggml tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("{n_dims} dimensions, ggml allows at most {max}", max = super::MAX_DIMS)]
    TooManyDims { n_dims: u64 },
    /// kiln rejects empty tensors: no model has one, and llama.cpp divides by every dimension.
    #[error("dimension {axis} is 0 (empty tensors are not allowed)")]
    ZeroDimension { axis: usize },
    #[error("the element count overflows a signed 64-bit integer")]
    ElementCountOverflow,
    #[error("row length {row_len} is not a multiple of the {ty} block size {block_size}")]
    RowNotBlockMultiple {
        row_len: u64,
        ty: GgmlType,
        block_size: u64,
    },
    #[error("the byte size overflows a 64-bit integer")]
    ByteSizeOverflow,
}

/// A GGUF file that cannot be opened or parsed, or a metadata lookup that failed.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "not a GGUF file: the magic at byte 0 is {found:02x?}, expected \"GGUF\" (47 47 55 46)"
    )]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} at byte 4 (kiln reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },
    #[error(
        "big-endian GGUF file (version field at byte 4 reads as {raw:#010x}, version {version} \
         byte-swapped): only little-endian GGUF is supported"
    )]
    BigEndian { raw: u32, version: u32 },
    #[error(
        "file truncated at byte {offset}: the {what} of {location} needs {needed} bytes, \
         only {available} are left"
    )]
    Truncated {
        offset: u64,
        what: &'static str,
        location: String,
        needed: u64,
        available: u64,
    },
    #[error(
        "the {what} of {location} at byte {offset} is {count}, but each item takes at least \
         {min_item_size} bytes and only {available} bytes are left"
    )]
    CountTooLarge {
        offset: u64,
        what: &'static str,
        location: String,
        count: u64,
        min_item_size: u64,
        available: u64,
    },
    #[error("invalid UTF-8 at byte {offset} in the {what} of {location}")]
    InvalidUtf8 {
        offset: u64,
        what: &'static str,
        location: String,
    },
    #[error("unknown metadata value type {type_id} at byte {offset} in {location}")]
    UnknownValueType {
        offset: u64,
        type_id: u32,
        location: String,
    },
    #[error("invalid bool byte {value} at byte {offset} in {location} (must be 0 or 1)")]
    InvalidBool {
        offset: u64,
        value: u8,
        location: String,
    },
    #[error("arrays nested deeper than {max} levels at byte {offset} in {location}", max = super::MAX_ARRAY_DEPTH)]
    NestingTooDeep { offset: u64, location: String },
    #[error("duplicate metadata key '{key}' at byte {offset}")]
    DuplicateKey { offset: u64, key: String },
    #[error("general.alignment = {value} is not a nonzero power of two")]
    InvalidAlignment { value: u64 },
    #[error("the header ends at byte {header_end}: padding it to general.alignment = {alignment} overflows")]
    AlignmentOverflow { header_end: u64, alignment: u64 },
    #[error("unknown ggml type id {type_id} at byte {offset} for tensor '{tensor}'")]
    UnknownGgmlType {
        offset: u64,
        type_id: u32,
        tensor: String,
    },
    #[error("tensor '{tensor}' (info at byte {offset}) has an invalid shape {dims:?}: {reason}")]
    InvalidShape {
        offset: u64,
        tensor: String,
        dims: Vec<u64>,
        reason: ShapeError,
    },
    #[error("duplicate tensor name '{tensor}' at byte {offset}")]
    DuplicateTensor { offset: u64, tensor: String },
    #[error("tensor '{tensor}': data offset {data_offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        tensor: String,
        data_offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor '{tensor}': {n_bytes} bytes at data offset {data_offset} (file byte \
         {data_section} + {data_offset}) end past the end of the file ({file_size} bytes)"
    )]
    TensorOutOfBounds {
        tensor: String,
        data_offset: u64,
        n_bytes: u64,
        data_section: u64,
        file_size: u64,
    },
    #[error(
        "tensors '{first}' and '{second}' overlap: '{second}' starts at data offset \
         {second_start}, before '{first}' ends at {first_end}"
    )]
    OverlappingTensors {
        first: String,
        second: String,
        first_end: u64,
        second_start: u64,
    },
    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: MetaType,
    },
}

/// A [`super::GgufWriter`] input that would not make a valid GGUF file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GgufWriteError {
    #[error(
        "GGUF version {0} cannot be written (only 2 and 3 share the layout this writer emits)"
    )]
    UnsupportedVersion(u32),
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    #[error(
        "metadata key '{key}': array item {index} has type {found}, the array holds {expected}"
    )]
    MixedArray {
        key: String,
        index: usize,
        expected: MetaType,
        found: MetaType,
    },
    #[error("metadata key '{key}': arrays nested deeper than {max} levels", max = super::MAX_ARRAY_DEPTH)]
    NestingTooDeep { key: String },
    #[error("alignment {0} is not a nonzero power of two that fits in a u32")]
    InvalidAlignment(u64),
    #[error("general.alignment must be an unsigned integer, got {0}")]
    AlignmentType(MetaType),
    #[error("tensor '{tensor}' has an invalid shape {dims:?}: {reason}")]
    InvalidShape {
        tensor: String,
        dims: Vec<u64>,
        reason: ShapeError,
    },
    #[error("tensor '{tensor}': {actual} data bytes given, its shape and type need {expected}")]
    DataSize {
        tensor: String,
        expected: u64,
        actual: u64,
    },
}

/// At most this many bytes of a file-supplied string go into an error message.
const MAX_ERROR_STRING: usize = 200;

/// `s`, cut at a character boundary to at most [`MAX_ERROR_STRING`] bytes.
pub(crate) fn clip(s: &str) -> String {
    if s.len() <= MAX_ERROR_STRING {
        return s.to_owned();
    }
    let mut end = MAX_ERROR_STRING;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}... ({} bytes)",
        s.get(..end).unwrap_or_default(),
        s.len()
    )
}
