//! `kiln synth --shape NAME -o OUT.gguf`: a GGUF file with the tensor names, shapes and metadata
//! of a real model and random weights in a quantization mix, so that speed and memory can be
//! measured at real shapes (`kiln run`, `kiln bench`, `kiln plan`) without the checkpoint. The
//! text such a model writes is meaningless.
//!
//! - **Shapes** are the models' published Hugging Face `config.json`, read by kiln-models as any
//!   checkpoint is read. Llama 3.x keeps its `llama3` rope scaling (context 131072): the per-pair
//!   frequency divisors transformers computes become `rope_freqs.weight`, as llama.cpp's
//!   converter writes them. `--layers N` changes the layer count and nothing else.
//! - **Tensors** are named and shaped as llama.cpp names them (`blk.N.attn_q.weight`, ggml
//!   order); Qwen3 adds its per-head `attn_q_norm`/`attn_k_norm`; a tied model has no
//!   `output.weight`. Types come from [`kiln_quant::plan_types`] for a model whose weights are
//!   all F32: what `kiln quantize` (and llama-quantize) would make of the real F32 model.
//! - **Weights** are deterministic in `--seed` and the tensor's name only (so a file of fewer
//!   layers holds the same values in the layers it has): each value is a sum of four uniforms
//!   (bell-shaped, std 0.02, within ±3.5 std) from a counter-based splitmix64; norms are 1.0.
//!   They are quantized with [`kiln_quant::quantize`] (parallel inside).
//! - **Tokenizer**: SentencePiece (`tokenizer.ggml.model = "llama"`) with `<unk>`, `<s>`, `</s>`,
//!   the 256 byte tokens `<0x00>`..`<0xFF>` and made-up pieces (printable ASCII, then lowercase
//!   strings, each alone and after `▁`), one token per row of the embedding table.
//! - **Streaming**: the header is computed first, then each tensor is generated, quantized and
//!   written a slab of rows at a time (memory stays near one slab), into a temporary file renamed
//!   over OUT only when complete (see [`super::gguf_out`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use indicatif::ProgressBar;
use kiln_core::config::DecoderConfig;
use kiln_core::GgmlType;
use kiln_formats::{MetaArray, MetaType, MetaValue, DEFAULT_ALIGNMENT};
use kiln_models::hf::HfConfig;
use kiln_quant::mix::{MixModel, MixTensor};
use kiln_quant::{plan_types, QuantMix};
use rayon::prelude::*;

use super::gguf_out::{
    header, lay_out, progress_bar, write_padding, OutTensor, TempFile, SLAB_ELEMENTS,
};
use super::quantize::mix_parser;

#[derive(clap::Args)]
pub struct SynthArgs {
    /// The model whose shapes to copy.
    #[arg(long, value_enum)]
    shape: Shape,
    /// The quantization mix (case-insensitive).
    #[arg(long = "type", value_name = "TYPE", ignore_case = true, value_parser = mix_parser(),
          default_value = "q4_k_m")]
    mix: QuantMix,
    /// Layers to write instead of the model's own count (small files for tests).
    #[arg(long, value_name = "N", value_parser = layer_count)]
    layers: Option<u32>,
    /// Seed of the random weights (the same seed, shape, type and layers give the same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the model (replaced only once it is complete).
    #[arg(short = 'o', long = "output", value_name = "OUT.gguf")]
    output: PathBuf,
}

/// `--layers`: a whole number of at least 1.
fn layer_count(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("a model needs at least one layer".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a layer count: {e}")),
    }
}

/// The models `--shape` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Shape {
    /// Llama 3.2 1B: d 2048, 16 layers, 32/8 heads of 64, FFN 8192, tied embeddings.
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    /// Llama 3.1 8B: d 4096, 32 layers, 32/8 heads of 128, FFN 14336.
    #[value(name = "llama-3.1-8b")]
    Llama31_8b,
    /// Qwen3 0.6B: d 1024, 28 layers, 16/8 heads of 128, FFN 3072, QK norms, tied embeddings.
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
}

/// meta-llama/Llama-3.2-1B `config.json`, as published.
const LLAMA_3_2_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "vocab_size": 128256
}"#;

/// meta-llama/Llama-3.1-8B `config.json`, as published.
const LLAMA_3_1_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "vocab_size": 128256
}"#;

