//! Tensor lookup by role, with type and shape checks, and upload to the backend.
//!
//! Model code names every tensor as llama.cpp's GGUF files do (`blk.3.attn_q.weight`, the
//! `LLM_TENSOR_*` table), whatever file it comes from: a [`TensorSource`] answers those names,
//! from a GGUF directly ([`GgufSource`]) or from a Hugging Face safetensors checkpoint through the
//! family's name map ([`HfSource`]). One loader then serves every family and both formats.
//!
//! Invariants:
//! - every tensor's dims are checked against the config before it is uploaded; a wrong shape, a
//!   missing tensor or a type kiln cannot compute is a typed error naming the tensor as the file
//!   names it;
//! - fused matrices (Phi-3's `attn_qkv` and gate/up `ffn_up`) and stacked experts (GGUF's 3-D
//!   `ffn_*_exps`) are split into zero-copy row views ([`WeightData::slice_rows`]), so every
//!   expert is a weight of its own that is only touched when the router selects it.

use std::ops::Range;
use std::sync::Arc;

use kiln_backend::{Backend, GptqMatrix, GptqTensors, Linear, WeightData};
use kiln_core::config::DecoderConfig;
use kiln_formats::safetensors::Dtype;
use kiln_formats::{GgufFile, SafetensorsModel};
use serde_json::Value;

use crate::decoder::{Ffn, MoeFfn};
use crate::hf::HfConfig;
use crate::{Decoder, DecoderLayer, ModelError, SplitDecoder};

/// Tensors by GGUF name, with GGUF-order dims (`dims[0]` contiguous).
pub(crate) trait TensorSource {
    /// The tensor named `name`, or `None` when the file has none.
    fn tensor(&self, name: &str) -> Result<Option<WeightData>, ModelError>;

    /// Expert `e` of `n_experts` of the stacked expert matrix `name` (`blk.N.ffn_up_exps.weight`):
    /// a 2-D weight of `[in, out]`.
    fn expert(
        &self,
        name: &str,
        e: usize,
        n_experts: usize,
    ) -> Result<Option<WeightData>, ModelError>;

    /// The linear layer `prefix` (`blk.N.attn_q`) as a GPTQ matrix, when the file stores it so.
    fn gptq(
        &self,
        _prefix: &str,
        _in_features: usize,
        _out_features: usize,
    ) -> Result<Option<GptqMatrix>, ModelError> {
        Ok(None)
    }
}

/// `dims` as `usize`, or a shape error naming the tensor.
fn usize_dims(name: &str, dims: &[u64]) -> Result<Vec<usize>, ModelError> {
    dims.iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| ModelError::Shape {
            name: name.into(),
            expected: vec![],
            found: vec![],
        })
}

/// A GGUF file: names as they are.
pub(crate) struct GgufSource<'a>(pub &'a GgufFile);

impl TensorSource for GgufSource<'_> {
    fn tensor(&self, name: &str) -> Result<Option<WeightData>, ModelError> {
        let Some(info) = self.0.tensor(name) else {
            return Ok(None);
        };
        Ok(Some(WeightData {
            name: name.to_string(),
            ty: info.ty,
            dims: usize_dims(name, &info.dims)?,
            bytes: self.0.tensor_data(info),
        }))
    }

    fn expert(
        &self,
        name: &str,
        e: usize,
        n_experts: usize,
    ) -> Result<Option<WeightData>, ModelError> {
        let Some(all) = self.tensor(name)? else {
            return Ok(None);
        };
        if all.dims.len() != 3 || all.dims[2] != n_experts {
            return Err(ModelError::Shape {
                name: name.into(),
                expected: vec![
                    all.row_len(),
                    all.dims.get(1).copied().unwrap_or(0),
                    n_experts,
                ],
                found: all.dims,
            });
        }
        let rows = all.dims[1];
        Ok(all.slice_rows(e * rows..(e + 1) * rows, format!("{name}[expert {e}]")))
    }
}

