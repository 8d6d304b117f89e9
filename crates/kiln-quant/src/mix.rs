//! Quantization mixes: which type each tensor of a model gets, as `llama-quantize` decides it.
//!
//! A [`QuantMix`] is a llama.cpp file type (`Q4_K_M`, `Q8_0`, ...): a default tensor type plus
//! rules that give some tensors more bits. [`plan_types`] ports llama.cpp's
//! `llama_tensor_get_type` (`src/llama-quant.cpp`, without an importance matrix, type
//! overrides or `--pure`) for the mixes listed in [`QuantMix::ALL`]:
//!
//! - Only 2-D and 3-D tensors whose name ends in `weight` are converted, never norms
//!   (`*_norm.weight`), MoE routers (`ffn_gate_inp`), position or token-type embeddings, nor the
//!   small tensors llama.cpp lists by name; every other tensor (1-D norms and biases,
//!   `rope_freqs`, `rope_factors_*`) keeps its type and bytes.
//! - `output.weight`, and `token_embd.weight` when the model has no `output.weight` (tied
//!   embeddings), get Q6_K unless the mix is Q8_0 (Q8_0 when the row is not a whole number of
//!   the mix's blocks).
//! - attention V (`attn_v`, fused `attn_qkv`, `attn_kv_b`), counted in llama.cpp's tensor
//!   order (layer, then name): Q2_K → Q4_K when `n_head / n_head_kv >= 4`, else Q3_K;
//!   Q3_K_M → Q5_K for the first two, else Q4_K; Q3_K_L → Q5_K; Q4_K_M and Q5_K_M → Q6_K on
//!   the "use more bits" layers (the first and last eighth, and every third in between);
//!   Q4_K_S → Q5_K for the first four. A 70B llama or qwen2 (80 layers, grouped-query
//!   attention) then moves Q3_K/Q4_K to Q5_K; an 8-expert model puts them all at Q8_0.
//! - `attn_k` of an 8-expert model → Q8_0.
//! - `ffn_down` (experts included; with experts the layer is read from the `blk.N.` name):
//!   Q2_K → Q3_K; Q3_K_M → Q5_K in the first sixteenth of the layers, else Q4_K; Q3_K_L → Q5_K;
//!   Q4_K_M and Q5_K_M → Q6_K on the use-more-bits layers; Q4_K_S → Q5_K in the first eighth.
//! - `attn_output`: Q2_K → Q3_K, Q3_K_M → Q4_K, Q3_K_L → Q5_K; for 8 experts, Q5_K for the
//!   Q2_K, Q3_K_S, Q3_K_M, Q4_K_S and Q4_K_M mixes.
//! - Fallback: a row length that is not a whole number of the chosen type's blocks moves Q2_K
//!   and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0; if that still does not fit (or
//!   the type already has 32-element blocks), F16.
//! - F16 and BF16 mixes convert every eligible tensor, with no rules.
//!
//! Left out, because they concern architectures or file types kiln does not run or write:
//! Falcon's rules, GLM5-next's Q8_0 floor, the IQ*, TQ*, Q2_K_S, MXFP4 and NVFP4 mixes (and
//! their branches in the rules above), the imatrix-only Q4_0/Q5_0 `ffn_down` rule, and
//! `attn_qkv`'s own branch, which llama.cpp never reaches (the attention-V branch before it
//! takes fused QKV tensors too). `ffn_gate`/`ffn_up` have rules only for IQ3_XS.

use std::str::FromStr;

use kiln_core::GgmlType;

use crate::QuantError;

/// A quantization mix (llama.cpp's `LLAMA_FTYPE_MOSTLY_*`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantMix {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    F16,
    BF16,
}

impl QuantMix {
    pub const ALL: [QuantMix; 16] = [
        QuantMix::Q4_0,
        QuantMix::Q4_1,
        QuantMix::Q5_0,
        QuantMix::Q5_1,
        QuantMix::Q8_0,
        QuantMix::Q2_K,
        QuantMix::Q3_K_S,
        QuantMix::Q3_K_M,
        QuantMix::Q3_K_L,
        QuantMix::Q4_K_S,
        QuantMix::Q4_K_M,
        QuantMix::Q5_K_S,
        QuantMix::Q5_K_M,
        QuantMix::Q6_K,
        QuantMix::F16,
        QuantMix::BF16,
    ];