/// Qwen/Qwen3-0.6B `config.json`, as published.
const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Llama32_1b => "llama-3.2-1b",
            Shape::Llama31_8b => "llama-3.1-8b",
            Shape::Qwen3_0_6b => "qwen3-0.6b",
        }
    }

    fn config_json(self) -> &'static str {
        match self {
            Shape::Llama32_1b => LLAMA_3_2_1B,
            Shape::Llama31_8b => LLAMA_3_1_8B,
            Shape::Qwen3_0_6b => QWEN3_0_6B,
        }
    }

    /// `general.architecture`, as llama.cpp's converter names the family.
    fn architecture(self) -> &'static str {
        match self {
            Shape::Llama32_1b | Shape::Llama31_8b => "llama",
            Shape::Qwen3_0_6b => "qwen3",
        }
    }

    /// Whether each layer normalises query and key heads (Qwen3's `q_norm`/`k_norm`).
    fn qk_norm(self) -> bool {
        self == Shape::Qwen3_0_6b
    }
}

/// A model to write: the shape's configuration and the layer count of the file.
struct Model {
    shape: Shape,
    config: DecoderConfig,
    n_layers: usize,
    tied_embeddings: bool,
}

impl Model {
    fn new(shape: Shape, layers: Option<u32>) -> Result<Model> {
        let file = format!("{} config.json", shape.name());
        let hf = HfConfig::parse(&file, shape.config_json())?;
        let config = kiln_models::arch::hf_decoder_shape(&hf)?;
        let tied_embeddings = hf.bool_or("tie_word_embeddings", false)?;
        let n_layers = layers.map_or(config.n_layers, |n| n as usize);
        Ok(Model {
            shape,
            config,
            n_layers,
            tied_embeddings,
        })
    }
}

/// What a tensor's values are.
enum Fill {
    /// Bell-shaped random weights, std [`WEIGHT_STD`], from the stream `stream`.
    Random { stream: u64 },
    /// Norm weights.
    Ones,
    /// Given values (rope frequency factors).
    Values(Arc<[f32]>),
}

struct SynthTensor {
    name: String,
    /// ggml order: `dims[0]` is the row length.
    dims: Vec<u64>,
    fill: Fill,
}

/// The standard deviation of random weights (transformers' `initializer_range` for these models).
const WEIGHT_STD: f32 = 0.02;

/// splitmix64's output function of state `z`.
fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64's increment.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The random stream of tensor `name` under `seed` (FNV-1a of the name, mixed with the seed).
fn stream_of(seed: u64, name: &str) -> u64 {
    let fnv = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    });
    splitmix64(seed.wrapping_mul(GOLDEN_GAMMA) ^ fnv)
}

/// Element `i` of stream `stream`: the sum of four 16-bit uniforms on (0, 1), centred (variance
/// 4/12) and scaled to [`WEIGHT_STD`]. Counter-based, so any slice is computed independently.
fn random_weight(stream: u64, i: u64) -> f32 {
    let bits = splitmix64(stream.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)));
    let sum: f32 = (0..4)
        .map(|k| ((bits >> (16 * k)) & 0xFFFF) as f32 + 0.5)
        .sum::<f32>()
        / 65536.0;
    // sqrt(3): one over the standard deviation of a sum of four unit uniforms.
    (sum - 2.0) * (WEIGHT_STD * 3f32.sqrt())
}

impl Fill {
    /// Values `start..start + out.len()` of the tensor.
    fn fill(&self, start: usize, out: &mut [f32]) -> Result<()> {
        match self {
            Fill::Random { stream } => {
                const CHUNK: usize = 1 << 16;
                out.par_chunks_mut(CHUNK)
                    .enumerate()
                    .for_each(|(c, chunk)| {
                        let first = (start + c * CHUNK) as u64;
                        for (j, v) in chunk.iter_mut().enumerate() {
                            *v = random_weight(*stream, first + j as u64);
                        }
                    });
            }
            Fill::Ones => out.fill(1.0),
            Fill::Values(values) => {
                let src = values
                    .get(start..start + out.len())
                    .context("fewer values than elements")?;
                out.copy_from_slice(src);
            }
        }
        Ok(())
    }
}

/// Every tensor of the model (rope factors, embeddings, layers, output).
fn tensors(model: &Model, seed: u64) -> Vec<SynthTensor> {
    let c = &model.config;
    let (d, vocab, ffn) = (c.d_model as u64, c.vocab_size as u64, c.ffn_dim as u64);
    let mut out = Vec::new();
    // First, as llama.cpp's converter writes it.
    if let Some(factors) = &c.rope_global.freq_factors {
        out.push(SynthTensor {
            name: "rope_freqs.weight".into(),
            dims: vec![factors.len() as u64],
            fill: Fill::Values(factors.clone()),
        });
    }
    let mut push = |name: String, dims: Vec<u64>| {
        let fill = if dims.len() == 1 {
            Fill::Ones
        } else {
            Fill::Random {
                stream: stream_of(seed, &name),
            }
        };
        out.push(SynthTensor { name, dims, fill });
    };
    push("token_embd.weight".into(), vec![d, vocab]);
    for i in 0..model.n_layers {
        let p = |role: &str| format!("blk.{i}.{role}.weight");
        push(p("attn_norm"), vec![d]);
        push(p("attn_q"), vec![d, c.q_dim() as u64]);
        push(p("attn_k"), vec![d, c.kv_dim() as u64]);
        push(p("attn_v"), vec![d, c.v_dim() as u64]);
        if model.shape.qk_norm() {
            push(p("attn_q_norm"), vec![c.head_dim as u64]);
            push(p("attn_k_norm"), vec![c.head_dim as u64]);
        }
        push(p("attn_output"), vec![(c.n_heads * c.head_dim_v) as u64, d]);
        push(p("ffn_norm"), vec![d]);
        push(p("ffn_gate"), vec![d, ffn]);
        push(p("ffn_up"), vec![d, ffn]);
        push(p("ffn_down"), vec![ffn, d]);
    }
    push("output_norm.weight".into(), vec![d]);
    if !model.tied_embeddings {
        push("output.weight".into(), vec![d, vocab]);
    }
    out
}

