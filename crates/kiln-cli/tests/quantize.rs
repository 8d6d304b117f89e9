//! `kiln quantize`: per-tensor types by llama.cpp's rules, bytes from kiln-quant's ggml-exact
//! quantizers, metadata carried over, a file the GGUF writer would produce byte for byte, and
//! clean errors.

use std::path::{Path, PathBuf};
use std::process::Output;

use kiln_core::GgmlType;
use kiln_formats::{GgufFile, GgufWriter, MetaArray, MetaType, MetaValue};
use kiln_quant::{dequantize, quantize, quantized_size};

mod common;

fn kiln(args: &[&str]) -> Output {
    common::run(args, "", None)
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-quantize-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "kiln panicked: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
}

/// Bell-shaped weights from a seeded splitmix64 (sum of four uniforms, sigma about 0.012).
fn weights(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed;
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    (0..n)
        .map(|_| (0..4).map(|_| uniform()).sum::<f32>() * 0.01)
        .collect()
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn encode(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; quantized_size(ty, x.len()).unwrap()];
    quantize(ty, x, &mut out).unwrap();
    out
}

/// One tensor of the tiny model: its input type and values, and the type llama.cpp's Q4_K_M
/// rules give it.
struct Tiny {
    name: &'static str,
    dims: Vec<u64>,
    input_ty: GgmlType,
    values: Vec<f32>,
    q4_k_m: GgmlType,
}

/// A two-layer llama (4 query heads per KV head) with rows of 256, `ffn_down` rows of 32, norms,
/// an F16 and a Q8_0 weight. Expected Q4_K_M types, from llama.cpp's rules:
/// - attention V: use-more-bits layers of 2 are {1} (layer >= 7*2/8): Q4_K, then Q6_K;
/// - ffn_down: Q4_K and Q6_K likewise, which rows of 32 turn into Q5_0 and Q8_0;
/// - output: Q6_K; norms and rope_freqs: unchanged.
fn tiny_model() -> Vec<Tiny> {
    use GgmlType::*;
    let mut seed = 0;
    let mut t = |name, dims: &[u64], input_ty, q4_k_m| {
        seed += 1;
        let n = dims.iter().product::<u64>() as usize;
        let mut values = weights(seed, n);
        if name == "blk.0.attn_q.weight" {
            values[7] = 0.5; // an outlier
        }
        if input_ty != F32 {
            // Values the input type holds exactly, so the expected bytes start from them.
            let mut back = vec![0.0; n];
            dequantize(input_ty, &encode(input_ty, &values), &mut back).unwrap();
            values = back;
        }
        Tiny {
            name,
            dims: dims.to_vec(),
            input_ty,
            values,
            q4_k_m,
        }
    };
    vec![
        t("token_embd.weight", &[256, 16], F32, Q4_K),
        t("output_norm.weight", &[256], F32, F32),
        t("output.weight", &[256, 16], F32, Q6_K),
        t("rope_freqs.weight", &[16], F32, F32),
        t("blk.0.attn_norm.weight", &[256], F32, F32),
        t("blk.0.attn_q.weight", &[256, 32], F32, Q4_K),
        t("blk.0.attn_v.weight", &[256, 8], F32, Q4_K),
        t("blk.0.ffn_up.weight", &[256, 32], F16, Q4_K),
        t("blk.0.ffn_down.weight", &[32, 256], F32, Q5_0),
        t("blk.1.attn_norm.weight", &[256], F32, F32),
        t("blk.1.attn_q.weight", &[256, 32], Q8_0, Q4_K),
        t("blk.1.attn_v.weight", &[256, 8], F32, Q6_K),
        t("blk.1.ffn_down.weight", &[32, 256], F32, Q8_0),
    ]
}

fn metadata() -> Vec<(String, MetaValue)> {
    let tokens = ["<s>", "a", "b"]
        .map(|t| MetaValue::String(t.into()))
        .to_vec();
    vec![
        (
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ),
        ("general.name".into(), MetaValue::String("tiny".into())),
        ("general.file_type".into(), MetaValue::U32(0)),
        ("llama.block_count".into(), MetaValue::U32(2)),
        ("llama.attention.head_count".into(), MetaValue::U32(4)),
        ("llama.attention.head_count_kv".into(), MetaValue::U32(1)),
        ("llama.rope.freq_base".into(), MetaValue::F32(10000.0)),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(MetaArray::new(MetaType::String, tokens)),
        ),
        ("split.count".into(), MetaValue::U16(1)),
    ]
}

