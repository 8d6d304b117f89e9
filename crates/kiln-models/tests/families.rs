//! Every decoder family against Hugging Face transformers in float32, from both file formats.
//!
//! The fixtures (`tests/fixtures/decoders/<family>/` at the repository root, made by `scripts/gen_decoder_fixtures.py`)
//! are tiny random checkpoints saved by transformers, converted to GGUF by llama.cpp's own
//! `convert_hf_to_gguf.py` at the same dtype, with HF's float32 logits for every position of
//! each prompt, its greedy continuation, and for MoE models the router's choices.
//!
//! Tolerance: the safetensors file and the GGUF hold bit-identical weights, and the reference
//! ran in float32 on exactly those weights (F16/BF16 upcast), so the only difference is the
//! order of f32 arithmetic. Relative f32 rounding is 6e-8 per operation; through a few dot
//! products of ≤ 512 terms, two layers and a softmax it stays well below 1e-5 of the logits'
//! scale. The tests allow `LOGIT_TOL = 1e-5 · max|logit|` (measured: at most 1.4e-6, printed by
//! each test)
//! and require every greedy token to be equal (the fixtures' smallest greedy margin is 0.09,
//! three orders of magnitude above that tolerance). Those checks run with an f32 KV cache, the
//! reference's arithmetic; with the default f16 cache (keys and values rounded once, relative
//! error ≤ 2^-11) the prompt logits must stay within `F16_KV_TOL = 3e-3 · max|logit|` (measured:
//! 4e-4 to 1.0e-3, printed by each test).
//!
//! All of that runs with exact f32 products ([`exact`]: `CpuOptions::bf16_dot` and
//! `CpuOptions::amx_float` off). The defaults, where the CPU has AVX512_BF16, also round
//! activations to BF16 in products of BF16 weights (as llama.cpp does), and where the OS grants
//! AMX tiles split the prefill's F32 products into BF16 parts (`kiln_cpu`'s `sgemm::amx`); with
//! them the prompt logits of every family must stay within
//! `DEFAULTS_TOL = 3e-2 · max|logit|` (measured on the BF16 fixtures: up to 1.2e-2; greedy
//! tokens may then differ, the fixtures' margins being small).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_backend::{Backend, KvDtype};
use kiln_core::SharedBytes;
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_formats::{GgufFile, GgufWriter};
use kiln_models::{load_gguf_decoder, load_hf_decoder, Decoder, Route, Trace};
use serde_json::Value;

const LOGIT_TOL: f32 = 1e-5;
const F16_KV_TOL: f32 = 3e-3;
const DEFAULTS_TOL: f32 = 3e-2;

/// A backend of `threads` threads with exact f32 products of BF16 and F32 weights (the
/// reference's arithmetic), otherwise the defaults.
fn exact(threads: usize) -> CpuBackend {
    CpuBackend::with_options(&CpuOptions {
        bf16_dot: false,
        amx_float: false,
        ..CpuOptions::threads(threads)
    })
    .unwrap()
}

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family)
}

fn reference(family: &str) -> Value {
    let text = std::fs::read_to_string(fixture(family).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Safetensors,
    Gguf,
}

impl Format {
    /// The reference's `applies_to` label.
    fn label(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Gguf => "gguf",
        }
    }
}

/// The reference's cases that apply to `format`.
fn cases(r: &Value, format: Format) -> Vec<&Value> {
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["applies_to"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a.as_str() == Some(format.label()))
        })
        .collect()
}

fn load(family: &str, format: Format, b: &CpuBackend) -> Decoder<CpuBackend> {
    let dir = fixture(family);
    match format {
        Format::Safetensors => load_hf_decoder(b, &dir).unwrap(),
        Format::Gguf => {
            let name = reference(family)["gguf"].as_str().unwrap().to_string();
            let file = GgufFile::open(&dir.join(name)).unwrap();
            load_gguf_decoder(b, &file).unwrap()
        }
    }
}

/// Records every MoE layer's routing of the forward pass.
#[derive(Default)]
struct Routes(Mutex<Vec<(usize, Vec<Route>)>>);

impl<B: Backend> Trace<B> for Routes {
    fn routes(&self, layer: usize, routes: &[Route]) {
        self.0.lock().unwrap().push((layer, routes.to_vec()));
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs every case of `family` that applies to `format`: logits of every prompt position,
/// greedy continuation, and routing where the reference has it.
fn check_family(family: &str, format: Format) {
    let r = reference(family);
    let label = format.label();
    let b = CpuBackend::with_options(&CpuOptions {
        kv_dtype: KvDtype::F32,
        bf16_dot: false,
        amx_float: false,
        ..CpuOptions::threads(2)
    })
    .unwrap();
    let model = load(family, format, &b);
    // The same model's passes with the default f16 cache, then with every default.
    let b16 = exact(2);
    assert_eq!(b16.kv_dtype(), KvDtype::F16);
    let defaults = CpuBackend::new(2).unwrap();
    let vocab = model.config.vocab_size;
    let mut n_cases = 0;
    for case in cases(&r, format) {
        n_cases += 1;
        let name = case["name"].as_str().unwrap();
        let ids = u32s(&case["ids"]);
        let greedy = u32s(&case["greedy"]);
        let want = read_f32(&fixture(family).join(case["logits"].as_str().unwrap()));
        assert_eq!(
            want.len(),
            ids.len() * vocab,
            "{family}/{name}: reference size"
        );

        let mut cache = model.new_cache(&b, ids.len() + greedy.len()).unwrap();
        let routes = Routes::default();
        let hidden = model.forward_traced(&b, &ids, &mut cache, &routes).unwrap();
        let got = b.to_f32(&model.logits(&b, &hidden).unwrap()).unwrap();
        let scale = want.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let rel = diff / scale;
        eprintln!("{family} [{label}] {name}: max |Δlogit| {diff:.3e} (scale {scale:.2}, relative {rel:.2e})");
        assert!(
            rel <= LOGIT_TOL,
            "{family} [{label}] {name}: logits differ by {diff} (scale {scale})"
        );
        let mut cache16 = model.new_cache(&b16, ids.len()).unwrap();
        let h16 = model.forward(&b16, &ids, &mut cache16).unwrap();
        let got16 = b16.to_f32(&model.logits(&b16, &h16).unwrap()).unwrap();
        let diff16 = got16
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{family} [{label}] {name}, f16 KV cache: max |Δlogit| {diff16:.3e} (relative {:.2e})",
            diff16 / scale
        );
        assert!(
            diff16 <= F16_KV_TOL * scale,
            "{family} [{label}] {name}: with an f16 cache, logits differ by {diff16} (scale {scale})"
        );
        let mut cache_d = model.new_cache(&defaults, ids.len()).unwrap();
        let hd = model.forward(&defaults, &ids, &mut cache_d).unwrap();
        let got_d = defaults
            .to_f32(&model.logits(&defaults, &hd).unwrap())
            .unwrap();
        let diff_d = got_d
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{family} [{label}] {name}, defaults: max |Δlogit| {diff_d:.3e} (relative {:.2e})",
            diff_d / scale
        );
        assert!(
            diff_d <= DEFAULTS_TOL * scale,
            "{family} [{label}] {name}: with the defaults, logits differ by {diff_d} (scale {scale})"
        );

        if let Some(layers) = case.get("routing").and_then(Value::as_array) {
            let seen = routes.0.lock().unwrap();
            assert_eq!(seen.len(), layers.len(), "{family}/{name}: MoE layers");
            // The layers that route (all of them unless the reference says).
            let routed: Vec<usize> = match case.get("routing_layers") {
                Some(l) => u32s(l).into_iter().map(|i| i as usize).collect(),
                None => (0..layers.len()).collect(),
            };
            for ((want_l, want_layer), layer) in routed.iter().zip(layers).zip(0..) {
                let (l, got_routes) = &seen[layer];
                assert_eq!(l, want_l, "{family}/{name}: routing of layer {want_l}");
                let want_layer = want_layer.as_array().unwrap();
                assert_eq!(got_routes.len(), want_layer.len());
                for (t, (g, w)) in got_routes.iter().zip(want_layer).enumerate() {
                    assert_eq!(
                        g.experts,
                        u32s(w),
                        "{family} [{label}] {name}: layer {layer} token {t} routed differently"
                    );
                }
            }
        }

        // Greedy continuation, one token at a time through the cache.
        let last = &got[(ids.len() - 1) * vocab..];
        let mut next = argmax(last);
        let mut generated = vec![next];
        while generated.len() < greedy.len() {
            let h = model.forward(&b, &[next], &mut cache).unwrap();
            next = argmax(&b.to_f32(&model.logits(&b, &h).unwrap()).unwrap());
            generated.push(next);
        }
        assert_eq!(
            generated, greedy,
            "{family} [{label}] {name}: greedy tokens differ"
        );
    }
    assert!(n_cases > 0, "{family}: no case applies to {label}");
}

