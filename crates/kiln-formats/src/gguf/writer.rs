//! A GGUF writer (version 3 by default, or 2: same layout), for tests, fuzzing and synthetic
//! models.
//!
//! Every input is validated when it is added (homogeneous arrays, bounded nesting, unique keys
//! and names, valid shapes, data sizes that match), so that whatever this writer emits, the
//! reader accepts and reads back equal. Tensors are laid out in insertion order, each at the next
//! multiple of the alignment; the data section and the file end are padded with zeros.

use std::collections::HashSet;
use std::io::{self, Write};

use kiln_core::GgmlType;

use super::error::GgufWriteError;
use super::tensor::tensor_n_bytes;
use super::value::MetaValue;
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory; see the module doc.
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// 2 or 3 (their layouts are identical; version 1 used 32-bit counts).
    pub fn set_version(&mut self, version: u32) -> Result<&mut Self, GgufWriteError> {
        if !matches!(version, 2 | 3) {
            return Err(GgufWriteError::UnsupportedVersion(version));
        }
        self.version = version;
        Ok(self)
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Sets the alignment and stores it as `general.alignment` (u32), replacing any earlier value.
    pub fn set_alignment(&mut self, alignment: u64) -> Result<&mut Self, GgufWriteError> {
        let as_u32 = u32::try_from(alignment)
            .ok()
            .filter(|a| a.is_power_of_two())
            .ok_or(GgufWriteError::InvalidAlignment(alignment))?;
        self.alignment = alignment;
        match self.metadata.iter_mut().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, value)) => *value = MetaValue::U32(as_u32),
            None => {
                self.keys.insert(ALIGNMENT_KEY.to_owned());
                self.metadata
                    .push((ALIGNMENT_KEY.to_owned(), MetaValue::U32(as_u32)));
            }
        }
        Ok(self)
    }

    /// Appends a kv pair. `general.alignment` also sets the alignment, so it must be an unsigned
    /// integer holding a power of two.
    pub fn add_meta(
        &mut self,
        key: impl Into<String>,
        value: MetaValue,
    ) -> Result<&mut Self, GgufWriteError> {
        let key = key.into();
        if self.keys.contains(&key) {
            return Err(GgufWriteError::DuplicateKey(key));
        }
        check_value(&key, &value, 0)?;
        if key == ALIGNMENT_KEY {
            let alignment = match value {
                MetaValue::U8(_) | MetaValue::U16(_) | MetaValue::U32(_) | MetaValue::U64(_) => {
                    value.as_u64().unwrap_or(0)
                }
                ref other => return Err(GgufWriteError::AlignmentType(other.meta_type())),
            };
            // The cap keeps the padding of a test file sane; the reader takes any power of two.
            if !alignment.is_power_of_two() || alignment > u32::MAX.into() {
                return Err(GgufWriteError::InvalidAlignment(alignment));
            }
            self.alignment = alignment;
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Appends a tensor; `dims` in ggml order (`dims[0]` is the row length), `data` exactly the
    /// bytes its shape and type need.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: &[u8],
    ) -> Result<&mut Self, GgufWriteError> {
        let name = name.into();
        if self.names.contains(&name) {
            return Err(GgufWriteError::DuplicateTensor(name));
        }
        let expected = tensor_n_bytes(dims, ty).map_err(|reason| GgufWriteError::InvalidShape {
            tensor: name.clone(),
            dims: dims.to_vec(),
            reason,
        })?;
        if data.len() as u64 != expected {
            return Err(GgufWriteError::DataSize {
                tensor: name,
                expected,
                actual: data.len() as u64,
            });
        }
        self.names.insert(name.clone());
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data: data.to_vec(),
        });
        Ok(self)
    }

    /// Zero bytes that pad `len` up to the alignment.
    fn padding(&self, len: u64) -> usize {
        // The alignment is a power of two <= u64::MAX / 2, and `len` is the size of something
        // in memory, so neither the rounding nor the cast can overflow.
        (len.next_multiple_of(self.alignment) - len) as usize
    }

    /// Everything before the data section, padding included.
    fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&value.meta_type().id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            let len = t.data.len() as u64;
            offset += len + self.padding(len) as u64;
        }
        out.resize(out.len() + self.padding(out.len() as u64), 0);
        out
    }

    /// Writes the whole file.
    pub fn write_to<W: Write>(&self, mut out: W) -> io::Result<()> {
        out.write_all(&self.header())?;
        let zeros = vec![0u8; self.padding(1)];
        for t in &self.tensors {
            out.write_all(&t.data)?;
            let pad = self.padding(t.data.len() as u64);
            out.write_all(zeros.get(..pad).unwrap_or_default())?;
        }
        out.flush()
    }

    /// The whole file in memory.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header();
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            out.resize(out.len() + self.padding(t.data.len() as u64), 0);
        }
        out
    }
}

