//! The bidirectional encoder forward pass (BERT, XLM-RoBERTa, ModernBERT), over a packed batch.
//!
//! A batch is the concatenation of its sequences' tokens, `[total, d_model]`, with no padding:
//! every row-wise op (linears, norms, activations) runs once per real token, and attention runs
//! inside each sequence (`Backend::packed_attention`). A sequence therefore gets the same
//! embedding whatever else is in its batch.
//!
//! ```text
//! h = norm(tok[ids] + pos[offset + i]? + type[0]?)
//! per layer, post-norm (BERT):  h = norm(h + attn(h)) ; h = norm(h + ffn(h))
//! per layer, pre-norm (ModernBERT): h = h + attn(norm?(h)) ; h = h + ffn(norm(h))
//! attn(x) = packed_attention(rope?(x·Wq), rope?(x·Wk), x·Wv) · Wo   (local layers: a radius)
//! ffn(x) = act(x·Wup) · Wdown,  or gated: (act(x·Wup) * x·Wgate) · Wdown
//! then final_norm? (ModernBERT)
//! ```

use std::sync::Arc;

use kiln_backend::{
    Activation, Backend, Linear, PackedAttentionParams, RopeParams, RopeStyle, WeightData,
};
use kiln_core::config::{
    EncoderArch, EncoderAttention, EncoderConfig, EncoderPositions, FfnActivation,
};
use kiln_formats::{SafeTensor, SafetensorsModel};

use crate::pooling::{l2_normalize, Pooling};
use crate::ModelError;

/// A layer norm's weight and optional bias.
pub struct Norm<B: Backend> {
    pub weight: B::Weight,
    pub bias: Option<B::Weight>,
}

impl<B: Backend> Norm<B> {
    fn apply(&self, b: &B, x: &B::Tensor, eps: f32) -> Result<B::Tensor, ModelError> {
        Ok(b.layer_norm(x, &self.weight, self.bias.as_ref(), eps)?)
    }
}

/// One encoder block. Which norms exist follows `post_norm` (see the module doc).
pub struct EncoderLayer<B: Backend> {
    pub attention: EncoderAttention,
    /// Pre-norm before attention (ModernBERT; absent on its first layer).
    pub attn_norm: Option<Norm<B>>,
    pub q: Linear<B>,
    pub k: Linear<B>,
    pub v: Linear<B>,
    pub o: Linear<B>,
    /// Post-norm after the attention residual (BERT).
    pub attn_out_norm: Option<Norm<B>>,
    /// Pre-norm before the FFN (ModernBERT).
    pub mlp_norm: Option<Norm<B>>,
    pub up: Linear<B>,
    /// Gate half of a GeGLU FFN.
    pub gate: Option<Linear<B>>,
    pub down: Linear<B>,
    /// Post-norm after the FFN residual (BERT).
    pub out_norm: Option<Norm<B>>,
}

/// An encoder resident on backend `B`.
pub struct Encoder<B: Backend> {
    pub config: EncoderConfig,
    pub tok_embeddings: B::Weight,
    pub pos_embeddings: Option<B::Weight>,
    pub type_embeddings: Option<B::Weight>,
    pub emb_norm: Norm<B>,
    pub layers: Vec<EncoderLayer<B>>,
    pub final_norm: Option<Norm<B>>,
}

impl<B: Backend> Encoder<B> {
    /// Checks a batch before any work: no empty sequence, none longer than the positions allow,
    /// every id inside the vocabulary.
    pub fn check_batch(&self, seqs: &[&[u32]]) -> Result<(), ModelError> {
        for s in seqs {
            if s.is_empty() {
                return Err(ModelError::EmptySequence);
            }
            if s.len() > self.config.max_positions {
                return Err(ModelError::SequenceTooLong {
                    len: s.len(),
                    max: self.config.max_positions,
                });
            }
            if let Some(&id) = s.iter().find(|&&id| id as usize >= self.config.vocab_size) {
                return Err(ModelError::BadToken {
                    id,
                    vocab: self.config.vocab_size,
                });
            }
        }
        Ok(())
    }

    /// Final hidden states of a packed batch: `[Σ len, d_model]`, sequence after sequence.
    pub fn forward(&self, b: &B, seqs: &[&[u32]]) -> Result<B::Tensor, ModelError> {
        self.check_batch(seqs)?;
        b.run(|| self.forward_inner(b, seqs))
    }