/// `general.*`, the architecture's keys that kiln and llama.cpp read, and the tokenizer.
fn metadata(model: &Model, mix: QuantMix) -> Result<Vec<(String, MetaValue)>> {
    let c = &model.config;
    let arch = model.shape.architecture();
    let count = |n: usize| -> Result<MetaValue> { Ok(MetaValue::U32(u32::try_from(n)?)) };
    let mut meta: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), arch.into()),
        (
            "general.name".into(),
            format!("{} (kiln synth: random weights)", model.shape.name()).into(),
        ),
        ("general.file_type".into(), MetaValue::U32(mix.file_type())),
        ("general.quantization_version".into(), MetaValue::U32(2)),
    ];
    for (key, value) in [
        ("context_length", count(c.context_length)?),
        ("embedding_length", count(c.d_model)?),
        ("block_count", count(model.n_layers)?),
        ("feed_forward_length", count(c.ffn_dim)?),
        ("attention.head_count", count(c.n_heads)?),
        ("attention.head_count_kv", count(c.n_kv_heads)?),
        ("rope.freq_base", MetaValue::F32(c.rope_global.base)),
        (
            "attention.layer_norm_rms_epsilon",
            MetaValue::F32(c.norm_eps),
        ),
        ("attention.key_length", count(c.head_dim)?),
        ("attention.value_length", count(c.head_dim_v)?),
        ("rope.dimension_count", count(c.rope_dim)?),
        ("vocab_size", count(c.vocab_size)?),
    ] {
        meta.push((format!("{arch}.{key}"), value));
    }
    meta.extend(tokenizer_metadata(c.vocab_size)?);
    Ok(meta)
}

/// A SentencePiece vocabulary of `vocab_size` tokens: `<unk>`, `<s>`, `</s>`, the byte tokens,
/// then made-up pieces scored so that shorter pieces merge first.
fn tokenizer_metadata(vocab_size: usize) -> Result<Vec<(String, MetaValue)>> {
    const UNKNOWN: i32 = 2;
    const CONTROL: i32 = 3;
    const BYTE: i32 = 6;
    const NORMAL: i32 = 1;
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), BYTE);
    if vocab_size < tokens.len() {
        bail!(
            "a vocabulary of {vocab_size} cannot hold the {} special and byte tokens",
            tokens.len()
        );
    }
    let n_special = tokens.len();
    tokens.extend(made_up_pieces().take(vocab_size - n_special));
    types.resize(tokens.len(), NORMAL);
    let scores = (0..tokens.len()).map(|id| match id.checked_sub(n_special) {
        Some(rank) => MetaValue::F32(-(rank as f32)),
        None => MetaValue::F32(0.0),
    });
    let array = |ty, items: Vec<MetaValue>| MetaValue::Array(MetaArray::new(ty, items));
    Ok(vec![
        ("tokenizer.ggml.model".into(), "llama".into()),
        (
            "tokenizer.ggml.tokens".into(),
            array(
                MetaType::String,
                tokens.into_iter().map(MetaValue::String).collect(),
            ),
        ),
        (
            "tokenizer.ggml.scores".into(),
            array(MetaType::F32, scores.collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            array(
                MetaType::I32,
                types.into_iter().map(MetaValue::I32).collect(),
            ),
        ),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(0)),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(true)),
        (
            "tokenizer.ggml.add_eos_token".into(),
            MetaValue::Bool(false),
        ),
    ])
}