/// How a Hugging Face family names its tensors (the `model.layers.N.` part is common to all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HfNames {
    /// Llama, Mistral, Qwen2, Qwen3, Phi-3 (`qkv_proj`, `gate_up_proj`) and Qwen3-MoE
    /// (`mlp.gate`, `mlp.experts.E.{gate,up,down}_proj`).
    Llama,
    /// Mixtral: `block_sparse_moe.gate` and `block_sparse_moe.experts.E.{w1,w3,w2}`.
    Mixtral,
}

/// `quantization_config` of a GPTQ checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GptqConfig {
    /// Inputs per group; `None`: one group over all inputs (`group_size: -1`).
    pub group_size: Option<usize>,
    /// Zero points stored minus one (`checkpoint_format: "gptq"`, not `"gptq_v2"`).
    pub v1_zeros: bool,
}

impl GptqConfig {
    /// The GPTQ settings of `config.json`; `None` for an unquantized checkpoint, an error for
    /// any quantization kiln does not run.
    pub(crate) fn read(hf: &HfConfig) -> Result<Option<GptqConfig>, ModelError> {
        let Some(q) = hf.raw("quantization_config") else {
            return Ok(None);
        };
        let key = "quantization_config";
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        if method != "gptq" {
            return Err(hf.error(
                key,
                format!("{method} quantization is not supported (kiln runs GPTQ 4-bit)"),
            ));
        }
        let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(0);
        if bits != 4 {
            return Err(hf.error(key, format!("GPTQ with {bits} bits: kiln runs 4-bit only")));
        }
        let group_size = match q.get("group_size").and_then(Value::as_i64) {
            Some(-1) => None,
            Some(g) if g > 0 => Some(g as usize),
            other => return Err(hf.error(key, format!("group_size {other:?}: expected -1 or > 0"))),
        };
        let v1_zeros = match q.get("checkpoint_format").and_then(Value::as_str) {
            None | Some("gptq") => true,
            Some("gptq_v2") => false,
            Some(other) => return Err(hf.error(key, format!("GPTQ checkpoint format \"{other}\""))),
        };
        Ok(Some(GptqConfig {
            group_size,
            v1_zeros,
        }))
    }
}

/// `blk.N.role.suffix` as `(N, role, suffix)` (`suffix`: `weight`, `bias`, ...).
fn layer_role(name: &str) -> Option<(&str, &str, &str)> {
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    let (role, suffix) = rest.rsplit_once('.')?;
    Some((layer, role, suffix))
}

/// A safetensors checkpoint seen through its family's name map.
pub(crate) struct HfSource<'a> {
    pub st: &'a SafetensorsModel,
    pub names: HfNames,
    pub gptq: Option<GptqConfig>,
}

impl HfSource<'_> {
    /// The HF name of the GGUF tensor `name`, `None` for names the family does not have.
    fn hf_name(&self, name: &str) -> Option<String> {
        let fixed = match name {
            "token_embd.weight" => Some("model.embed_tokens.weight"),
            "output_norm.weight" => Some("model.norm.weight"),
            "output.weight" => Some("lm_head.weight"),
            _ => None,
        };
        if let Some(f) = fixed {
            return Some(f.to_string());
        }
        let (layer, role, suffix) = layer_role(name)?;
        let hf_role = match (role, self.names) {
            ("attn_norm", _) => "input_layernorm",
            ("attn_q", _) => "self_attn.q_proj",
            ("attn_k", _) => "self_attn.k_proj",
            ("attn_v", _) => "self_attn.v_proj",
            ("attn_qkv", _) => "self_attn.qkv_proj",
            ("attn_q_norm", _) => "self_attn.q_norm",
            ("attn_k_norm", _) => "self_attn.k_norm",
            ("attn_output", _) => "self_attn.o_proj",
            ("ffn_norm", _) => "post_attention_layernorm",
            ("ffn_gate", _) => "mlp.gate_proj",
            ("ffn_up", _) => "mlp.up_proj",
            ("ffn_gate_up", _) => "mlp.gate_up_proj",
            ("ffn_down", _) => "mlp.down_proj",
            ("ffn_gate_inp", HfNames::Llama) => "mlp.gate",
            ("ffn_gate_inp", HfNames::Mixtral) => "block_sparse_moe.gate",
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{hf_role}.{suffix}"))
    }

    fn data(&self, hf: &str) -> Result<Option<WeightData>, ModelError> {
        let Some(t) = self.st.tensor(hf) else {
            return Ok(None);
        };
        let ty = t.ggml_type().ok_or_else(|| ModelError::UnsupportedDtype {
            name: hf.into(),
            dtype: format!("{:?}", t.dtype),
        })?;
        Ok(Some(WeightData {
            name: hf.into(),
            ty,
            dims: t.ggml_dims(),
            bytes: t.bytes.clone(),
        }))
    }
}