/// The prompts of `family` (those that apply to `format`) run alone and then together in one
/// batch, prefill and greedy decode: each sequence's logits match its solo run (up to the
/// rounding of products over more rows) and every batched decode step picks the reference's
/// greedy token.
fn check_batch(family: &str, format: Format) {
    let r = reference(family);
    let label = format.label();
    let b = exact(2);
    let model = load(family, format, &b);
    let vocab = model.config.vocab_size;
    let cases = cases(&r, format);
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| u32s(&c["ids"])).collect();
    let greedy: Vec<Vec<u32>> = cases.iter().map(|c| u32s(&c["greedy"])).collect();
    let steps = greedy[0].len();

    let mut solo = Vec::new();
    for p in &prompts {
        let mut cache = model.new_cache(&b, p.len() + steps).unwrap();
        let h = model.forward(&b, p, &mut cache).unwrap();
        solo.push(b.to_f32(&model.logits(&b, &h).unwrap()).unwrap());
    }

    let mut caches: Vec<_> = prompts
        .iter()
        .map(|p| model.new_cache(&b, p.len() + steps).unwrap())
        .collect();
    let seqs: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
    let mut refs: Vec<&mut kiln_models::KvCache<CpuBackend>> = caches.iter_mut().collect();
    let h = model
        .forward_batch(&b, &seqs, &mut refs, &kiln_models::NoTrace)
        .unwrap();
    let all = b.to_f32(&model.logits(&b, &h).unwrap()).unwrap();
    let mut offset = 0;
    let mut next = Vec::new();
    for (p, want) in prompts.iter().zip(&solo) {
        let got = &all[offset * vocab..(offset + p.len()) * vocab];
        let scale = want.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let diff = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("{family} [{label}] batched vs alone: max |Δlogit| {diff:.3e}");
        assert!(
            diff <= LOGIT_TOL * scale,
            "{family}: batched logits differ by {diff}"
        );
        next.push(argmax(&got[(p.len() - 1) * vocab..]));
        offset += p.len();
    }
    let mut generated: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    for _ in 1..steps {
        let step: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let seqs: Vec<&[u32]> = step.iter().map(|s| s.as_slice()).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let h = model
            .forward_batch(&b, &seqs, &mut refs, &kiln_models::NoTrace)
            .unwrap();
        let logits = b.to_f32(&model.logits(&b, &h).unwrap()).unwrap();
        next = logits.chunks_exact(vocab).map(argmax).collect();
        for (g, &t) in generated.iter_mut().zip(&next) {
            g.push(t);
        }
    }
    assert_eq!(
        generated, greedy,
        "{family} [{label}]: batched greedy decode"
    );
}

/// The prompts of `family` through a paged cache (blocks of 3 positions, scattered through the
/// pool in a shuffled order) give, prefill and every greedy decode step, the bits of the same
/// batch through contiguous caches.
fn check_paged(family: &str, format: Format) {
    let r = reference(family);
    let b = exact(2);
    let model = load(family, format, &b);
    let cases = cases(&r, format);
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| u32s(&c["ids"])).collect();
    let greedy: Vec<Vec<u32>> = cases.iter().map(|c| u32s(&c["greedy"])).collect();
    let steps = greedy[0].len();
    let max_positions = prompts.iter().map(Vec::len).max().unwrap() + steps;
    let block_size = 3;
    let per_seq = max_positions.div_ceil(block_size);
    let n_blocks = per_seq * prompts.len() + 4;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for i in (1..ids.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let tables: Vec<&[u32]> = ids.chunks(per_seq).take(prompts.len()).collect();
    let mut paged =
        kiln_models::PagedKvCache::new(&b, &model.config, n_blocks, block_size, max_positions)
            .unwrap();
    let mut caches: Vec<_> = prompts
        .iter()
        .map(|_| model.new_cache(&b, max_positions).unwrap())
        .collect();
    let mut lens = vec![0usize; prompts.len()];
    let mut inputs: Vec<Vec<u32>> = prompts.clone();
    for step in 0..steps {
        let seqs: Vec<&[u32]> = inputs.iter().map(|p| p.as_slice()).collect();
        let mut refs: Vec<&mut kiln_models::KvCache<CpuBackend>> = caches.iter_mut().collect();
        let want = model
            .forward_batch(&b, &seqs, &mut refs, &kiln_models::NoTrace)
            .unwrap();
        let views: Vec<kiln_models::PagedSeq<'_>> = tables
            .iter()
            .zip(&lens)
            .map(|(&table, &len)| kiln_models::PagedSeq::new(table, len))
            .collect();
        let got = model
            .forward_paged(&b, &seqs, &mut paged, &views, &kiln_models::NoTrace)
            .unwrap();
        let (want, got) = (b.to_f32(&want).unwrap(), b.to_f32(&got).unwrap());
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{family} [{}]: paged hidden states differ at step {step}",
            format.label()
        );
        for (len, input) in lens.iter_mut().zip(&seqs) {
            *len += input.len();
        }
        inputs = greedy.iter().map(|g| vec![g[step]]).collect();
    }
    // A table that does not cover the new positions is an error, not a panic.
    let short = [kiln_models::PagedSeq::new(&tables[0][..1], 0)];
    assert!(model
        .forward_paged(
            &b,
            &[&prompts[0][..4]],
            &mut paged,
            &short,
            &kiln_models::NoTrace
        )
        .is_err());
}

