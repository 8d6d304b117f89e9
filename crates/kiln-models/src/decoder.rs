//! The decoder-only transformer forward pass, one for every family.
//!
//! Per layer (pre-norm residual blocks; the optional post-norms are Gemma's "sandwich"):
//!
//! ```text
//! h = norm(x) ; q,k,v = h·Wq, h·Wk, h·Wv ; q,k = qk_norm(q,k)? ; q,k = rope(q,k)
//! a = attention(q, K, V) · Wo ; x = x + post_attn_norm?(a)
//! h = norm(x) ; f = (act(h·Wgate) * h·Wup) · Wdown ; x = x + post_ffn_norm?(f)
//! ```
//! then `logits = norm(x) · Woutᵀ`.

use std::sync::Arc;

use kiln_backend::{Activation, AttentionParams, Backend, Linear, RopeParams, RopeStyle};
use kiln_core::config::{DecoderConfig, FfnActivation, LayerAttention, RopeKind};

use crate::{KvCache, ModelError};

/// A do-nothing-by-default hook on every named intermediate, so a test can diff a model layer by
/// layer against a reference.
pub trait Trace<B: Backend>: Sync {
    fn trace(&self, _backend: &B, _name: &str, _layer: usize, _x: &B::Tensor) {}
}

/// The default hook: does nothing.
pub struct NoTrace;
impl<B: Backend> Trace<B> for NoTrace {}

/// One transformer block's weights.
pub struct DecoderLayer<B: Backend> {
    pub attn_norm: B::Weight,              // (d_model)
    pub q: Linear<B>,                      // (n_heads * head_dim, d_model)
    pub k: Linear<B>,                      // (n_kv_heads * head_dim, d_model)
    pub v: Linear<B>,                      // (n_kv_heads * head_dim_v, d_model)
    pub q_norm: Option<B::Weight>,         // (head_dim) QK-norm: Gemma 3, Qwen 3
    pub k_norm: Option<B::Weight>,         // (head_dim)
    pub o: Linear<B>,                      // (d_model, n_heads * head_dim_v)
    pub post_attn_norm: Option<B::Weight>, // (d_model) Gemma's sandwich norm
    pub ffn_norm: B::Weight,               // (d_model)
    pub gate: Linear<B>,                   // (ffn_dim, d_model)
    pub up: Linear<B>,                     // (ffn_dim, d_model)
    pub down: Linear<B>,                   // (d_model, ffn_dim)
    pub post_ffn_norm: Option<B::Weight>,  // (d_model)
}

/// A decoder-only language model resident on backend `B`.
pub struct Decoder<B: Backend> {
    pub config: DecoderConfig,
    pub token_embd: Arc<B::Weight>, // (vocab, d_model)
    pub layers: Vec<DecoderLayer<B>>,
    pub output_norm: B::Weight, // (d_model)
    pub output: Linear<B>,      // (vocab, d_model); tied to token_embd when the file has no output
}

impl<B: Backend> Decoder<B> {
    /// Run `ids` (at positions `cache.len()..`) through the model, appending their keys and
    /// values to `cache`, and return the final normalized hidden states `(ids.len(), d_model)`.
    /// [`Decoder::logits`] turns any subset of those rows into logits.
    pub fn forward(
        &self,
        b: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
    ) -> Result<B::Tensor, ModelError> {
        self.forward_traced(b, ids, cache, &NoTrace)
    }

    pub fn forward_traced(
        &self,
        b: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        b.run(|| self.forward_inner(b, ids, cache, trace))
    }