    /// The lowercase name `kiln quantize --type` takes (`q4_k_m`).
    pub fn name(self) -> &'static str {
        use QuantMix::*;
        match self {
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q2_K => "q2_k",
            Q3_K_S => "q3_k_s",
            Q3_K_M => "q3_k_m",
            Q3_K_L => "q3_k_l",
            Q4_K_S => "q4_k_s",
            Q4_K_M => "q4_k_m",
            Q5_K_S => "q5_k_s",
            Q5_K_M => "q5_k_m",
            Q6_K => "q6_k",
            F16 => "f16",
            BF16 => "bf16",
        }
    }

    /// llama.cpp's `LLAMA_FTYPE_*` number, which GGUF stores as `general.file_type`.
    pub fn file_type(self) -> u32 {
        use QuantMix::*;
        match self {
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q8_0 => 7,
            Q5_0 => 8,
            Q5_1 => 9,
            Q2_K => 10,
            Q3_K_S => 11,
            Q3_K_M => 12,
            Q3_K_L => 13,
            Q4_K_S => 14,
            Q4_K_M => 15,
            Q5_K_S => 16,
            Q5_K_M => 17,
            Q6_K => 18,
            BF16 => 32,
        }
    }

    /// The type of every converted tensor no rule moves (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        use QuantMix::*;
        match self {
            Q4_0 => GgmlType::Q4_0,
            Q4_1 => GgmlType::Q4_1,
            Q5_0 => GgmlType::Q5_0,
            Q5_1 => GgmlType::Q5_1,
            Q8_0 => GgmlType::Q8_0,
            Q2_K => GgmlType::Q2_K,
            Q3_K_S | Q3_K_M | Q3_K_L => GgmlType::Q3_K,
            Q4_K_S | Q4_K_M => GgmlType::Q4_K,
            Q5_K_S | Q5_K_M => GgmlType::Q5_K,
            Q6_K => GgmlType::Q6_K,
            F16 => GgmlType::F16,
            BF16 => GgmlType::BF16,
        }
    }

    /// Whether the per-tensor rules and the fallback apply (llama.cpp: the default type is a
    /// block format).
    fn is_block_mix(self) -> bool {
        !matches!(self, QuantMix::F16 | QuantMix::BF16)
    }
}

impl FromStr for QuantMix {
    type Err = QuantError;

    /// Case-insensitive: `Q4_K_M`, `q4_k_m`.
    fn from_str(s: &str) -> Result<QuantMix, QuantError> {
        QuantMix::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| QuantError::UnknownMix(s.to_owned()))
    }
}

impl std::fmt::Display for QuantMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the rules need to know about the model, from its GGUF metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MixModel {
    /// `general.architecture` (`llama`, `qwen2`, `gemma3`, ...).
    pub architecture: String,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// `{arch}.attention.head_count` and `head_count_kv` (of layer 0 when per-layer arrays).
    pub n_head: u32,
    pub n_head_kv: u32,
    /// `{arch}.expert_count`, 0 for a dense model.
    pub n_expert: u32,
}

