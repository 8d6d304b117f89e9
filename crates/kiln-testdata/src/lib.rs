//! kiln-testdata: where the tests' reference data lives (a dev-dependency only): the golden
//! folders, the Gemma model that `kiln pull` fetched, and llama.cpp's test vocabularies and chat
//! templates.
//!
//! llama.cpp's vocabulary test files (`models/ggml-vocab-*.gguf` with `.inp`/`.out` pairs) are
//! taken from the llama-cpp-python 0.3.36 source distribution on PyPI, which vendors llama.cpp
//! (upstream 0c1e57098, the commit the golden data was made with). They are cached under
//! `$KILN_HOME/cache/llama-cpp-python-0.3.36/`; when missing, the sdist is downloaded with pip and
//! only `vendor/llama.cpp/models/ggml-vocab-*` and the chat templates
//! `vendor/llama.cpp/models/templates/*.jinja` (into `templates/`) are extracted, into a temporary
//! directory that is then renamed into place (so a crashed or concurrent run never leaves a
//! half-filled cache). A cache made before the templates were extracted is incomplete, and so is
//! refreshed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const SDIST: &str = "llama-cpp-python==0.3.36";
const CACHE_NAME: &str = "llama-cpp-python-0.3.36";

/// `$KILN_HOME`, defaulting to `~/.cache/kiln`.
pub fn kiln_home() -> PathBuf {
    if let Some(home) = std::env::var_os("KILN_HOME") {
        return PathBuf::from(home);
    }
    let home = std::env::var_os("HOME").expect("neither KILN_HOME nor HOME is set");
    PathBuf::from(home).join(".cache").join("kiln")
}

/// The golden data of a model, e.g. `golden_dir("gemma3-270m")`.
///
/// Found from the running test's crate (cargo and nextest set `CARGO_MANIFEST_DIR` for test
/// processes; every crate sits at `crates/NAME`), not from this crate's build: two clones that
/// share one target folder (as `.ci/run` does) may share this crate's compiled copy.
pub fn golden_dir(model: &str) -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    crate_dir.join("../../tests/golden").join(model)
}

/// The Gemma 3 270M GGUF, which `kiln pull gemma3-270m` puts in place.
pub fn gemma_model_path() -> PathBuf {
    let path = kiln_home()
        .join("models")
        .join("gemma3-270m")
        .join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "model file {} is missing: run `kiln pull gemma3-270m` (or set KILN_HOME)",
        path.display()
    );
    path
}

/// One `{"text", "ids"}` line of a golden `tokenize*.jsonl`.
pub struct Case {
    pub text: String,
    pub ids: Vec<u32>,
}

pub fn read_jsonl_cases(path: &Path) -> Vec<Case> {
    let data = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    data.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            Case {
                text: v["text"].as_str().unwrap().to_string(),
                ids: v["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
                    .collect(),
            }
        })
        .collect()
}

/// The cases of llama.cpp's `<vocab>.gguf.inp` / `.out` pair, paired as `test-tokenizer-0` pairs
/// them: inputs separated by `"\n__ggml_vocab_test__\n"`, one output line of space-separated ids
/// per input.
pub fn read_vocab_cases(vocab: &Path) -> Vec<Case> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).unwrap();
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(SEP) {
            Some(next) => {
                inputs.push(inp[pos..pos + next].to_string());
                pos += next + SEP.len();
            }
            None => {
                inputs.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: inputs and outputs differ in number",
        vocab.display()
    );
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(text, ids)| Case { text, ids })
        .collect()
}

/// Every `models/ggml-vocab-*.gguf` of llama.cpp 0c1e57098, and whether it comes with test cases
/// (`.gguf.inp` / `.gguf.out`).
pub const VOCABS: [(&str, bool); 19] = [
    ("aquila", false),
    ("baichuan", false),
    ("bert-bge", true),
    ("command-r", true),
    ("deepseek-coder", true),
    ("deepseek-llm", true),
    ("falcon", true),
    ("gemma-4", true),
    ("gpt-2", true),
    ("gpt-neox", false),
    ("llama-bpe", true),
    ("llama-spm", true),
    ("mpt", true),
    ("nomic-bert-moe", false),
    ("phi-3", true),
    ("qwen2", true),
    ("qwen35", true),
    ("refact", true),
    ("starcoder", true),
];

