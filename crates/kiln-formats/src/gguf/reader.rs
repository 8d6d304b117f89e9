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
//! - every tensor has 0 to [`MAX_DIMS`] dims (none: a scalar, one element), no dim is 0, the
//!   element count fits an i64, the row length `dims[0]` is a whole number of blocks, its offset
//!   is a multiple of the alignment, and its bytes lie inside the file and overlap no other
//!   tensor's (llama.cpp does not check overlap; a valid writer never produces it, and an
//!   overlapping offset is far more likely corruption than intent).
//!
//! Hostile input yields a [`GgufError`], never a panic: every read is bounds-checked, every
//! count is checked against the bytes left (count × smallest encoding of an item) before anything
//! is allocated for it, arithmetic on file values is checked, and arrays nest at most
//! [`MAX_ARRAY_DEPTH`] levels so that recursion stays shallow. Memory use is at most linear in the
//! file size (an in-memory [`MetaValue`] is larger than its encoding, up to 32× for u8 arrays).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use kiln_core::{GgmlType, SharedBytes};

use super::error::{clip, GgufError, ShapeError};
use super::value::{MetaArray, MetaType, MetaValue};
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};

/// Smallest encoding of a kv pair: empty key (u64 length), u32 type, 1-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest encoding of a tensor info: empty name, u32 n_dims = 0, u32 type, u64 offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length (ne0). Empty for a scalar.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Relative to the data section, as stored.
    pub offset: u64,
    /// Computed from `dims` and `ty`; validated to lie inside the file.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of the dims (1 for a scalar); cannot overflow for a parsed tensor.
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// Bytes of a tensor of shape `dims` and type `ty`, checking every rule of the module doc.
pub(crate) fn tensor_n_bytes(dims: &[u64], ty: GgmlType) -> Result<u64, ShapeError> {
    if dims.len() > MAX_DIMS {
        return Err(ShapeError::TooManyDims {
            n_dims: dims.len() as u64,
        });
    }
    if let Some(axis) = dims.iter().position(|&d| d == 0) {
        return Err(ShapeError::ZeroDimension { axis });
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or(ShapeError::ElementCountOverflow)?;
    let row_len = dims.first().copied().unwrap_or(1);
    let block_size = ty.block_size() as u64;
    if row_len % block_size != 0 {
        return Err(ShapeError::RowNotBlockMultiple {
            row_len,
            ty,
            block_size,
        });
    }
    let row_bytes = ty.row_bytes(row_len).ok_or(ShapeError::ByteSizeOverflow)?;
    // row_len >= 1 (no zero dims), so the division is exact and safe.
    (n_elements / row_len)
        .checked_mul(row_bytes)
        .ok_or(ShapeError::ByteSizeOverflow)
}

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

impl GgufFile {
    /// Memory-maps `path` and parses it. The map lives as long as any [`SharedBytes`] taken
    /// from [`GgufFile::tensor_data`].
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
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
        // SAFETY: the map is read-only and we never hand out mutable access. Soundness needs the
        // file not to be truncated or rewritten by another process while mapped; like every
        // mmap-based model loader we take model files to be immutable while in use.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error)?;
        GgufFile::from_bytes(SharedBytes::new(Arc::new(map)))
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

/// Where the parser is, for error messages. Borrowed from the input so that tracking it costs
/// nothing until an error is built.
#[derive(Clone, Copy)]
enum Location<'a> {
    Header,
    Key { index: u64 },
    Value { index: u64, key: &'a str },
    TensorInfo { index: u64, name: Option<&'a str> },
}

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Location::Header => f.write_str("the header"),
            Location::Key { index } => write!(f, "the key of kv pair #{index}"),
            Location::Value { index, key } => {
                write!(f, "the value of key '{}' (kv pair #{index})", clip(key))
            }
            Location::TensorInfo { index, name: None } => write!(f, "tensor info #{index}"),
            Location::TensorInfo {
                index,
                name: Some(name),
            } => write!(f, "tensor info #{index} ('{}')", clip(name)),
        }
    }
}