    fn forward_inner(&self, b: &B, seqs: &[&[u32]]) -> Result<B::Tensor, ModelError> {
        let c = &self.config;
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.iter().copied()).collect();
        // Position of each token inside its own sequence.
        let local_pos: Vec<u32> = lens.iter().flat_map(|&n| 0..n as u32).collect();

        let mut h = b.embedding(&self.tok_embeddings, &ids)?;
        if let (Some(table), EncoderPositions::Absolute { offset, .. }) =
            (&self.pos_embeddings, &c.positions)
        {
            let rows: Vec<u32> = local_pos.iter().map(|&p| p + *offset as u32).collect();
            h = b.add(&h, &b.embedding(table, &rows)?)?;
        }
        if let Some(types) = &self.type_embeddings {
            h = b.add(&h, &b.embedding(types, &vec![0; ids.len()])?)?;
        }
        let eps = c.norm_eps;
        h = self.emb_norm.apply(b, &h, eps)?;

        let act = match c.activation {
            FfnActivation::Gelu => Activation::Gelu,
            FfnActivation::GeluTanh => Activation::GeluTanh,
            FfnActivation::Silu => Activation::Silu,
        };
        for layer in &self.layers {
            // Attention block.
            let normed;
            let x = match &layer.attn_norm {
                Some(n) => {
                    normed = n.apply(b, &h, eps)?;
                    &normed
                }
                None => &h,
            };
            let mut q = b.matmul(x, &layer.q)?;
            let mut k = b.matmul(x, &layer.k)?;
            let v = b.matmul(x, &layer.v)?;
            if let EncoderPositions::Rope { global, local } = &c.positions {
                let rc = match layer.attention {
                    EncoderAttention::Global => global,
                    EncoderAttention::Local { .. } => local,
                };
                let rp = RopeParams::new(rc, c.n_heads, c.head_dim, c.head_dim, RopeStyle::Neox);
                q = b.rope(&q, &local_pos, &rp)?;
                k = b.rope(&k, &local_pos, &rp)?;
            }
            let params = PackedAttentionParams {
                n_heads: c.n_heads,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
                radius: match layer.attention {
                    EncoderAttention::Global => None,
                    EncoderAttention::Local { radius } => Some(radius),
                },
            };
            let a = b.packed_attention(&q, &k, &v, &lens, &params)?;
            let a = b.matmul(&a, &layer.o)?;
            h = match &layer.attn_out_norm {
                Some(n) => b.add_layer_norm(&h, &a, &n.weight, n.bias.as_ref(), eps)?,
                None => b.add(&h, &a)?,
            };

            // Feed-forward block.
            let normed;
            let x = match &layer.mlp_norm {
                Some(n) => {
                    normed = n.apply(b, &h, eps)?;
                    &normed
                }
                None => &h,
            };
            let f = match &layer.gate {
                Some(gate) => {
                    b.gated_activation(&b.matmul(x, &layer.up)?, &b.matmul(x, gate)?, act)?
                }
                None => b.matmul_activation(x, &layer.up, act)?,
            };
            let f = b.matmul(&f, &layer.down)?;
            h = match &layer.out_norm {
                Some(n) => b.add_layer_norm(&h, &f, &n.weight, n.bias.as_ref(), eps)?,
                None => b.add(&h, &f)?,
            };
        }
        if let Some(n) = &self.final_norm {
            h = n.apply(b, &h, eps)?;
        }
        Ok(h)
    }

    /// One embedding per sequence: forward, then `pooling`, then L2 normalization when
    /// `normalize`.
    pub fn embed(
        &self,
        b: &B,
        seqs: &[&[u32]],
        pooling: Pooling,
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let h = self.forward(b, seqs)?;
        let states = b.to_f32(&h)?;
        let d = self.config.d_model;
        let mut out = Vec::with_capacity(seqs.len());
        let mut start = 0;
        for s in seqs {
            let rows = &states[start * d..(start + s.len()) * d];
            let mut e = pooling.pool(rows, d);
            if normalize {
                l2_normalize(&mut e);
            }
            out.push(e);
            start += s.len();
        }
        Ok(out)
    }
}