/// Distinct pieces without end: `▁`, each printable ASCII character alone and after `▁`, then
/// the lowercase strings of 2, 3, ... letters, each alone and after `▁`.
fn made_up_pieces() -> impl Iterator<Item = String> {
    let singles = ('!'..='~').flat_map(|c| [c.to_string(), format!("▁{c}")]);
    let words = (2u32..).flat_map(|len| {
        (0..26u64.pow(len)).flat_map(move |mut n| {
            let mut word = vec![b'a'; len as usize];
            for letter in word.iter_mut().rev() {
                *letter = b'a' + (n % 26) as u8;
                n /= 26;
            }
            let word = String::from_utf8_lossy(&word).into_owned();
            [format!("▁{word}"), word]
        })
    });
    std::iter::once("▁".to_string()).chain(singles).chain(words)
}

pub fn run(a: SynthArgs) -> Result<()> {
    let started = Instant::now();
    let model = Model::new(a.shape, a.layers)?;
    let tensors = tensors(&model, a.seed);
    let mix_model = MixModel {
        architecture: model.shape.architecture().to_owned(),
        n_layer: u32::try_from(model.n_layers)?,
        n_head: u32::try_from(model.config.n_heads)?,
        n_head_kv: u32::try_from(model.config.n_kv_heads)?,
        n_expert: 0,
    };
    let mix_tensors: Vec<MixTensor> = tensors
        .iter()
        .map(|t| MixTensor {
            name: &t.name,
            dims: &t.dims,
            ty: GgmlType::F32,
        })
        .collect();
    let plans = plan_types(a.mix, &mix_model, &mix_tensors)?;
    let alignment = DEFAULT_ALIGNMENT;
    let layout = lay_out(
        tensors
            .iter()
            .zip(&plans)
            .map(|(t, p)| (t.name.as_str(), t.dims.as_slice(), p.ty)),
        alignment,
    )?;
    let header = header(&metadata(&model, a.mix)?, layout.iter(), alignment);

    let mut tmp = TempFile::create(&a.output)?;
    let total: u64 = tensors.iter().map(|t| t.dims.iter().product::<u64>()).sum();
    let bar = progress_bar(total);
    let path = tmp.path.clone();
    let write_err = || format!("writing {}", path.display());
    tmp.writer.write_all(&header).with_context(write_err)?;
    for (t, out) in tensors.iter().zip(&layout) {
        bar.set_message(t.name.clone());
        write_tensor(t, out, &mut tmp.writer, &bar)
            .with_context(|| format!("writing tensor {} as {}", t.name, out.ty))?;
        write_padding(&mut tmp.writer, out.n_bytes, alignment).with_context(write_err)?;
    }
    bar.finish_and_clear();
    tmp.commit(&a.output)?;

    report(&a, &model, &layout, total, started);
    Ok(())
}

/// Generates, quantizes and writes one tensor, a slab of rows at a time.
fn write_tensor(
    t: &SynthTensor,
    out: &OutTensor,
    w: &mut impl Write,
    bar: &ProgressBar,
) -> Result<()> {
    let row_len = usize::try_from(t.dims.first().copied().unwrap_or(1))?;
    let n = usize::try_from(t.dims.iter().product::<u64>())?;
    let slab = (SLAB_ELEMENTS / row_len.max(1)).max(1) * row_len;
    let mut values = vec![0.0f32; slab.min(n)];
    let mut bytes = vec![0u8; kiln_quant::quantized_size(out.ty, values.len())?];
    let mut start = 0;
    while start < n {
        let len = slab.min(n - start);
        let (values, bytes) = (
            &mut values[..len],
            &mut bytes[..kiln_quant::quantized_size(out.ty, len)?],
        );
        t.fill.fill(start, values)?;
        kiln_quant::quantize(out.ty, values, bytes)?;
        w.write_all(bytes)?;
        bar.inc(len as u64);
        start += len;
    }
    Ok(())
}

/// Prints what was written: shape, size, types, time.
fn report(a: &SynthArgs, model: &Model, layout: &[OutTensor], weights: u64, started: Instant) {
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let data: u64 = layout.iter().map(|t| t.n_bytes).sum();
    let size = std::fs::metadata(&a.output).map_or(0, |m| m.len());
    let plural = if model.n_layers == 1 { "" } else { "s" };
    println!(
        "{} ({} layer{plural}, random weights, seed {}) -> {} as {} in {:.1} s",
        model.shape.name(),
        model.n_layers,
        a.seed,
        a.output.display(),
        a.mix,
        started.elapsed().as_secs_f64()
    );
    println!(
        "  {:.1} M weights, {:.2} bits/weight; file {:.2} MiB",
        weights as f64 / 1e6,
        8.0 * data as f64 / weights.max(1) as f64,
        mib(size)
    );
    let mut by_type: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for t in layout {
        *by_type.entry(t.ty).or_default() += 1;
    }
    let counts: Vec<String> = by_type.iter().map(|(ty, n)| format!("{ty} {n}")).collect();
    println!("  tensors: {}", counts.join(", "));
}