macro_rules! family_tests {
    ($($name:ident: $family:literal,)*) => {
        $(
            mod $name {
                use super::*;
                #[test]
                fn safetensors() {
                    check_family($family, Format::Safetensors);
                }
                #[test]
                fn gguf() {
                    check_family($family, Format::Gguf);
                }
                #[test]
                fn batch() {
                    check_batch($family, Format::Safetensors);
                    check_batch($family, Format::Gguf);
                }
                #[test]
                fn paged() {
                    check_paged($family, Format::Gguf);
                }
            }
        )*
    };
}

family_tests! {
    llama: "llama",
    mistral: "mistral",
    qwen2: "qwen2",
    qwen2_yarn: "qwen2-yarn",
    qwen3: "qwen3",
    phi3: "phi3",
    qwen3moe: "qwen3moe",
    qwen2moe: "qwen2moe",
    gemma3: "gemma3",
    mixtral: "mixtral",
}

/// Families whose fixture has no GGUF: the safetensors against HF, alone, batched and paged.
macro_rules! safetensors_family_tests {
    ($($(#[$doc:meta])* $name:ident: $family:literal,)*) => {
        $(
            $(#[$doc])*
            mod $name {
                use super::*;
                #[test]
                fn safetensors() {
                    check_family($family, Format::Safetensors);
                }
                #[test]
                fn batch() {
                    check_batch($family, Format::Safetensors);
                }
                #[test]
                fn paged() {
                    check_paged($family, Format::Safetensors);
                }
            }
        )*
    };
}

safetensors_family_tests! {
    /// Qwen3-MoE as transformers 5 saves it: `config.json` untouched from `save_pretrained`, so the
    /// expert count is spelled `num_local_experts` (and the rope base sits in `rope_parameters`,
    /// the dtype in `dtype`). No GGUF: the safetensors against HF, alone, batched and paged.
    qwen3moe_tf5: "qwen3moe-tf5",
    /// Qwen2-MoE mixing dense and expert layers (`decoder_sparse_step` 2: layers 0 and 2 dense, 1
    /// routed with a shared expert). No GGUF (llama.cpp's converter cannot write one): the
    /// safetensors against HF, alone, batched and paged.
    qwen2moe_mixed: "qwen2moe-mixed",
    /// The text model of a multimodal Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`: settings
    /// under `text_config`, weights under `language_model.`, a vision tower kiln leaves alone).
    /// No GGUF: the safetensors against HF, alone, batched and paged.
    gemma3_mm: "gemma3-mm",
    /// Dynamic NTK rope scaling on a Llama trained at 16 positions (every prompt runs past them). No
    /// GGUF (llama.cpp has no dynamic NTK): the safetensors against HF, alone, batched and paged;
    /// the prompt's logits need the base of a pass over the whole prompt, each greedy step the base
    /// of its own position.
    llama_dynamic: "llama-dynamic",
}

/// The mixed Qwen2-MoE's configuration: which layers route, the shared expert, no
/// renormalisation.
#[test]
fn qwen2moe_mixed_config_says_which_layers_route() {
    let b = exact(1);
    let c = load("qwen2moe-mixed", Format::Safetensors, &b).config;
    let moe = c.moe.expect("experts");
    assert_eq!(moe.dense_layers, [0, 2]);
    assert_eq!(moe.shared_ffn_dim, Some(96));
    assert!(!moe.normalize_top_k);
    assert!(moe.routes(1) && !moe.routes(0) && !moe.routes(2));
}

/// The text model's configuration equals the one `Gemma3ForCausalLM`'s `config.json` gives.
#[test]
fn gemma3_mm_reads_the_text_config() {
    let b = exact(1);
    let mm = load("gemma3-mm", Format::Safetensors, &b).config;
    let text = load("gemma3", Format::Safetensors, &b).config;
    assert_eq!(mm, text);
}

/// The base a pass uses, against transformers' formula worked by hand; within the original
/// context the base is the plain one; the usable context is 4 × 16.
#[test]
fn dynamic_ntk_base_grows_with_the_pass() {
    use kiln_core::config::LayerAttention;
    let b = exact(1);
    let c = load("llama-dynamic", Format::Safetensors, &b).config;
    assert_eq!(c.context_length, 64);
    assert_eq!(c.rope_for(LayerAttention::Global, 64, 16).base, 1e4);
    let grown = c.rope_for(LayerAttention::Global, 64, 40).base;
    let want = 1e4 * (4.0f64 * 40.0 / 16.0 - 3.0).powf(16.0 / 14.0);
    assert!(
        (f64::from(grown) - want).abs() < 1e-3 * want,
        "{grown} vs {want}"
    );
}

/// Gemma 3 settings kiln cannot honour are refused naming the key; transformers' defaults fill
/// the keys a `config.json` leaves out (`layer_types` from the pattern of 6, the rope bases).
#[test]
fn gemma3_configs_are_read_with_transformers_defaults() {
    use kiln_core::config::LayerAttention;
    use kiln_models::arch::hf_decoder_shape;
    use kiln_models::hf::HfConfig;
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("gemma3").join("config.json")).unwrap(),
    )
    .unwrap();
    let shape = |edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut c = base.clone();
        edit(c.as_object_mut().unwrap());
        let hf = HfConfig::parse("config.json", &c.to_string()).unwrap();
        hf_decoder_shape(&hf)
    };
    let c = shape(&|c| {
        for k in [
            "layer_types",
            "_sliding_window_pattern",
            "rope_theta",
            "rope_local_base_freq",
            "rope_scaling",
            "query_pre_attn_scalar",
        ] {
            c.remove(k);
        }
        c["num_hidden_layers"] = 12.into();
    })
    .unwrap();
    let global: Vec<usize> = (0..12)
        .filter(|&i| c.layer_attention[i] == LayerAttention::Global)
        .collect();
    assert_eq!(global, [5, 11]);
    assert_eq!(c.rope_global.base, 1e6);
    assert_eq!(c.rope_global.freq_scale, 1.0);
    assert_eq!(c.rope_local.base, 1e4);
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    for (key, value, want) in [
        ("hidden_activation", serde_json::json!("gelu"), "gelu"),
        (
            "final_logit_softcapping",
            serde_json::json!(30.0),
            "final_logit_softcapping",
        ),
        (
            "use_bidirectional_attention",
            serde_json::json!(true),
            "EmbeddingGemma",
        ),
        (
            "layer_types",
            serde_json::json!(["full_attention"]),
            "layer_types",
        ),
    ] {
        let e = shape(&|c| {
            c.insert(key.into(), value.clone());
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(want), "{key}: {e}");
    }
}

/// `mlp_only_layers` and `decoder_sparse_step` pick the dense layers of both Qwen-MoE families
/// as transformers does; nonsense values are refused naming the key.
#[test]
fn qwen_moe_dense_layers_follow_the_config() {
    use kiln_models::arch::hf_decoder_shape;
    use kiln_models::hf::HfConfig;
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen2moe").join("config.json")).unwrap(),
    )
    .unwrap();
    let dense = |edit: &dyn Fn(&mut Value)| {
        let mut c = base.clone();
        c["num_hidden_layers"] = 6.into();
        edit(&mut c);
        let hf = HfConfig::parse("config.json", &c.to_string()).unwrap();
        hf_decoder_shape(&hf).map(|s| s.moe.unwrap().dense_layers)
    };
    assert_eq!(dense(&|_| {}).unwrap(), Vec::<usize>::new());
    assert_eq!(
        dense(&|c| c["mlp_only_layers"] = serde_json::json!([0, 4])).unwrap(),
        [0, 4]
    );
    assert_eq!(
        dense(&|c| c["decoder_sparse_step"] = 3.into()).unwrap(),
        [0, 1, 3, 4]
    );
    assert_eq!(
        dense(&|c| {
            c["decoder_sparse_step"] = 2.into();
            c["mlp_only_layers"] = serde_json::json!([1]);
        })
        .unwrap(),
        [0, 1, 2, 4]
    );
    // Qwen3-MoE reads the same keys (and has no shared expert).
    let e = dense(&|c| {
        c["model_type"] = "qwen3_moe".into();
        c["mlp_only_layers"] = serde_json::json!([5]);
    })
    .unwrap();
    assert_eq!(e, [5]);
    for (key, value) in [
        ("decoder_sparse_step", serde_json::json!(0)),
        ("mlp_only_layers", serde_json::json!(["a"])),
        ("mlp_only_layers", serde_json::json!(3)),
    ] {
        let err = dense(&|c| c[key] = value.clone()).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }
    // A Qwen2-MoE config without its shared expert's width is refused naming it.
    let err = dense(&|c| {
        c.as_object_mut()
            .unwrap()
            .remove("shared_expert_intermediate_size");
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("shared_expert_intermediate_size"), "{err}");
}

/// transformers 5's `Qwen3MoeConfig` and `MixtralConfig` both store the expert count as
/// `num_local_experts` and alias `num_experts` to it (`attribute_map`), so either spelling is the
/// same setting for both families: the configuration kiln reads does not depend on which one a
/// `config.json` uses, two disagreeing spellings are refused, and a missing count is reported
/// under every accepted spelling.
#[test]
fn expert_count_reads_under_both_spellings() {
    use kiln_models::arch::hf_decoder_shape;
    use kiln_models::hf::HfConfig;
    let shape =
        |c: &Value| hf_decoder_shape(&HfConfig::parse("config.json", &c.to_string()).unwrap());
    let read = |family: &str| -> Value {
        let text = std::fs::read_to_string(fixture(family).join("config.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };

    // The transformers 5 file really has the transformers 5 spellings.
    let tf5 = read("qwen3moe-tf5");
    assert_eq!(tf5["num_local_experts"], 4);
    assert!(tf5.get("num_experts").is_none());
    assert!(tf5.get("rope_theta").is_none());
    assert_eq!(tf5["rope_parameters"]["rope_theta"], 1e6);
    let tf5_config = shape(&tf5).unwrap();
    let moe = tf5_config.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.n_experts,
            moe.top_k,
            moe.expert_ffn_dim,
            moe.normalize_top_k
        ),
        (4, 2, 32, true)
    );
    // The published spelling's fixture (same shape, norm_topk_prob false) reads alike.
    let mut published = shape(&read("qwen3moe")).unwrap();
    published.moe.as_mut().unwrap().normalize_top_k = true;
    assert_eq!(published, tf5_config);

    for (family, spelled, other) in [
        ("qwen3moe-tf5", "num_local_experts", "num_experts"),
        ("qwen3moe", "num_experts", "num_local_experts"),
        ("mixtral", "num_local_experts", "num_experts"),
    ] {
        let config = read(family);
        let want = shape(&config).unwrap();
        let n = config[spelled].clone();
        let edit = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
            let mut c = config.clone();
            f(c.as_object_mut().unwrap());
            c
        };
        let respelled = edit(&|c| {
            c.remove(spelled);
            c.insert(other.into(), n.clone());
        });
        assert_eq!(shape(&respelled).unwrap(), want, "{family}: {other}");
        let both = edit(&|c| {
            c.insert(other.into(), n.clone());
        });
        assert_eq!(shape(&both).unwrap(), want, "{family}: both spellings");
        let disagree = edit(&|c| {
            c.insert(other.into(), 3.into());
        });
        let e = shape(&disagree).unwrap_err().to_string();
        assert!(
            e.contains("num_experts") && e.contains("num_local_experts"),
            "{family}: {e}"
        );
        let missing = edit(&|c| {
            c.remove(spelled);
        });
        let e = shape(&missing).unwrap_err().to_string();
        assert!(
            e.contains("missing") && e.contains("num_experts, num_local_experts"),
            "{family}: {e}"
        );
    }
}

/// A copy of `file` in which the rows of the stacked expert tensors that `poison(layer, expert)`
/// selects are NaN (the F32 Qwen3-MoE fixture).
fn poisoned(file: &GgufFile, poison: impl Fn(usize, usize) -> bool) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if k != "general.alignment" {
            w.add_meta(k.clone(), v.clone()).unwrap();
        }
    }
    for t in file.tensors() {
        let mut data = file.tensor_data(t).to_vec();
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .filter(|(_, role)| role.contains("_exps"))
            .map(|(l, _)| l.parse::<usize>().unwrap());
        if let Some(layer) = layer {
            assert_eq!(t.ty, kiln_core::GgmlType::F32);
            let n_experts = t.dims[2] as usize;
            let per_expert = data.len() / n_experts;
            for (e, chunk) in data.chunks_mut(per_expert).enumerate() {
                if poison(layer, e) {
                    for x in chunk.chunks_mut(4) {
                        x.copy_from_slice(&f32::NAN.to_le_bytes());
                    }
                }
            }
        }
        w.add_tensor(t.name.clone(), &t.dims, t.ty, &data).unwrap();
    }
    GgufFile::from_bytes(SharedBytes::from_vec(w.to_bytes())).unwrap()
}