    fn forward_inner(
        &self,
        b: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
        trace: &dyn Trace<B>,
    ) -> Result<B::Tensor, ModelError> {
        let c = &self.config;
        let n = ids.len();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ModelError::BadToken {
                id,
                vocab: c.vocab_size,
            });
        }
        cache.check_room(n)?;
        let pos0 = cache.len();
        let positions: Vec<u32> = (pos0..pos0 + n).map(|p| p as u32).collect();

        let mut x = b.embedding(&self.token_embd, ids)?;
        if let Some(s) = c.embed_scale {
            x = b.scale(&x, s)?;
        }
        trace.trace(b, "embd", 0, &x);
        let act = match c.activation {
            FfnActivation::GeluTanh => Activation::GeluTanh,
            FfnActivation::Gelu => Activation::Gelu,
            FfnActivation::Silu => Activation::Silu,
        };
        let style = match c.rope_kind {
            RopeKind::Normal => RopeStyle::Normal,
            RopeKind::Neox => RopeStyle::Neox,
        };

        for (il, layer) in self.layers.iter().enumerate() {
            let (rope, window) = match c.layer_attention[il] {
                LayerAttention::Global => (c.rope_global, None),
                LayerAttention::Sliding { window } => (c.rope_local, Some(window)),
            };
            let rope_params = |n_heads| RopeParams {
                n_heads,
                head_dim: c.head_dim,
                rope_dim: c.rope_dim,
                base: rope.base,
                freq_scale: rope.freq_scale,
                style,
            };

            // Attention block.
            let h = b.rms_norm(&x, &layer.attn_norm, c.norm_eps)?;
            let mut q = b.matmul(&h, &layer.q)?;
            let mut k = b.matmul(&h, &layer.k)?;
            let v = b.matmul(&h, &layer.v)?;
            if let Some(w) = &layer.q_norm {
                q = b.rms_norm(&q, w, c.norm_eps)?;
            }
            if let Some(w) = &layer.k_norm {
                k = b.rms_norm(&k, w, c.norm_eps)?;
            }
            let q = b.rope(&q, &positions, &rope_params(c.n_heads))?;
            let k = b.rope(&k, &positions, &rope_params(c.n_kv_heads))?;
            trace.trace(b, "q", il, &q);
            trace.trace(b, "k", il, &k);
            b.write_rows(&mut cache.k[il], pos0, &k)?;
            b.write_rows(&mut cache.v[il], pos0, &v)?;
            let params = AttentionParams {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                scale: c.attention_scale,
                sliding_window: window,
                softcap: c.attn_logit_softcap,
            };
            let a = b.attention(&q, &cache.k[il], &cache.v[il], pos0, pos0 + n, &params)?;
            let a = b.matmul(&a, &layer.o)?;
            trace.trace(b, "attn_out", il, &a);
            x = match &layer.post_attn_norm {
                Some(w) => b.add_rms_norm(&x, &a, w, c.norm_eps)?,
                None => b.add(&x, &a)?,
            };

            // Feed-forward block.
            let h = b.rms_norm(&x, &layer.ffn_norm, c.norm_eps)?;
            let gate = b.matmul(&h, &layer.gate)?;
            let up = b.matmul(&h, &layer.up)?;
            let f = b.gated_activation(&gate, &up, act)?;
            let f = b.matmul(&f, &layer.down)?;
            trace.trace(b, "ffn_out", il, &f);
            x = match &layer.post_ffn_norm {
                Some(w) => b.add_rms_norm(&x, &f, w, c.norm_eps)?,
                None => b.add(&x, &f)?,
            };
            trace.trace(b, "l_out", il, &x);
        }
        cache.advance(n);
        Ok(b.rms_norm(&x, &self.output_norm, c.norm_eps)?)
    }

    /// Logits `(rows, vocab)` of final hidden states (any rows of `forward`'s result).
    pub fn logits(&self, b: &B, hidden: &B::Tensor) -> Result<B::Tensor, ModelError> {
        Ok(b.run(|| b.matmul(hidden, &self.output))?)
    }

    /// A KV cache for this model holding `capacity` positions.
    pub fn new_cache(&self, b: &B, capacity: usize) -> Result<KvCache<B>, ModelError> {
        KvCache::new(b, &self.config, capacity)
    }
}