/// A bounds-checked little-endian reader. Invariant: `pos <= buf.len()`.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    location: Location<'a>,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn truncated(&self, needed: u64, what: &'static str) -> GgufError {
        GgufError::Truncated {
            offset: self.offset(),
            what,
            location: self.location.to_string(),
            needed,
            available: self.remaining(),
        }
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let bytes = usize::try_from(n)
            .ok()
            .and_then(|n| Some(self.pos..self.pos.checked_add(n)?))
            .and_then(|range| self.buf.get(range))
            .ok_or_else(|| self.truncated(n, what))?;
        self.pos += bytes.len();
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let bytes = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.first_chunk::<N>())
            .ok_or_else(|| self.truncated(N as u64, what))?;
        self.pos += N;
        Ok(*bytes)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        self.array::<1>(what).map(|[b]| b)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A u64 length followed by that many bytes of UTF-8.
    fn string(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let len = self.u64(what)?;
        let start = self.offset();
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|e| GgufError::InvalidUtf8 {
            offset: start + e.valid_up_to() as u64,
            what,
            location: self.location.to_string(),
        })
    }

    /// A u64 count of items that each take at least `min_item_size` bytes, rejected before
    /// anything is allocated when the bytes left cannot hold that many. The result fits a usize.
    fn count(&mut self, what: &'static str, min_item_size: u64) -> Result<usize, GgufError> {
        let offset = self.offset();
        let count = self.u64(what)?;
        let available = self.remaining();
        count
            .checked_mul(min_item_size)
            .filter(|&size| size <= available)
            .and_then(|_| usize::try_from(count).ok())
            .ok_or_else(|| GgufError::CountTooLarge {
                offset,
                what,
                location: self.location.to_string(),
                count,
                min_item_size,
                available,
            })
    }

    fn meta_type(&mut self, what: &'static str) -> Result<MetaType, GgufError> {
        let offset = self.offset();
        let type_id = self.u32(what)?;
        MetaType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            offset,
            type_id,
            location: self.location.to_string(),
        })
    }

    /// A value of type `ty`; `depth` is the number of arrays it sits in.
    fn value(&mut self, ty: MetaType, depth: usize) -> Result<MetaValue, GgufError> {
        Ok(match ty {
            MetaType::U8 => MetaValue::U8(self.u8("u8 value")?),
            MetaType::I8 => MetaValue::I8(i8::from_le_bytes(self.array("i8 value")?)),
            MetaType::U16 => MetaValue::U16(u16::from_le_bytes(self.array("u16 value")?)),
            MetaType::I16 => MetaValue::I16(i16::from_le_bytes(self.array("i16 value")?)),
            MetaType::U32 => MetaValue::U32(self.u32("u32 value")?),
            MetaType::I32 => MetaValue::I32(i32::from_le_bytes(self.array("i32 value")?)),
            MetaType::F32 => MetaValue::F32(f32::from_le_bytes(self.array("f32 value")?)),
            MetaType::U64 => MetaValue::U64(self.u64("u64 value")?),
            MetaType::I64 => MetaValue::I64(i64::from_le_bytes(self.array("i64 value")?)),
            MetaType::F64 => MetaValue::F64(f64::from_le_bytes(self.array("f64 value")?)),
            MetaType::Bool => {
                let offset = self.offset();
                match self.u8("bool value")? {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    value => {
                        return Err(GgufError::InvalidBool {
                            offset,
                            value,
                            location: self.location.to_string(),
                        })
                    }
                }
            }
            MetaType::String => MetaValue::String(self.string("string value")?.to_owned()),
            MetaType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        offset: self.offset(),
                        location: self.location.to_string(),
                    });
                }
                let elem_type = self.meta_type("array element type")?;
                let count = self.count("array length", elem_type.min_encoded_size())?;
                // Bounded by `count`'s check: at most (bytes left / smallest item) items.
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(self.value(elem_type, depth + 1)?);
                }
                MetaValue::Array(MetaArray { elem_type, items })
            }
        })
    }
}

struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        location: Location::Header,
    };
    let magic = cur.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = cur.u32("version")?;
    match version {
        2 | 3 => {}
        // A big-endian writer keeps the magic but swaps the version: 3 reads as 0x03000000.
        raw if matches!(raw.swap_bytes(), 1..=3) => {
            return Err(GgufError::BigEndian {
                raw,
                version: raw.swap_bytes(),
            })
        }
        version => return Err(GgufError::UnsupportedVersion { version }),
    }
    let tensor_count = cur.count("tensor count", MIN_TENSOR_INFO_SIZE)?;
    let kv_count = cur.count("metadata kv count", MIN_KV_SIZE)?;

    let (metadata, metadata_index) = parse_metadata(&mut cur, kv_count)?;
    let alignment = match metadata_index.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let value = metadata.get(i).map(|(_, v)| v);
            validate_alignment(value)?
        }
    };
    let (tensors, tensor_index) = parse_tensor_infos(&mut cur, tensor_count)?;

    let header_end = cur.offset();
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .ok_or(GgufError::AlignmentOverflow {
            header_end,
            alignment,
        })?;
    check_tensor_ranges(&tensors, alignment, data_offset, buf.len() as u64)?;
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        metadata_index,
        tensors,
        tensor_index,
    })
}

type Metadata = (Vec<(String, MetaValue)>, HashMap<String, usize>);

fn parse_metadata(cur: &mut Cursor<'_>, kv_count: usize) -> Result<Metadata, GgufError> {
    // Both bounded by `count`'s check on kv_count.
    let mut metadata = Vec::with_capacity(kv_count);
    let mut index = HashMap::with_capacity(kv_count);
    for i in 0..kv_count {
        cur.location = Location::Key { index: i as u64 };
        let key_offset = cur.offset();
        let key = cur.string("key")?;
        if index.contains_key(key) {
            return Err(GgufError::DuplicateKey {
                offset: key_offset,
                key: clip(key),
            });
        }
        cur.location = Location::Value {
            index: i as u64,
            key,
        };
        let ty = cur.meta_type("value type")?;
        let value = cur.value(ty, 0)?;
        index.insert(key.to_owned(), metadata.len());
        metadata.push((key.to_owned(), value));
    }
    Ok((metadata, index))
}

/// `general.alignment` must be an unsigned integer (the spec says u32; any width is accepted)
/// that is a nonzero power of two.
fn validate_alignment(value: Option<&MetaValue>) -> Result<u64, GgufError> {
    let value = value.ok_or(GgufError::MissingKey {
        key: ALIGNMENT_KEY.to_owned(),
    })?;
    let alignment = match value {
        MetaValue::U8(_) | MetaValue::U16(_) | MetaValue::U32(_) | MetaValue::U64(_) => {
            value.as_u64().unwrap_or(0)
        }
        other => {
            return Err(GgufError::WrongType {
                key: ALIGNMENT_KEY.to_owned(),
                expected: "an unsigned integer",
                found: other.meta_type(),
            })
        }
    };
    if !alignment.is_power_of_two() {
        return Err(GgufError::InvalidAlignment { value: alignment });
    }
    Ok(alignment)
}

type Tensors = (Vec<TensorInfo>, HashMap<String, usize>);