/// Only the experts the router selects are read: filling every other expert's weights with NaN
/// changes no bit of the output (a NaN weight that entered any product would spread to the
/// logits, even multiplied by a zero gate weight), while poisoning a selected one does.
#[test]
fn unselected_experts_are_never_read() {
    let dir = fixture("qwen3moe");
    let clean = GgufFile::open(&dir.join("model-f32.gguf")).unwrap();
    let b = exact(2);
    let ids = [12u32, 7, 301];
    let run = |file: &GgufFile| {
        let model = load_gguf_decoder(&b, file).unwrap();
        let mut cache = model.new_cache(&b, ids.len()).unwrap();
        let routes = Routes::default();
        let h = model.forward_traced(&b, &ids, &mut cache, &routes).unwrap();
        let logits = b.to_f32(&model.logits(&b, &h).unwrap()).unwrap();
        let routes = routes.0.into_inner().unwrap();
        (logits, routes)
    };
    let (want, routes) = run(&clean);
    let selected = |layer: usize, e: usize| {
        routes[layer]
            .1
            .iter()
            .any(|r| r.experts.contains(&(e as u32)))
    };
    let n_experts = clean.get_u64("qwen3moe.expert_count").unwrap() as usize;
    let unselected = (0..routes.len())
        .flat_map(|l| (0..n_experts).map(move |e| (l, e)))
        .filter(|&(l, e)| !selected(l, e))
        .count();
    assert!(
        unselected > 0,
        "every expert was selected: use fewer tokens"
    );

    let (got, _) = run(&poisoned(&clean, |l, e| !selected(l, e)));
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "poisoning {unselected} unselected experts changed the output"
    );
    // The control: a selected expert's NaN does reach the logits.
    let (got, _) = run(&poisoned(&clean, |l, e| {
        l == 0 && e == routes[0].1[0].experts[0] as usize
    }));
    assert!(got.iter().any(|x| x.is_nan()));
}