impl MixModel {
    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B`, the only model size its rules look at.
    fn is_70b(&self) -> bool {
        match self.architecture.as_str() {
            "llama" => self.n_expert != 8 && self.n_layer == 80 && self.n_head != self.n_head_kv,
            "qwen2" => self.n_layer == 80,
            _ => false,
        }
    }
}

/// A tensor as the rules see it.
#[derive(Clone, Copy, Debug)]
pub struct MixTensor<'a> {
    pub name: &'a str,
    /// ggml order: `dims[0]` is the row length.
    pub dims: &'a [u64],
    /// Its current type.
    pub ty: GgmlType,
}

/// The type chosen for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub ty: GgmlType,
    /// Set when the rules wanted a type whose blocks do not divide the row length: the type
    /// they wanted (`ty` is the fallback).
    pub fallback_from: Option<GgmlType>,
}

/// Broad roles of tensors (llama.cpp's `tensor_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttentionQkv,
    AttentionKvB,
    AttentionV,
    AttentionK,
    AttentionQ,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

impl Category {
    fn of(name: &str) -> Category {
        if name == "output.weight" {
            return Category::Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return Category::TokenEmbd;
        }
        const BY_SUBSTRING: [(&str, Category); 9] = [
            ("attn_qkv.weight", Category::AttentionQkv),
            ("attn_kv_b.weight", Category::AttentionKvB),
            ("attn_v.weight", Category::AttentionV),
            ("attn_k.weight", Category::AttentionK),
            ("attn_q.weight", Category::AttentionQ),
            ("attn_output.weight", Category::AttentionOutput),
            ("ffn_up", Category::FfnUp),
            ("ffn_gate", Category::FfnGate),
            ("ffn_down", Category::FfnDown),
        ];
        BY_SUBSTRING
            .iter()
            .find(|(part, _)| name.contains(part))
            .map_or(Category::Other, |&(_, c)| c)
    }

    fn is_attention_v(self) -> bool {
        matches!(
            self,
            Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB
        )
    }
}

/// Name parts of 2-D weights llama.cpp never quantizes (`tensor_allows_quantization`).
const NEVER_QUANTIZED: [&str; 35] = [
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// ggml's `ggml_n_dims`: trailing dimensions of 1 do not count (a `[n, 1]` tensor is 1-D).
fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// Whether llama.cpp converts this tensor at all.
pub fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    n_dims(dims) >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !NEVER_QUANTIZED.iter().any(|part| name.contains(part))
}

/// The layer of a `blk.N.` name, as C's `sscanf(name, "blk.%d.", &layer)` reads it.
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let digits_end = rest
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(rest.len(), |(i, _)| i);
    rest.get(..digits_end)?.parse().ok()
}

/// llama.cpp's "use more bits" layers: the first and last eighth, and every third between.
fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// The running counters of llama.cpp's `quantize_state_impl`.
struct State<'m> {
    mix: QuantMix,
    model: &'m MixModel,
    tied_embeddings: bool,
    n_attention_v: i64,
    i_attention_v: i64,
    i_ffn_down: i64,
}

