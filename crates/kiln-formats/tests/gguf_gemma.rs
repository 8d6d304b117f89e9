//! The real Gemma 3 270M Q4_K_M file, when present. Expected values were read with the `gguf`
//! Python package (`gguf.GGUFReader`), whose 36 fields include 3 pseudo-fields (`GGUF.version`,
//! `GGUF.tensor_count`, `GGUF.kv_count`) that are header values, not kv pairs.

use std::path::PathBuf;
use std::time::Instant;

use kiln_core::GgmlType;
use kiln_formats::{write_dump, DumpOptions, GgufFile, MetaType};

fn gemma_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = PathBuf::from(home).join(".cache/kiln/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf");
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipped: {} is absent", path.display());
        None
    }
}

#[test]
fn gemma_header_matches_the_python_reader() {
    let Some(path) = gemma_path() else { return };
    let started = Instant::now();
    let file = GgufFile::open(&path).unwrap();
    let first_open = started.elapsed();
    // Printed for the record, not asserted (timings belong in benchmarks): the page cache is
    // warm after the first open, so the best of 5 is the cost of parsing the header
    // (262,144-entry vocabulary arrays) and dropping the result.
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            drop(GgufFile::open(&path).unwrap());
            t.elapsed()
        })
        .min()
        .unwrap();
    eprintln!("open + parse: first {first_open:?}, best of 5 (with drop) {best:?}");

    assert_eq!(file.version(), 3);
    assert_eq!(file.file_size(), 253_113_024);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset(), 6_525_120);
    assert_eq!(file.metadata().len(), 33);
    assert_eq!(file.tensors().len(), 236);
    assert_eq!(file.architecture(), Some("gemma3"));
    assert_eq!(file.get_u64("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(file.get_u64("gemma3.block_count").unwrap(), 18);
    assert_eq!(file.get_u64("gemma3.context_length").unwrap(), 32768);
    assert_eq!(file.get_u64("general.file_type").unwrap(), 15);
    assert_eq!(file.get_f64("gemma3.rope.freq_base").unwrap(), 1_000_000.0);
    assert_eq!(
        file.get_f64("gemma3.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-6f32 as f64
    );
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert!(file.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(file.get_array("general.tags").unwrap().len(), 4);
    let first_key = &file.metadata()[0].0;
    let last_key = &file.metadata()[32].0;
    assert_eq!(
        (first_key.as_str(), last_key.as_str()),
        ("general.architecture", "general.file_type")
    );

    let tokens = file.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.elem_type, MetaType::String);
    assert_eq!(tokens.len(), 262_144);
    let first: Vec<&str> = tokens.items[..4]
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(first, ["<pad>", "<eos>", "<bos>", "<unk>"]);
    let scores = file.get_array("tokenizer.ggml.scores").unwrap();
    assert_eq!((scores.elem_type, scores.len()), (MetaType::F32, 262_144));
    assert_eq!(scores.items[0].as_f64(), Some(-1000.0));
    let types = file.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!((types.elem_type, types.len()), (MetaType::I32, 262_144));
    assert_eq!(types.items[0].as_i64(), Some(3));

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ty, GgmlType::Q8_0);
    assert_eq!(embd.dims, [640, 262_144]);
    assert_eq!(embd.offset, 2560);
    assert_eq!(embd.n_bytes, 178_257_920);
    let down = file.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(
        (down.ty, down.dims.as_slice()),
        (GgmlType::Q6_K, &[2048, 640][..])
    );
    assert_eq!((down.offset, down.n_bytes), (179_371_008, 1_075_200));

    let mut counts = std::collections::BTreeMap::new();
    let mut data_bytes = 0;
    for t in file.tensors() {
        *counts.entry(t.ty).or_insert(0) += 1;
        let data = file.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes, "{}", t.name);
        assert!(file.data_offset() + t.offset + t.n_bytes <= file.file_size());
        data_bytes += t.n_bytes;
    }
    assert_eq!(data_bytes, 246_587_904, "the tensors tile the data section");
    let expected = [
        (GgmlType::F32, 109),
        (GgmlType::Q5_0, 81),
        (GgmlType::Q8_0, 10),
        (GgmlType::Q4_K, 27),
        (GgmlType::Q6_K, 9),
    ];
    assert_eq!(counts, expected.into_iter().collect());
}

#[test]
fn gemma_dump_shows_metadata_and_the_tensor_table() {
    let Some(path) = gemma_path() else { return };
    let file = GgufFile::open(&path).unwrap();
    let mut out = Vec::new();
    write_dump(&file, &mut out, &DumpOptions::default()).unwrap();
    let text = String::from_utf8(out).unwrap();
    for needle in [
        "GGUF version 3",
        "33 metadata key/value pairs, 236 tensors",
        "general.architecture = \"gemma3\"",
        "[STRING; 262144]",
        "tokenizer.ggml.tokens = [\"<pad>\", \"<eos>\", \"<bos>\", \"<unk>\"",
        "... (262136 more)]",
        "Tensors (236):",
        "token_embd.weight",
        "Q8_0",
        "[640, 262144]",
        "Q4_K",
        "Total: 236 tensors",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // One line per tensor, one per kv pair: the dump of a 262k-token vocabulary stays short.
    assert!(
        text.lines().count() < 33 + 236 + 30,
        "{} lines",
        text.lines().count()
    );
}
