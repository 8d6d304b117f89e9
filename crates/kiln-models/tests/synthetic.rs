//! Loading and running a tiny random Gemma-3-shaped GGUF written on the fly: the loader's checks
//! (types refused by name, missing tensors, wrong shapes) and the forward pass's invariants
//! (decoding token by token equals one prefill; thread counts do not change results).

use kiln_backend::Backend;
use kiln_core::{GgmlType, SharedBytes};
use kiln_cpu::CpuBackend;
use kiln_formats::{GgufFile, GgufWriter, MetaValue};
use kiln_models::{load_gguf_decoder, ModelError};

const D: usize = 64;
const HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const FFN: usize = 96;
const VOCAB: usize = 50;
const LAYERS: usize = 6; // the sliding-window pattern has one global layer in six
const WINDOW: usize = 4;

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A tiny Gemma 3 file; `tweak(name, dims, ty, bytes)` may change a tensor before it is written
/// (return None to leave it out).
fn tiny_gemma3(
    tweak: impl Fn(&str, Vec<u64>) -> Option<(Vec<u64>, GgmlType, Vec<u8>)>,
) -> GgufFile {
    let mut w = GgufWriter::new();
    let meta: Vec<(&str, MetaValue)> = vec![
        ("general.architecture", "gemma3".into()),
        ("gemma3.embedding_length", MetaValue::U32(D as u32)),
        ("gemma3.block_count", MetaValue::U32(LAYERS as u32)),
        ("gemma3.feed_forward_length", MetaValue::U32(FFN as u32)),
        ("gemma3.attention.head_count", MetaValue::U32(HEADS as u32)),
        ("gemma3.attention.head_count_kv", MetaValue::U32(1)),
        (
            "gemma3.attention.key_length",
            MetaValue::U32(HEAD_DIM as u32),
        ),
        (
            "gemma3.attention.value_length",
            MetaValue::U32(HEAD_DIM as u32),
        ),
        (
            "gemma3.attention.sliding_window",
            MetaValue::U32(WINDOW as u32),
        ),
        (
            "gemma3.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-6),
        ),
        ("gemma3.context_length", MetaValue::U32(128)),
        ("gemma3.rope.freq_base", MetaValue::F32(1e6)),
    ];
    for (k, v) in meta {
        w.add_meta(k, v).unwrap();
    }
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![D as u64, VOCAB as u64]),
        ("output_norm.weight".into(), vec![D as u64]),
    ];
    for i in 0..LAYERS {
        let kv = HEAD_DIM as u64;
        for (role, dims) in [
            ("attn_norm.weight", vec![D as u64]),
            ("attn_q.weight", vec![D as u64, (HEADS * HEAD_DIM) as u64]),
            ("attn_k.weight", vec![D as u64, kv]),
            ("attn_v.weight", vec![D as u64, kv]),
            ("attn_q_norm.weight", vec![kv]),
            ("attn_k_norm.weight", vec![kv]),
            (
                "attn_output.weight",
                vec![(HEADS * HEAD_DIM) as u64, D as u64],
            ),
            ("post_attention_norm.weight", vec![D as u64]),
            ("ffn_norm.weight", vec![D as u64]),
            ("ffn_gate.weight", vec![D as u64, FFN as u64]),
            ("ffn_up.weight", vec![D as u64, FFN as u64]),
            ("ffn_down.weight", vec![FFN as u64, D as u64]),
            ("post_ffw_norm.weight", vec![D as u64]),
        ] {
            tensors.push((format!("blk.{i}.{role}"), dims));
        }
    }
    for (name, dims) in tensors {
        let Some((dims, ty, bytes)) = tweak(&name, dims) else {
            continue;
        };
        w.add_tensor(name, &dims, ty, &bytes).unwrap();
    }
    GgufFile::from_bytes(SharedBytes::from_vec(w.to_bytes())).unwrap()
}

/// F32 tensors: norms near 1, matrices small random.
fn random_f32(name: &str, dims: Vec<u64>) -> Option<(Vec<u64>, GgmlType, Vec<u8>)> {
    let n: u64 = dims.iter().product();
    let seed = name
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let mut v = values(n as usize, seed, if dims.len() == 1 { 0.2 } else { 0.3 });
    if dims.len() == 1 {
        v.iter_mut().for_each(|x| *x += 1.0);
    }
    Some((dims, GgmlType::F32, f32_bytes(&v)))
}