/// Hard strings (whitespace runs, digits, code, CJK, emoji, specials) through each family's
/// tokenizer, against the reference libraries' ids (`add_special_tokens=False`):
/// - `tokenizer.json` through the HF `tokenizers` crate equals transformers' fast tokenizer on
///   every string;
/// - the GGUF's tokenizer (kiln's port of llama.cpp): byte-level BPE families equal the fast
///   tokenizer with special-token parsing on; SentencePiece families equal the `sentencepiece`
///   library (`tokenizer.model`, no special parsing). transformers' fast Llama tokenizer itself
///   differs from `sentencepiece` on leading whitespace, which is why SentencePiece is the
///   reference there.
///
/// One known difference is asserted as such: Qwen's `tokenizer.json` declares an NFC
/// normalizer that llama.cpp does not apply (a GGUF has no field for it), so a decomposed
/// accent tokenizes differently from a GGUF, as it does in llama.cpp.
#[test]
fn tokenizers_match_the_reference_on_hard_strings() {
    const NOT_NFC: &str = "Cafe\u{301} with a combining accent";
    for family in [
        "llama", "mistral", "qwen2", "qwen3", "phi3", "qwen3moe", "mixtral",
    ] {
        let r = reference(family);
        let t = &r["tokenizer"];
        let strings: Vec<&str> = t["strings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let want: Vec<Vec<u32>> = t["ids"].as_array().unwrap().iter().map(u32s).collect();
        let spm: Option<Vec<Vec<u32>>> = t
            .get("sentencepiece_ids")
            .map(|v| v.as_array().unwrap().iter().map(u32s).collect());
        let dir = fixture(family);
        let file = GgufFile::open(&dir.join(r["gguf"].as_str().unwrap())).unwrap();
        let gguf = kiln_tokenizer::Tokenizer::from_gguf(&file).unwrap();
        let hf = kiln_tokenizer::HfTokenizer::from_file(
            &dir.join("tokenizer.json"),
            kiln_tokenizer::Truncation::None,
        )
        .unwrap();
        assert!(strings.len() >= 30 && strings.contains(&NOT_NFC));
        for (i, text) in strings.iter().enumerate() {
            assert_eq!(
                hf.encode(text, false).unwrap(),
                want[i],
                "{family} tokenizer.json: {text:?}"
            );
            let (got, reference) = match &spm {
                Some(spm) => (gguf.encode(text, false, false), &spm[i]),
                None => (gguf.encode(text, false, true), &want[i]),
            };
            if family.starts_with("qwen") && *text == NOT_NFC {
                assert_ne!(
                    &got, reference,
                    "{family}: llama.cpp does not normalize to NFC"
                );
            } else {
                assert_eq!(&got, reference, "{family} GGUF: {text:?}");
            }
        }
    }
}

/// GPTQ: kiln's repacked matrices dequantize to exactly what llama.cpp's converter
/// (`dequant_gptq`, after GPTQModel) makes of the same tensors, for group sizes 32/64/128 with and
/// without act-order; and a GPTQ Llama run on its packed weights gives the logits of HF float32
/// on the dequantized weights.
#[test]
fn gptq_dequantizes_exactly_as_the_reference() {
    use kiln_backend::{GptqMatrix, GptqTensors};
    for family in ["llama-gptq-g32", "llama-gptq-g64", "llama-gptq-g128"] {
        let dir = fixture(family);
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let q = &config["quantization_config"];
        let group_size = q["group_size"].as_u64().unwrap() as usize;
        let st = kiln_formats::SafetensorsModel::open(&dir).unwrap();
        let mut act_order = false;
        for layer in ["self_attn.q_proj", "mlp.down_proj"] {
            let p = format!("model.layers.0.{layer}");
            let t = |s: &str| st.tensor(&format!("{p}.{s}")).unwrap();
            let (qweight, qzeros, scales, g_idx) =
                (t("qweight"), t("qzeros"), t("scales"), t("g_idx"));
            let (n_in, n_out) = (qweight.shape[0] * 8, qweight.shape[1]);
            let m = GptqMatrix::from_checkpoint(
                &p,
                &GptqTensors {
                    qweight: &qweight.bytes,
                    qzeros: &qzeros.bytes,
                    scales: &scales.bytes,
                    g_idx: Some(&g_idx.bytes),
                },
                n_in,
                n_out,
                group_size,
                true,
            )
            .unwrap();
            act_order |= m.perm.is_some();
            let want = read_f32(&dir.join(format!("dequant-{p}.f32")));
            let got = m.dequantize();
            assert_eq!(got.len(), want.len());
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{family} {layer}: dequantized values differ");
        }
        assert_eq!(
            act_order,
            q["desc_act"].as_bool().unwrap(),
            "{family}: act-order must show as a permutation"
        );
    }
}

#[test]
fn gptq_llama_matches_hf_on_the_dequantized_weights() {
    check_family("llama-gptq-g32", Format::Safetensors);
    check_batch("llama-gptq-g32", Format::Safetensors);
}

/// The Llama fixture of k-quant shapes (rows of 256) quantized to Q4_K_M by kiln's quantizer (the
/// types llama-quantize picks, bytes identical to ggml's reference quantizers) and run against HF
/// float32 on the unquantized weights.
///
/// The error the quantization implies is measured, not guessed: a control model gets, in every
/// matrix, exactly that matrix's quantization error values but shuffled (same size and
/// distribution, no structure), and runs in f32. Random tiny models amplify weight noise strongly
/// (≈ 6× the relative weight error, in units of the logits' RMS), so a fixed bound would be
/// arbitrary; the quantized model must stay within 2× the control's logit error (RMS), and it
/// must pick the reference's greedy token at every confident step: a flip needs the difference
/// of two logit errors (standard deviation √2·rms Δ) to exceed the margin, so a step whose
/// reference margin is above 6·rms Δ (more than 4 such deviations) is confident.
#[test]
fn k_quant_gguf_stays_within_its_quantization_error() {
    let types = check_quantized("llama-kq", kiln_quant::QuantMix::Q4_K_M, None, 10);
    assert!(
        types.contains_key("Q4_K") && types.contains_key("Q6_K"),
        "{types:?}"
    );
}

/// Mixture-of-experts layers on quantized expert blocks: the 3-D `ffn_*_exps` tensors quantized
/// to Q4_0 (each expert a row view of them), everything else as in the file, held to the same
/// measured bound. (Quantizing every matrix of this random MoE model flips near-tie routes,
/// which no bound derived from weight noise covers; the experts alone do not.)
#[test]
fn moe_experts_run_on_quantized_blocks() {
    let types = check_quantized("qwen3moe", kiln_quant::QuantMix::Q4_0, Some("_exps"), 3);
    assert_eq!(types.get("Q4_0"), Some(&6), "{types:?}");
}

/// Quantizes the GGUF of `family` with `mix` (kiln's quantizer and llama.cpp's rules; only the
/// tensors whose name contains `only`, when given) and checks it against the reference as the
/// k-quant test's doc says, with at least `min_confident` confident choices; returns the
/// quantized matrices' type counts.
fn check_quantized(
    family: &str,
    mix: kiln_quant::QuantMix,
    only: Option<&str>,
    min_confident: usize,
) -> std::collections::BTreeMap<String, usize> {
    use kiln_quant::mix::{MixModel, MixTensor};
    let dir = fixture(family);
    let r = reference(family);
    let src = GgufFile::open(&dir.join(r["gguf"].as_str().unwrap())).unwrap();
    let arch = src.architecture().unwrap().to_string();
    let u32_meta = |k: &str| src.get_u64(&format!("{arch}.{k}")).unwrap_or(0) as u32;
    let model = MixModel {
        architecture: arch.clone(),
        n_layer: u32_meta("block_count"),
        n_head: u32_meta("attention.head_count"),
        n_head_kv: u32_meta("attention.head_count_kv"),
        n_expert: u32_meta("expert_count"),
    };
    let infos = src.tensors();
    let mix_tensors: Vec<MixTensor> = infos
        .iter()
        .map(|t| MixTensor {
            name: &t.name,
            dims: &t.dims,
            ty: t.ty,
        })
        .collect();
    let mut plans = kiln_quant::plan_types(mix, &model, &mix_tensors).unwrap();
    if let Some(only) = only {
        for (p, t) in plans.iter_mut().zip(infos) {
            if !t.name.contains(only) {
                p.ty = t.ty;
            }
        }
    }
    let new_writer = || {
        let mut w = GgufWriter::new();
        for (k, v) in src.metadata() {
            if k != "general.alignment" {
                w.add_meta(k.clone(), v.clone()).unwrap();
            }
        }
        w
    };
    let (mut quantized, mut control) = (new_writer(), new_writer());
    let (mut err2, mut norm2) = (0f64, 0f64);
    let mut types = std::collections::BTreeMap::new();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for (t, plan) in infos.iter().zip(&plans) {
        let n = t.dims.iter().product::<u64>() as usize;
        let mut x = vec![0f32; n];
        kiln_quant::dequantize(t.ty, &src.tensor_data(t), &mut x).unwrap();
        let mut q = vec![0u8; kiln_quant::quantized_size(plan.ty, n).unwrap()];
        kiln_quant::quantize(plan.ty, &x, &mut q).unwrap();
        quantized
            .add_tensor(t.name.clone(), &t.dims, plan.ty, &q)
            .unwrap();
        let mut back = vec![0f32; n];
        kiln_quant::dequantize(plan.ty, &q, &mut back).unwrap();
        let mut noise: Vec<f32> = back.iter().zip(&x).map(|(b, a)| b - a).collect();
        if t.dims.len() >= 2 && plan.ty != t.ty {
            *types.entry(plan.ty.to_string()).or_insert(0) += 1;
            err2 += noise.iter().map(|&e| (e as f64).powi(2)).sum::<f64>();
            norm2 += x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>();
        }
        for i in (1..n).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            noise.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        let noisy: Vec<u8> = x
            .iter()
            .zip(&noise)
            .flat_map(|(a, e)| (a + e).to_le_bytes())
            .collect();
        control
            .add_tensor(t.name.clone(), &t.dims, kiln_core::GgmlType::F32, &noisy)
            .unwrap();
    }
    let eps = (err2 / norm2).sqrt();
    eprintln!(
        "{family} {}: matrices {types:?}, relative RMS weight error {eps:.4}",
        mix.name()
    );
    let open = |w: GgufWriter| GgufFile::from_bytes(SharedBytes::from_vec(w.to_bytes())).unwrap();
    let b = exact(2);
    let m = load_gguf_decoder(&b, &open(quantized)).unwrap();
    let m_control = load_gguf_decoder(&b, &open(control)).unwrap();
    let vocab = m.config.vocab_size;
    let rms = |v: &mut dyn Iterator<Item = f32>| {
        let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
        (s / n as f64).sqrt() as f32
    };
    let mut confident_steps = 0;
    for case in cases(&r, Format::Gguf) {
        let name = case["name"].as_str().unwrap();
        let ids = u32s(&case["ids"]);
        let greedy = u32s(&case["greedy"]);
        let want = read_f32(&dir.join(case["logits"].as_str().unwrap()));
        let run = |m: &Decoder<CpuBackend>| {
            let mut cache = m.new_cache(&b, ids.len() + greedy.len()).unwrap();
            let h = m.forward(&b, &ids, &mut cache).unwrap();
            (b.to_f32(&m.logits(&b, &h).unwrap()).unwrap(), cache)
        };
        let (got, mut cache) = run(&m);
        let (noisy, _) = run(&m_control);
        let diff_rms = rms(&mut got.iter().zip(&want).map(|(a, b)| a - b));
        let control_rms = rms(&mut noisy.iter().zip(&want).map(|(a, b)| a - b));
        let max_diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{family} [{}] {name}: rms Δlogit {diff_rms:.3} (control with the same weight \
             error: {control_rms:.3}; logits rms {:.2}), max {max_diff:.3}",
            mix.name(),
            rms(&mut want.iter().copied())
        );
        assert!(
            diff_rms <= 2.0 * control_rms,
            "{name}: rms Δlogit {diff_rms}"
        );

        // Next-token choices at every prompt position: the confident ones must agree.
        for (pos, (g, w)) in got
            .chunks_exact(vocab)
            .zip(want.chunks_exact(vocab))
            .enumerate()
        {
            let top = argmax(w) as usize;
            let second = w
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != top)
                .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
            if w[top] - second > 6.0 * diff_rms {
                confident_steps += 1;
                assert_eq!(argmax(g) as usize, top, "{name}: confident position {pos}");
            }
        }

        // Greedy, following the reference's tokens so that one early flip does not derail the
        // rest; the confident steps must agree.
        let margins: Vec<f32> = case["greedy_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap() as f32)
            .collect();
        let mut logits = got[(ids.len() - 1) * vocab..].to_vec();
        for (step, (&want_tok, &margin)) in greedy.iter().zip(&margins).enumerate() {
            if margin > 6.0 * diff_rms {
                confident_steps += 1;
                assert_eq!(argmax(&logits), want_tok, "{name}: confident step {step}");
            }
            let h = m.forward(&b, &[want_tok], &mut cache).unwrap();
            logits = b.to_f32(&m.logits(&b, &h).unwrap()).unwrap();
        }
    }
    eprintln!(
        "{family} [{}]: {confident_steps} confident next-token choices agree",
        mix.name()
    );
    assert!(
        confident_steps >= min_confident,
        "only {confident_steps} confident steps"
    );
    types
}

