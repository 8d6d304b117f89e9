//! Building models from files: the configuration from the family's reader ([`crate::arch`]),
//! the tensors from the one loader ([`crate::weights`]) by role ([`crate::names`]), assembled
//! into a [`Decoder`], a [`SplitDecoder`] or an [`Encoder`].
//!
//! Invariants:
//! - a whole model and a split one load their tensors in the same order, so that a broken file
//!   reports the same first error whichever way it is loaded;
//! - for a split after layer `n` of `L` (`0 ≤ n ≤ L`): the embedding table and layers `0..n` go
//!   to the front, layers `n..L`, the final norm and the output matrix to the back; tied
//!   embeddings are uploaded to each side that uses them (see [`crate::split`]).

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use kiln_backend::{Backend, Linear, WeightData};
use kiln_core::config::{DecoderConfig, EncoderArch, EncoderConfig, EncoderPositions};
use kiln_formats::{GgufFile, SafetensorsModel};

use crate::cache::split_layers;
use crate::decoder::{Ffn, MoeFfn, SharedExpert};
use crate::encoder::{Encoder, EncoderLayer, Norm};
use crate::gptq::GptqConfig;
use crate::hf::HfConfig;
use crate::names::Role;
use crate::weights::{Bias, Loader, Source};
use crate::{arch, Decoder, DecoderLayer, ModelError, SplitDecoder};

/// Load a decoder model from a parsed GGUF file onto `backend`.
pub fn load_gguf_decoder<B: Backend>(
    backend: &B,
    file: &GgufFile,
) -> Result<Decoder<B>, ModelError> {
    let (config, source) = gguf_decoder_source(file)?;
    load_decoder(backend, &source, config)
}

/// The decoder configuration of a GGUF file's metadata, and the file under its family's names.
fn gguf_decoder_source(file: &GgufFile) -> Result<(DecoderConfig, Source<'_>), ModelError> {
    let arch = file.architecture().ok_or_else(|| ModelError::Metadata {
        key: "general.architecture".into(),
        detail: "missing".into(),
    })?;
    let config = arch::decoder_config(arch, file)?;
    Ok((config, Source::gguf(file, arch::gguf_names(arch))))
}

/// Load a decoder model from a Hugging Face folder (`config.json` and `model.safetensors` or a
/// sharded `model.safetensors.index.json`) onto `backend`. F32, F16 and BF16 weights are used as
/// they are (zero-copy on the CPU).
pub fn load_hf_decoder<B: Backend>(backend: &B, dir: &Path) -> Result<Decoder<B>, ModelError> {
    let (hf, st) = open_hf_dir(dir)?;
    load_hf_decoder_from(backend, &hf, &st)
}

/// [`load_hf_decoder`] from an already parsed configuration and checkpoint.
pub fn load_hf_decoder_from<B: Backend>(
    backend: &B,
    hf: &HfConfig,
    st: &SafetensorsModel,
) -> Result<Decoder<B>, ModelError> {
    let (config, source) = hf_decoder_source(hf, st)?;
    load_decoder(backend, &source, config)
}

/// Load a decoder model from a parsed GGUF file, split after layer `front_layers`: the embedding
/// and layers `0..front_layers` onto `front`, the other layers and the head onto `back`. A split
/// point beyond the model's layer count is [`ModelError::SplitPoint`].
pub fn load_gguf_decoder_split<F: Backend, R: Backend>(
    front: &F,
    back: &R,
    file: &GgufFile,
    front_layers: usize,
) -> Result<SplitDecoder<F, R>, ModelError> {
    let (config, source) = gguf_decoder_source(file)?;
    load_split(front, back, &source, config, front_layers)
}

/// [`load_gguf_decoder_split`] from a Hugging Face folder (as [`load_hf_decoder`]).
pub fn load_hf_decoder_split<F: Backend, R: Backend>(
    front: &F,
    back: &R,
    dir: &Path,
    front_layers: usize,
) -> Result<SplitDecoder<F, R>, ModelError> {
    let (hf, st) = open_hf_dir(dir)?;
    load_hf_decoder_split_from(front, back, &hf, &st, front_layers)
}

/// [`load_hf_decoder_split`] from an already parsed configuration and checkpoint.
pub fn load_hf_decoder_split_from<F: Backend, R: Backend>(
    front: &F,
    back: &R,
    hf: &HfConfig,
    st: &SafetensorsModel,
    front_layers: usize,
) -> Result<SplitDecoder<F, R>, ModelError> {
    let (config, source) = hf_decoder_source(hf, st)?;
    load_split(front, back, &source, config, front_layers)
}

