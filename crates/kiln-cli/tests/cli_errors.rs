//! Bad input to the `kiln` binary gets a one-line error and a failing exit status, never a
//! panic: unknown models, files that are not GGUF, truncated files, malformed JSON lines.

use std::process::Output;

mod common;

fn kiln(args: &[&str], stdin: &str, home: &std::path::Path) -> Output {
    common::run(args, stdin, Some(home))
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "kiln panicked: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cli-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn unknown_model_names_list_the_known_ones() {
    let home = temp_dir("unknown");
    let out = kiln(&["run", "-m", "no-such-model", "-p", "hi"], "", &home);
    assert_clean_failure(&out, "gemma3-270m");
}

#[test]
fn files_that_are_not_gguf_or_are_truncated_are_reported() {
    let home = temp_dir("corrupt");
    let not_gguf = home.join("not.gguf");
    std::fs::write(&not_gguf, b"this is not a model file at all").unwrap();
    let out = kiln(&["inspect", not_gguf.to_str().unwrap()], "", &home);
    assert_clean_failure(&out, "not.gguf");

    // A valid header cut short in the middle of the metadata.
    let mut header = b"GGUF".to_vec();
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&0u64.to_le_bytes()); // tensors
    header.extend_from_slice(&1_000_000u64.to_le_bytes()); // metadata pairs it doesn't have
    let truncated = home.join("truncated.gguf");
    std::fs::write(&truncated, &header).unwrap();
    for cmd in [
        &["inspect", truncated.to_str().unwrap()][..],
        &["run", "-m", truncated.to_str().unwrap(), "-p", "x"],
    ] {
        let out = kiln(cmd, "", &home);
        assert_clean_failure(&out, "truncated.gguf");
    }
}

/// A GGUF with nothing but a small SentencePiece vocabulary.
fn vocab_only_gguf(path: &std::path::Path) {
    use kiln_formats::{GgufWriter, MetaArray, MetaType, MetaValue};
    let tokens = ["<unk>", "<s>", "</s>", "\u{2581}", "a", "b", "\u{2581}a"];
    let mut w = GgufWriter::new();
    let strings = tokens.iter().map(|t| MetaValue::from(*t)).collect();
    w.add_meta("general.architecture", "llama".into()).unwrap();
    w.add_meta("tokenizer.ggml.model", "llama".into()).unwrap();
    w.add_meta(
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaArray::new(MetaType::String, strings)),
    )
    .unwrap();
    let scores = (0..tokens.len())
        .map(|i| MetaValue::F32(-(i as f32)))
        .collect();
    w.add_meta(
        "tokenizer.ggml.scores",
        MetaValue::Array(MetaArray::new(MetaType::F32, scores)),
    )
    .unwrap();
    let types = [2, 3, 3, 1, 1, 1, 1]
        .iter()
        .map(|&t| MetaValue::I32(t))
        .collect();
    w.add_meta(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaArray::new(MetaType::I32, types)),
    )
    .unwrap();
    w.add_meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1))
        .unwrap();
    w.add_meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2))
        .unwrap();
    std::fs::write(path, w.to_bytes()).unwrap();
}

#[test]
fn malformed_jsonl_names_the_line() {
    let home = temp_dir("jsonl");
    let model = home.join("vocab.gguf");
    vocab_only_gguf(&model);
    let m = model.to_str().unwrap();
    let ok = kiln(
        &["tokenize", "-m", m, "--jsonl"],
        "{\"text\": \"ab\"}\n",
        &home,
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("\"ids\""));
    let out = kiln(
        &["tokenize", "-m", m, "--jsonl"],
        "{\"text\": \"a\"}\n{\"text\": 1}\n",
        &home,
    );
    assert_clean_failure(&out, "stdin line 2");
    let out = kiln(&["tokenize", "-m", m, "--jsonl"], "not json\n", &home);
    assert_clean_failure(&out, "stdin line 1 is not valid JSON");
    // A vocabulary-only file is not a runnable model: the error says what is missing.
    let out = kiln(&["run", "-m", m, "-p", "a"], "", &home);
    assert_clean_failure(&out, "llama");
}

/// A copy of a model folder (and its subfolders) into `dst`, minus the files named in `skip`.
fn copy_model_dir(src: &std::path::Path, dst: &std::path::Path, skip: &[&str]) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if e.path().is_dir() {
            copy_model_dir(&e.path(), &dst.join(&name), skip);
        } else if !skip.contains(&name.as_str()) {
            std::fs::copy(e.path(), dst.join(&name)).unwrap();
        }
    }
}

