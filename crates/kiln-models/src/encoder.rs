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

use kiln_backend::{Activation, Backend, Linear, PackedAttentionParams, RopeParams, RopeStyle};
use kiln_core::config::{EncoderAttention, EncoderConfig, EncoderPositions};

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

        let act = Activation::from(c.activation);
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
