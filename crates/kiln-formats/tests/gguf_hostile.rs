//! Hostile GGUF input: one test per way a file can be broken, each asserting the error variant
//! (the mutation fuzz is in `gguf_fuzz.rs`).

mod common;

use common::{parse, sample_writer, Raw};
use kiln_core::GgmlType;
use kiln_formats::{GgufError, MetaType, ShapeError, MAX_ARRAY_DEPTH};

const F32: u32 = GgmlType::F32 as u32;
const Q8_0: u32 = GgmlType::Q8_0 as u32;
const STRING: u32 = MetaType::String as u32;
const ARRAY: u32 = MetaType::Array as u32;
const U8: u32 = MetaType::U8 as u32;

/// A v3 file with one tensor `w` and `data_len` zero bytes of data.
fn one_tensor(dims: &[u64], type_id: u32, offset: u64, data_len: usize) -> Result<(), GgufError> {
    Raw::header(3, 1, 0)
        .tensor("w", dims, type_id, offset)
        .pad(32)
        .zeros(data_len)
        .parse()
        .map(drop)
}

#[test]
fn bad_magic() {
    let err = Raw(b"GGML".to_vec())
        .u32(3)
        .u64(0)
        .u64(0)
        .parse()
        .unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { found } if &found == b"GGML"));
    assert!(err.to_string().contains("byte 0"), "{err}");
}