#[test]
fn embedding_folders_with_missing_or_broken_files_are_named() {
    let home = temp_dir("embed");
    // A tiny real checkpoint committed with kiln-models' tests.
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/encoders/xlm-roberta-tiny");
    let run = |dir: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["embed", "-m", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.push("hello");
        kiln(&args, "", &home)
    };
    let ok = run(&fixture, &[]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    for (missing, needle) in [
        ("config.json", "config.json"),
        ("tokenizer.json", "tokenizer.json"),
        ("model.safetensors.index.json", "model.safetensors"),
    ] {
        let dir = home.join(format!("no-{missing}"));
        copy_model_dir(&fixture, &dir, &[missing]);
        assert_clean_failure(&run(&dir, &[]), needle);
    }
    let broken = home.join("broken");
    copy_model_dir(&fixture, &broken, &[]);
    std::fs::write(
        broken.join("config.json"),
        "{\"model_type\": \"xlm-roberta\", ",
    )
    .unwrap();
    assert_clean_failure(&run(&broken, &[]), "config.json");
    std::fs::write(broken.join("config.json"), "{\"model_type\": \"gpt2\"}").unwrap();
    assert_clean_failure(&run(&broken, &[]), "gpt2");
    copy_model_dir(&fixture, &broken, &[]);
    std::fs::write(broken.join("tokenizer.json"), "{}").unwrap();
    assert_clean_failure(&run(&broken, &[]), "tokenizer.json");
    copy_model_dir(&fixture, &broken, &[]);
    std::fs::write(
        broken.join("modules.json"),
        "[{\"type\": \"sentence_transformers.models.Dense\"}]",
    )
    .unwrap();
    assert_clean_failure(&run(&broken, &[]), "Dense");
    copy_model_dir(&fixture, &broken, &[]);
    std::fs::remove_file(broken.join("1_Pooling/config.json")).unwrap();
    assert_clean_failure(&run(&broken, &[]), "1_Pooling/config.json");
    // A shard cut short.
    copy_model_dir(&fixture, &broken, &[]);
    let shard = std::fs::read_dir(&broken)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_failure(
        &run(&broken, &[]),
        shard.file_name().unwrap().to_str().unwrap(),
    );
    // A GGUF file is not an embedding folder; nothing to embed is an error too.
    assert_clean_failure(
        &kiln(&["embed", "-m", "/dev/null", "x"], "", &home),
        "folder",
    );
    assert_clean_failure(
        &kiln(&["embed", "-m", fixture.to_str().unwrap()], "", &home),
        "nothing to embed",
    );
    assert_clean_failure(
        &kiln(
            &["embed", "-m", fixture.to_str().unwrap(), "--jsonl"],
            "{\"text\": 3}\n",
            &home,
        ),
        "line 1",
    );
}

/// `kiln inspect` ends with a verdict line: the architecture and whether kiln runs it, or the
/// reason it does not, for GGUF files and Hugging Face folders alike.
#[test]
fn inspect_names_the_architecture_and_says_whether_kiln_runs_it() {
    let home = temp_dir("inspect");
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let verdict = |target: &std::path::Path| {
        let out = kiln(&["inspect", target.to_str().unwrap()], "", &home);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        stdout.lines().last().unwrap_or_default().to_string()
    };
    let qwen3 = fixtures.join("decoders/qwen3");
    let line = verdict(&qwen3.join("model-bf16.gguf"));
    assert!(
        line.starts_with("kiln: architecture qwen3 (decoder): supported"),
        "{line}"
    );
    let line = verdict(&qwen3);
    assert!(
        line.starts_with("kiln: architecture qwen3 (decoder): supported"),
        "{line}"
    );

    // An architecture kiln does not run is named, with the list of those it does.
    let mut w = kiln_formats::GgufWriter::new();
    w.add_meta(
        "general.architecture",
        kiln_formats::MetaValue::String("falcon".into()),
    )
    .unwrap();
    let falcon = home.join("falcon.gguf");
    std::fs::write(&falcon, w.to_bytes()).unwrap();
    let line = verdict(&falcon);
    assert!(
        line.contains("architecture falcon (decoder): NOT supported") && line.contains("qwen3moe"),
        "{line}"
    );
    let out = kiln(
        &["run", "-m", falcon.to_str().unwrap(), "-p", "x"],
        "",
        &home,
    );
    assert_clean_failure(&out, "falcon");

    // A Hugging Face folder of an unknown model type.
    let folder = home.join("gpt-bigcode");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("config.json"),
        r#"{"model_type": "gpt_bigcode"}"#,
    )
    .unwrap();
    let line = verdict(&folder);
    assert!(
        line.contains("gpt_bigcode") && line.contains("NOT supported"),
        "{line}"
    );
}

#[test]
fn serve_refuses_bad_setups_before_listening() {
    let home = temp_dir("serve");
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders/llama/model-f32.gguf");
    let tiny = tiny.to_str().unwrap();
    let missing = home.join("no-such-template.jinja");
    let broken = home.join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}{{ m.content }").unwrap();
    let a = format!("a={tiny}");
    for (args, needle) in [
        (
            vec![
                "serve",
                "-m",
                tiny,
                "--port",
                "0",
                "--chat-template",
                missing.to_str().unwrap(),
            ],
            "no-such-template.jinja",
        ),
        (
            vec![
                "serve",
                "-m",
                tiny,
                "--port",
                "0",
                "--chat-template",
                broken.to_str().unwrap(),
            ],
            "syntax",
        ),
        (
            vec!["serve", "-m", &a, "-m", &a, "--port", "0"],
            "two models are named 'a'",
        ),
        (
            vec![
                "serve",
                "-m",
                tiny,
                "--port",
                "0",
                "--chat-template",
                "b=x.jinja",
            ],
            "no decoder is named 'b'",
        ),
        (
            vec!["serve", "-m", tiny, "--port", "0", "--kv-memory", "0"],
            "--kv-memory",
        ),
        (
            vec!["serve", "-m", tiny, "--host", "not an address"],
            "not an address",
        ),
    ] {
        let out = kiln(&args, "", &home);
        assert_clean_failure(&out, needle);
    }
}
