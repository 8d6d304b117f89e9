//! GgufWriter → GgufFile round trips, lookups, `open`, and the dump of a synthetic file.

mod common;

use common::{filler, parse, sample_writer, strings};
use kiln_core::GgmlType;
use kiln_formats::{
    write_dump, DumpOptions, GgufError, GgufFile, GgufWriter, LoadMode, MetaArray, MetaType,
    MetaValue,
};

/// Every value type, extremes included, and arrays of every shape the format allows.
fn all_values() -> Vec<(String, MetaValue)> {
    let array = |ty: MetaType, items: Vec<MetaValue>| MetaValue::from(MetaArray::new(ty, items));
    let mut nested = array(MetaType::U32, vec![MetaValue::U32(7)]);
    for _ in 0..kiln_formats::MAX_ARRAY_DEPTH - 1 {
        nested = array(MetaType::Array, vec![nested]);
    }
    vec![
        ("general.architecture".into(), "test-arch".into()),
        ("u8".into(), MetaValue::U8(u8::MAX)),
        ("i8".into(), MetaValue::I8(i8::MIN)),
        ("u16".into(), MetaValue::U16(u16::MAX)),
        ("i16".into(), MetaValue::I16(i16::MIN)),
        ("u32".into(), MetaValue::U32(u32::MAX)),
        ("i32".into(), MetaValue::I32(-123_456)),
        ("f32".into(), MetaValue::F32(-1.5e-7)),
        ("bool.true".into(), MetaValue::Bool(true)),
        ("bool.false".into(), MetaValue::Bool(false)),
        ("string".into(), "héllo\n\u{1F600}".into()),
        ("string.empty".into(), "".into()),
        ("u64".into(), MetaValue::U64(u64::MAX)),
        ("i64".into(), MetaValue::I64(i64::MIN)),
        ("f64".into(), MetaValue::F64(std::f64::consts::PI)),
        (
            "array.f32".into(),
            array(
                MetaType::F32,
                vec![MetaValue::F32(0.5), MetaValue::F32(-2.0)],
            ),
        ),
        ("array.empty".into(), array(MetaType::U64, vec![])),
        ("array.strings".into(), strings(&["a", "", "ü"])),
        (
            "array.of_arrays_of_strings".into(),
            array(
                MetaType::Array,
                vec![strings(&["x", "y"]), strings(&[]), strings(&["z"])],
            ),
        ),
        (
            "array.of_mixed_arrays".into(),
            array(
                MetaType::Array,
                vec![
                    array(MetaType::Bool, vec![MetaValue::Bool(true)]),
                    array(MetaType::I8, vec![MetaValue::I8(-1), MetaValue::I8(2)]),
                    array(MetaType::Array, vec![]),
                ],
            ),
        ),
        (
            "array.empty_of_arrays".into(),
            array(MetaType::Array, vec![]),
        ),
        (
            "array.u8".into(),
            array(MetaType::U8, vec![MetaValue::U8(0), MetaValue::U8(255)]),
        ),
        (
            "array.u16".into(),
            array(
                MetaType::U16,
                vec![MetaValue::U16(1), MetaValue::U16(65535)],
            ),
        ),
        (
            "array.i16".into(),
            array(MetaType::I16, vec![MetaValue::I16(-2)]),
        ),
        (
            "array.u32".into(),
            array(MetaType::U32, vec![MetaValue::U32(3), MetaValue::U32(4)]),
        ),
        (
            "array.i32".into(),
            array(MetaType::I32, vec![MetaValue::I32(-5), MetaValue::I32(6)]),
        ),
        (
            "array.u64".into(),
            array(MetaType::U64, vec![MetaValue::U64(u64::MAX)]),
        ),
        (
            "array.i64".into(),
            array(
                MetaType::I64,
                vec![MetaValue::I64(i64::MIN), MetaValue::I64(0)],
            ),
        ),
        (
            "array.f64".into(),
            array(
                MetaType::F64,
                vec![MetaValue::F64(-0.25), MetaValue::F64(1e300)],
            ),
        ),
        (
            "array.bool".into(),
            array(
                MetaType::Bool,
                vec![MetaValue::Bool(false), MetaValue::Bool(true)],
            ),
        ),
        ("array.deepest_allowed".into(), nested),
    ]
}