/// The configuration kiln reads from `config.json` equals the one it reads from the GGUF
/// llama.cpp's converter wrote, field by field, except where the formats really differ (the
/// rotary layout of `llama`-architecture GGUFs, Mistral's dropped window, Qwen3-MoE's
/// renormalisation): in particular the rope factors kiln computes from `rope_scaling` equal the
/// converter's `rope_freqs` / `rope_factors_*` tensors.
#[test]
fn configs_agree_across_formats() {
    use kiln_core::config::{LayerAttention, RopeKind};
    let b = exact(1);
    for family in [
        "llama",
        "mistral",
        "qwen2",
        "qwen2-yarn",
        "qwen3",
        "phi3",
        "qwen3moe",
        "qwen2moe",
        "gemma3",
        "mixtral",
    ] {
        let hf = load(family, Format::Safetensors, &b).config;
        let gguf = load(family, Format::Gguf, &b).config;
        let close =
            |a: &Option<std::sync::Arc<[f32]>>, b: &Option<std::sync::Arc<[f32]>>| match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    a.len() == b.len()
                        && a.iter()
                            .zip(b.iter())
                            .all(|(x, y)| (x - y).abs() <= 1e-6 * x.abs())
                }
                _ => false,
            };
        assert!(
            close(&hf.rope_global.freq_factors, &gguf.rope_global.freq_factors),
            "{family}: rope factors {:?} vs {:?}",
            hf.rope_global.freq_factors,
            gguf.rope_global.freq_factors
        );
        assert!(
            (hf.rope_global.mscale - gguf.rope_global.mscale).abs() < 1e-6,
            "{family}"
        );
        assert_eq!(hf.rope_global.base, gguf.rope_global.base, "{family}");
        assert_eq!(
            hf.rope_global.freq_scale, gguf.rope_global.freq_scale,
            "{family}"
        );
        let (hl, gl) = (&hf.rope_local, &gguf.rope_local);
        assert_eq!(
            (hl.base, hl.freq_scale, hl.mscale),
            (gl.base, gl.freq_scale, gl.mscale),
            "{family}: local rope"
        );
        assert!(close(&hl.freq_factors, &gl.freq_factors), "{family}");
        assert_eq!(hf.attention_scale, gguf.attention_scale, "{family}");
        assert_eq!(hf.embed_scale, gguf.embed_scale, "{family}");
        assert_eq!(hf.activation, gguf.activation, "{family}");
        assert_eq!(hf.attn_logit_softcap, gguf.attn_logit_softcap, "{family}");
        assert_eq!(hf.head_dim_v, gguf.head_dim_v, "{family}");
        assert_eq!(hf.rope_long.is_some(), gguf.rope_long.is_some(), "{family}");
        if let (Some(a), Some(b)) = (&hf.rope_long, &gguf.rope_long) {
            assert_eq!(a.original_context, b.original_context);
            assert!(
                close(&a.rope.freq_factors, &b.rope.freq_factors),
                "{family}: long factors"
            );
        }
        let llama_arch = matches!(family, "llama" | "mistral" | "mixtral");
        assert_eq!(
            gguf.rope_kind,
            if llama_arch {
                RopeKind::Normal
            } else {
                RopeKind::Neox
            }
        );
        assert_eq!(hf.rope_kind, RopeKind::Neox);
        for (field, a, b) in [
            ("d_model", hf.d_model, gguf.d_model),
            ("n_layers", hf.n_layers, gguf.n_layers),
            ("n_heads", hf.n_heads, gguf.n_heads),
            ("n_kv_heads", hf.n_kv_heads, gguf.n_kv_heads),
            ("head_dim", hf.head_dim, gguf.head_dim),
            ("ffn_dim", hf.ffn_dim, gguf.ffn_dim),
            ("vocab_size", hf.vocab_size, gguf.vocab_size),
            ("context_length", hf.context_length, gguf.context_length),
            ("rope_dim", hf.rope_dim, gguf.rope_dim),
        ] {
            assert_eq!(a, b, "{family}: {field}");
        }
        assert_eq!(hf.norm_eps, gguf.norm_eps, "{family}");
        if family == "mistral" {
            assert!(hf
                .layer_attention
                .iter()
                .all(|a| matches!(a, LayerAttention::Sliding { window: 8 })));
            assert!(gguf
                .layer_attention
                .iter()
                .all(|a| *a == LayerAttention::Global));
        } else {
            assert_eq!(hf.layer_attention, gguf.layer_attention, "{family}");
        }
        match (&hf.moe, &gguf.moe) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert_eq!(
                    (a.n_experts, a.top_k, a.expert_ffn_dim, a.shared_ffn_dim),
                    (b.n_experts, b.top_k, b.expert_ffn_dim, b.shared_ffn_dim)
                );
                assert_eq!(a.dense_layers, b.dense_layers, "{family}");
                // llama.cpp renormalises Qwen3-MoE's and Mixtral's weights, not Qwen2-MoE's.
                assert_eq!(b.normalize_top_k, family != "qwen2moe", "{family}");
                assert_eq!(a.normalize_top_k, family == "mixtral", "{family}");
            }
            _ => panic!("{family}: MoE in one format only"),
        }
    }
}

