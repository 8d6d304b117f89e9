//! What a model costs, read from its file's tensor table and configuration without loading a
//! weight: bytes per layer and per tensor type, the KV cache per token, activations per batch,
//! and the bytes and multiply-adds of a decode step and of a prompt token.
//!
//! Every tensor is placed by its name: a numbered layer (`blk.N.`, `layers.N.`, `layer.N.`), the
//! embedding (names with `embd`/`embed`), or the head (the rest: the final norm, the output
//! projection, a pooler). A tensor with more than one row and more than one column outside the
//! embedding is a matrix that every token multiplies (a mixture-of-experts tensor only for its
//! routed share); everything else is a vector read once per step.
//!
//! The KV cache is counted as kiln allocates it: f32 keys and values for every layer and every
//! position of the context, sliding-window layers included (kiln has no ring buffers yet, so a
//! window saves reads, not memory).

use kiln_backend::{Activation, KvDtype};
use kiln_core::config::{DecoderConfig, EncoderConfig, LayerAttention};
use kiln_core::GgmlType;
use kiln_formats::{GgufFile, SafetensorsModel};

use super::probe::AttentionShape;
use crate::PREFILL_CHUNK;

/// Where a tensor belongs in the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    Embedding,
    Layer(usize),
    Head,
}

/// One tensor of the file.
#[derive(Clone, Debug)]
pub struct TensorCost {
    pub name: String,
    pub ty: GgmlType,
    /// Row length (GGUF `dims[0]`).
    pub k: u64,
    /// Rows (the product of the other dims).
    pub n: u64,
    pub bytes: u64,
    pub place: Place,
    /// A mixture-of-experts tensor: a token reads only its routed experts' share.
    pub expert: bool,
}

impl TensorCost {
    /// A matrix every token multiplies (outside the embedding lookup).
    pub fn is_matrix(&self) -> bool {
        self.place != Place::Embedding && self.k > 1 && self.n > 1
    }
}

/// The architecture-level facts the cost model needs.
#[derive(Clone, Debug)]
pub enum ModelShape {
    Decoder(DecoderConfig),
    Encoder(EncoderConfig),
}

/// A model's costs, from its file.
#[derive(Clone, Debug)]
pub struct ModelCost {
    pub shape: ModelShape,
    pub tensors: Vec<TensorCost>,
    /// The output projection is the token embedding (no output matrix in the file).
    pub tied_output: bool,
    /// The element type the KV cache is stored in (the backend's choice: `Backend::kv_dtype`).
    pub kv_dtype: KvDtype,
}

/// The layer number in a tensor name: the number after a `blk`, `layers`, `layer` or `h`
/// segment.
fn layer_of(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts.windows(2).find_map(|w| {
        matches!(w[0], "blk" | "layers" | "layer" | "h")
            .then(|| w[1].parse().ok())
            .flatten()
    })
}

fn place_of(name: &str) -> Place {
    if let Some(l) = layer_of(name) {
        Place::Layer(l)
    } else if name.contains("embd") || name.contains("embed") {
        Place::Embedding
    } else {
        Place::Head
    }
}

fn is_expert(name: &str) -> bool {
    name.contains("_exps") || name.contains(".experts.")
}

fn tensor(name: &str, ty: GgmlType, dims: &[u64], bytes: u64) -> TensorCost {
    let k = dims.first().copied().unwrap_or(1);
    let n = dims.iter().skip(1).product::<u64>().max(1);
    TensorCost {
        name: name.to_string(),
        ty,
        k,
        n,
        bytes,
        place: place_of(name),
        expert: is_expert(name),
    }
}

/// Bytes of the keys and values of one position over all layers, stored as `dtype`.
pub fn kv_bytes_per_token(c: &DecoderConfig, dtype: KvDtype) -> u64 {
    (c.n_layers * kiln_models::kv_row_bytes(c, dtype)) as u64
}

impl ModelCost {
    /// The costs of a GGUF decoder.
    pub fn from_gguf(file: &GgufFile, config: DecoderConfig) -> ModelCost {
        let tensors: Vec<TensorCost> = file
            .tensors()
            .iter()
            .map(|t| tensor(&t.name, t.ty, &t.dims, t.n_bytes))
            .collect();
        let tied_output = file.tensor("output.weight").is_none();
        ModelCost {
            shape: ModelShape::Decoder(config),
            tensors,
            tied_output,
            kv_dtype: KvDtype::default(),
        }
    }