/// Tensor lookup in a safetensors checkpoint under the prefix its exporter used, with dtype and
/// shape checks (shapes in PyTorch order).
struct StLoader<'a, B: Backend> {
    backend: &'a B,
    st: &'a SafetensorsModel,
    prefix: &'static str,
}

impl<B: Backend> StLoader<'_, B> {
    fn find(&self, name: &str) -> Option<&SafeTensor> {
        self.st.tensor(&format!("{}{name}", self.prefix))
    }

    /// The tensor `name` with PyTorch shape `shape`, rows `rows` of it when given.
    fn data(
        &self,
        name: &str,
        shape: &[usize],
        rows: Option<std::ops::Range<usize>>,
    ) -> Result<Option<WeightData>, ModelError> {
        let Some(t) = self.find(name) else {
            return Ok(None);
        };
        let full = format!("{}{name}", self.prefix);
        let ty = t.ggml_type().ok_or_else(|| ModelError::UnsupportedDtype {
            name: full.clone(),
            dtype: format!("{:?}", t.dtype),
        })?;
        if t.shape != shape {
            return Err(ModelError::Shape {
                name: full,
                expected: shape.to_vec(),
                found: t.shape.clone(),
            });
        }
        let mut dims = t.ggml_dims();
        let mut bytes = t.bytes.clone();
        if let Some(r) = rows {
            let row_bytes = t.bytes.len() / shape[0].max(1);
            bytes = bytes
                .slice(r.start * row_bytes..r.end * row_bytes)
                .ok_or_else(|| ModelError::Shape {
                    name: full.clone(),
                    expected: shape.to_vec(),
                    found: t.shape.clone(),
                })?;
            if let Some(last) = dims.last_mut() {
                *last = r.len();
            }
        }
        Ok(Some(WeightData {
            name: full,
            ty,
            dims,
            bytes,
        }))
    }

    fn required(&self, name: &str, shape: &[usize]) -> Result<B::Weight, ModelError> {
        let d = self
            .data(name, shape, None)?
            .ok_or_else(|| ModelError::MissingTensor(format!("{}{name}", self.prefix)))?;
        Ok(self.backend.upload_weight(&d)?)
    }

    /// A layer norm `<prefix>.weight` / `.bias` (older BERT exports: `.gamma` / `.beta`).
    fn norm(&self, prefix: &str, d: usize, bias: bool) -> Result<Norm<B>, ModelError> {
        let (w, b) = if self.find(&format!("{prefix}.gamma")).is_some() {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(Norm {
            weight: self.required(&format!("{prefix}.{w}"), &[d])?,
            bias: if bias {
                Some(self.required(&format!("{prefix}.{b}"), &[d])?)
            } else {
                None
            },
        })
    }

    /// Rows `rows` of the linear `<prefix>.weight` (`[total_out, in]`) as a layer of its own,
    /// with the same rows of `<prefix>.bias` when `bias`. Splitting a fused QKV or gate/up
    /// matrix this way is a zero-copy view of the file.
    fn linear_rows(
        &self,
        prefix: &str,
        total_out: usize,
        in_features: usize,
        rows: std::ops::Range<usize>,
        bias: bool,
    ) -> Result<Linear<B>, ModelError> {
        let wname = format!("{prefix}.weight");
        let out_features = rows.len();
        let w = self
            .data(&wname, &[total_out, in_features], Some(rows.clone()))?
            .ok_or_else(|| ModelError::MissingTensor(format!("{}{wname}", self.prefix)))?;
        let bias = if bias {
            let bname = format!("{prefix}.bias");
            let d = self
                .data(&bname, &[total_out], Some(rows))?
                .ok_or_else(|| ModelError::MissingTensor(format!("{}{bname}", self.prefix)))?;
            Some(self.backend.upload_weight(&d)?)
        } else {
            None
        };
        Ok(Linear {
            weight: Arc::new(self.backend.upload_weight(&w)?),
            bias,
            in_features,
            out_features,
            ty: w.ty,
        })
    }

    fn linear(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear<B>, ModelError> {
        self.linear_rows(prefix, out, inp, 0..out, bias)
    }
}

/// Loads an encoder of `config` from a safetensors checkpoint (HF names, with or without the
/// `bert.` / `roberta.` / `model.` prefix a task head adds).
pub fn load_encoder<B: Backend>(
    backend: &B,
    st: &SafetensorsModel,
    config: EncoderConfig,
) -> Result<Encoder<B>, ModelError> {
    let probe = match config.arch {
        EncoderArch::ModernBert => "embeddings.tok_embeddings.weight",
        _ => "embeddings.word_embeddings.weight",
    };
    let prefix = ["", "bert.", "roberta.", "model."]
        .into_iter()
        .find(|p| st.tensor(&format!("{p}{probe}")).is_some())
        .ok_or_else(|| ModelError::MissingTensor(probe.into()))?;
    let l = StLoader {
        backend,
        st,
        prefix,
    };
    let c = &config;
    let (d, f) = (c.d_model, c.ffn_dim);
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
                let p = |s: &str| format!("encoder.layer.{i}.{s}");
                layers.push(EncoderLayer {
                    attention: c.layer_attention[i],
                    attn_norm: None,
                    q: l.linear(&p("attention.self.query"), d, d, c.attention_bias)?,
                    k: l.linear(&p("attention.self.key"), d, d, c.attention_bias)?,
                    v: l.linear(&p("attention.self.value"), d, d, c.attention_bias)?,
                    o: l.linear(&p("attention.output.dense"), d, d, c.attention_bias)?,
                    attn_out_norm: Some(l.norm(
                        &p("attention.output.LayerNorm"),
                        d,
                        c.norm_bias,
                    )?),
                    mlp_norm: None,
                    up: l.linear(&p("intermediate.dense"), f, d, c.mlp_bias)?,
                    gate: None,
                    down: l.linear(&p("output.dense"), d, f, c.mlp_bias)?,
                    out_norm: Some(l.norm(&p("output.LayerNorm"), d, c.norm_bias)?),
                });
            }
            Encoder {
                tok_embeddings: l
                    .required("embeddings.word_embeddings.weight", &[c.vocab_size, d])?,
                pos_embeddings: Some(
                    l.required("embeddings.position_embeddings.weight", &[table_len, d])?,
                ),
                type_embeddings: if c.type_vocab_size > 0 {
                    Some(l.required(
                        "embeddings.token_type_embeddings.weight",
                        &[c.type_vocab_size, d],
                    )?)
                } else {
                    None
                },
                emb_norm: l.norm("embeddings.LayerNorm", d, c.norm_bias)?,
                layers,
                final_norm: None,
                config,
            }
        }
        EncoderArch::ModernBert => {
            for i in 0..c.n_layers {
                let p = |s: &str| format!("layers.{i}.{s}");
                let qkv = |r: std::ops::Range<usize>| {
                    l.linear_rows(&p("attn.Wqkv"), 3 * d, d, r, c.attention_bias)
                };
                layers.push(EncoderLayer {
                    attention: c.layer_attention[i],
                    // ModernBERT's first layer reads the (already normed) embeddings directly.
                    attn_norm: if i == 0 {
                        None
                    } else {
                        Some(l.norm(&p("attn_norm"), d, c.norm_bias)?)
                    },
                    q: qkv(0..d)?,
                    k: qkv(d..2 * d)?,
                    v: qkv(2 * d..3 * d)?,
                    o: l.linear(&p("attn.Wo"), d, d, c.attention_bias)?,
                    attn_out_norm: None,
                    mlp_norm: Some(l.norm(&p("mlp_norm"), d, c.norm_bias)?),
                    up: l.linear_rows(&p("mlp.Wi"), 2 * f, d, 0..f, c.mlp_bias)?,
                    gate: Some(l.linear_rows(&p("mlp.Wi"), 2 * f, d, f..2 * f, c.mlp_bias)?),
                    down: l.linear(&p("mlp.Wo"), d, f, c.mlp_bias)?,
                    out_norm: None,
                });
            }
            Encoder {
                tok_embeddings: l
                    .required("embeddings.tok_embeddings.weight", &[c.vocab_size, d])?,
                pos_embeddings: None,
                type_embeddings: None,
                emb_norm: l.norm("embeddings.norm", d, c.norm_bias)?,
                layers,
                final_norm: Some(l.norm("final_norm", d, c.norm_bias)?),
                config,
            }
        }
    };
    Ok(encoder)
}