/// YaRN's frequencies and attention factor, as kiln derives them from `config.json` and from
/// the GGUF's `rope.scaling.*` keys, equal what transformers computed for the fixture
/// (`rope_inv_freq`, `rope_attention_scaling` in its reference): the ramp keeps pair 0, blends
/// pairs 1-3 and interpolates the rest.
#[test]
fn yarn_frequencies_equal_transformers() {
    let r = reference("qwen2-yarn");
    let want: Vec<f64> = r["rope_inv_freq"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let want_scaling = r["rope_attention_scaling"].as_f64().unwrap();
    let b = exact(1);
    for format in [Format::Safetensors, Format::Gguf] {
        let c = load("qwen2-yarn", format, &b).config;
        let rope = &c.rope_global;
        let factors = rope.freq_factors.as_ref().expect("YaRN sets divisors");
        assert_eq!(factors.len(), want.len());
        for (i, (&f, &w)) in factors.iter().zip(&want).enumerate() {
            let got = f64::from(rope.freq_scale)
                * f64::from(rope.base).powf(-2.0 * i as f64 / c.rope_dim as f64)
                / f64::from(f);
            assert!(
                (got - w).abs() <= 1e-6 * w,
                "{format:?} pair {i}: {got} vs transformers' {w}"
            );
        }
        assert!(
            (f64::from(rope.mscale) - want_scaling).abs() < 1e-6,
            "{format:?}: attention factor {} vs {want_scaling}",
            rope.mscale
        );
        // Kept, blended and interpolated pairs all occur.
        assert_eq!(factors[0], 1.0);
        assert!(factors[1] > 1.0 && factors[1] < 4.0);
        assert_eq!(factors[7], 4.0);
    }
}

/// Rope scalings and quantizations kiln does not implement are refused by name, from either
/// format.
#[test]
fn unsupported_scalings_and_quantizations_are_refused_by_name() {
    let dir = fixture("llama");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let st = kiln_formats::SafetensorsModel::open(&dir).unwrap();
    let b = exact(1);
    let try_config = |edit: &dyn Fn(&mut Value)| {
        let mut c = config.clone();
        edit(&mut c);
        let hf = kiln_models::hf::HfConfig::parse("config.json", &c.to_string()).unwrap();
        kiln_models::load_hf_decoder_from(&b, &hf, &st)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let e = try_config(&|c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "fourier", "factor": 4.0})
    });
    assert!(
        e.contains("\"fourier\"") && e.contains("not supported"),
        "{e}"
    );
    let e = try_config(&|c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 0.5})
    });
    assert!(e.contains("dynamic") && e.contains("factor"), "{e}");
    let e = try_config(&|c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": -2.0})
    });
    assert!(e.contains("factor") && e.contains("-2"), "{e}");
    let e = try_config(&|c| {
        c["quantization_config"] = serde_json::json!({"quant_method": "awq", "bits": 4})
    });
    assert!(e.contains("awq"), "{e}");
    let e = try_config(&|c| {
        c["quantization_config"] =
            serde_json::json!({"quant_method": "gptq", "bits": 3, "group_size": 128})
    });
    assert!(e.contains("3 bits"), "{e}");
    let e = try_config(&|c| c["hidden_act"] = "gelu".into());
    assert!(e.contains("gelu"), "{e}");
    let e = try_config(&|c| c["model_type"] = "gpt_neox".into());
    assert!(e.contains("gpt_neox") && e.contains("not supported"), "{e}");

    // GGUFs with a scaling kiln does not know, and with YaRN missing its factor.
    let file = GgufFile::open(&dir.join("model-f32.gguf")).unwrap();
    let with_scaling = |kind: &str| {
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata() {
            if k != "general.alignment" {
                w.add_meta(k.clone(), v.clone()).unwrap();
            }
        }
        w.add_meta(
            "llama.rope.scaling.type",
            kiln_formats::MetaValue::String(kind.into()),
        )
        .unwrap();
        for t in file.tensors() {
            w.add_tensor(t.name.clone(), &t.dims, t.ty, &file.tensor_data(t))
                .unwrap();
        }
        let f = GgufFile::from_bytes(SharedBytes::from_vec(w.to_bytes())).unwrap();
        load_gguf_decoder(&b, &f).err().unwrap().to_string()
    };
    let e = with_scaling("ntk-by-parts");
    assert!(
        e.contains("\"ntk-by-parts\"") && e.contains("llama.rope.scaling.type"),
        "{e}"
    );
    let e = with_scaling("yarn");
    assert!(e.contains("llama.rope.scaling.factor"), "{e}");
}
