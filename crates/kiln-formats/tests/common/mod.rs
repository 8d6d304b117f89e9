//! Shared by the GGUF integration tests: a raw byte builder for files the writer refuses to
//! make, and a small valid sample file.
#![allow(dead_code)]

use kiln_core::{GgmlType, SharedBytes};
use kiln_formats::{GgufError, GgufFile, GgufWriter, MetaArray, MetaType, MetaValue};

/// Little-endian GGUF bytes built field by field.
#[derive(Clone, Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }

    pub fn u8(mut self, v: u8) -> Raw {
        self.0.push(v);
        self
    }

    pub fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }

    /// A GGUF string: u64 length, then the bytes (need not be UTF-8).
    pub fn str(self, s: impl AsRef<[u8]>) -> Raw {
        let s = s.as_ref();
        self.u64(s.len() as u64).bytes(s)
    }

    /// Key and value type id; the value follows.
    pub fn key(self, key: impl AsRef<[u8]>, type_id: u32) -> Raw {
        self.str(key).u32(type_id)
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.key(key, MetaType::U32.id()).u32(v)
    }

    pub fn tensor(self, name: impl AsRef<[u8]>, dims: &[u64], type_id: u32, offset: u64) -> Raw {
        let mut raw = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            raw = raw.u64(d);
        }
        raw.u32(type_id).u64(offset)
    }

    /// Zeros up to the next multiple of `alignment`.
    pub fn pad(mut self, alignment: usize) -> Raw {
        let len = self.0.len().next_multiple_of(alignment);
        self.0.resize(len, 0);
        self
    }

    pub fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }

    pub fn parse(self) -> Result<GgufFile, GgufError> {
        parse(self.0)
    }
}

pub fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(SharedBytes::from_vec(bytes))
}

pub fn strings(items: &[&str]) -> MetaValue {
    MetaArray::new(
        MetaType::String,
        items.iter().map(|&s| MetaValue::from(s)).collect(),
    )
    .into()
}

/// Deterministic filler bytes, different for each tensor.
pub fn filler(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A small valid file: several value types, nested and empty arrays, three tensors, alignment 16.
pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set_alignment(16).unwrap();
    w.add_meta("general.architecture", "llama".into()).unwrap();
    w.add_meta("llama.block_count", MetaValue::U32(2)).unwrap();
    w.add_meta("llama.rope.freq_base", MetaValue::F32(10000.0))
        .unwrap();
    w.add_meta("flag", MetaValue::Bool(true)).unwrap();
    w.add_meta("neg", MetaValue::I64(-5)).unwrap();
    w.add_meta("tokens", strings(&["a", "bc", ""])).unwrap();
    let nested = MetaArray::new(
        MetaType::Array,
        vec![
            strings(&["x", "yz"]),
            MetaArray::new(MetaType::I16, vec![MetaValue::I16(-1)]).into(),
            MetaArray::new(MetaType::U8, vec![]).into(),
        ],
    );
    w.add_meta("nested", nested.into()).unwrap();
    w.add_tensor("a", &[4, 2], GgmlType::F32, &filler(32, 1))
        .unwrap();
    w.add_tensor("b", &[32, 1], GgmlType::Q8_0, &filler(34, 2))
        .unwrap();
    w.add_tensor("c", &[3], GgmlType::F16, &filler(6, 3))
        .unwrap();
    w
}
