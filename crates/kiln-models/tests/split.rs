//! A [`SplitDecoder`] over two CPU backends against the single-backend [`Decoder`], on every
//! family fixture (`tests/fixtures/decoders` at the repository root, see its README), both file formats, at every split
//! point `n` in `0..=L`.
//!
//! Tolerance: none. The CPU backend computes every output element with the same instruction
//! sequence whatever its thread count, the hidden state crosses between the backends as exact
//! f32 copies, and a layer computes the same whichever backend holds it; so every traced
//! intermediate, hidden state and logit must be the same bits (the backends are given different
//! thread counts to show that those do not matter either).
//!
//! The fixtures cover tied output matrices (llama GGUF, qwen2, the GPTQ llama), sliding windows
//! (mistral safetensors: 8, phi3: 12, with prompts longer than the window), fused QKV and
//! long-rope (phi3), QK-norm (qwen3), attention biases (qwen2), mixtures of experts (qwen3moe,
//! mixtral), k-quants (llama-kq) and GPTQ.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_backend::Backend;
use kiln_cpu::CpuBackend;
use kiln_formats::GgufFile;
use kiln_models::{
    load_gguf_decoder, load_gguf_decoder_split, load_hf_decoder, load_hf_decoder_split, CausalLm,
    Decoder, KvCache, ModelError, NoTrace, PagedKvCache, PagedLayout, PagedSeq, SplitDecoder,
    SplitKvCache, Trace,
};
use serde_json::Value;

type Cpu = CpuBackend;

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family)
}