struct TestTensor {
    name: &'static str,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

fn all_tensors() -> Vec<TestTensor> {
    let specs: [(&str, &[u64], GgmlType); 7] = [
        ("f32.matrix", &[3, 5], GgmlType::F32),
        ("f16.vector", &[7], GgmlType::F16),
        ("q8_0.3d", &[64, 2, 3], GgmlType::Q8_0),
        ("q4_k.4d", &[256, 1, 2, 1], GgmlType::Q4_K),
        ("bf16", &[5, 1], GgmlType::BF16),
        ("i8.scalar", &[], GgmlType::I8),
        ("q6_k", &[512, 3], GgmlType::Q6_K),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, &(name, dims, ty))| {
            let n_bytes = ty.row_bytes(dims.first().copied().unwrap_or(1)).unwrap()
                * dims.iter().skip(1).product::<u64>();
            TestTensor {
                name,
                dims: dims.to_vec(),
                ty,
                data: filler(n_bytes as usize, i as u8),
            }
        })
        .collect()
}

fn write(version: u32, alignment: u64) -> (Vec<u8>, Vec<(String, MetaValue)>) {
    let mut w = GgufWriter::new();
    w.set_version(version).unwrap();
    w.set_alignment(alignment).unwrap();
    for (k, v) in all_values() {
        w.add_meta(k, v).unwrap();
    }
    for t in all_tensors() {
        w.add_tensor(t.name, &t.dims, t.ty, &t.data).unwrap();
    }
    let mut expected = vec![(
        "general.alignment".to_owned(),
        MetaValue::U32(alignment as u32),
    )];
    expected.extend(all_values());
    (w.to_bytes(), expected)
}

fn check_round_trip(version: u32, alignment: u64) {
    let (bytes, expected_meta) = write(version, alignment);
    let file_len = bytes.len() as u64;
    let file = parse(bytes).unwrap();
    assert_eq!(file.version(), version);
    assert_eq!(file.alignment(), alignment);
    assert_eq!(file.file_size(), file_len);
    assert_eq!(file.data_offset() % alignment, 0);
    assert_eq!(file.metadata(), expected_meta.as_slice());
    for (key, value) in &expected_meta {
        assert_eq!(file.get(key), Some(value), "{key}");
    }
    assert_eq!(file.architecture(), Some("test-arch"));

    let tensors = all_tensors();
    assert_eq!(file.tensors().len(), tensors.len());
    let mut previous_end = 0;
    for (info, t) in file.tensors().iter().zip(&tensors) {
        assert_eq!(info.name, t.name);
        assert_eq!(info.dims, t.dims);
        assert_eq!(info.ty, t.ty);
        assert_eq!(info.n_bytes, t.data.len() as u64);
        assert_eq!(info.offset % alignment, 0);
        assert!(info.offset >= previous_end, "tensors laid out in order");
        previous_end = info.offset + info.n_bytes;
        assert_eq!(&*file.tensor_data(info), t.data.as_slice(), "{}", t.name);
        assert_eq!(file.tensor(t.name), Some(info));
    }
    assert_eq!(file.tensor("i8.scalar").unwrap().n_elements(), 1);
    assert_eq!(file.tensor("q8_0.3d").unwrap().n_elements(), 64 * 6);
    assert!(file.tensor("missing").is_none());
}

#[test]
fn round_trip_v3_every_value_type_and_tensor_layout() {
    check_round_trip(3, 64);
}

#[test]
fn round_trip_v2() {
    check_round_trip(2, 32);
}

#[test]
fn round_trip_with_alignment_one_and_large() {
    check_round_trip(3, 1);
    check_round_trip(3, 4096);
}