    /// The costs of a safetensors checkpoint (decoder or encoder): its tensors whose names start
    /// with `prefix` (the text model of a multimodal checkpoint; `""` for all). `tied_output` as
    /// the configuration says (`tie_word_embeddings` without an `lm_head`); false for encoders.
    pub fn from_safetensors(
        st: &SafetensorsModel,
        shape: ModelShape,
        tied_output: bool,
        prefix: &str,
    ) -> Self {
        let tensors = st
            .tensors()
            .into_iter()
            .filter(|t| t.name.starts_with(prefix))
            .map(|t| {
                let dims: Vec<u64> = t.ggml_dims().iter().map(|&d| d as u64).collect();
                // GPTQ checkpoints store I32 words; their element type is counted by bytes only.
                let ty = t.ggml_type().unwrap_or(GgmlType::I32);
                tensor(&t.name, ty, &dims, t.bytes.len() as u64)
            })
            .collect();
        ModelCost {
            shape,
            tensors,
            tied_output,
            kv_dtype: KvDtype::default(),
        }
    }

    pub fn n_layers(&self) -> usize {
        match &self.shape {
            ModelShape::Decoder(c) => c.n_layers,
            ModelShape::Encoder(c) => c.n_layers,
        }
    }

    pub fn d_model(&self) -> usize {
        match &self.shape {
            ModelShape::Decoder(c) => c.d_model,
            ModelShape::Encoder(c) => c.d_model,
        }
    }

    pub fn decoder(&self) -> Option<&DecoderConfig> {
        match &self.shape {
            ModelShape::Decoder(c) => Some(c),
            ModelShape::Encoder(_) => None,
        }
    }