impl TensorSource for HfSource<'_> {
    fn tensor(&self, name: &str) -> Result<Option<WeightData>, ModelError> {
        match self.hf_name(name) {
            Some(hf) => self.data(&hf),
            None => Ok(None),
        }
    }

    fn expert(
        &self,
        name: &str,
        e: usize,
        _n_experts: usize,
    ) -> Result<Option<WeightData>, ModelError> {
        let Some((layer, role, "weight")) = layer_role(name) else {
            return Ok(None);
        };
        let role = match (role, self.names) {
            ("ffn_gate_exps", HfNames::Llama) => "mlp.experts.{e}.gate_proj",
            ("ffn_up_exps", HfNames::Llama) => "mlp.experts.{e}.up_proj",
            ("ffn_down_exps", HfNames::Llama) => "mlp.experts.{e}.down_proj",
            ("ffn_gate_exps", HfNames::Mixtral) => "block_sparse_moe.experts.{e}.w1",
            ("ffn_up_exps", HfNames::Mixtral) => "block_sparse_moe.experts.{e}.w3",
            ("ffn_down_exps", HfNames::Mixtral) => "block_sparse_moe.experts.{e}.w2",
            _ => return Ok(None),
        };
        let role = role.replace("{e}", &e.to_string());
        self.data(&format!("model.layers.{layer}.{role}.weight"))
    }

    fn gptq(
        &self,
        prefix: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Option<GptqMatrix>, ModelError> {
        let Some(cfg) = self.gptq else {
            return Ok(None);
        };
        let Some(hf) = self.hf_name(&format!("{prefix}.weight")) else {
            return Ok(None);
        };
        let p = hf.trim_end_matches(".weight");
        let Some(qweight) = self.st.tensor(&format!("{p}.qweight")) else {
            return Ok(None);
        };
        let group_size = cfg.group_size.unwrap_or(in_features);
        let groups = in_features / group_size.max(1);
        let get = |suffix: &str, dtype: Dtype, shape: &[usize]| {
            let name = format!("{p}.{suffix}");
            let t = self
                .st
                .tensor(&name)
                .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
            if t.dtype != dtype || t.shape != shape {
                return Err(ModelError::File {
                    file: name,
                    detail: format!(
                        "{:?} {:?}, expected {dtype:?} {shape:?} for a {out_features}×\
                         {in_features} GPTQ layer in groups of {group_size}",
                        t.dtype, t.shape
                    ),
                });
            }
            Ok(t)
        };
        let qweight =
            get("qweight", Dtype::I32, &[in_features / 8, out_features]).map(|_| qweight)?;
        let qzeros = get("qzeros", Dtype::I32, &[groups, out_features / 8])?;
        let scales = get("scales", Dtype::F16, &[groups, out_features])?;
        let g_idx = match self.st.tensor(&format!("{p}.g_idx")) {
            Some(_) => Some(get("g_idx", Dtype::I32, &[in_features])?),
            None => None,
        };
        let tensors = GptqTensors {
            qweight: &qweight.bytes,
            qzeros: &qzeros.bytes,
            scales: &scales.bytes,
            g_idx: g_idx.map(|t| &t.bytes[..]),
        };
        GptqMatrix::from_checkpoint(
            p,
            &tensors,
            in_features,
            out_features,
            group_size,
            cfg.v1_zeros,
        )
        .map(Some)
        .map_err(|e| ModelError::File {
            file: p.to_string(),
            detail: e.detail,
        })
    }
}