fn reference(family: &str) -> Value {
    let text = std::fs::read_to_string(fixture(family).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The prompts of the fixture's cases (whatever format they are the reference for: only their
/// ids are used) and the first tokens of their greedy continuations.
fn prompts(family: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    reference(family)["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (u32s(&c["ids"]), u32s(&c["greedy"])))
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Format {
    Safetensors,
    Gguf,
}

fn gguf_file(family: &str) -> GgufFile {
    let name = reference(family)["gguf"].as_str().unwrap().to_string();
    GgufFile::open(&fixture(family).join(name)).unwrap()
}

fn load(family: &str, format: Format, b: &Cpu) -> Decoder<Cpu> {
    match format {
        Format::Safetensors => load_hf_decoder(b, &fixture(family)).unwrap(),
        Format::Gguf => load_gguf_decoder(b, &gguf_file(family)).unwrap(),
    }
}

fn load_split(
    family: &str,
    format: Format,
    front: &Cpu,
    back: &Cpu,
    n: usize,
) -> Result<SplitDecoder<Cpu, Cpu>, ModelError> {
    match format {
        Format::Safetensors => load_hf_decoder_split(front, back, &fixture(family), n),
        Format::Gguf => load_gguf_decoder_split(front, back, &gguf_file(family), n),
    }
}

fn bits(b: &Cpu, x: &<Cpu as Backend>::Tensor) -> Vec<u32> {
    b.to_f32(x).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// A traced intermediate: name, layer, shape and bits.
type Traced = (String, usize, (usize, usize), Vec<u32>);

/// Every traced intermediate, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<Traced>>);

impl Trace<Cpu> for Recorder {
    fn trace(&self, b: &Cpu, name: &str, layer: usize, x: &<Cpu as Backend>::Tensor) {
        let entry = (name.to_string(), layer, b.shape(x), bits(b, x));
        self.0.lock().unwrap().push(entry);
    }
}

impl Recorder {
    fn take(&self) -> Vec<Traced> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// The backends: the whole model on one, the split on two others of different thread counts.
struct Backends {
    single: Cpu,
    front: Cpu,
    back: Cpu,
}

fn backends() -> Backends {
    Backends {
        single: CpuBackend::new(2).unwrap(),
        front: CpuBackend::new(1).unwrap(),
        back: CpuBackend::new(3).unwrap(),
    }
}

const DECODE_STEPS: usize = 4;

/// Each prompt alone through contiguous caches: prefill, then decode steps; every traced
/// intermediate (under the model's layer index), hidden state and logit equal; and the same
/// through [`CausalLm`].
fn check_contiguous(
    label: &str,
    bk: &Backends,
    model: &Decoder<Cpu>,
    split: &SplitDecoder<Cpu, Cpu>,
) {
    let Backends {
        single: b,
        front: f,
        back: r,
    } = bk;
    let n = split.front_layers();
    for (p, (prompt, greedy)) in prompts_of(label).iter().enumerate() {
        let capacity = prompt.len() + DECODE_STEPS;
        let mut cache = model.new_cache(b, capacity).unwrap();
        let mut split_cache = split.new_cache(f, r, capacity).unwrap();
        assert_eq!(split_cache.front().layers(), 0..n);
        assert_eq!(split_cache.back().layers(), n..model.config.n_layers);
        let (want_trace, got_trace) = (Recorder::default(), Recorder::default());
        // The prompt, then one token per decode step.
        let inputs = std::iter::once(&prompt[..]).chain(greedy[..DECODE_STEPS].chunks(1));
        for (step, input) in inputs.enumerate() {
            let want = model
                .forward_traced(b, input, &mut cache, &want_trace)
                .unwrap();
            let got = split
                .forward_traced(f, r, input, &mut split_cache, &got_trace)
                .unwrap();
            let what = format!("{label} split {n}, prompt {p}, step {step}");
            let (want_t, got_t) = (want_trace.take(), got_trace.take());
            assert_eq!(want_t.len(), got_t.len(), "{what}: traced intermediates");
            for (w, g) in want_t.iter().zip(&got_t) {
                assert!(w == g, "{what}: {} of layer {} differs", w.0, w.1);
            }
            assert_eq!(bits(b, &want), bits(r, &got), "{what}: hidden states");
            let want_logits = model.logits(b, &want).unwrap();
            let got_logits = split.logits(r, &got).unwrap();
            assert_eq!(
                bits(b, &want_logits),
                bits(r, &got_logits),
                "{what}: logits"
            );
            assert_eq!(split_cache.len(), cache.len());
        }
    }

    // The same through the trait the engine generates with.
    let (single_lm, split_lm) = (model.on(b), split.on(f, r));
    let (prompt, greedy) = &prompts_of(label)[0];
    let mut cache = single_lm.new_cache(prompt.len() + 2).unwrap();
    let mut split_cache = split_lm.new_cache(prompt.len() + 2).unwrap();
    for input in [&prompt[..], &greedy[..1], &greedy[1..2]] {
        let want = single_lm.forward_last(input, &mut cache).unwrap();
        let got = split_lm.forward_last(input, &mut split_cache).unwrap();
        assert_eq!(
            bits(b, &want),
            bits(r, &got),
            "{label} split {n}: CausalLm hidden"
        );
        let (want, got) = (
            single_lm.logits(&want).unwrap(),
            split_lm.logits(&got).unwrap(),
        );
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label} split {n}: CausalLm logits"
        );
    }
}

/// The label's family (labels are `family [format]`).
fn prompts_of(label: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    prompts(label.split(' ').next().unwrap())
}

/// All prompts in one batch through contiguous caches, prefill then batched decode steps.
fn check_batch(label: &str, bk: &Backends, model: &Decoder<Cpu>, split: &SplitDecoder<Cpu, Cpu>) {
    let Backends {
        single: b,
        front: f,
        back: r,
    } = bk;
    let n = split.front_layers();
    let cases = prompts_of(label);
    let mut caches: Vec<KvCache<Cpu>> = cases
        .iter()
        .map(|(p, _)| model.new_cache(b, p.len() + DECODE_STEPS).unwrap())
        .collect();
    let mut split_caches: Vec<SplitKvCache<Cpu, Cpu>> = cases
        .iter()
        .map(|(p, _)| split.new_cache(f, r, p.len() + DECODE_STEPS).unwrap())
        .collect();
    let mut inputs: Vec<Vec<u32>> = cases.iter().map(|(p, _)| p.clone()).collect();
    for step in 0..=DECODE_STEPS {
        let seqs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut refs: Vec<&mut KvCache<Cpu>> = caches.iter_mut().collect();
        let want = model.forward_batch(b, &seqs, &mut refs, &NoTrace).unwrap();
        let mut refs: Vec<&mut SplitKvCache<Cpu, Cpu>> = split_caches.iter_mut().collect();
        let got = split
            .forward_batch(f, r, &seqs, &mut refs, &NoTrace)
            .unwrap();
        let what = format!("{label} split {n}, batch step {step}");
        assert_eq!(bits(b, &want), bits(r, &got), "{what}: hidden states");
        let want_logits = model.logits(b, &want).unwrap();
        let got_logits = split.logits(r, &got).unwrap();
        assert_eq!(
            bits(b, &want_logits),
            bits(r, &got_logits),
            "{what}: logits"
        );
        inputs = cases.iter().map(|(_, g)| vec![g[step]]).collect();
    }
}

/// All prompts in one batch through paged caches (blocks of 3 positions scattered through the
/// pool in a shuffled order), the split's two parts under the same tables.
fn check_paged(label: &str, bk: &Backends, model: &Decoder<Cpu>, split: &SplitDecoder<Cpu, Cpu>) {
    let Backends {
        single: b,
        front: f,
        back: r,
    } = bk;
    let n = split.front_layers();
    let cases = prompts_of(label);
    let max_positions = cases.iter().map(|(p, _)| p.len()).max().unwrap() + DECODE_STEPS;
    let block_size = 3;
    let per_seq = max_positions.div_ceil(block_size);
    let n_blocks = per_seq * cases.len() + 4;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..ids.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let tables: Vec<&[u32]> = ids.chunks(per_seq).take(cases.len()).collect();
    let mut paged =
        PagedKvCache::new(b, &model.config, n_blocks, block_size, max_positions).unwrap();
    let layout = PagedLayout {
        n_blocks,
        window_blocks: None,
        block_size,
        max_positions,
    };
    let mut split_paged = split.new_paged_cache(f, r, &layout).unwrap();
    assert_eq!(split_paged.front().layers(), 0..n);
    assert_eq!(split_paged.back().n_blocks(), n_blocks);
    let mut lens = vec![0usize; cases.len()];
    let mut inputs: Vec<Vec<u32>> = cases.iter().map(|(p, _)| p.clone()).collect();
    for step in 0..=DECODE_STEPS {
        let seqs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        let views: Vec<PagedSeq<'_>> = tables
            .iter()
            .zip(&lens)
            .map(|(&table, &len)| PagedSeq::new(table, len))
            .collect();
        let want = model
            .forward_paged(b, &seqs, &mut paged, &views, &NoTrace)
            .unwrap();
        let got = split
            .forward_paged(f, r, &seqs, &mut split_paged, &views, &NoTrace)
            .unwrap();
        let what = format!("{label} split {n}, paged step {step}");
        assert_eq!(bits(b, &want), bits(r, &got), "{what}: hidden states");
        let want_logits = model.logits(b, &want).unwrap();
        let got_logits = split.logits(r, &got).unwrap();
        assert_eq!(
            bits(b, &want_logits),
            bits(r, &got_logits),
            "{what}: logits"
        );
        for (len, input) in lens.iter_mut().zip(&seqs) {
            *len += input.len();
        }
        inputs = cases.iter().map(|(_, g)| vec![g[step]]).collect();
    }
}

/// Every split point of `family` in `format`, and one past the last, which is an error.
fn check_family(family: &str, format: Format) {
    let label = format!("{family} [{format:?}]");
    let bk = backends();
    let model = load(family, format, &bk.single);
    let layers = model.config.n_layers;
    assert!(layers >= 2, "{label}: a split needs layers on both sides");
    for n in 0..=layers {
        let split = load_split(family, format, &bk.front, &bk.back, n).unwrap();
        assert_eq!((split.front.len(), split.back.len()), (n, layers - n));
        check_contiguous(&label, &bk, &model, &split);
        check_batch(&label, &bk, &model, &split);
        check_paged(&label, &bk, &model, &split);
    }
    match load_split(family, format, &bk.front, &bk.back, layers + 1) {
        Err(ModelError::SplitPoint {
            front_layers,
            n_layers,
        }) => assert_eq!((front_layers, n_layers), (layers + 1, layers)),
        Err(e) => panic!("{label}: split after layer {}: {e}", layers + 1),
        Ok(_) => panic!("{label}: split after layer {} loaded", layers + 1),
    }
}

macro_rules! split_tests {
    ($($name:ident: $family:literal [$($format:ident),*],)*) => {
        $(
            #[test]
            fn $name() {
                $(check_family($family, Format::$format);)*
            }
        )*
    };
}

split_tests! {
    llama: "llama" [Safetensors, Gguf],
    mistral: "mistral" [Safetensors, Gguf],
    qwen2: "qwen2" [Safetensors, Gguf],
    qwen3: "qwen3" [Safetensors, Gguf],
    phi3: "phi3" [Safetensors, Gguf],
    qwen3moe: "qwen3moe" [Safetensors, Gguf],
    qwen2moe: "qwen2moe" [Safetensors, Gguf],
    qwen2moe_mixed: "qwen2moe-mixed" [Safetensors],
    gemma3: "gemma3" [Safetensors, Gguf],
    gemma3_mm: "gemma3-mm" [Safetensors],
    mixtral: "mixtral" [Safetensors, Gguf],
    llama_kq: "llama-kq" [Gguf],
    llama_gptq: "llama-gptq-g32" [Safetensors],
}

/// A tied output matrix (the llama GGUF has no `output.weight`) is the embedding table on both
/// backends: looked up on the front, multiplied by on the back.
#[test]
fn tied_output_is_the_embedding_table_on_the_back() {
    let file = gguf_file("llama");
    assert!(file.tensor("output.weight").is_none());
    let bk = backends();
    let split = load_gguf_decoder_split(&bk.front, &bk.back, &file, 1).unwrap();
    let c = &split.config;
    let ids: Vec<u32> = (0..c.vocab_size as u32).step_by(37).collect();
    // Row `id` of the output matrix is the embedding of `id`: multiply one-hot rows by it.
    let mut one_hot = vec![0f32; ids.len() * c.d_model];
    let mut want = Vec::new();
    let table = bk.front.embedding(&split.token_embd, &ids).unwrap();
    let table = bk.front.to_f32(&table).unwrap();
    for row in 0..ids.len() {
        // logits[row][id] = embd[id] · embd[id]
        let e = &table[row * c.d_model..(row + 1) * c.d_model];
        want.push(e.iter().map(|x| x * x).sum::<f32>());
        one_hot[row * c.d_model..(row + 1) * c.d_model].copy_from_slice(e);
    }
    let x = bk
        .back
        .tensor_from_f32(&one_hot, ids.len(), c.d_model)
        .unwrap();
    let logits = bk
        .back
        .to_f32(&split.logits(&bk.back, &x).unwrap())
        .unwrap();
    for (row, (&id, w)) in ids.iter().zip(&want).enumerate() {
        let got = logits[row * c.vocab_size + id as usize];
        assert!(
            (got - w).abs() <= 1e-4 * w.abs(),
            "token {id}: {got} vs {w}"
        );
    }
}

/// Caches that do not hold the layers of the run they are given, and layer ranges outside the
/// model, are typed errors, never panics.
#[test]
fn mismatched_caches_and_layer_ranges_are_errors() {
    let bk = backends();
    let model = load("llama", Format::Gguf, &bk.single);
    let c = &model.config;
    let ids = [1u32, 2, 3];
    // A cache of the first layer only, given to the whole model.
    let mut part = KvCache::for_layers(&bk.single, c, 0..1, 8).unwrap();
    let e = model.forward(&bk.single, &ids, &mut part).unwrap_err();
    assert!(matches!(e, ModelError::Batch(_)), "{e}");
    assert!(part.is_empty(), "a failed pass counts no position");
    // A split cache made for another split point.
    let split = load_split("llama", Format::Gguf, &bk.front, &bk.back, 1).unwrap();
    let mut other = SplitKvCache::new(&bk.front, &bk.back, c, 2, 8).unwrap();
    let e = split
        .forward(&bk.front, &bk.back, &ids, &mut other)
        .unwrap_err();
    assert!(matches!(e, ModelError::Batch(_)), "{e}");
    assert!(other.is_empty(), "a failed pass counts no position");
    // Ranges outside the model.
    let e = KvCache::for_layers(&bk.single, c, 1..3, 8).err().unwrap();
    assert!(matches!(e, ModelError::LayerRange { .. }), "{e}");
    let layout = PagedLayout {
        n_blocks: 4,
        window_blocks: None,
        block_size: 4,
        max_positions: 16,
    };
    let e = PagedKvCache::with_layout(&bk.single, c, 0..3, &layout)
        .err()
        .unwrap();
    assert!(matches!(e, ModelError::LayerRange { .. }), "{e}");
    let e = SplitKvCache::new(&bk.front, &bk.back, c, 3, 8)
        .err()
        .unwrap();
    assert!(matches!(e, ModelError::SplitPoint { .. }), "{e}");
    assert!(
        e.to_string().contains("3 layers") && e.to_string().contains("has 2"),
        "{e}"
    );
}