#[test]
fn typed_getters_convert_or_name_the_problem() {
    let (bytes, _) = write(3, 32);
    let file = parse(bytes).unwrap();
    assert_eq!(file.get_u64("u8").unwrap(), 255);
    assert_eq!(file.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(file.get_f64("u32").unwrap(), u32::MAX as f64);
    assert_eq!(file.get_f64("f32").unwrap(), -1.5e-7f32 as f64);
    assert_eq!(file.get_str("string").unwrap(), "héllo\n\u{1F600}");
    assert!(!file.get_bool("bool.false").unwrap());
    assert_eq!(file.get_array("array.strings").unwrap().len(), 3);
    assert_eq!(
        file.get_array("array.strings").unwrap().items[2].as_str(),
        Some("ü")
    );

    match file.get_u64("i8") {
        Err(GgufError::WrongType { key, found, .. }) => {
            assert_eq!(key, "i8");
            assert_eq!(found, MetaType::I8);
        }
        other => panic!("negative i8 read as u64: {other:?}"),
    }
    assert!(matches!(
        file.get_str("u32"),
        Err(GgufError::WrongType {
            found: MetaType::U32,
            ..
        })
    ));
    assert!(matches!(
        file.get_bool("string"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        file.get_array("f64"),
        Err(GgufError::WrongType { .. })
    ));
    match file.get_f64("nope") {
        Err(e @ GgufError::MissingKey { .. }) => assert!(e.to_string().contains("'nope'")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_mapped_file_is_read_into_memory_later_from_the_same_handle() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("kiln-formats-hold-test.gguf");
    let w = sample_writer();
    std::fs::write(&path, w.to_bytes()).unwrap();
    let mut file = GgufFile::open_with(&path, LoadMode::Map).unwrap();
    assert_eq!(file.load_mode(), Some(LoadMode::Map));
    let before = file.tensor_data(file.tensor("b").unwrap());
    // The path is gone: what follows reads the handle the file was opened with.
    let moved = dir.join("kiln-formats-hold-test-moved.gguf");
    std::fs::rename(&path, &moved).unwrap();
    file.hold_as(LoadMode::Read).unwrap();
    assert_eq!(file.load_mode(), Some(LoadMode::Read));
    let after = file.tensor_data(file.tensor("b").unwrap());
    assert_eq!(&*after, filler(34, 2).as_slice());
    assert_eq!(&*before, &*after, "views taken before keep their bytes");
    file.hold_as(LoadMode::Read).unwrap(); // already so: nothing to do

    // A file rewritten while open (another header, same length) is refused, and kept as it was.
    let mut again = GgufFile::open_with(&moved, LoadMode::Map).unwrap();
    let mut bytes = w.to_bytes();
    bytes[4] ^= 0xff; // the version field
    std::fs::write(&moved, &bytes).unwrap();
    match again.hold_as(LoadMode::Read) {
        Err(e @ GgufError::Io { .. }) => assert!(e.to_string().contains("changed"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(again.load_mode(), Some(LoadMode::Map));
    // Parsed from bytes: no file to read again.
    let mut in_memory = parse(w.to_bytes()).unwrap();
    assert_eq!(in_memory.load_mode(), None);
    in_memory.hold_as(LoadMode::Read).unwrap();
}

#[test]
fn a_file_without_tensors_is_read_into_memory_too() {
    // A vocabulary-only file (llama.cpp's ggml-vocab-*.gguf): its data section starts at the
    // header's end rounded up to the alignment, past the end of the file.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("kiln-formats-no-tensors.gguf");
    let mut w = GgufWriter::new();
    w.add_meta("general.name", MetaValue::from("vocab"))
        .unwrap();
    let bytes = w.to_bytes();
    std::fs::write(&path, &bytes).unwrap();
    let mut file = GgufFile::open_with(&path, LoadMode::Map).unwrap();
    assert!(
        file.data_offset() >= bytes.len() as u64,
        "the case this test is for"
    );
    file.hold_as(LoadMode::Read).unwrap();
    assert_eq!(file.load_mode(), Some(LoadMode::Read));
    assert_eq!(file.get_str("general.name").unwrap(), "vocab");
}

#[test]
fn open_maps_or_reads_the_file_and_reports_io_errors() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("kiln-formats-open-test.gguf");
    let w = sample_writer();
    let mut f = std::fs::File::create(&path).unwrap();
    w.write_to(&mut f).unwrap();
    drop(f);
    let in_memory = parse(w.to_bytes()).unwrap();
    let empty = dir.join("kiln-formats-empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    for mode in [LoadMode::Map, LoadMode::Read] {
        let from_disk = GgufFile::open_with(&path, mode).unwrap();
        assert_eq!(from_disk.metadata(), in_memory.metadata(), "{mode:?}");
        assert_eq!(from_disk.tensors(), in_memory.tensors(), "{mode:?}");
        let b = from_disk.tensor("b").unwrap();
        let data = from_disk.tensor_data(b);
        drop(from_disk);
        assert_eq!(
            &*data,
            filler(34, 2).as_slice(),
            "views outlive the file ({mode:?})"
        );

        assert!(matches!(
            GgufFile::open_with(&empty, mode),
            Err(GgufError::Truncated { offset: 0, .. })
        ));
        match GgufFile::open_with(&dir.join("does-not-exist.gguf"), mode) {
            Err(e @ GgufError::Io { .. }) => {
                assert!(e.to_string().contains("does-not-exist.gguf"))
            }
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    // `open` maps.
    assert_eq!(
        GgufFile::open(&path).unwrap().tensors(),
        in_memory.tensors()
    );
}

#[test]
fn a_file_without_tensors_or_metadata_is_valid() {
    let file = parse(GgufWriter::new().to_bytes()).unwrap();
    assert!(file.tensors().is_empty());
    assert!(file.metadata().is_empty());
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset(), 32);
    assert_eq!(file.architecture(), None);
}

#[test]
fn tensor_data_of_a_foreign_tensor_info_is_empty_not_a_panic() {
    let file = parse(sample_writer().to_bytes()).unwrap();
    let mut foreign = file.tensor("a").unwrap().clone();
    foreign.offset = u64::MAX - 3;
    assert!(file.tensor_data(&foreign).is_empty());
    foreign.offset = 1 << 20;
    assert!(file.tensor_data(&foreign).is_empty());
}

#[test]
fn dump_of_a_synthetic_file_shows_header_metadata_and_tensor_table() {
    let (bytes, _) = write(3, 64);
    let file = parse(bytes).unwrap();
    let mut out = Vec::new();
    write_dump(&file, &mut out, &DumpOptions::default()).unwrap();
    let text = String::from_utf8(out).unwrap();
    println!("{text}");
    for needle in [
        "GGUF version 3",
        "alignment 64",
        "general.alignment = 64",
        "[STRING; 3]",
        "array.strings = [\"a\", \"\", \"ü\"]",
        "string = \"héllo\\n\u{1F600}\"",
        "array.of_arrays_of_strings = [[STRING; 2] [\"x\", \"y\"], [STRING; 0] [], [STRING; 1] [\"z\"]]",
        "i64 = -9223372036854775808",
        "Tensors (7):",
        "[BOOL; 2]",
        "array.f64 = [-0.25, 1e300]",
        "name",
        "type",
        "shape",
        "bytes",
        "offset",
        "q8_0.3d",
        "[64, 2, 3]",
        "Q4_K",
        "BF16",
        "Total: 7 tensors",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }

    let mut w = GgufWriter::new();
    let long: Vec<MetaValue> = (0..100u32).map(MetaValue::U32).collect();
    w.add_meta("long", MetaArray::new(MetaType::U32, long).into())
        .unwrap();
    w.add_meta("text", "x".repeat(1000).into()).unwrap();
    let file = parse(w.to_bytes()).unwrap();
    let mut out = Vec::new();
    let opts = DumpOptions {
        max_array_items: 3,
        show_tensors: false,
    };
    write_dump(&file, &mut out, &opts).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("long = [0, 1, 2, ... (97 more)]"), "{text}");
    assert!(text.contains("...(+920 chars)"), "{text}");
    assert!(!text.contains("Tensors ("), "{text}");
}

#[test]
fn released_pages_read_back_the_same_bytes() {
    // A tensor of 64 pages and a bit, not page-aligned in the file: `release_pages` hands back
    // the whole pages inside it (a map drops them, the private copy maps the file's over them)
    // and every byte, inside and around, must read as before, also after the file is dropped.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("kiln-formats-release-test.gguf");
    let mut w = GgufWriter::new();
    w.set_alignment(32).unwrap();
    // Bytes that differ from page to page (a shifted page would not read the same).
    let big: Vec<u8> = (0..64 * 4096 + 96u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    w.add_tensor("head", &[24], GgmlType::F32, &filler(96, 5))
        .unwrap();
    w.add_tensor("big", &[big.len() as u64 / 4], GgmlType::F32, &big)
        .unwrap();
    w.add_tensor("tail", &[8], GgmlType::F32, &filler(32, 6))
        .unwrap();
    let mut f = std::fs::File::create(&path).unwrap();
    w.write_to(&mut f).unwrap();
    drop(f);
    for mode in [LoadMode::Map, LoadMode::Read] {
        let file = GgufFile::open_with(&path, mode).unwrap();
        let data = |name: &str| file.tensor_data(file.tensor(name).unwrap());
        let (head, tail) = (data("head"), data("tail"));
        let view = data("big");
        assert_eq!(&*view, big.as_slice(), "{mode:?}");
        // A slice first, then the whole tensor, twice: releasing is repeatable.
        view.slice(4096..3 * 4096 + 5).unwrap().release_pages();
        for _ in 0..2 {
            view.release_pages();
            assert_eq!(&*view, big.as_slice(), "{mode:?}: after release");
        }
        assert_eq!(&*head, filler(96, 5).as_slice(), "{mode:?}");
        assert_eq!(&*tail, filler(32, 6).as_slice(), "{mode:?}");
        drop(file);
        assert_eq!(&*view, big.as_slice(), "{mode:?}: after the file");
    }
}