/// Fetches tensors from a source and uploads them, checking every shape against the config.
struct Loader<'a, B: Backend> {
    backend: &'a B,
    source: &'a dyn TensorSource,
}

impl<'a, B: Backend> Loader<'a, B> {
    /// `data` if its type is computable and its dims are `expected`.
    fn checked(&self, data: WeightData, expected: &[usize]) -> Result<WeightData, ModelError> {
        if !data.ty.is_supported() {
            return Err(ModelError::UnsupportedType {
                name: data.name,
                ty: data.ty,
            });
        }
        if data.dims != expected {
            return Err(ModelError::Shape {
                name: data.name,
                expected: expected.to_vec(),
                found: data.dims,
            });
        }
        Ok(data)
    }

    /// A tensor that may be absent, with GGUF dims `expected` (`[row_len, rows]`, 1-D as `[n]`).
    fn optional(&self, name: &str, expected: &[usize]) -> Result<Option<WeightData>, ModelError> {
        self.source
            .tensor(name)?
            .map(|d| self.checked(d, expected))
            .transpose()
    }

    fn required(&self, name: &str, expected: &[usize]) -> Result<WeightData, ModelError> {
        self.optional(name, expected)?
            .ok_or_else(|| ModelError::MissingTensor(name.into()))
    }

    fn upload(&self, data: &WeightData) -> Result<B::Weight, ModelError> {
        Ok(self.backend.upload_weight(data)?)
    }

