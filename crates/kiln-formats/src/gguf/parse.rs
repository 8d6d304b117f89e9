//! The parser behind [`GgufFile::from_bytes`](super::GgufFile::from_bytes).
//!
//! Hostile input yields a [`GgufError`], never a panic: every read goes through a bounds-checked
//! [`Cursor`], every count is checked against the bytes left (count × smallest encoding of an
//! item) before anything is allocated for it, arithmetic on file values is checked, and arrays
//! nest at most [`MAX_ARRAY_DEPTH`] levels so that recursion stays shallow. Memory use is at most
//! linear in the file size (an in-memory [`MetaValue`] is larger than its encoding, up to 32× for
//! u8 arrays), and time is linear in the header size.

use std::collections::HashMap;
use std::fmt;

use kiln_core::GgmlType;

use super::error::{clip, GgufError, ShapeError};
use super::tensor::{tensor_n_bytes, TensorInfo};
use super::value::{MetaArray, MetaType, MetaValue};
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};

/// Smallest encoding of a kv pair: empty key (u64 length), u32 type, 1-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest encoding of a tensor info: empty name, u32 n_dims = 0, u32 type, u64 offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

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
                match elem_type {
                    // The hot paths (vocabularies: 100k+ strings, scores, token types) skip the
                    // per-item dispatch through `value`.
                    MetaType::String => {
                        for _ in 0..count {
                            items.push(MetaValue::String(self.string("string value")?.to_owned()));
                        }
                    }
                    MetaType::Array => {
                        for _ in 0..count {
                            items.push(self.value(elem_type, depth + 1)?);
                        }
                    }
                    _ => self.fixed_size_items(elem_type, count, &mut items)?,
                }
                MetaValue::Array(MetaArray { elem_type, items })
            }
        })
    }

    /// `count` items of a fixed-size type, decoded from one bounds-checked slice.
    fn fixed_size_items(
        &mut self,
        ty: MetaType,
        count: usize,
        items: &mut Vec<MetaValue>,
    ) -> Result<(), GgufError> {
        // For fixed-size types the minimum size is the size, so `count` checked that
        // count × size bytes are left: no overflow, and `take` succeeds.
        let size = ty.min_encoded_size();
        let start = self.offset();
        let bytes = self.take(count as u64 * size, "array items")?;
        fn le<const N: usize>(chunk: &[u8]) -> [u8; N] {
            // `chunks_exact(N)` yields exactly N bytes, so the fallback is never taken.
            chunk.first_chunk::<N>().copied().unwrap_or([0; N])
        }
        match ty {
            MetaType::U8 => items.extend(bytes.iter().map(|&b| MetaValue::U8(b))),
            MetaType::I8 => items.extend(bytes.iter().map(|&b| MetaValue::I8(b as i8))),
            MetaType::U16 => items.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| MetaValue::U16(u16::from_le_bytes(le(c)))),
            ),
            MetaType::I16 => items.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| MetaValue::I16(i16::from_le_bytes(le(c)))),
            ),
            MetaType::U32 => items.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| MetaValue::U32(u32::from_le_bytes(le(c)))),
            ),
            MetaType::I32 => items.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| MetaValue::I32(i32::from_le_bytes(le(c)))),
            ),
            MetaType::F32 => items.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| MetaValue::F32(f32::from_le_bytes(le(c)))),
            ),
            MetaType::U64 => items.extend(
                bytes
                    .chunks_exact(8)
                    .map(|c| MetaValue::U64(u64::from_le_bytes(le(c)))),
            ),
            MetaType::I64 => items.extend(
                bytes
                    .chunks_exact(8)
                    .map(|c| MetaValue::I64(i64::from_le_bytes(le(c)))),
            ),
            MetaType::F64 => items.extend(
                bytes
                    .chunks_exact(8)
                    .map(|c| MetaValue::F64(f64::from_le_bytes(le(c)))),
            ),
            MetaType::Bool => {
                for (i, &b) in bytes.iter().enumerate() {
                    match b {
                        0 | 1 => items.push(MetaValue::Bool(b == 1)),
                        value => {
                            return Err(GgufError::InvalidBool {
                                offset: start + i as u64,
                                value,
                                location: self.location.to_string(),
                            })
                        }
                    }
                }
            }
            // Not fixed-size: handled by the caller.
            MetaType::String | MetaType::Array => {}
        }
        Ok(())
    }
}

pub(crate) struct Parsed {
    pub(crate) version: u32,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) metadata: Vec<(String, MetaValue)>,
    pub(crate) metadata_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
}

pub(crate) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
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
    let data_offset =
        header_end
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
