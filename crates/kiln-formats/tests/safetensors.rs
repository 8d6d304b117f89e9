//! safetensors reader: dtypes, sharded index, and clear errors on bad files.

use std::path::Path;

use kiln_core::{GgmlType, SharedBytes};
use kiln_formats::safetensors::{Dtype, INDEX_FILE, SINGLE_FILE};
use kiln_formats::{write_safetensors, SafetensorsError, SafetensorsModel};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn sample() -> Vec<u8> {
    let f16: Vec<u8> = [1.0f32, -2.5]
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = [0.5f32, 3.0, 4.0]
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    write_safetensors(&[
        (
            "a.weight",
            Dtype::F32,
            vec![2, 3],
            f32_bytes(&[1., 2., 3., 4., 5., 6.]),
        ),
        ("b.f16", Dtype::F16, vec![2], f16),
        ("c.bf16", Dtype::BF16, vec![3, 1], bf16),
        ("ids", Dtype::I64, vec![1], 7i64.to_le_bytes().to_vec()),
    ])
    .unwrap()
}

#[test]
fn reads_dtypes_shapes_and_bytes() {
    let m = SafetensorsModel::from_bytes("mem", SharedBytes::from_vec(sample())).unwrap();
    assert_eq!(m.len(), 4);
    let a = m.tensor("a.weight").unwrap();
    assert_eq!(a.shape, vec![2, 3]);
    assert_eq!(a.ggml_dims(), vec![3, 2]);
    assert_eq!(a.ggml_type(), Some(GgmlType::F32));
    assert_eq!(&*a.bytes, &f32_bytes(&[1., 2., 3., 4., 5., 6.])[..]);
    let b = m.tensor("b.f16").unwrap();
    assert_eq!(b.ggml_type(), Some(GgmlType::F16));
    assert_eq!(
        half::f16::from_le_bytes([b.bytes[2], b.bytes[3]]).to_f32(),
        -2.5
    );
    assert_eq!(
        m.tensor("c.bf16").unwrap().ggml_type(),
        Some(GgmlType::BF16)
    );
    // Non-float tensors are listed but have no compute type.
    assert_eq!(m.tensor("ids").unwrap().ggml_type(), None);
    let names: Vec<_> = m.tensors().iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["a.weight", "b.f16", "c.bf16", "ids"]);
}

#[test]
fn opens_a_folder_with_one_file() {
    let dir = tempdir("single");
    std::fs::write(dir.join(SINGLE_FILE), sample()).unwrap();
    let m = SafetensorsModel::open(&dir).unwrap();
    assert_eq!(m.files(), &[dir.join(SINGLE_FILE)]);
    assert_eq!(m.tensor("a.weight").unwrap().n_elements(), 6);
}

fn write_shards(dir: &Path) {
    let s1 = write_safetensors(&[("x", Dtype::F32, vec![2], f32_bytes(&[1., 2.]))]).unwrap();
    let s2 = write_safetensors(&[("y", Dtype::F32, vec![1], f32_bytes(&[3.]))]).unwrap();
    std::fs::write(dir.join("model-00001-of-00002.safetensors"), s1).unwrap();
    std::fs::write(dir.join("model-00002-of-00002.safetensors"), s2).unwrap();
}

#[test]
fn opens_a_sharded_checkpoint_through_its_index() {
    let dir = tempdir("sharded");
    write_shards(&dir);
    std::fs::write(
        dir.join(INDEX_FILE),
        r#"{"metadata": {"total_size": 12}, "weight_map": {
            "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let m = SafetensorsModel::open(&dir).unwrap();
    assert_eq!(m.files().len(), 2);
    assert_eq!(&*m.tensor("y").unwrap().bytes, &3f32.to_le_bytes());
    assert_eq!(m.tensor("y").unwrap().file, 1);
}

#[test]
fn index_errors_name_the_problem() {
    let dir = tempdir("badindex");
    write_shards(&dir);
    let cases = [
        ("{", "malformed index"),
        (r#"{"metadata": {}}"#, "weight_map"),
        (
            r#"{"weight_map": {"x": "../model-00001-of-00002.safetensors"}}"#,
            "plain file name",
        ),
        (
            r#"{"weight_map": {"x": "model-00002-of-00002.safetensors"}}"#,
            "tensor x is not in",
        ),
        (
            r#"{"weight_map": {"x": "missing.safetensors"}}"#,
            "missing.safetensors",
        ),
    ];
    for (json, want) in cases {
        std::fs::write(dir.join(INDEX_FILE), json).unwrap();
        let err = SafetensorsModel::open(&dir).unwrap_err().to_string();
        assert!(err.contains(want), "{json}: {err}");
    }
}

#[test]
fn corrupt_files_give_errors_that_name_the_file() {
    let dir = tempdir("corrupt");
    let path = dir.join("bad.safetensors");
    let good = sample();
    let mut cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![1, 2, 3],
        good[..good.len() - 1].to_vec(),
        [&good[..], &[0u8]].concat(),
        u64::MAX.to_le_bytes().to_vec(),
    ];
    let mut bad_json = good.clone();
    bad_json[9] = b'!';
    cases.push(bad_json);
    for bytes in cases {
        std::fs::write(&path, &bytes).unwrap();
        match SafetensorsModel::open(&path) {
            Err(e @ SafetensorsError::Header { .. }) => {
                assert!(e.to_string().contains("bad.safetensors"), "{e}")
            }
            other => panic!("{} bytes: {other:?}", bytes.len()),
        }
    }
    let err = SafetensorsModel::open(&dir.join("nope.safetensors")).unwrap_err();
    assert!(matches!(err, SafetensorsError::Io { .. }), "{err}");
    let empty = tempdir("empty");
    let err = SafetensorsModel::open(&empty).unwrap_err().to_string();
    assert!(err.contains(SINGLE_FILE), "{err}");
}

#[test]
fn a_tensor_in_two_shards_is_refused() {
    let dir = tempdir("dup");
    let s = write_safetensors(&[("x", Dtype::F32, vec![1], f32_bytes(&[1.]))]).unwrap();
    let (p1, p2) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    std::fs::write(&p1, &s).unwrap();
    std::fs::write(&p2, &s).unwrap();
    let err = SafetensorsModel::open_files(&[p1, p2]).unwrap_err();
    assert!(matches!(err, SafetensorsError::Duplicate { .. }), "{err}");
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-st-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