    /// Bytes of the tensors in `place`.
    pub fn bytes_at(&self, place: Place) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.place == place)
            .map(|t| t.bytes)
            .sum()
    }

    /// Bytes of the whole file's tensors.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Bytes per tensor type, largest first.
    pub fn bytes_by_type(&self) -> Vec<(GgmlType, u64)> {
        let mut by: Vec<(GgmlType, u64)> = Vec::new();
        for t in &self.tensors {
            match by.iter_mut().find(|(ty, _)| *ty == t.ty) {
                Some((_, b)) => *b += t.bytes,
                None => by.push((t.ty, t.bytes)),
            }
        }
        by.sort_by_key(|e| std::cmp::Reverse(e.1));
        by
    }

    /// The share of a mixture-of-experts tensor that `batch` tokens read: the expected number
    /// of distinct experts chosen under uniform routing, over the expert count.
    pub fn expert_share(&self, batch: usize) -> f64 {
        match self.decoder().and_then(|c| c.moe.as_ref()) {
            Some(m) => {
                let p = (m.top_k as f64 / m.n_experts.max(1) as f64).min(1.0);
                1.0 - (1.0 - p).powi(batch.max(1) as i32)
            }
            None => 1.0,
        }
    }

    /// Multiply-adds per token of a mixture-of-experts matrix's share (top_k of n experts).
    fn expert_macs_share(&self) -> f64 {
        match self.decoder().and_then(|c| c.moe.as_ref()) {
            Some(m) => m.top_k as f64 / m.n_experts.max(1) as f64,
            None => 1.0,
        }
    }

    /// The output projection's tensor (the embedding when tied); `None` for encoders.
    pub fn output(&self) -> Option<&TensorCost> {
        self.decoder()?;
        let name = |t: &&TensorCost| {
            if self.tied_output {
                t.place == Place::Embedding && t.is_embedding_table()
            } else {
                t.place == Place::Head && t.k > 1 && t.n > 1
            }
        };
        self.tensors.iter().find(name)
    }

    /// The matrices of `place` with the share of their bytes a step of `batch` tokens reads and
    /// the multiply-adds per token.
    pub fn products(&self, place: Place, batch: usize) -> Vec<Product<'_>> {
        let read = self.expert_share(batch);
        let macs = self.expert_macs_share();
        let mut out: Vec<Product<'_>> = self
            .tensors
            .iter()
            .filter(|t| t.place == place && t.is_matrix())
            .map(|t| Product {
                tensor: t,
                bytes: if t.expert {
                    t.bytes as f64 * read
                } else {
                    t.bytes as f64
                },
                macs_per_token: (t.k * t.n) as f64 * if t.expert { macs } else { 1.0 },
            })
            .collect();
        if place == Place::Head && self.tied_output {
            if let Some(t) = self.output() {
                out.push(Product {
                    tensor: t,
                    bytes: t.bytes as f64,
                    macs_per_token: (t.k * t.n) as f64,
                });
            }
        }
        out
    }

    /// The probe shape of each weight type of the model's matrices that kiln can write (GPTQ's
    /// packed words are predicted from their bytes alone).
    pub fn probe_shapes(&self) -> Vec<ProductShape> {
        let mut largest: Vec<&TensorCost> = Vec::new();
        let output = self.output();
        let matrices = self.tensors.iter().filter(|t| t.is_matrix()).chain(output);
        for t in matrices.filter(|t| kiln_quant::can_quantize(t.ty)) {
            match largest.iter_mut().find(|l| l.ty == t.ty) {
                Some(l) if l.bytes < t.bytes => *l = t,
                Some(_) => {}
                None => largest.push(t),
            }
        }
        largest
            .into_iter()
            .map(|t| ProductShape {
                ty: t.ty,
                k: t.k as usize,
                n: (t.n as usize).min(PROBE_MAX_ROWS),
            })
            .collect()
    }

    /// Bytes of the vectors (norms, biases) of `place`.
    pub fn vector_bytes(&self, place: Place) -> f64 {
        self.tensors
            .iter()
            .filter(|t| t.place == place && !t.is_matrix() && place != Place::Embedding)
            .map(|t| t.bytes as f64)
            .sum()
    }

    /// Bytes of weights a decode step of `batch` sequences reads in layers `layers` (and the
    /// head when `head`): every matrix (the routed share of expert tensors) and every vector.
    pub fn step_weight_bytes(
        &self,
        layers: std::ops::Range<usize>,
        head: bool,
        batch: usize,
    ) -> f64 {
        let mut places: Vec<Place> = layers.map(Place::Layer).collect();
        if head {
            places.push(Place::Head);
        }
        places
            .into_iter()
            .map(|pl| {
                self.products(pl, batch)
                    .iter()
                    .map(|p| p.bytes)
                    .sum::<f64>()
                    + self.vector_bytes(pl)
            })
            .sum()
    }

    /// Bytes of one sequence's KV cache read per step, averaged over the `n` steps of a
    /// generation from an empty cache (step `i` attends to `i` positions, or the window).
    pub fn mean_kv_read_bytes(&self, n: usize) -> f64 {
        let layers = 0..self.n_layers();
        (1..=n)
            .map(|i| self.kv_read_bytes(layers.clone(), i))
            .sum::<f64>()
            / n.max(1) as f64
    }

    /// Bytes of one sequence's KV cache read by a decode step at `position` (the positions it
    /// attends to: all before it, or the window on sliding-window layers), for layers `layers`.
    pub fn kv_read_bytes(&self, layers: std::ops::Range<usize>, position: usize) -> f64 {
        let Some(c) = self.decoder() else { return 0.0 };
        let row = kiln_models::kv_row_bytes(c, self.kv_dtype) as f64;
        c.layer_attention[layers]
            .iter()
            .map(|a| match a {
                LayerAttention::Global => position as f64,
                LayerAttention::Sliding { window } => position.min(*window) as f64,
            })
            .sum::<f64>()
            * row
    }

    /// Attention multiply-adds of a prompt of `tokens` tokens in layers `layers` (causal, or
    /// bidirectional for encoders; windows respected).
    pub fn attention_macs(&self, layers: std::ops::Range<usize>, tokens: usize) -> f64 {
        let t = tokens as f64;
        match &self.shape {
            ModelShape::Decoder(c) => {
                let per = (c.n_heads * (c.head_dim + c.head_dim_v)) as f64;
                c.layer_attention[layers]
                    .iter()
                    .map(|a| {
                        let visible: f64 = match a {
                            LayerAttention::Global => t * (t + 1.0) / 2.0,
                            LayerAttention::Sliding { window } => {
                                (0..tokens).map(|i| (i + 1).min(*window) as f64).sum()
                            }
                        };
                        visible * per
                    })
                    .sum()
            }
            ModelShape::Encoder(c) => layers.len() as f64 * t * t * (2 * c.attn_dim()) as f64,
        }
    }

    /// The attention shape a rate is probed at for this model (over 256 tokens).
    pub fn attention_shape(&self) -> AttentionShape {
        match &self.shape {
            ModelShape::Decoder(c) => AttentionShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                tokens: 256,
                causal: true,
            },
            ModelShape::Encoder(c) => AttentionShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_heads,
                head_dim: c.head_dim,
                tokens: 256,
                causal: false,
            },
        }
    }

    /// The gated activation the model's FFN runs.
    pub fn activation(&self) -> Activation {
        match &self.shape {
            ModelShape::Decoder(c) => c.activation,
            ModelShape::Encoder(c) => c.activation,
        }
        .into()
    }

    /// Elements the element-wise ops of one layer touch per token: norms, residual adds, QK
    /// norms and ropes over the queries and keys, the FFN's activation.
    pub fn elementwise_per_token(&self) -> f64 {
        match &self.shape {
            ModelShape::Decoder(c) => {
                let ffn = c
                    .moe
                    .as_ref()
                    .map_or(c.ffn_dim, |m| m.expert_ffn_dim * m.top_k);
                (4 * c.d_model + 2 * (c.q_dim() + c.kv_dim()) + ffn) as f64
            }
            ModelShape::Encoder(c) => (6 * c.d_model + c.ffn_dim) as f64,
        }
    }

    /// Bytes of the contiguous KV caches of `batch` sequences of `ctx` positions, in layers
    /// `layers`: a sliding-window layer keeps a ring of its window plus one prompt piece
    /// ([`crate::PREFILL_CHUNK`]) of rows, at most `ctx` (see `kiln_models::KvCache`).
    pub fn kv_cache_bytes(&self, layers: std::ops::Range<usize>, ctx: usize, batch: usize) -> u64 {
        let Some(c) = self.decoder() else { return 0 };
        let rows: usize = c.layer_attention[layers]
            .iter()
            .map(|a| match a {
                LayerAttention::Global => ctx,
                LayerAttention::Sliding { window } => {
                    kiln_models::ring_rows(*window, crate::PREFILL_CHUNK, ctx).min(ctx)
                }
            })
            .sum();
        (rows * kiln_models::kv_row_bytes(c, self.kv_dtype) * batch) as u64
    }

    /// Bytes of the activations of one forward pass over `rows` tokens (the largest tensors a
    /// pass holds at once: the residual stream and its norm, Q/K/V, the attention output, the
    /// FFN's gate, up and product), plus `logit_rows` rows of logits.
    pub fn activation_bytes(&self, rows: usize, logit_rows: usize) -> u64 {
        let per_row = match &self.shape {
            ModelShape::Decoder(c) => {
                let ffn = c
                    .moe
                    .as_ref()
                    .map_or(c.ffn_dim, |m| m.expert_ffn_dim * m.top_k);
                3 * c.d_model
                    + c.q_dim()
                    + c.kv_dim()
                    + c.v_dim()
                    + c.n_heads * c.head_dim_v
                    + 3 * ffn
            }
            ModelShape::Encoder(c) => 4 * c.d_model + 3 * c.attn_dim() + 3 * c.ffn_dim,
        };
        let vocab = self.decoder().map_or(0, |c| c.vocab_size);
        ((rows * per_row + logit_rows * vocab) * size_of::<f32>()) as u64
    }

    /// Rows of the largest forward pass a decoder runs for `batch` sequences: a prompt chunk or
    /// the batch.
    pub fn pass_rows(&self, batch: usize) -> usize {
        PREFILL_CHUNK.max(batch)
    }
}

