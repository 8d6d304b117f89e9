//! GGUF metadata values: the 13 value types of the format and their in-memory form.
//!
//! Invariant kept by the reader and checked by the writer: every item of a [`MetaArray`] has the
//! array's `elem_type`, and arrays nest at most [`super::MAX_ARRAY_DEPTH`] levels.

use std::fmt;

/// A GGUF metadata value type; the discriminant is the id stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetaType {
    /// Every type, indexed by its id.
    pub const ALL: [MetaType; 13] = [
        MetaType::U8,
        MetaType::I8,
        MetaType::U16,
        MetaType::I16,
        MetaType::U32,
        MetaType::I32,
        MetaType::F32,
        MetaType::Bool,
        MetaType::String,
        MetaType::Array,
        MetaType::U64,
        MetaType::I64,
        MetaType::F64,
    ];

    /// The type with this file id, `None` for ids the format does not define.
    pub fn from_id(id: u32) -> Option<MetaType> {
        usize::try_from(id)
            .ok()
            .and_then(|i| MetaType::ALL.get(i))
            .copied()
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name `gguf-dump` prints (`UINT32`, `STRING`, ...).
    pub fn name(self) -> &'static str {
        match self {
            MetaType::U8 => "UINT8",
            MetaType::I8 => "INT8",
            MetaType::U16 => "UINT16",
            MetaType::I16 => "INT16",
            MetaType::U32 => "UINT32",
            MetaType::I32 => "INT32",
            MetaType::F32 => "FLOAT32",
            MetaType::Bool => "BOOL",
            MetaType::String => "STRING",
            MetaType::Array => "ARRAY",
            MetaType::U64 => "UINT64",
            MetaType::I64 => "INT64",
            MetaType::F64 => "FLOAT64",
        }
    }

    /// The fewest bytes one value of this type takes in a file: its fixed size, the u64 length
    /// of a string, or the u32 element type plus u64 count of an array. The reader multiplies a
    /// count by this before it allocates, so that a forged count cannot outgrow the file.
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            MetaType::U8 | MetaType::I8 | MetaType::Bool => 1,
            MetaType::U16 | MetaType::I16 => 2,
            MetaType::U32 | MetaType::I32 | MetaType::F32 => 4,
            MetaType::U64 | MetaType::I64 | MetaType::F64 | MetaType::String => 8,
            MetaType::Array => 12,
        }
    }
}

impl fmt::Display for MetaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array: every item has type `elem_type` (arrays of arrays hold arrays whose own
/// element types may differ from each other).
#[derive(Debug, Clone, PartialEq)]
pub struct MetaArray {
    pub elem_type: MetaType,
    pub items: Vec<MetaValue>,
}

impl MetaArray {
    pub fn new(elem_type: MetaType, items: Vec<MetaValue>) -> Self {
        MetaArray { elem_type, items }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl MetaValue {
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(_) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// Any unsigned integer, or a signed one that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer whose value fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any float or integer (64-bit integers above 2^53 round to the nearest f64).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<$t> for MetaValue {
            fn from(v: $t) -> Self {
                MetaValue::$variant(v)
            }
        })*
    };
}

from_scalar!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, MetaArray => Array, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for MetaValue {
    fn from(v: &str) -> Self {
        MetaValue::String(v.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip_and_unknown_ids_are_none() {
        for (i, t) in MetaType::ALL.iter().enumerate() {
            assert_eq!(t.id() as usize, i);
            assert_eq!(MetaType::from_id(t.id()), Some(*t));
        }
        assert_eq!(MetaType::from_id(13), None);
        assert_eq!(MetaType::from_id(u32::MAX), None);
    }

    #[test]
    fn integer_accessors_convert_only_when_the_value_fits() {
        assert_eq!(MetaValue::I32(-1).as_u64(), None);
        assert_eq!(MetaValue::I32(7).as_u64(), Some(7));
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U8(200).as_i64(), Some(200));
        assert_eq!(MetaValue::F32(1.5).as_u64(), None);
        assert_eq!(MetaValue::F32(1.5).as_f64(), Some(1.5));
        assert_eq!(MetaValue::I16(-3).as_f64(), Some(-3.0));
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::from("x").as_str(), Some("x"));
        assert_eq!(MetaValue::from(true).as_bool(), Some(true));
        assert!(MetaValue::from(MetaArray::new(MetaType::U8, vec![]))
            .as_array()
            .is_some_and(MetaArray::is_empty));
    }
}