fn logits_of(b: &CpuBackend, file: &GgufFile, ids: &[u32], one_by_one: bool) -> Vec<f32> {
    let model = load_gguf_decoder(b, file).unwrap();
    let mut cache = model.new_cache(b, ids.len()).unwrap();
    let hidden = if one_by_one {
        let mut last = None;
        for &id in ids {
            last = Some(model.forward(b, &[id], &mut cache).unwrap());
        }
        last.unwrap()
    } else {
        let h = model.forward(b, ids, &mut cache).unwrap();
        b.rows(&h, ids.len() - 1..ids.len()).unwrap()
    };
    b.to_f32(&model.logits(b, &hidden).unwrap()).unwrap()
}

#[test]
fn decoding_token_by_token_equals_one_prefill_and_threads_do_not_matter() {
    let file = tiny_gemma3(random_f32);
    // Longer than the window, so the sliding layers drop early positions.
    let ids: Vec<u32> = (0..11).map(|i| (i * 7 % VOCAB) as u32).collect();
    let b1 = CpuBackend::new(1).unwrap();
    let b2 = CpuBackend::new(2).unwrap();
    let prefill = logits_of(&b1, &file, &ids, false);
    assert_eq!(prefill.len(), VOCAB);
    let stepwise = logits_of(&b1, &file, &ids, true);
    for (a, c) in prefill.iter().zip(&stepwise) {
        assert!(
            (a - c).abs() <= 1e-4 * (1.0 + a.abs()),
            "prefill {a} vs stepwise {c}"
        );
    }
    assert_eq!(
        prefill,
        logits_of(&b2, &file, &ids, false),
        "2 threads changed the logits"
    );
    // The window matters: a token outside every window but the global layer's still counts,
    // so changing the first token changes the last logits.
    let mut other = ids.clone();
    other[0] = 1;
    assert_ne!(prefill, logits_of(&b1, &file, &other, false));
}

#[test]
fn unsupported_types_are_refused_by_name() {
    let file = tiny_gemma3(|name, dims| {
        if name == "blk.2.ffn_up.weight" {
            // IQ2_XXS blocks are 256 elements: make the row one block wide.
            let blocks = dims[1];
            Some((
                vec![256, blocks],
                GgmlType::IQ2_XXS,
                vec![0; 66 * blocks as usize],
            ))
        } else {
            random_f32(name, dims)
        }
    });
    let err = load_gguf_decoder(&CpuBackend::new(1).unwrap(), &file)
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            ModelError::UnsupportedType {
                ty: GgmlType::IQ2_XXS,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("blk.2.ffn_up.weight") && msg.contains("IQ2_XXS"),
        "{msg}"
    );
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let file = tiny_gemma3(|name, dims| {
        if name == "blk.4.attn_k.weight" {
            None
        } else {
            random_f32(name, dims)
        }
    });
    let err = load_gguf_decoder(&CpuBackend::new(1).unwrap(), &file)
        .err()
        .unwrap();
    assert!(err.to_string().contains("blk.4.attn_k.weight"), "{err}");

    let file = tiny_gemma3(|name, dims| {
        if name == "blk.0.ffn_down.weight" {
            random_f32(name, vec![dims[0], dims[1] + 1])
        } else {
            random_f32(name, dims)
        }
    });
    let err = load_gguf_decoder(&CpuBackend::new(1).unwrap(), &file)
        .err()
        .unwrap();
    assert!(
        matches!(err, ModelError::Shape { .. })
            && err.to_string().contains("blk.0.ffn_down.weight"),
        "{err}"
    );
}

#[test]
fn bad_tokens_and_a_full_cache_are_errors_not_panics() {
    let file = tiny_gemma3(random_f32);
    let b = CpuBackend::new(1).unwrap();
    let model = load_gguf_decoder(&b, &file).unwrap();
    let mut cache = model.new_cache(&b, 4).unwrap();
    assert!(matches!(
        model.forward(&b, &[VOCAB as u32], &mut cache),
        Err(ModelError::BadToken { .. })
    ));
    assert!(matches!(
        model.forward(&b, &[1, 2, 3, 4, 5], &mut cache),
        Err(ModelError::ContextFull { .. })
    ));
    assert!(
        cache.is_empty(),
        "a failed forward must not advance the cache"
    );
    model.forward(&b, &[1, 2, 3, 4], &mut cache).unwrap();
    assert_eq!(cache.len(), 4);
}

#[test]
fn unknown_architectures_are_refused() {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", "mamba".into()).unwrap();
    let file = GgufFile::from_bytes(SharedBytes::from_vec(w.to_bytes())).unwrap();
    let err = load_gguf_decoder(&CpuBackend::new(1).unwrap(), &file)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("mamba") && err.to_string().contains("gemma3"),
        "{err}"
    );
}
