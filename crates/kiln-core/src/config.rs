//! Typed configuration of transformers: decoder-only LLMs ([`DecoderConfig`]) and
//! bidirectional encoders ([`EncoderConfig`]).
//!
//! Families differ in small, named ways (rope style and bases, which norms exist, activation,
//! embedding scale, soft-capping, sliding-window pattern); each difference is a field here, read
//! once from the file's metadata by the family's loader, so that one forward pass serves all.

use std::sync::Arc;

/// How a layer attends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier position.
    Global,
    /// Only the last `window` positions (including the current one).
    Sliding { window: usize },
}

impl LayerAttention {
    /// The window of a sliding-window layer.
    pub fn window(self) -> Option<usize> {
        match self {
            LayerAttention::Global => None,
            LayerAttention::Sliding { window } => Some(window),
        }
    }
}

/// The first position a query at `pos` sees under a window of `window` positions (the window
/// holds `pos` itself).
pub fn window_start(pos: usize, window: usize) -> usize {
    (pos + 1).saturating_sub(window)
}

/// Rotary position embedding of one kind of layer: pair `i` of `rope_dim / 2` turns by
/// `position · freq_scale · base^(-2i / rope_dim) / freq_factors[i]`, and cos/sin are multiplied
/// by `mscale`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub base: f32,
    /// Linear position scaling (1.0 = none).
    pub freq_scale: f32,
    /// One divisor per rotary pair (Llama 3.1's frequency scaling, Phi-3's long-rope factors);
    /// `None` = all 1.
    pub freq_factors: Option<Arc<[f32]>>,
    /// Multiplies cos and sin (Phi-3 long-rope's attention factor; 1.0 = none).
    pub mscale: f32,
}

impl RopeConfig {
    /// Plain rotary embedding with base `base`: no scaling of any kind.
    pub fn plain(base: f32) -> Self {
        RopeConfig {
            base,
            freq_scale: 1.0,
            freq_factors: None,
            mscale: 1.0,
        }
    }
}

/// Dynamic NTK rope scaling (transformers' `rope_type: dynamic`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DynamicNtk {
    pub factor: f32,
    /// The context the base is for (`max_position_embeddings`).
    pub original_context: usize,
}

impl DynamicNtk {
    /// `rope` with the base of a pass reaching `extent` positions (`extent` past the original
    /// context; see [`DecoderConfig::rope_for`]), computed in f64.
    pub fn scaled(&self, rope: &RopeConfig, rope_dim: usize, extent: usize) -> RopeConfig {
        let (f, d) = (f64::from(self.factor), rope_dim as f64);
        let grow = f * extent as f64 / self.original_context as f64 - (f - 1.0);
        RopeConfig {
            base: (f64::from(rope.base) * grow.powf(d / (d - 2.0))) as f32,
            ..rope.clone()
        }
    }
}

/// Phi-3's long-rope: a second rope for contexts longer than the training one.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// Contexts (KV-cache capacities) above this use `rope` instead of the short one.
    pub original_context: usize,
    pub rope: RopeConfig,
}

/// Mixture-of-experts feed-forward: a router picks `top_k` of `n_experts` expert FFNs per token.
///
/// Gating (Mixtral, Qwen-MoE): `p = softmax(router_logits)`, keep the `top_k` largest, and with
/// `normalize_top_k` divide them by their sum; the layer's output is `Σ p_e · expert_e(x)`,
/// plus, with a shared expert (Qwen2-MoE), `sigmoid(x · w_gate) · shared(x)`, a gated FFN every
/// token runs.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub top_k: usize,
    pub normalize_top_k: bool,
    /// Inner width of each expert's FFN.
    pub expert_ffn_dim: usize,
    /// Inner width of the shared expert, where the layers have one (Qwen2-MoE).
    pub shared_ffn_dim: Option<usize>,
    /// Layers whose FFN is an ordinary dense one of `ffn_dim` (Qwen-MoE's `mlp_only_layers` and
    /// `decoder_sparse_step`), ascending; every other layer routes.
    pub dense_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether layer `layer` routes its tokens to experts (else its FFN is dense).
    pub fn routes(&self, layer: usize) -> bool {
        self.dense_layers.binary_search(&layer).is_err()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs (Llama in GGUF, after the converter's Q/K permutation).
    Normal,
    /// Halves (GPT-NeoX, Gemma, Qwen, Phi-3).
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// GELU, tanh approximation, gating `up` (Gemma).
    GeluTanh,
    /// Exact (erf) GELU (BERT; ModernBERT's GeGLU).
    Gelu,
    /// SiLU gating `up` (Llama, Qwen, Mistral).
    Silu,
}

/// Everything the decoder forward pass needs to know about a model's shape and arithmetic.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// `general.architecture` ("gemma3", ...).
    pub arch: String,
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Per-head width of queries and keys.
    pub head_dim: usize,
    /// Per-head width of values.
    pub head_dim_v: usize,
    /// Inner width of the feed-forward block.
    pub ffn_dim: usize,
    pub norm_eps: f32,
    /// Training context length (prompts may not exceed it).
    pub context_length: usize,
    pub rope_kind: RopeKind,
    /// Leading elements of each head that rotate.
    pub rope_dim: usize,
    /// Rope of global-attention layers.
    pub rope_global: RopeConfig,
    /// Rope of sliding-window layers (Gemma 3 uses a smaller base there).
    pub rope_local: RopeConfig,
    /// Phi-3 long-rope: replaces both ropes when the context exceeds its original length.
    pub rope_long: Option<LongRope>,
    /// Dynamic NTK scaling: past its original context, a forward pass's base grows with how far
    /// the sequence reaches (see [`DecoderConfig::rope_for`]).
    pub rope_dynamic: Option<DynamicNtk>,
    /// One entry per layer.
    pub layer_attention: Vec<LayerAttention>,
    /// Multiplies `q·k` before the softmax.
    pub attention_scale: f32,
    pub attn_logit_softcap: Option<f32>,
    pub activation: FfnActivation,
    /// Multiplies the token embeddings (Gemma: `√d_model`).
    pub embed_scale: Option<f32>,
    /// `Some`: every layer's FFN is a mixture of experts (`ffn_dim` is then unused).
    pub moe: Option<MoeConfig>,
}