impl State<'_> {
    /// `llama_tensor_get_type_impl` for the mixes of this module.
    fn rule(&mut self, t: &MixTensor, category: Category) -> Result<GgmlType, QuantError> {
        use GgmlType as G;
        use QuantMix as M;
        let (mix, model) = (self.mix, self.model);
        let mut ty = mix.default_type();
        if category == Category::Output || (self.tied_embeddings && category == Category::TokenEmbd)
        {
            let row = t.dims.first().copied().unwrap_or(1);
            if !row.is_multiple_of(ty.block_size() as u64) {
                ty = G::Q8_0;
            } else if ty != G::Q8_0 {
                ty = G::Q6_K;
            }
        } else if category.is_attention_v() {
            let i = self.i_attention_v;
            match mix {
                M::Q2_K => ty = if model.n_gqa() >= 4 { G::Q4_K } else { G::Q3_K },
                M::Q3_K_M => ty = if i < 2 { G::Q5_K } else { G::Q4_K },
                M::Q3_K_L => ty = G::Q5_K,
                M::Q4_K_M | M::Q5_K_M if use_more_bits(i, self.n_attention_v) => ty = G::Q6_K,
                M::Q4_K_S if i < 4 => ty = G::Q5_K,
                _ => {}
            }
            if model.is_70b() && matches!(ty, G::Q3_K | G::Q4_K) {
                ty = G::Q5_K;
            }
            if model.n_expert == 8 {
                ty = G::Q8_0;
            }
            self.i_attention_v += 1;
        } else if category == Category::AttentionK {
            if model.n_expert == 8 {
                ty = G::Q8_0;
            }
        } else if category == Category::FfnDown {
            let (i, n) = self.ffn_layer(t.name)?;
            match mix {
                M::Q2_K => ty = G::Q3_K,
                M::Q3_K_M => ty = if i < n / 16 { G::Q5_K } else { G::Q4_K },
                M::Q3_K_L => ty = G::Q5_K,
                M::Q4_K_M | M::Q5_K_M if use_more_bits(i, n) => ty = G::Q6_K,
                M::Q4_K_S if i < n / 8 => ty = G::Q5_K,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if category == Category::AttentionOutput {
            if model.n_expert == 8 {
                if matches!(mix, M::Q2_K | M::Q3_K_S | M::Q3_K_M | M::Q4_K_S | M::Q4_K_M) {
                    ty = G::Q5_K;
                }
            } else {
                match mix {
                    M::Q2_K => ty = G::Q3_K,
                    M::Q3_K_M => ty = G::Q4_K,
                    M::Q3_K_L => ty = G::Q5_K,
                    _ => {}
                }
            }
        }
        Ok(ty)
    }

    /// `(layer, layer count)` of an `ffn_down` tensor: the running count for a dense model, the
    /// `blk.N.` of the name with experts (which need not come one per layer).
    fn ffn_layer(&self, name: &str) -> Result<(i64, i64), QuantError> {
        let n = i64::from(self.model.n_layer);
        if self.model.n_expert <= 1 {
            return Ok((self.i_ffn_down, n));
        }
        let layer = layer_of(name).ok_or_else(|| QuantError::MixLayer {
            tensor: name.to_owned(),
            reason: "no blk.N. layer in its name".to_owned(),
        })?;
        if !(0..n).contains(&layer) {
            return Err(QuantError::MixLayer {
                tensor: name.to_owned(),
                reason: format!("layer {layer} is not in [0, {n})"),
            });
        }
        Ok((layer, n))
    }
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks divide the row length.
fn fallback(row_len: u64, ty: GgmlType) -> GgmlType {
    use GgmlType as G;
    let fits = |t: GgmlType| row_len.is_multiple_of(t.block_size() as u64);
    if fits(ty) {
        return ty;
    }
    let smaller = match ty {
        G::Q2_K | G::Q3_K => G::Q4_0,
        G::Q4_K => G::Q5_0,
        G::Q5_K => G::Q5_1,
        G::Q6_K => G::Q8_0,
        other => other,
    };
    if fits(smaller) {
        smaller
    } else {
        G::F16
    }
}

/// The type of every tensor (in the order given) when a model is quantized with `mix`.
///
/// Tensors that are not converted keep their type. The attention-V and `ffn_down` counters run
/// in llama.cpp's order (by `blk.N` layer, then by name; tensors outside layers first), whatever
/// the order of `tensors`.
pub fn plan_types(
    mix: QuantMix,
    model: &MixModel,
    tensors: &[MixTensor],
) -> Result<Vec<TensorPlan>, QuantError> {
    let categories: Vec<Category> = tensors.iter().map(|t| Category::of(t.name)).collect();
    let mut state = State {
        mix,
        model,
        tied_embeddings: !categories.contains(&Category::Output),
        n_attention_v: categories.iter().filter(|c| c.is_attention_v()).count() as i64,
        i_attention_v: 0,
        i_ffn_down: 0,
    };
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| {
            let name = tensors.get(i).map_or("", |t| t.name);
            (layer_of(name).unwrap_or(-1), name)
        };
        key(a).cmp(&key(b))
    });

    let mut plans: Vec<TensorPlan> = tensors
        .iter()
        .map(|t| TensorPlan {
            ty: t.ty,
            fallback_from: None,
        })
        .collect();
    for i in order {
        let (Some(t), Some(&category), Some(plan)) =
            (tensors.get(i), categories.get(i), plans.get_mut(i))
        else {
            continue;
        };
        if !allows_quantization(t.name, t.dims) {
            continue;
        }
        if !mix.is_block_mix() {
            plan.ty = mix.default_type();
            continue;
        }
        let wanted = state.rule(t, category)?;
        let row_len = t.dims.first().copied().unwrap_or(1);
        plan.ty = fallback(row_len, wanted);
        if plan.ty != wanted {
            plan.fallback_from = Some(wanted);
        }
    }
    Ok(plans)
}