fn parse_tensor_infos(cur: &mut Cursor<'_>, tensor_count: usize) -> Result<Tensors, GgufError> {
    // Both bounded by `count`'s check on tensor_count.
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        cur.location = Location::TensorInfo {
            index: i as u64,
            name: None,
        };
        let info_offset = cur.offset();
        let name = cur.string("tensor name")?;
        if index.contains_key(name) {
            return Err(GgufError::DuplicateTensor {
                offset: info_offset,
                tensor: clip(name),
            });
        }
        cur.location = Location::TensorInfo {
            index: i as u64,
            name: Some(name),
        };
        let n_dims = cur.u32("dimension count")?;
        let n_dims = usize::try_from(n_dims)
            .ok()
            .filter(|&n| n <= MAX_DIMS)
            .ok_or_else(|| GgufError::InvalidShape {
                offset: info_offset,
                tensor: clip(name),
                dims: Vec::new(),
                reason: ShapeError::TooManyDims {
                    n_dims: n_dims.into(),
                },
            })?;
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(cur.u64("dimension")?);
        }
        let type_offset = cur.offset();
        let type_id = cur.u32("ggml type")?;
        let ty = GgmlType::from_id(type_id).map_err(|_| GgufError::UnknownGgmlType {
            offset: type_offset,
            type_id,
            tensor: clip(name),
        })?;
        let offset = cur.u64("data offset")?;
        let n_bytes = tensor_n_bytes(&dims, ty).map_err(|reason| GgufError::InvalidShape {
            offset: info_offset,
            tensor: clip(name),
            dims: dims.clone(),
            reason,
        })?;
        index.insert(name.to_owned(), tensors.len());
        tensors.push(TensorInfo {
            name: name.to_owned(),
            dims,
            ty,
            offset,
            n_bytes,
        });
    }
    Ok((tensors, index))
}

/// Every tensor aligned, inside the file, and disjoint from the others.
fn check_tensor_ranges(
    tensors: &[TensorInfo],
    alignment: u64,
    data_section: u64,
    file_size: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: clip(&t.name),
                data_offset: t.offset,
                alignment,
            });
        }
        let end = data_section
            .checked_add(t.offset)
            .and_then(|start| start.checked_add(t.n_bytes));
        if end.is_none_or(|end| end > file_size) {
            return Err(GgufError::TensorOutOfBounds {
                tensor: clip(&t.name),
                data_offset: t.offset,
                n_bytes: t.n_bytes,
                data_section,
                file_size,
            });
        }
    }
    // In bounds, so offset + n_bytes cannot overflow below. A stable sort keeps file order
    // among equal offsets, so the error names the earlier tensor first.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    let mut furthest: Option<&TensorInfo> = None;
    for t in by_offset {
        if let Some(prev) = furthest {
            let prev_end = prev.offset + prev.n_bytes;
            if t.offset < prev_end {
                return Err(GgufError::OverlappingTensors {
                    first: clip(&prev.name),
                    second: clip(&t.name),
                    first_end: prev_end,
                    second_start: t.offset,
                });
            }
        }
        if furthest.is_none_or(|prev| t.offset + t.n_bytes > prev.offset + prev.n_bytes) {
            furthest = Some(t);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_rules() {
        assert_eq!(tensor_n_bytes(&[640, 3], GgmlType::Q8_0), Ok(3 * 20 * 34));
        assert_eq!(tensor_n_bytes(&[], GgmlType::F32), Ok(4));
        assert_eq!(
            tensor_n_bytes(&[4, 0], GgmlType::F32),
            Err(ShapeError::ZeroDimension { axis: 1 })
        );
        assert_eq!(
            tensor_n_bytes(&[1 << 32, 1 << 31], GgmlType::F32),
            Err(ShapeError::ElementCountOverflow)
        );
        assert_eq!(
            tensor_n_bytes(&[1 << 62], GgmlType::F32),
            Err(ShapeError::ByteSizeOverflow)
        );
        assert!(matches!(
            tensor_n_bytes(&[640], GgmlType::Q4_K),
            Err(ShapeError::RowNotBlockMultiple { row_len: 640, .. })
        ));
        assert_eq!(
            tensor_n_bytes(&[1, 1, 1, 1, 1], GgmlType::F32),
            Err(ShapeError::TooManyDims { n_dims: 5 })
        );
    }
}