    fn vector(&self, name: &str, len: usize) -> Result<B::Weight, ModelError> {
        self.upload(&self.required(name, &[len])?)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<B::Weight>, ModelError> {
        self.optional(name, &[len])?
            .map(|d| self.upload(&d))
            .transpose()
    }

    fn make_linear(
        &self,
        weight: &WeightData,
        bias: Option<&WeightData>,
    ) -> Result<Linear<B>, ModelError> {
        Ok(Linear {
            weight: Arc::new(self.upload(weight)?),
            bias: bias.map(|b| self.upload(b)).transpose()?,
            in_features: weight.row_len(),
            out_features: weight.n_rows(),
            ty: weight.ty,
        })
    }

    /// A linear layer `out_features × in_features` (a float or GGUF-quantized `<prefix>.weight`,
    /// or a GPTQ matrix), with an optional bias `<prefix>.bias`.
    fn linear(
        &self,
        prefix: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Linear<B>, ModelError> {
        let name = format!("{prefix}.weight");
        let b = self.optional(&format!("{prefix}.bias"), &[out_features])?;
        if let Some(w) = self.optional(&name, &[in_features, out_features])? {
            return self.make_linear(&w, b.as_ref());
        }
        let matrix = self
            .source
            .gptq(prefix, in_features, out_features)?
            .ok_or(ModelError::MissingTensor(name.clone()))?;
        Ok(Linear {
            weight: Arc::new(self.backend.upload_gptq(&name, Arc::new(matrix))?),
            bias: b.map(|b| self.upload(&b)).transpose()?,
            in_features,
            out_features,
            ty: kiln_core::GgmlType::I32,
        })
    }

    /// Consecutive row blocks of `outs` rows each of the fused linear `<prefix>` (weight and
    /// optional bias), as separate layers.
    fn split_linear(
        &self,
        prefix: &str,
        in_features: usize,
        outs: &[usize],
    ) -> Result<Vec<Linear<B>>, ModelError> {
        let total: usize = outs.iter().sum();
        let w = self.required(&format!("{prefix}.weight"), &[in_features, total])?;
        let b = self.optional(&format!("{prefix}.bias"), &[total])?;
        let mut start = 0;
        let mut parts = Vec::with_capacity(outs.len());
        for &n in outs {
            let rows = start..start + n;
            let part = |d: &WeightData| {
                // A 1-D bias is one row of `total` elements: view it as `total` rows of one.
                let view = WeightData {
                    dims: if d.dims.len() == 1 {
                        vec![1, total]
                    } else {
                        d.dims.clone()
                    },
                    ..d.clone()
                };
                let mut s = view
                    .slice_rows(
                        rows.clone(),
                        format!("{}[{}..{}]", d.name, rows.start, rows.end),
                    )
                    .ok_or_else(|| ModelError::Shape {
                        name: d.name.clone(),
                        expected: vec![in_features, total],
                        found: d.dims.clone(),
                    })?;
                if d.dims.len() == 1 {
                    s.dims = vec![n];
                }
                Ok::<_, ModelError>(s)
            };
            let pw = part(&w)?;
            let pb = b.as_ref().map(part).transpose()?;
            parts.push(self.make_linear(&pw, pb.as_ref())?);
            start += n;
        }
        Ok(parts)
    }

    /// Expert `e` of the stacked matrix `name`, `in_features → out_features`.
    fn expert(
        &self,
        name: &str,
        e: usize,
        n_experts: usize,
        in_features: usize,
        out_features: usize,
    ) -> Result<Linear<B>, ModelError> {
        let w = self
            .source
            .expert(name, e, n_experts)?
            .ok_or_else(|| ModelError::MissingTensor(format!("{name} (expert {e})")))?;
        let w = self.checked(w, &[in_features, out_features])?;
        self.make_linear(&w, None)
    }
}

/// The whole model on `backend`.
pub(crate) fn load_decoder<B: Backend>(
    backend: &B,
    source: &dyn TensorSource,
    config: DecoderConfig,
) -> Result<Decoder<B>, ModelError> {
    let l = Loader { backend, source };
    let (embd, token_embd) = l.embedding(&config)?;
    let output = l.output(&config, &embd, Some(&token_embd))?;
    let layers = load_layers(&l, &config, 0..config.n_layers)?;
    let output_norm = l.vector("output_norm.weight", config.d_model)?;
    Ok(Decoder {
        config,
        token_embd,
        layers,
        output_norm,
        output,
    })
}

/// The model split after layer `front_layers`: the embedding and layers `0..front_layers` on
/// `front`, layers `front_layers..` and the head on `back` (see [`crate::split`]).
pub(crate) fn load_split<F: Backend, R: Backend>(
    front: &F,
    back: &R,
    source: &dyn TensorSource,
    config: DecoderConfig,
    front_layers: usize,
) -> Result<SplitDecoder<F, R>, ModelError> {
    let (front_range, back_range) = crate::split::split_layers(&config, front_layers)?;
    let f = Loader {
        backend: front,
        source,
    };
    let r = Loader {
        backend: back,
        source,
    };
    // In the whole model's order, so that a broken file reports the same first error.
    let (embd, token_embd) = f.embedding(&config)?;
    let output = r.output(&config, &embd, None)?;
    let front_part = load_layers(&f, &config, front_range)?;
    let back_part = load_layers(&r, &config, back_range)?;
    let output_norm = r.vector("output_norm.weight", config.d_model)?;
    Ok(SplitDecoder {
        config,
        token_embd,
        front: front_part,
        back: back_part,
        output_norm,
        output,
    })
}

impl<B: Backend> Loader<'_, B> {
    /// The embedding table's data (checked) and the table on this backend.
    fn embedding(&self, c: &DecoderConfig) -> Result<(WeightData, Arc<B::Weight>), ModelError> {
        let embd = self.required("token_embd.weight", &[c.d_model, c.vocab_size])?;
        let table = Arc::new(self.upload(&embd)?);
        Ok((embd, table))
    }

    /// The output matrix: `output.weight`, or when the file has none (tied embeddings) the
    /// embedding table `embd`, shared with `table` when this backend holds it already, uploaded
    /// again otherwise.
    fn output(
        &self,
        c: &DecoderConfig,
        embd: &WeightData,
        table: Option<&Arc<B::Weight>>,
    ) -> Result<Linear<B>, ModelError> {
        let (d, vocab) = (c.d_model, c.vocab_size);
        Ok(match self.optional("output.weight", &[d, vocab])? {
            Some(w) => self.make_linear(&w, None)?,
            None => Linear {
                weight: match table {
                    Some(table) => table.clone(),
                    None => Arc::new(self.upload(embd)?),
                },
                bias: None,
                in_features: d,
                out_features: vocab,
                ty: embd.ty,
            },
        })
    }
}

/// The weights of layers `range` (a range of `0..c.n_layers`) on `l`'s backend.
fn load_layers<B: Backend>(
    l: &Loader<'_, B>,
    c: &DecoderConfig,
    range: Range<usize>,
) -> Result<Vec<DecoderLayer<B>>, ModelError> {
    let (source, d) = (l.source, c.d_model);
    let mut layers = Vec::with_capacity(range.len());
    for i in range {
        let p = |role: &str| format!("blk.{i}.{role}");
        let (q, k, v) = if source.tensor(&p("attn_qkv.weight"))?.is_some() {
            let mut qkv = l.split_linear(&p("attn_qkv"), d, &[c.q_dim(), c.kv_dim(), c.v_dim()])?;
            let v = qkv.pop();
            let k = qkv.pop();
            let q = qkv.pop();
            match (q, k, v) {
                (Some(q), Some(k), Some(v)) => (q, k, v),
                _ => return Err(ModelError::MissingTensor(p("attn_qkv.weight"))),
            }
        } else {
            (
                l.linear(&p("attn_q"), d, c.q_dim())?,
                l.linear(&p("attn_k"), d, c.kv_dim())?,
                l.linear(&p("attn_v"), d, c.v_dim())?,
            )
        };
        let ffn = match &c.moe {
            Some(moe) => {
                let (n, f) = (moe.n_experts, moe.expert_ffn_dim);
                let stacked = |role: &str, inp, out| {
                    (0..n)
                        .map(|e| l.expert(&p(role), e, n, inp, out))
                        .collect::<Result<Vec<_>, _>>()
                };
                Ffn::Moe(MoeFfn {
                    router: l.linear(&p("ffn_gate_inp"), d, n)?,
                    gate: stacked("ffn_gate_exps.weight", d, f)?,
                    up: stacked("ffn_up_exps.weight", d, f)?,
                    down: stacked("ffn_down_exps.weight", f, d)?,
                })
            }
            None => {
                let f = c.ffn_dim;
                // Phi-3 fuses gate and up into one matrix of 2·ffn rows, gate first: HF
                // `gate_up_proj`, GGUF `ffn_up` (then without `ffn_gate`).
                let fused = if source.tensor(&p("ffn_gate_up.weight"))?.is_some() {
                    Some(p("ffn_gate_up"))
                } else if source.tensor(&p("ffn_gate.weight"))?.is_none()
                    && source
                        .tensor(&p("ffn_up.weight"))?
                        .is_some_and(|t| t.n_rows() == 2 * f)
                {
                    Some(p("ffn_up"))
                } else {
                    None
                };
                let (gate, up) = match fused {
                    None => (
                        l.linear(&p("ffn_gate"), d, f)?,
                        l.linear(&p("ffn_up"), d, f)?,
                    ),
                    Some(fused) => {
                        let mut gu = l.split_linear(&fused, d, &[f, f])?;
                        match (gu.pop(), gu.pop()) {
                            (Some(up), Some(gate)) => (gate, up),
                            _ => return Err(ModelError::MissingTensor(p("ffn_gate.weight"))),
                        }
                    }
                };
                Ffn::Dense {
                    gate,
                    up,
                    down: l.linear(&p("ffn_down"), f, d)?,
                }
            }
        };
        layers.push(DecoderLayer {
            attn_norm: l.vector(&p("attn_norm.weight"), d)?,
            q,
            k,
            v,
            q_norm: l.optional_vector(&p("attn_q_norm.weight"), c.head_dim)?,
            k_norm: l.optional_vector(&p("attn_k_norm.weight"), c.head_dim)?,
            o: l.linear(&p("attn_output"), c.n_heads * c.head_dim_v, d)?,
            post_attn_norm: l.optional_vector(&p("post_attention_norm.weight"), d)?,
            ffn_norm: l.vector(&p("ffn_norm.weight"), d)?,
            ffn,
            post_ffn_norm: l.optional_vector(&p("post_ffw_norm.weight"), d)?,
        });
    }
    Ok(layers)
}