#[test]
fn empty_and_too_short_for_magic() {
    for bytes in [&b""[..], b"GG"] {
        let err = parse(bytes.to_vec()).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Truncated {
                    offset: 0,
                    what: "magic",
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn version_1_is_unsupported() {
    let err = Raw::header(1, 0, 0).parse().unwrap_err();
    assert!(matches!(err, GgufError::UnsupportedVersion { version: 1 }));
}

#[test]
fn unknown_versions_are_unsupported() {
    for version in [0, 4, 0xffff_ffff] {
        let err = Raw::header(version, 0, 0).parse().unwrap_err();
        assert!(
            matches!(err, GgufError::UnsupportedVersion { version: v } if v == version),
            "{err}"
        );
    }
}

#[test]
fn big_endian_is_detected() {
    for version in [2u32, 3] {
        let bytes = Raw(b"GGUF".to_vec())
            .bytes(&version.to_be_bytes())
            .bytes(&0u64.to_be_bytes())
            .bytes(&0u64.to_be_bytes());
        let err = bytes.parse().unwrap_err();
        assert!(
            matches!(err, GgufError::BigEndian { version: v, .. } if v == version),
            "{err}"
        );
        assert!(err.to_string().contains("big-endian"));
    }
}

#[test]
fn truncated_header_counts() {
    let err = Raw(b"GGUF".to_vec())
        .u32(3)
        .u64(0)
        .bytes(&[0; 5])
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::Truncated {
                offset: 16,
                what: "metadata kv count",
                needed: 8,
                available: 5,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn truncation_at_every_header_length_is_a_truncated_error() {
    let full = sample_writer().to_bytes();
    let file = parse(full.clone()).unwrap();
    let header_end = file.data_offset() as usize;
    let data_end = file
        .tensors()
        .iter()
        .map(|t| header_end + (t.offset + t.n_bytes) as usize)
        .max()
        .unwrap();
    // Cutting only the padding after the last tensor leaves a valid file.
    for len in data_end..full.len() {
        parse(full[..len].to_vec()).unwrap();
    }
    // Every cut inside the header proper (before the padding) fails as truncated, or as a count
    // that the bytes left cannot hold; cuts in the padding or data fail because a tensor no
    // longer fits.
    for len in 0..data_end {
        let err = parse(full[..len].to_vec()).unwrap_err();
        if len < header_end - 16 {
            assert!(
                matches!(
                    err,
                    GgufError::Truncated { .. } | GgufError::CountTooLarge { .. }
                ),
                "{len}: {err}"
            );
        } else {
            assert!(
                matches!(
                    err,
                    GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }
                ),
                "{len}: {err}"
            );
        }
    }
}

#[test]
fn kv_count_larger_than_the_file_could_hold() {
    for count in [u64::MAX, 1 << 40, 3] {
        let err = Raw::header(3, 0, count).kv_u32("a", 1).parse().unwrap_err();
        assert!(
            matches!(err, GgufError::CountTooLarge { what: "metadata kv count", count: c, offset: 16, .. } if c == count),
            "{err}"
        );
    }
}

#[test]
fn tensor_count_larger_than_the_file_could_hold() {
    let err = Raw::header(3, u64::MAX / 2, 0)
        .zeros(100)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::CountTooLarge {
                what: "tensor count",
                offset: 8,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn key_length_larger_than_the_file() {
    let err = Raw::header(3, 0, 1)
        .u64(u64::MAX)
        .bytes(b"abcdefghijkl")
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::Truncated {
                what: "key",
                needed: u64::MAX,
                available: 12,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn string_value_length_larger_than_the_file_names_the_key() {
    let err = Raw::header(3, 0, 1)
        .key("general.name", STRING)
        .u64(1 << 50)
        .bytes(b"short")
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::Truncated {
                what: "string value",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("'general.name'"), "{err}");
}

#[test]
fn array_count_larger_than_the_file_could_hold() {
    // 10 bytes left but 11 u8 items claimed: rejected before any item is read or allocated.
    let err = Raw::header(3, 0, 1)
        .key("arr", ARRAY)
        .u32(U8)
        .u64(11)
        .zeros(10)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::CountTooLarge {
                what: "array length",
                count: 11,
                min_item_size: 1,
                available: 10,
                ..
            }
        ),
        "{err}"
    );
    // Strings take at least 8 bytes each, arrays 12.
    for (elem, min) in [(STRING, 8), (ARRAY, 12)] {
        let err = Raw::header(3, 0, 1)
            .key("arr", ARRAY)
            .u32(elem)
            .u64(u64::MAX / 4)
            .zeros(64)
            .parse()
            .unwrap_err();
        assert!(
            matches!(err, GgufError::CountTooLarge { min_item_size: m, .. } if m == min),
            "{err}"
        );
    }
}

#[test]
fn invalid_utf8_in_a_key() {
    let err = Raw::header(3, 0, 1)
        .key(b"ab\xffc", U8)
        .u8(0)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidUtf8 {
                what: "key",
                offset: 34,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn invalid_utf8_in_a_string_value() {
    let err = Raw::header(3, 0, 1)
        .key("k", STRING)
        .str(b"\xc3\x28")
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidUtf8 {
                what: "string value",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("'k'"), "{err}");
}

#[test]
fn invalid_utf8_in_a_tensor_name() {
    let err = Raw::header(3, 1, 0)
        .tensor(b"\x80w", &[1], F32, 0)
        .pad(32)
        .zeros(32)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidUtf8 {
                what: "tensor name",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_value_type() {
    let err = Raw::header(3, 0, 1)
        .key("k", 13)
        .u64(0)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::UnknownValueType {
                type_id: 13,
                offset: 33,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_array_element_type() {
    let err = Raw::header(3, 0, 1)
        .key("k", ARRAY)
        .u32(0xdead)
        .u64(0)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::UnknownValueType {
                type_id: 0xdead,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bool_other_than_0_or_1() {
    let err = Raw::header(3, 0, 1)
        .key("b", MetaType::Bool.id())
        .u8(2)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidBool {
                value: 2,
                offset: 37,
                ..
            }
        ),
        "{err}"
    );
    // Inside an array: the offset of the bad item.
    let err = Raw::header(3, 0, 1)
        .key("b", ARRAY)
        .u32(MetaType::Bool.id())
        .u64(3)
        .bytes(&[1, 0, 7])
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidBool {
                value: 7,
                offset: 51,
                ..
            }
        ),
        "{err}"
    );
}

/// `depth` arrays nested in each other, the innermost an empty u8 array.
fn nested(depth: usize) -> Raw {
    let mut raw = Raw::header(3, 0, 1).key("deep", ARRAY);
    for _ in 1..depth {
        raw = raw.u32(ARRAY).u64(1);
    }
    raw.u32(U8).u64(0)
}

#[test]
fn array_nesting_is_bounded() {
    let file = nested(MAX_ARRAY_DEPTH).parse().unwrap();
    assert!(file.get_array("deep").is_ok());
    let err = nested(MAX_ARRAY_DEPTH + 1).parse().unwrap_err();
    assert!(matches!(err, GgufError::NestingTooDeep { .. }), "{err}");
    // A million levels would blow the stack if the depth were not checked before recursing.
    let err = nested(1_000_000).parse().unwrap_err();
    assert!(matches!(err, GgufError::NestingTooDeep { .. }), "{err}");
}

#[test]
fn duplicate_key() {
    let err = Raw::header(3, 0, 2)
        .kv_u32("k", 1)
        .kv_u32("k", 2)
        .parse()
        .unwrap_err();
    assert!(
        matches!(err, GgufError::DuplicateKey { ref key, offset: 41 } if key == "k"),
        "{err}"
    );
}

#[test]
fn alignment_zero() {
    let err = Raw::header(3, 0, 1)
        .kv_u32("general.alignment", 0)
        .parse()
        .unwrap_err();
    assert!(
        matches!(err, GgufError::InvalidAlignment { value: 0 }),
        "{err}"
    );
}

#[test]
fn alignment_not_a_power_of_two() {
    let err = Raw::header(3, 0, 1)
        .kv_u32("general.alignment", 48)
        .parse()
        .unwrap_err();
    assert!(
        matches!(err, GgufError::InvalidAlignment { value: 48 }),
        "{err}"
    );
}

#[test]
fn alignment_of_the_wrong_type() {
    for raw in [
        Raw::header(3, 0, 1)
            .key("general.alignment", STRING)
            .str("32"),
        Raw::header(3, 0, 1)
            .key("general.alignment", MetaType::I32.id())
            .u32(32),
        Raw::header(3, 0, 1)
            .key("general.alignment", MetaType::F32.id())
            .bytes(&32f32.to_le_bytes()),
    ] {
        let err = raw.parse().unwrap_err();
        assert!(
            matches!(err, GgufError::WrongType { ref key, .. } if key == "general.alignment"),
            "{err}"
        );
    }
}

#[test]
fn alignment_of_any_unsigned_width_is_accepted() {
    let file = Raw::header(3, 0, 1)
        .key("general.alignment", MetaType::U64.id())
        .u64(1 << 40)
        .parse()
        .unwrap();
    assert_eq!(file.alignment(), 1 << 40);
    // No tensors, so a data section past the end of the file holds nothing and is harmless.
    assert!(file.data_offset() > file.file_size());
}

#[test]
fn unknown_ggml_type_names_the_tensor() {
    let err = one_tensor(&[32], 4, 0, 64).unwrap_err();
    assert!(
        matches!(err, GgufError::UnknownGgmlType { ref tensor, type_id: 4, offset: 45 } if tensor == "w"),
        "{err}"
    );
    assert!(err.to_string().contains("'w'"), "{err}");
}

#[test]
fn more_than_four_dims() {
    let err = one_tensor(&[1, 1, 1, 1, 1], F32, 0, 32).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidShape {
                reason: ShapeError::TooManyDims { n_dims: 5 },
                ..
            }
        ),
        "{err}"
    );
    // A forged n_dims is rejected before any dim is read or allocated.
    let err = Raw::header(3, 1, 0)
        .str("w")
        .u32(u32::MAX)
        .zeros(64)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidShape {
                reason: ShapeError::TooManyDims {
                    n_dims: 0xffff_ffff
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn zero_dims_is_a_scalar_but_a_zero_dim_is_rejected() {
    one_tensor(&[], F32, 0, 32).unwrap();
    let err = one_tensor(&[4, 0], F32, 0, 32).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidShape {
                reason: ShapeError::ZeroDimension { axis: 1 },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn element_count_overflow() {
    let err = one_tensor(&[1 << 32, 1 << 32], F32, 0, 32).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidShape {
                reason: ShapeError::ElementCountOverflow,
                ..
            }
        ),
        "{err}"
    );
    let err = one_tensor(&[u64::MAX], F32, 0, 32).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidShape {
                reason: ShapeError::ElementCountOverflow,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn row_length_not_a_multiple_of_the_block_size() {
    let err = one_tensor(&[33, 2], Q8_0, 0, 256).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::InvalidShape {
                reason: ShapeError::RowNotBlockMultiple {
                    row_len: 33,
                    block_size: 32,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn misaligned_tensor_offset() {
    let err = one_tensor(&[1], F32, 4, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::MisalignedTensor {
                data_offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tensor_data_past_the_end_of_the_file() {
    let err = one_tensor(&[16], F32, 0, 63).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::TensorOutOfBounds {
                n_bytes: 64,
                data_offset: 0,
                ..
            }
        ),
        "{err}"
    );
    // An offset near u64::MAX must not overflow on the way to the same error.
    let err = one_tensor(&[16], F32, u64::MAX - 31, 64).unwrap_err();
    assert!(matches!(err, GgufError::TensorOutOfBounds { .. }), "{err}");
}

#[test]
fn overlapping_tensors() {
    let two = |second_offset: u64| {
        Raw::header(3, 2, 0)
            .tensor("first", &[16], F32, 0)
            .tensor("second", &[8], F32, second_offset)
            .pad(32)
            .zeros(128)
            .parse()
    };
    two(64).unwrap();
    for offset in [0, 32] {
        let err = two(offset).unwrap_err();
        assert!(
            matches!(err, GgufError::OverlappingTensors { ref first, ref second, .. } if first == "first" && second == "second"),
            "{err}"
        );
    }
}

#[test]
fn duplicate_tensor_name() {
    let err = Raw::header(3, 2, 0)
        .tensor("w", &[8], F32, 0)
        .tensor("w", &[8], F32, 32)
        .pad(32)
        .zeros(64)
        .parse()
        .unwrap_err();
    assert!(
        matches!(err, GgufError::DuplicateTensor { ref tensor, offset: 57 } if tensor == "w"),
        "{err}"
    );
}

#[test]
fn truncated_tensor_info_names_the_tensor() {
    let err = Raw::header(3, 1, 0)
        .str("blk.0.w")
        .u32(2)
        .u64(32)
        .parse()
        .unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::Truncated {
                what: "dimension",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("'blk.0.w'"), "{err}");
}