fn write_tiny(path: &Path, model: &[Tiny]) {
    let mut w = GgufWriter::new();
    for (k, v) in metadata() {
        w.add_meta(k, v).unwrap();
    }
    for t in model {
        let bytes = match t.input_ty {
            GgmlType::F32 => f32_bytes(&t.values),
            ty => encode(ty, &t.values),
        };
        w.add_tensor(t.name, &t.dims, t.input_ty, &bytes).unwrap();
    }
    w.write_to(std::fs::File::create(path).unwrap()).unwrap();
}

#[test]
fn q4_k_m_of_a_tiny_llama() {
    let dir = temp_dir("tiny");
    let (input, output) = (dir.join("tiny-f32.gguf"), dir.join("tiny-q4_k_m.gguf"));
    let model = tiny_model();
    write_tiny(&input, &model);
    let out = kiln(&["quantize", s(&input), s(&output), "--type", "Q4_K_M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The Q8_0 input tensor is requantized: one warning.
    assert_eq!(
        stderr.matches("warning: requantizing").count(),
        1,
        "{stderr}"
    );
    assert!(stdout.contains("general.file_type 15"), "{stdout}");
    assert!(
        stdout.contains("fallback: Q4_K -> Q5_0 for rows of 32"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fallback: Q6_K -> Q8_0 for rows of 32"),
        "{stdout}"
    );

    let file = GgufFile::open(&output).unwrap();
    let got: Vec<(String, GgmlType)> = file
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.ty))
        .collect();
    let want: Vec<(String, GgmlType)> = model.iter().map(|t| (t.name.into(), t.q4_k_m)).collect();
    assert_eq!(got, want);

    // Metadata: carried over in order; file type and quantization version set; split keys gone.
    let mut meta = metadata();
    meta.retain(|(k, _)| !k.starts_with("split."));
    meta[2].1 = MetaValue::U32(15);
    meta.push(("general.quantization_version".into(), MetaValue::U32(2)));
    assert_eq!(file.metadata(), &meta[..]);

    // Values: each converted tensor is kiln-quant's quantization of the input (which is ggml's,
    // see kiln-quant's fixtures), and within its format's error of the input: relative RMS error
    // below 2^(1 - b) for b bits per code.
    for (t, info) in model.iter().zip(file.tensors()) {
        let data = file.tensor_data(info);
        if t.q4_k_m == GgmlType::F32 {
            assert_eq!(&data[..], &f32_bytes(&t.values)[..], "{}", t.name);
            continue;
        }
        assert_eq!(&data[..], &encode(t.q4_k_m, &t.values)[..], "{}", t.name);
        let mut back = vec![0.0f32; t.values.len()];
        dequantize(info.ty, &data, &mut back).unwrap();
        let err: f64 = t
            .values
            .iter()
            .zip(&back)
            .map(|(&a, &b)| f64::from(a - b).powi(2))
            .sum();
        let norm: f64 = t.values.iter().map(|&a| f64::from(a).powi(2)).sum();
        let bits = match info.ty {
            GgmlType::Q4_K => 4,
            GgmlType::Q5_0 => 5,
            GgmlType::Q6_K => 6,
            GgmlType::Q8_0 => 8,
            other => panic!("unexpected {other}"),
        };
        let rel = (err / norm).sqrt();
        assert!(
            rel < 2f64.powi(1 - bits),
            "{}: {} error {rel}",
            t.name,
            info.ty
        );
    }

    // The whole file is what GgufWriter makes of the same metadata and tensors: the streamed
    // header, offsets, alignment and padding agree with the crate that reads them.
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_meta(k, v).unwrap();
    }
    for (t, info) in model.iter().zip(file.tensors()) {
        w.add_tensor(t.name, &t.dims, info.ty, &file.tensor_data(info))
            .unwrap();
    }
    assert!(std::fs::read(&output).unwrap() == w.to_bytes());
    // No temporary file left next to the output.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn float_and_legacy_mixes() {
    let dir = temp_dir("mixes");
    let input = dir.join("tiny.gguf");
    let model = tiny_model();
    write_tiny(&input, &model);
    for (mix, weight_ty, output_ty) in [
        ("f16", GgmlType::F16, GgmlType::F16),
        ("bf16", GgmlType::BF16, GgmlType::BF16),
        ("q8_0", GgmlType::Q8_0, GgmlType::Q8_0),
        ("q4_0", GgmlType::Q4_0, GgmlType::Q6_K),
    ] {
        let output = dir.join(format!("tiny-{mix}.gguf"));
        let out = kiln(&["quantize", s(&input), s(&output), "--type", mix]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = GgufFile::open(&output).unwrap();
        for (t, info) in model.iter().zip(file.tensors()) {
            let expected = match t.q4_k_m {
                GgmlType::F32 => GgmlType::F32,
                _ if t.name == "output.weight" => output_ty,
                _ => weight_ty,
            };
            assert_eq!(info.ty, expected, "{mix} {}", t.name);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_are_reported_cleanly() {
    let dir = temp_dir("errors");
    let input = dir.join("tiny.gguf");
    write_tiny(&input, &tiny_model());
    let output = dir.join("out.gguf");

    let missing = dir.join("missing.gguf");
    let out = kiln(&["quantize", s(&missing), s(&output), "--type", "q8_0"]);
    assert_clean_failure(&out, "no such file");

    let not_gguf = dir.join("not.gguf");
    std::fs::write(&not_gguf, b"definitely not a model").unwrap();
    let out = kiln(&["quantize", s(&not_gguf), s(&output), "--type", "q8_0"]);
    assert_clean_failure(&out, "not.gguf");

    // Unknown types are refused by name, listing the known ones.
    let out = kiln(&["quantize", s(&input), s(&output), "--type", "q9_k"]);
    assert_clean_failure(&out, "q4_k_m");

    // Writing over the input, by any spelling of its path.
    let before = std::fs::read(&input).unwrap();
    let same = dir.join(".").join("tiny.gguf");
    let out = kiln(&["quantize", s(&input), s(&same), "--type", "q8_0"]);
    assert_clean_failure(&out, "is the input file");
    assert!(std::fs::read(&input).unwrap() == before);

    // A NaN weight: a typed error naming the tensor, no output, no temporary file left behind.
    let mut model = tiny_model();
    model[5].values[3] = f32::NAN;
    let nan_input = dir.join("nan.gguf");
    write_tiny(&nan_input, &model);
    let out = kiln(&["quantize", s(&nan_input), s(&output), "--type", "q4_k_m"]);
    assert_clean_failure(&out, "blk.0.attn_q.weight");
    assert_clean_failure(&out, "element 3 is NaN");
    assert!(!output.exists());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_lists_the_types() {
    let out = kiln(&["quantize", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for name in [
        "q4_0", "q5_1", "q8_0", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_m", "q6_k", "bf16",
    ] {
        assert!(help.contains(name), "{name} missing from:\n{help}");
    }
}

#[test]
fn requantizing_gemma_with_its_own_mix_reproduces_the_file() {
    // The published Gemma 3 270M Q4_K_M was written by llama-quantize. Planning Q4_K_M for it
    // must give every tensor the type it already has (the attention-V and ffn_down layer rules,
    // the tied embedding's Q8_0, the Q5_0/Q8_0 fallbacks for rows of 640), so every tensor is
    // copied, and the file comes out identical: header, metadata order and all.
    let dir = temp_dir("gemma");
    let output = dir.join("gemma.gguf");
    let out = kiln(&["quantize", "gemma3-270m", s(&output), "--type", "q4_k_m"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let input = stdout.split(" -> ").next().unwrap();
    let original = std::fs::read(input).unwrap();
    assert!(
        std::fs::read(&output).unwrap() == original,
        "the requantized file differs from the original:\n{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