impl TensorCost {
    /// The token embedding table (the one embedding tensor with the vocabulary's rows).
    fn is_embedding_table(&self) -> bool {
        self.k > 1 && self.n > 1 && (self.name.contains("token") || self.name.contains("word"))
    }
}

/// The matrix a product rate is probed on for one weight type: the shape of the model's
/// largest matrix of that type, with at most [`PROBE_MAX_ROWS`] rows (a forward pass's own
/// shapes: per-call costs and the memory streams differ between a 640×256 and a 2048×8192
/// matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProductShape {
    pub ty: GgmlType,
    pub k: usize,
    pub n: usize,
}

/// Most rows of a probed matrix (an output projection's 262k rows stream as 8k do).
pub const PROBE_MAX_ROWS: usize = 8192;

impl ProductShape {
    /// The key of its rates in the probe cache.
    pub fn key(&self) -> String {
        format!("{} {}x{}", self.ty, self.k, self.n)
    }
}

/// One matrix product of a step: the tensor, the bytes a step reads from it, and multiply-adds
/// per token.
#[derive(Clone, Copy, Debug)]
pub struct Product<'a> {
    pub tensor: &'a TensorCost,
    pub bytes: f64,
    pub macs_per_token: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_placed_by_name() {
        assert_eq!(place_of("blk.12.attn_q.weight"), Place::Layer(12));
        assert_eq!(
            place_of("model.layers.3.mlp.up_proj.weight"),
            Place::Layer(3)
        );
        assert_eq!(
            place_of("encoder.layer.5.output.dense.weight"),
            Place::Layer(5)
        );
        assert_eq!(place_of("token_embd.weight"), Place::Embedding);
        assert_eq!(place_of("model.embed_tokens.weight"), Place::Embedding);
        assert_eq!(
            place_of("embeddings.position_embeddings.weight"),
            Place::Embedding
        );
        assert_eq!(place_of("output.weight"), Place::Head);
        assert_eq!(place_of("lm_head.weight"), Place::Head);
        assert_eq!(place_of("pooler.dense.weight"), Place::Head);
        assert!(is_expert("blk.0.ffn_up_exps.weight"));
        assert!(is_expert("model.layers.0.mlp.experts.7.up_proj.weight"));
    }
}