/// The `config.json` and the checkpoint of a Hugging Face folder.
fn open_hf_dir(dir: &Path) -> Result<(HfConfig, SafetensorsModel), ModelError> {
    let hf = HfConfig::read(&dir.join("config.json"))?;
    let st = SafetensorsModel::open(dir).map_err(|e| ModelError::File {
        file: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok((hf, st))
}

/// The decoder configuration of a Hugging Face checkpoint, and the checkpoint under its
/// family's names.
fn hf_decoder_source<'a>(
    hf: &HfConfig,
    st: &'a SafetensorsModel,
) -> Result<(DecoderConfig, Source<'a>), ModelError> {
    let (config, names) = arch::hf_decoder_config(hf)?;
    let prefix = arch::hf_weight_prefix(hf)?;
    let plain = Source::checkpoint(st, names, None).under(prefix);
    if !arch::hf_tied(hf)? && !plain.has(Role::Output, 0) {
        let name = plain.name(Role::Output, 0, 0, "weight").unwrap_or_default();
        return Err(ModelError::MissingTensor(format!(
            "{name} (config.json says the output is not tied to the embeddings)"
        )));
    }
    let gptq = GptqConfig::read(hf)?;
    Ok((config, Source::checkpoint(st, names, gptq).under(prefix)))
}

/// The whole model on `backend`.
fn load_decoder<B: Backend>(
    backend: &B,
    source: &Source<'_>,
    config: DecoderConfig,
) -> Result<Decoder<B>, ModelError> {
    let l = Loader { backend, source };
    let (embd, token_embd) = embedding(&l, &config)?;
    let output = output(&l, &config, &embd, Some(&token_embd))?;
    let layers = decoder_layers(&l, &config, 0..config.n_layers)?;
    let output_norm = l.vector(Role::OutputNorm, 0, config.d_model)?;
    Ok(Decoder {
        config,
        token_embd,
        layers,
        output_norm,
        output,
    })
}

/// The model split after layer `front_layers` over `front` and `back`.
fn load_split<F: Backend, R: Backend>(
    front: &F,
    back: &R,
    source: &Source<'_>,
    config: DecoderConfig,
    front_layers: usize,
) -> Result<SplitDecoder<F, R>, ModelError> {
    let (front_range, back_range) = split_layers(&config, front_layers)?;
    let f = Loader {
        backend: front,
        source,
    };
    let r = Loader {
        backend: back,
        source,
    };
    // In the whole model's order, so that a broken file reports the same first error.
    let (embd, token_embd) = embedding(&f, &config)?;
    let output = output(&r, &config, &embd, None)?;
    let front_part = decoder_layers(&f, &config, front_range)?;
    let back_part = decoder_layers(&r, &config, back_range)?;
    let output_norm = r.vector(Role::OutputNorm, 0, config.d_model)?;
    Ok(SplitDecoder {
        config,
        token_embd,
        front: front_part,
        back: back_part,
        output_norm,
        output,
    })
}

/// The embedding table's data (checked) and the table on `l`'s backend.
fn embedding<B: Backend>(
    l: &Loader<'_, B>,
    c: &DecoderConfig,
) -> Result<(WeightData, Arc<B::Weight>), ModelError> {
    let embd = l.required(Role::TokenEmbd, 0, "weight", &[c.d_model, c.vocab_size])?;
    let table = Arc::new(l.upload(&embd)?);
    Ok((embd, table))
}

/// The output matrix: its own, or when the file has none (tied embeddings) the embedding table
/// `embd`, shared with `table` when this backend holds it already, uploaded again otherwise.
fn output<B: Backend>(
    l: &Loader<'_, B>,
    c: &DecoderConfig,
    embd: &WeightData,
    table: Option<&Arc<B::Weight>>,
) -> Result<Linear<B>, ModelError> {
    let (d, vocab) = (c.d_model, c.vocab_size);
    Ok(match l.optional(Role::Output, 0, &[d, vocab])? {
        Some(w) => l.make_linear(&w, None)?,
        None => Linear {
            weight: match table {
                Some(table) => table.clone(),
                None => Arc::new(l.upload(embd)?),
            },
            bias: None,
            in_features: d,
            out_features: vocab,
            ty: embd.ty,
        },
    })
}

/// The weights of decoder layers `range` (a range of `0..c.n_layers`) on `l`'s backend.
fn decoder_layers<B: Backend>(
    l: &Loader<'_, B>,
    c: &DecoderConfig,
    range: Range<usize>,
) -> Result<Vec<DecoderLayer<B>>, ModelError> {
    let d = c.d_model;
    let lin = |role, i, inp, out| l.linear(role, i, inp, out, Bias::IfPresent);
    let mut layers = Vec::with_capacity(range.len());
    for i in range {
        let (q, k, v) = if l.peek(Role::AttnQkv, i)?.is_some() {
            let outs = [c.q_dim(), c.kv_dim(), c.v_dim()];
            let [q, k, v] = parts(l.split_linear(Role::AttnQkv, i, d, &outs, Bias::IfPresent)?)?;
            (q, k, v)
        } else {
            (
                lin(Role::AttnQ, i, d, c.q_dim())?,
                lin(Role::AttnK, i, d, c.kv_dim())?,
                lin(Role::AttnV, i, d, c.v_dim())?,
            )
        };
        let ffn = match &c.moe {
            Some(moe) if moe.routes(i) => {
                let (n, f) = (moe.n_experts, moe.expert_ffn_dim);
                let stacked = |role, inp, out| {
                    (0..n)
                        .map(|e| l.expert(role, i, (e, n), inp, out))
                        .collect::<Result<Vec<_>, _>>()
                };
                let shared = match moe.shared_ffn_dim {
                    Some(s) => Some(SharedExpert {
                        gate_inp: lin(Role::FfnGateInpShexp, i, d, 1)?,
                        gate: lin(Role::FfnGateShexp, i, d, s)?,
                        up: lin(Role::FfnUpShexp, i, d, s)?,
                        down: lin(Role::FfnDownShexp, i, s, d)?,
                    }),
                    None => None,
                };
                Ffn::Moe(MoeFfn {
                    router: lin(Role::FfnGateInp, i, d, n)?,
                    gate: stacked(Role::FfnGateExps, d, f)?,
                    up: stacked(Role::FfnUpExps, d, f)?,
                    down: stacked(Role::FfnDownExps, f, d)?,
                    shared,
                })
            }
            _ => {
                let f = c.ffn_dim;
                // Gate and up fused in one matrix of 2·ffn rows, gate first: Phi-3's HF
                // `gate_up_proj`, its GGUF `ffn_up` (then without `ffn_gate`).
                let fused = if l.peek(Role::FfnGateUp, i)?.is_some() {
                    Some(Role::FfnGateUp)
                } else if l.peek(Role::FfnGate, i)?.is_none()
                    && l.peek(Role::FfnUp, i)?.is_some_and(|t| t.n_rows() == 2 * f)
                {
                    Some(Role::FfnUp)
                } else {
                    None
                };
                let (gate, up) = match fused {
                    None => (lin(Role::FfnGate, i, d, f)?, lin(Role::FfnUp, i, d, f)?),
                    Some(fused) => {
                        let [gate, up] =
                            parts(l.split_linear(fused, i, d, &[f, f], Bias::IfPresent)?)?;
                        (gate, up)
                    }
                };
                Ffn::Dense {
                    gate,
                    up,
                    down: lin(Role::FfnDown, i, f, d)?,
                }
            }
        };
        layers.push(DecoderLayer {
            attn_norm: l.vector(Role::AttnNorm, i, d)?,
            q,
            k,
            v,
            q_norm: l.optional_vector(Role::AttnQNorm, i, c.head_dim)?,
            k_norm: l.optional_vector(Role::AttnKNorm, i, c.head_dim)?,
            o: lin(Role::AttnOut, i, c.n_heads * c.head_dim_v, d)?,
            post_attn_norm: l.optional_vector(Role::PostAttnNorm, i, d)?,
            ffn_norm: l.vector(Role::FfnNorm, i, d)?,
            ffn,
            post_ffn_norm: l.optional_vector(Role::PostFfnNorm, i, d)?,
        });
    }
    Ok(layers)
}

/// Loads an encoder of `config` from a safetensors checkpoint (HF names, with or without the
/// `bert.` / `roberta.` / `model.` prefix a task head adds).
pub fn load_encoder<B: Backend>(
    backend: &B,
    st: &SafetensorsModel,
    config: EncoderConfig,
) -> Result<Encoder<B>, ModelError> {
    let names = arch::encoder_names(config.arch);
    let source = Source::checkpoint_with_prefix(st, names, &["", "bert.", "roberta.", "model."])?;
    let l = Loader {
        backend,
        source: &source,
    };
    let c = &config;
    let (d, f) = (c.d_model, c.ffn_dim);
    let norm = |role, i| -> Result<Norm<B>, ModelError> {
        let (weight, bias) = l.layer_norm(role, i, d, c.norm_bias)?;
        Ok(Norm { weight, bias })
    };
    let attn_bias = Bias::when(c.attention_bias);
    let mlp_bias = Bias::when(c.mlp_bias);
    let mut layers = Vec::with_capacity(c.n_layers);
    let encoder = match c.arch {
        EncoderArch::Bert | EncoderArch::XlmRoberta => {
            let EncoderPositions::Absolute { table_len, .. } = c.positions else {
                return Err(ModelError::Config {
                    file: "config.json".into(),
                    key: "position_embedding_type".into(),
                    detail: "BERT-family models need absolute positions".into(),
                });
            };
            for i in 0..c.n_layers {
                layers.push(EncoderLayer {
                    attention: c.layer_attention[i],
                    attn_norm: None,
                    q: l.linear(Role::AttnQ, i, d, d, attn_bias)?,
                    k: l.linear(Role::AttnK, i, d, d, attn_bias)?,
                    v: l.linear(Role::AttnV, i, d, d, attn_bias)?,
                    o: l.linear(Role::AttnOut, i, d, d, attn_bias)?,
                    attn_out_norm: Some(norm(Role::AttnOutNorm, i)?),
                    mlp_norm: None,
                    up: l.linear(Role::FfnUp, i, d, f, mlp_bias)?,
                    gate: None,
                    down: l.linear(Role::FfnDown, i, f, d, mlp_bias)?,
                    out_norm: Some(norm(Role::LayerOutNorm, i)?),
                });
            }
            let table = |role, rows: usize| l.upload(&l.required(role, 0, "weight", &[d, rows])?);
            Encoder {
                tok_embeddings: table(Role::TokenEmbd, c.vocab_size)?,
                pos_embeddings: Some(table(Role::PosEmbd, table_len)?),
                type_embeddings: if c.type_vocab_size > 0 {
                    Some(table(Role::TypeEmbd, c.type_vocab_size)?)
                } else {
                    None
                },
                emb_norm: norm(Role::EmbdNorm, 0)?,
                layers,
                final_norm: None,
                config,
            }
        }
        EncoderArch::ModernBert => {
            for i in 0..c.n_layers {
                // ModernBERT's first layer reads the (already normed) embeddings directly.
                let attn_norm = if i == 0 {
                    None
                } else {
                    Some(norm(Role::AttnNorm, i)?)
                };
                let [q, k, v] = parts(l.split_linear(Role::AttnQkv, i, d, &[d; 3], attn_bias)?)?;
                let o = l.linear(Role::AttnOut, i, d, d, attn_bias)?;
                let mlp_norm = Some(norm(Role::FfnNorm, i)?);
                // `Wi` holds the activated half first, then the gate.
                let [up, gate] = parts(l.split_linear(Role::FfnUp, i, d, &[f, f], mlp_bias)?)?;
                layers.push(EncoderLayer {
                    attention: c.layer_attention[i],
                    attn_norm,
                    q,
                    k,
                    v,
                    o,
                    attn_out_norm: None,
                    mlp_norm,
                    up,
                    gate: Some(gate),
                    down: l.linear(Role::FfnDown, i, f, d, mlp_bias)?,
                    out_norm: None,
                });
            }
            Encoder {
                tok_embeddings: l.upload(&l.required(
                    Role::TokenEmbd,
                    0,
                    "weight",
                    &[d, c.vocab_size],
                )?)?,
                pos_embeddings: None,
                type_embeddings: None,
                emb_norm: norm(Role::EmbdNorm, 0)?,
                layers,
                final_norm: Some(norm(Role::OutputNorm, 0)?),
                config,
            }
        }
    };
    Ok(encoder)
}

/// The `N` parts [`Loader::split_linear`] cut.
fn parts<T, const N: usize>(v: Vec<T>) -> Result<[T; N], ModelError> {
    let got = v.len();
    v.try_into()
        .map_err(|_| ModelError::MissingTensor(format!("{got} parts of a fused matrix, not {N}")))
}