/// Every chat template in llama.cpp 0c1e57098's `models/templates/` (file stems of `*.jinja`).
pub const CHAT_TEMPLATES: [&str; 70] = [
    "Apertus-8B-Instruct",
    "Apriel-1.6-15b-Thinker-fixed",
    "Bielik-11B-v3.0-Instruct",
    "ByteDance-Seed-OSS",
    "Cohere2MoE",
    "CohereForAI-c4ai-command-r-plus-tool_use",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "GLM-4.6",
    "GLM-4.7-Flash",
    "GigaChat3-10B-A1.8B",
    "GigaChat3.1-10B-A1.8B",
    "HuggingFaceTB-SmolLM3-3B",
    "Kimi-K2-Instruct",
    "Kimi-K2-Thinking",
    "Kimi-K3",
    "LFM2-8B-A1B",
    "LFM2.5-8B-A1B",
    "LFM2.5-Instruct",
    "MiMo-VL",
    "MiniMax-M1",
    "MiniMax-M2",
    "MiniMax-M3",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "NVIDIA-Nemotron-Nano-v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "Qwen-QwQ-32B",
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "Reka-Edge",
    "Spark2.5",
    "StepFun3.5-Flash",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-V3.1",
    "deepseek-ai-DeepSeek-V3.2",
    "deepseek-ai-DeepSeek-V4-Flash-0731",
    "deepseek-ai-DeepSeek-V4",
    "fireworks-ai-llama-3-firefunction-v2",
    "google-gemma-2-2b-it",
    "google-gemma-4-31B-it-interleaved",
    "google-gemma-4-31B-it",
    "ibm-granite-granite-3.3-2B-Instruct",
    "ibm-granite-granite-4.0",
    "ibm-granite-granite-4.1",
    "inclusionai-ling-3.0-flash",
    "llama-cpp-deepseek-r1",
    "llama-cpp-rwkv-world",
    "meetkai-functionary-medium-v3.1",
    "meetkai-functionary-medium-v3.2",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct",
    "microsoft-Phi-3.5-mini-instruct",
    "mistralai-Ministral-3-14B-Reasoning-2512",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "moonshotai-Kimi-K2",
    "muse-glimmer",
    "openai-gpt-oss-120b",
    "openbmb-MiniCPM5-1B",
    "poolside-Laguna-S-2.1",
    "poolside-Laguna-XS-2.1",
    "poolside-Laguna-XS.2",
    "tencent-Hy3",
    "unsloth-Apriel-1.5",
    "unsloth-mistral-Devstral-Small-2507",
    "upstage-Solar-Open-100B",
];

fn cache_complete(dir: &Path) -> bool {
    let templates = dir.join("templates");
    CHAT_TEMPLATES
        .iter()
        .all(|t| templates.join(format!("{t}.jinja")).is_file())
        && VOCABS.iter().all(|&(v, has_cases)| {
            let exts: &[&str] = if has_cases {
                &["gguf", "gguf.inp", "gguf.out"]
            } else {
                &["gguf"]
            };
            exts.iter()
                .all(|ext| dir.join(format!("ggml-vocab-{v}.{ext}")).is_file())
        })
}

static FETCH: Mutex<()> = Mutex::new(());

/// The directory holding llama.cpp's chat templates (`<name>.jinja`, see [`CHAT_TEMPLATES`]),
/// downloading them on first use.
pub fn chat_templates_dir() -> PathBuf {
    llama_vocab_dir().join("templates")
}

/// The directory holding llama.cpp's `ggml-vocab-*` files (and the chat templates in
/// `templates/`), downloading them on first use.
pub fn llama_vocab_dir() -> PathBuf {
    let cache_root = kiln_home().join("cache");
    let dir = cache_root.join(CACHE_NAME);
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if cache_complete(&dir) {
        return dir;
    }
    std::fs::create_dir_all(&cache_root).unwrap();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = cache_root.join(format!(".{CACHE_NAME}.tmp-{}-{nonce}", std::process::id()));
    let download = tmp.join("download");
    let staged = tmp.join(CACHE_NAME);
    std::fs::create_dir_all(&download).unwrap();
    std::fs::create_dir_all(staged.join("templates")).unwrap();

    // `--no-binary llama-cpp-python` fetches the sdist; restricting it to that one package lets
    // pip take wheels for the build tools it runs to read the sdist's metadata (`:all:` would
    // build CMake from source first, which takes many minutes).
    // One retry: pip's isolated build environment occasionally fails for transient reasons.
    let pip_download = || {
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--no-binary"])
            .arg("llama-cpp-python")
            .arg(SDIST)
            .arg("-d")
            .arg(&download)
            .status()
            .expect("cannot run `python3 -m pip`")
    };
    let mut status = pip_download();
    if !status.success() {
        status = pip_download();
    }
    assert!(status.success(), "`pip download {SDIST}` failed ({status})");
    let sdist = std::fs::read_dir(&download)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .expect("pip downloaded no .tar.gz");

    const EXTRACT: &str = r#"
import sys, tarfile, os, shutil
sdist, dest = sys.argv[1], sys.argv[2]
n = 0
with tarfile.open(sdist) as tar:
    for m in tar:
        parts = m.name.split('/')
        if not m.isfile() or parts[1:4] != ['vendor', 'llama.cpp', 'models']:
            continue
        if len(parts) == 5 and parts[4].startswith('ggml-vocab-'):
            target = os.path.join(dest, parts[4])
        elif len(parts) == 6 and parts[4] == 'templates' and parts[5].endswith('.jinja'):
            target = os.path.join(dest, 'templates', parts[5])
        else:
            continue
        with tar.extractfile(m) as src, open(target, 'wb') as out:
            shutil.copyfileobj(src, out)
        n += 1
print(n, 'files extracted')
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(EXTRACT)
        .arg(&sdist)
        .arg(&staged)
        .status()
        .expect("cannot run python3");
    assert!(status.success(), "extracting {} failed", sdist.display());
    assert!(
        cache_complete(&staged),
        "the sdist lacks the vocab files or the chat templates"
    );

    // Replace an incomplete cache; a concurrent process may have filled it meanwhile.
    if dir.exists() && !cache_complete(&dir) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Err(e) = std::fs::rename(&staged, &dir) {
        assert!(
            cache_complete(&dir),
            "cannot move {} to {}: {e}",
            staged.display(),
            dir.display()
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    dir
}