impl DecoderConfig {
    /// Layers with a sliding window.
    pub fn windowed_layers(&self) -> usize {
        self.layer_attention
            .iter()
            .filter(|a| a.window().is_some())
            .count()
    }

    /// The widest sliding window of the layers, if any layer has one.
    pub fn widest_window(&self) -> Option<usize> {
        self.layer_attention.iter().filter_map(|a| a.window()).max()
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Width of all key heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Width of all value heads together.
    pub fn v_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim_v
    }

    /// The rope of a layer kind for a forward pass of one sequence whose KV cache holds
    /// `context` positions (long-rope picks its factors by it) and whose rows end at position
    /// `extent - 1` (dynamic NTK scales by it: the base of the pass is
    /// `base · (factor · extent / original − (factor − 1))^(d / (d − 2))` for `extent` past the
    /// original context, `d` the rotary dims, as transformers recomputes it per forward pass).
    pub fn rope_for(
        &self,
        attention: LayerAttention,
        context: usize,
        extent: usize,
    ) -> std::borrow::Cow<'_, RopeConfig> {
        let rope = match (&self.rope_long, attention) {
            (Some(long), _) if context > long.original_context => &long.rope,
            (_, LayerAttention::Global) => &self.rope_global,
            (_, LayerAttention::Sliding { .. }) => &self.rope_local,
        };
        match &self.rope_dynamic {
            Some(ntk) if extent > ntk.original_context => {
                std::borrow::Cow::Owned(ntk.scaled(rope, self.rope_dim, extent))
            }
            _ => std::borrow::Cow::Borrowed(rope),
        }
    }
}

/// Encoder families: they differ in norm placement, position encoding and FFN shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderArch {
    /// BERT: learned absolute positions, post-norm, biased linears, GELU FFN.
    Bert,
    /// XLM-RoBERTa (and RoBERTa): BERT with positions offset past the padding id.
    XlmRoberta,
    /// ModernBERT: RoPE, pre-norm, no biases, GeGLU, alternating global/local attention.
    ModernBert,
}

impl EncoderArch {
    pub fn name(self) -> &'static str {
        match self {
            EncoderArch::Bert => "bert",
            EncoderArch::XlmRoberta => "xlm-roberta",
            EncoderArch::ModernBert => "modernbert",
        }
    }
}

/// How an encoder knows where a token is.
#[derive(Clone, Debug, PartialEq)]
pub enum EncoderPositions {
    /// A learned table of `table_len` rows; token `i` of a sequence reads row `offset + i`
    /// (RoBERTa-style models start after the padding id: `offset = pad_id + 1`).
    Absolute { table_len: usize, offset: usize },
    /// Rotary embedding (NeoX halves) on queries and keys; local layers may use another base.
    Rope {
        global: RopeConfig,
        local: RopeConfig,
    },
}

/// How one encoder layer attends inside its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderAttention {
    /// Every token of the sequence.
    Global,
    /// Tokens at most `radius` positions away on either side.
    Local { radius: usize },
}

/// Everything an encoder forward pass needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    pub arch: EncoderArch,
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub norm_eps: f32,
    /// Layer norms have a bias (false for ModernBERT's default `norm_bias: false`).
    pub norm_bias: bool,
    /// Linear layers of attention / FFN have biases.
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// `true`: norm after each residual add (BERT); `false`: before each block (ModernBERT).
    pub post_norm: bool,
    /// `true`: the FFN's first projection yields `[input, gate]` halves, `act(input) · gate`.
    pub gated_ffn: bool,
    pub activation: FfnActivation,
    pub positions: EncoderPositions,
    /// Rows of the token-type table (BERT's segment embeddings; 0 when there is none). kiln
    /// encodes single texts, so every token has type 0.
    pub type_vocab_size: usize,
    pub layer_attention: Vec<EncoderAttention>,
    /// Longest sequence the position encoding allows.
    pub max_positions: usize,
}

impl EncoderConfig {
    /// Width of all heads together (= `d_model` for every supported family).
    pub fn attn_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}
