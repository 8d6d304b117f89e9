//! `kiln synth`: a two-layer Llama 3.2 1B that kiln inspects as supported and runs, with the real
//! model's tensor names, shapes and metadata and the q4_k_m mix's types; weights at the intended
//! scale; the same seed giving the same bytes whatever the thread count; clean argument errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_core::GgmlType;
use kiln_formats::GgufFile;

mod common;

fn kiln(args: &[&str]) -> Output {
    common::run(args, "", None)
}

/// A temporary folder removed when the test ends, passed or failed (the files are large).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("kiln-synth-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "kiln panicked: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "stderr should mention {needle:?}: {stderr}"
        );
    }
}

fn synth_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
    command.arg("synth").args(args);
    command
}

/// `kiln synth ARGS` (with `env`) that must succeed.
fn synth(args: &[&str], env: &[(&str, &str)]) {
    let out = synth_command(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln synth {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Mean and standard deviation of a tensor's dequantized values.
fn moments(file: &GgufFile, name: &str) -> (f64, f64) {
    let info = file.tensor(name).unwrap();
    let mut values = vec![0.0f32; info.n_elements() as usize];
    kiln_quant::dequantize(info.ty, &file.tensor_data(info), &mut values).unwrap();
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = values
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean, var.sqrt())
}

#[test]
fn two_layers_of_llama_3_2_1b_have_its_shapes_and_run() {
    use GgmlType::{F32, Q4_K, Q6_K};
    let dir = TempDir::new("llama");
    let path = dir.file("llama.gguf");
    synth(
        &["--shape", "llama-3.2-1b", "--layers", "2", "-o", &path],
        &[],
    );

    // The tensor table, in file order. q4_k_m: tied embeddings Q6_K; attention V and ffn_down
    // Q6_K on llama.cpp's use-more-bits layers, which of 2 layers are {1}; the rest Q4_K; norms
    // and rope factors stay F32.
    let mut expected: Vec<(String, Vec<u64>, GgmlType)> = vec![
        ("rope_freqs.weight".into(), vec![32], F32),
        ("token_embd.weight".into(), vec![2048, 128256], Q6_K),
    ];
    for layer in 0..2 {
        let more_bits = if layer == 1 { Q6_K } else { Q4_K };
        for (role, dims, ty) in [
            ("attn_norm", vec![2048], F32),
            ("attn_q", vec![2048, 2048], Q4_K),
            ("attn_k", vec![2048, 512], Q4_K),
            ("attn_v", vec![2048, 512], more_bits),
            ("attn_output", vec![2048, 2048], Q4_K),
            ("ffn_norm", vec![2048], F32),
            ("ffn_gate", vec![2048, 8192], Q4_K),
            ("ffn_up", vec![2048, 8192], Q4_K),
            ("ffn_down", vec![8192, 2048], more_bits),
        ] {
            expected.push((format!("blk.{layer}.{role}.weight"), dims, ty));
        }
    }
    expected.push(("output_norm.weight".into(), vec![2048], F32));

    let file = GgufFile::open(Path::new(&path)).unwrap();
    let found: Vec<(String, Vec<u64>, GgmlType)> = file
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), t.ty))
        .collect();
    assert_eq!(found, expected);

    for (key, value) in [
        ("general.file_type", 15),
        ("llama.block_count", 2),
        ("llama.embedding_length", 2048),
        ("llama.feed_forward_length", 8192),
        ("llama.attention.head_count", 32),
        ("llama.attention.head_count_kv", 8),
        ("llama.attention.key_length", 64),
        ("llama.context_length", 131072),
        ("llama.rope.dimension_count", 64),
    ] {
        assert_eq!(file.get_u64(key).unwrap(), value, "{key}");
    }
    assert_eq!(file.get_f64("llama.rope.freq_base").unwrap(), 500000.0);
    assert_eq!(
        file.get_array("tokenizer.ggml.tokens").unwrap().len(),
        128256
    );

    // Llama 3's rope scaling (factor 32): fast pairs unscaled, slow pairs divided by 32.
    let rope = file.tensor("rope_freqs.weight").unwrap();
    let factors: Vec<f32> = file
        .tensor_data(rope)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!((factors[0], factors[31]), (1.0, 32.0), "{factors:?}");

    // Weights: centred, std 0.02 (plus Q4_K's rounding); norms 1.
    let (mean, std) = moments(&file, "blk.0.attn_q.weight");
    assert!(
        mean.abs() < 1e-3 && (0.019..0.022).contains(&std),
        "{mean} {std}"
    );
    assert_eq!(moments(&file, "blk.1.ffn_norm.weight"), (1.0, 0.0));

    let inspect = common::run_ok(&["inspect", &path], "");
    assert!(
        inspect.contains("architecture llama (decoder): supported"),
        "{inspect}"
    );
    common::run_ok(
        &["run", "-m", &path, "-p", "hi", "-n", "4", "--temp", "0"],
        "",
    );
}

