//! Sliding-window layers in a ring ([`WindowedLayers::Ring`], the default) against the full
//! cache ([`WindowedLayers::Full`]), on every fixture family with windows: Gemma 3 (window 8,
//! five local layers of six), Mistral (8), Phi-3 (12) and Qwen2 with its windowed layers
//! switched on (the fixture's config has `use_sliding_window: false`; layers from
//! `max_window_layers` on then see 8 positions).
//!
//! Tolerance: none. Attention reads a ring through a block table, which the backends compute
//! exactly as over contiguous rows, so every hidden state must be the same bits, at every
//! position, for passes of every length (one position, chunks longer than the ring, which make
//! it grow mid-sequence, and batches of sequences at different lengths).

use std::path::{Path, PathBuf};

use kiln_backend::Backend;
use kiln_core::config::LayerAttention;
use kiln_cpu::CpuBackend;
use kiln_formats::GgufFile;
use kiln_models::{
    load_gguf_decoder, load_hf_decoder, Decoder, KvCache, ModelError, WindowedLayers, RING_BLOCK,
};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family)
}

/// Tokens `0..n` of a fixed pseudo-random stream below `vocab`.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn cache(
    m: &Decoder<CpuBackend>,
    b: &CpuBackend,
    capacity: usize,
    w: WindowedLayers,
) -> KvCache<CpuBackend> {
    KvCache::with_layout(b, &m.config, 0..m.config.n_layers, capacity, w).unwrap()
}

/// Runs one sequence through both caches in passes of `chunks` (cycled) up to the capacity,
/// comparing every hidden state's bits, then two sequences at once.
fn check(m: &Decoder<CpuBackend>, label: &str) {
    let b = CpuBackend::new(2).unwrap();
    let c = &m.config;
    let window = c.widest_window().expect("a windowed family");
    let capacity = c.context_length.min(200);
    let ids = tokens(capacity, c.vocab_size, 7);
    let mut ring = cache(m, &b, capacity, WindowedLayers::Ring);
    let mut full = cache(m, &b, capacity, WindowedLayers::Full);
    // One position, a short chunk, one longer than the ring (it grows with rows to keep), ...
    let chunks = [1, 5, 1, 1, 3 * RING_BLOCK / 2, 1, 1, 9, 1];
    let (mut at, mut pass) = (0, 0);
    while at < capacity {
        let n = chunks[pass % chunks.len()].min(capacity - at);
        let seq = &ids[at..at + n];
        let h_ring = b.to_f32(&m.forward(&b, seq, &mut ring).unwrap()).unwrap();
        let h_full = b.to_f32(&m.forward(&b, seq, &mut full).unwrap()).unwrap();
        let same = h_ring
            .iter()
            .zip(&h_full)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "{label}: pass {pass} (positions {at}..{}) differs",
            at + n
        );
        at += n;
        pass += 1;
    }
    // The windowed layers hold less than the capacity; the global ones all of it.
    let rows = ring.layer_rows();
    for (il, (a, &r)) in c.layer_attention.iter().zip(&rows).enumerate() {
        match a {
            LayerAttention::Global => assert_eq!(r, capacity, "{label}: layer {il}"),
            LayerAttention::Sliding { .. } => assert!(r < capacity, "{label}: layer {il} {r}"),
        }
    }
    assert!(full.layer_rows().iter().all(|&r| r == capacity));
    assert!(ring.kept_from() > 0, "{label}: the ring wrapped");
    // Going back within what the ring holds works; further back is refused, changing nothing.
    let kept = ring.kept_from();
    let err = ring.truncate(kept).unwrap_err();
    assert!(matches!(err, ModelError::WindowOverwritten { .. }), "{err}");
    assert_eq!(ring.len(), capacity);
    let back = capacity - 3;
    assert!(back + 1 >= kept + window);
    ring.truncate(back).unwrap();
    full.truncate(back).unwrap();
    let seq = &ids[back..back + 2];
    let h_ring = b.to_f32(&m.forward(&b, seq, &mut ring).unwrap()).unwrap();
    let h_full = b.to_f32(&m.forward(&b, seq, &mut full).unwrap()).unwrap();
    assert_eq!(h_ring, h_full, "{label}: after truncating");
    ring.truncate(0).unwrap();

    // Two sequences of different lengths in one pass (attention of both at once).
    let other = tokens(capacity, c.vocab_size, 11);
    let mut rings = [
        cache(m, &b, capacity, WindowedLayers::Ring),
        cache(m, &b, capacity, WindowedLayers::Ring),
    ];
    let mut fulls = [
        cache(m, &b, capacity, WindowedLayers::Full),
        cache(m, &b, capacity, WindowedLayers::Full),
    ];
    let (mut a0, mut a1) = (0, 0);
    for (n0, n1) in [(40, 3), (1, 50), (1, 1), (30, 1), (1, 1), (1, 1)] {
        let seqs: [&[u32]; 2] = [&ids[a0..a0 + n0], &other[a1..a1 + n1]];
        let [r0, r1] = &mut rings;
        let [f0, f1] = &mut fulls;
        let hr = m
            .forward_batch(&b, &seqs, &mut [r0, r1], &kiln_models::NoTrace)
            .unwrap();
        let hf = m
            .forward_batch(&b, &seqs, &mut [f0, f1], &kiln_models::NoTrace)
            .unwrap();
        assert_eq!(
            b.to_f32(&hr).unwrap(),
            b.to_f32(&hf).unwrap(),
            "{label}: batch at {a0}, {a1}"
        );
        a0 += n0;
        a1 += n1;
    }
}

#[test]
fn gemma3_ring_equals_full_cache() {
    let b = CpuBackend::new(1).unwrap();
    check(
        &load_hf_decoder(&b, &fixture("gemma3")).unwrap(),
        "gemma3 safetensors",
    );
    let file = GgufFile::open(&fixture("gemma3").join("model-bf16.gguf")).unwrap();
    check(&load_gguf_decoder(&b, &file).unwrap(), "gemma3 gguf");
}

#[test]
fn mistral_ring_equals_full_cache() {
    let b = CpuBackend::new(1).unwrap();
    check(
        &load_hf_decoder(&b, &fixture("mistral")).unwrap(),
        "mistral",
    );
}

#[test]
fn phi3_ring_equals_full_cache() {
    let b = CpuBackend::new(1).unwrap();
    check(&load_hf_decoder(&b, &fixture("phi3")).unwrap(), "phi3");
}

#[test]
fn qwen2_windowed_layers_ring_equals_full_cache() {
    let b = CpuBackend::new(1).unwrap();
    let mut m = load_hf_decoder(&b, &fixture("qwen2")).unwrap();
    // transformers' Qwen2 with use_sliding_window: layers from max_window_layers (1) on.
    for a in m.config.layer_attention.iter_mut().skip(1) {
        *a = LayerAttention::Sliding { window: 8 };
    }
    check(&m, "qwen2 windowed");
}
