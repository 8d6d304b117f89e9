//! Typed configuration of decoder-only transformers.
//!
//! Families differ in small, named ways (rope style and bases, which norms exist, activation,
//! embedding scale, soft-capping, sliding-window pattern); each difference is a field here, read
//! once from the file's metadata by the family's loader, so that one forward pass serves all.

/// How a layer attends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier position.
    Global,
    /// Only the last `window` positions (including the current one).
    Sliding { window: usize },
}

/// Rotary position embedding of one kind of layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub base: f32,
    /// Linear position scaling (1.0 = none).
    pub freq_scale: f32,
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
    /// One entry per layer.
    pub layer_attention: Vec<LayerAttention>,
    /// Multiplies `q·k` before the softmax.
    pub attention_scale: f32,
    pub attn_logit_softcap: Option<f32>,
    pub activation: FfnActivation,
    /// Multiplies the token embeddings (Gemma: `√d_model`).
    pub embed_scale: Option<f32>,
}

impl DecoderConfig {
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
}