/// Arrays homogeneous and nested at most [`MAX_ARRAY_DEPTH`] deep, as the reader requires.
fn check_value(key: &str, value: &MetaValue, depth: usize) -> Result<(), GgufWriteError> {
    let MetaValue::Array(array) = value else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufWriteError::NestingTooDeep {
            key: key.to_owned(),
        });
    }
    for (index, item) in array.items.iter().enumerate() {
        if item.meta_type() != array.elem_type {
            return Err(GgufWriteError::MixedArray {
                key: key.to_owned(),
                index,
                expected: array.elem_type,
                found: item.meta_type(),
            });
        }
        check_value(key, item, depth + 1)?;
    }
    Ok(())
}

/// Appends a GGUF string (u64 length, then the bytes): for writers that stream their own header.
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends a metadata value's GGUF encoding (without its type id), arrays included.
pub fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => {
            out.extend_from_slice(&a.elem_type.id().to_le_bytes());
            out.extend_from_slice(&(a.items.len() as u64).to_le_bytes());
            for item in &a.items {
                put_value(out, item);
            }
        }
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::value::{MetaArray, MetaType};

    #[test]
    fn rejects_what_the_reader_would_reject() {
        let mut w = GgufWriter::new();
        w.add_meta("a", MetaValue::U32(1)).unwrap();
        assert_eq!(
            w.add_meta("a", MetaValue::U8(1)).err(),
            Some(GgufWriteError::DuplicateKey("a".into()))
        );
        let mixed = MetaArray::new(MetaType::U8, vec![MetaValue::U8(1), MetaValue::I8(1)]);
        assert!(matches!(
            w.add_meta("m", mixed.into()),
            Err(GgufWriteError::MixedArray { index: 1, .. })
        ));
        let mut deep = MetaValue::from(MetaArray::new(MetaType::U8, vec![]));
        for _ in 0..MAX_ARRAY_DEPTH {
            deep = MetaArray::new(MetaType::Array, vec![deep]).into();
        }
        assert!(matches!(
            w.add_meta("deep", deep),
            Err(GgufWriteError::NestingTooDeep { .. })
        ));
        assert!(matches!(
            w.add_meta(ALIGNMENT_KEY, MetaValue::U32(48)),
            Err(GgufWriteError::InvalidAlignment(48))
        ));
        assert!(matches!(
            w.add_meta(ALIGNMENT_KEY, MetaValue::I32(64)),
            Err(GgufWriteError::AlignmentType(MetaType::I32))
        ));
        assert!(w.set_alignment(0).is_err());
        assert!(w.set_alignment(1 << 32).is_err());
        assert!(w.set_version(1).is_err());
        w.add_tensor("t", &[2], GgmlType::F32, &[0; 8]).unwrap();
        assert!(matches!(
            w.add_tensor("t", &[2], GgmlType::F32, &[0; 8]),
            Err(GgufWriteError::DuplicateTensor(_))
        ));
        assert!(matches!(
            w.add_tensor("u", &[2], GgmlType::F32, &[0; 7]),
            Err(GgufWriteError::DataSize {
                expected: 8,
                actual: 7,
                ..
            })
        ));
        assert!(matches!(
            w.add_tensor("v", &[31], GgmlType::Q8_0, &[]),
            Err(GgufWriteError::InvalidShape { .. })
        ));
    }

    #[test]
    fn write_to_and_to_bytes_agree_and_pad_to_the_alignment() {
        let mut w = GgufWriter::new();
        w.set_alignment(64).unwrap();
        w.add_tensor("a", &[3], GgmlType::F32, &[1; 12]).unwrap();
        w.add_tensor("b", &[5], GgmlType::I8, &[2; 5]).unwrap();
        let mut streamed = Vec::new();
        w.write_to(&mut streamed).unwrap();
        let bytes = w.to_bytes();
        assert_eq!(streamed, bytes);
        assert_eq!(bytes.len() % 64, 0);
    }
}