#[test]
fn the_same_seed_gives_the_same_bytes_whatever_the_threads() {
    let dir = TempDir::new("seed");
    let (a, b, c) = (dir.file("a.gguf"), dir.file("b.gguf"), dir.file("c.gguf"));
    let qwen = |seed, out| {
        [
            "--shape",
            "qwen3-0.6b",
            "--layers",
            "1",
            "--seed",
            seed,
            "-o",
            out,
        ]
    };
    synth(&qwen("7", &a), &[]);
    // One rayon thread: the generator and the quantizers split work in ways that must not show.
    synth(&qwen("7", &b), &[("RAYON_NUM_THREADS", "1")]);
    synth(&qwen("8", &c), &[]);
    let bytes = |p: &str| std::fs::read(p).unwrap();
    let (a, b, c) = (bytes(&a), bytes(&b), bytes(&c));
    assert!(a == b, "seed 7 gave different files");
    assert!(a.len() == c.len() && a != c, "seed 8 gave seed 7's file");

    // Qwen3's own tensors: per-head query and key norms, no rope factors, tied embeddings.
    let file = GgufFile::open(Path::new(&dir.file("a.gguf"))).unwrap();
    let dims = |name: &str| file.tensor(name).map(|t| t.dims.clone());
    assert_eq!(dims("blk.0.attn_q_norm.weight"), Some(vec![128]));
    assert_eq!(dims("blk.0.attn_q.weight"), Some(vec![1024, 2048]));
    assert_eq!(dims("token_embd.weight"), Some(vec![1024, 151936]));
    assert_eq!(dims("rope_freqs.weight"), None);
    assert_eq!(dims("output.weight"), None);
    assert_eq!(file.architecture(), Some("qwen3"));
}

#[test]
fn bad_arguments_are_refused_with_the_choices() {
    let dir = TempDir::new("errors");
    let out_path = dir.file("x.gguf");
    let out = kiln(&["synth", "--shape", "llama-9b", "-o", &out_path]);
    assert_clean_failure(
        &out,
        &["llama-9b", "llama-3.2-1b", "llama-3.1-8b", "qwen3-0.6b"],
    );
    let out = kiln(&[
        "synth",
        "--shape",
        "qwen3-0.6b",
        "--type",
        "q9_k",
        "-o",
        &out_path,
    ]);
    assert_clean_failure(&out, &["q9_k", "q4_k_m", "q8_0", "bf16"]);
    let out = kiln(&[
        "synth",
        "--shape",
        "qwen3-0.6b",
        "--layers",
        "0",
        "-o",
        &out_path,
    ]);
    assert_clean_failure(&out, &["at least one layer"]);
    let missing = dir.file("no-such-dir/x.gguf");
    let out = kiln(&[
        "synth",
        "--shape",
        "qwen3-0.6b",
        "--layers",
        "1",
        "-o",
        &missing,
    ]);
    assert_clean_failure(&out, &["no-such-dir"]);
    assert!(std::fs::read_dir(&dir.0).unwrap().next().is_none());
}
