//! The Llama lineage: Llama 2/3.x, Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE, Qwen3, Qwen3-MoE and
//! Phi-3, from GGUF metadata or a Hugging Face `config.json`. They share one block (pre-norm
//! RMSNorm, rotary attention with grouped KV heads, SiLU-gated FFN) and differ only in the fields
//! of [`DecoderConfig`] set here.
//!
//! Facts that differ between the two formats:
//! - **Rotary layout.** llama.cpp's converter permutes the Q/K rows of `llama`-architecture GGUFs
//!   (Llama, Mistral, Mixtral) so that rotation pairs are adjacent ([`RopeKind::Normal`]); every
//!   other GGUF and every HF checkpoint rotates halves ([`RopeKind::Neox`]). The weights are never
//!   permuted back: the rope style follows the file.
//! - **Frequency scaling.** Llama 3.1's scaling and Phi-3's long-rope factors are per-pair
//!   divisors: GGUF stores them as tensors (`rope_freqs`, `rope_factors_short/long`); from HF they
//!   are computed here from `rope_scaling` / `rope_parameters` as transformers does. YaRN is
//!   per-pair divisors and an attention factor too, computed from either format's settings
//!   ([`super::yarn`]); GGUF stores no tensor for it.
//! - **Sliding windows.** The converter drops Mistral's `sliding_window` (llama.cpp runs Mistral
//!   with full attention), so a Mistral GGUF attends globally and its HF checkpoint does not;
//!   kiln follows the file. Phi-3's window is in both.
//! - **Expert weights normalisation.** llama.cpp always renormalises Qwen3-MoE's top-k weights
//!   (`expert_weights_norm` absent) and never Qwen2-MoE's; HF follows `norm_topk_prob`.
//! - **Dense layers among expert ones** (Qwen-MoE's `mlp_only_layers`, `decoder_sparse_step`):
//!   from HF as transformers decides; in a GGUF, a layer without a router is dense.

use std::f64::consts::PI;
use std::sync::Arc;

use kiln_core::config::{
    DecoderConfig, DynamicNtk, FfnActivation, LayerAttention, LongRope, MoeConfig, RopeConfig,
    RopeKind,
};
use kiln_formats::GgufFile;
use serde_json::Value;

use super::{yarn, Meta};
use crate::hf::HfConfig;
use crate::names::{self, NameTable};
use crate::ModelError;

/// GGUF architectures of this lineage.
pub(crate) const GGUF_ARCHES: &[&str] =
    &["llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3"];

/// The expert count of `qwen3_moe` and `mixtral` configs. Both transformers 5 config classes
/// (`Qwen3MoeConfig`, `MixtralConfig`) store it as `num_local_experts` and alias `num_experts` to
/// it (`attribute_map`), so either spelling loads into either class: transformers 5 writes
/// `num_local_experts`, Qwen's published Qwen3-MoE checkpoints (transformers 4) `num_experts`.
const EXPERT_COUNT: &[&str] = &["num_experts", "num_local_experts"];

/// Shape fields every family has, before the family's particulars are applied.
struct Common {
    arch: String,
    vocab_size: usize,
    d_model: usize,
    n_layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    ffn_dim: usize,
    norm_eps: f32,
    context_length: usize,
    rope_dim: usize,
}

impl Common {
    fn build(
        self,
        rope_kind: RopeKind,
        rope: RopeConfig,
        rope_long: Option<LongRope>,
        rope_dynamic: Option<DynamicNtk>,
        layer_attention: Vec<LayerAttention>,
        moe: Option<MoeConfig>,
    ) -> Result<DecoderConfig, String> {
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "{} KV heads do not divide {} query heads",
                self.n_kv_heads, self.n_heads
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return Err(format!(
                "rotary width {} does not fit heads of {}",
                self.rope_dim, self.head_dim
            ));
        }
        let pairs = self.rope_dim / 2;
        for r in std::iter::once(&rope).chain(rope_long.as_ref().map(|l| &l.rope)) {
            if let Some(f) = &r.freq_factors {
                if f.len() != pairs || f.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
                    return Err(format!(
                        "{} rope frequency factors for {pairs} rotary pairs (each must be a \
                         positive number)",
                        f.len()
                    ));
                }
            }
        }
        if let Some(m) = &moe {
            if m.top_k == 0 || m.top_k > m.n_experts {
                return Err(format!(
                    "{} experts per token out of {}",
                    m.top_k, m.n_experts
                ));
            }
        }
        Ok(DecoderConfig {
            arch: self.arch,
            vocab_size: self.vocab_size,
            d_model: self.d_model,
            n_layers: self.n_layers,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim,
            ffn_dim: self.ffn_dim,
            norm_eps: self.norm_eps,
            context_length: self.context_length,
            rope_kind,
            rope_dim: self.rope_dim,
            rope_global: rope.clone(),
            rope_local: rope,
            rope_long,
            rope_dynamic,
            layer_attention,
            attention_scale: 1.0 / (self.head_dim as f32).sqrt(),
            attn_logit_softcap: None,
            activation: FfnActivation::Silu,
            embed_scale: None,
            moe,
        })
    }
}

/// A 1-D F32 tensor of the file (rope factors), `None` when absent.
fn f32_vector(file: &GgufFile, name: &str) -> Result<Option<Arc<[f32]>>, ModelError> {
    let Some(info) = file.tensor(name) else {
        return Ok(None);
    };
    if info.ty != kiln_core::GgmlType::F32 || info.dims.len() != 1 {
        return Err(ModelError::Metadata {
            key: name.into(),
            detail: format!(
                "expected a 1-D F32 tensor, found {} {:?}",
                info.ty, info.dims
            ),
        });
    }
    let bytes = file.tensor_data(info);
    Ok(Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    ))
}

/// The decoder configuration of a GGUF of this lineage (`arch` is one of [`GGUF_ARCHES`]).
pub(crate) fn gguf_config(arch: &str, file: &GgufFile) -> Result<DecoderConfig, ModelError> {
    let m = Meta::new(file, arch);
    let bad = |key: &str, detail: String| ModelError::Metadata {
        key: format!("{arch}.{key}"),
        detail,
    };
    let d_model = m.usize("embedding_length")?;
    let n_layers = m.usize("block_count")?;
    let n_heads = m.usize("attention.head_count")?;
    let head_dim = m.usize_or("attention.key_length", d_model / n_heads)?;
    let mut common = Common {
        arch: arch.to_string(),
        vocab_size: super::gguf_vocab_size(file)?,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads: m.usize_or("attention.head_count_kv", n_heads)?,
        head_dim,
        ffn_dim: m.usize("feed_forward_length")?,
        norm_eps: m.f32("attention.layer_norm_rms_epsilon")?,
        context_length: m.usize("context_length")?,
        rope_dim: m.usize_or("rope.dimension_count", head_dim)?,
    };

    let mut rope = RopeConfig::plain(m.f32_or("rope.freq_base", 10_000.0)?);
    rope.freq_factors = f32_vector(file, "rope_freqs.weight")?;
    let scaling = file
        .get_str(&format!("{arch}.rope.scaling.type"))
        .unwrap_or("none");
    match scaling {
        "none" => {}
        "linear" => rope.freq_scale = 1.0 / m.f32("rope.scaling.factor")?,
        "yarn" => {
            let original = gguf_yarn(&m, &mut rope, common.rope_dim, common.context_length)
                .map_err(|detail| bad("rope.scaling", detail))?;
            // The extended context, as from config.json (`rope_from_params`).
            common.context_length = common.context_length.max(original);
        }
        other => {
            return Err(bad(
                "rope.scaling.type",
                format!(
                    "rope scaling \"{other}\" is not supported (supported: none, linear, yarn)"
                ),
            ))
        }
    }
    let mut rope_long = None;
    if let Some(long) = f32_vector(file, "rope_factors_long.weight")? {
        // Phi-3 long-rope: short factors up to the original context, long ones beyond.
        let mscale = m.f32_or("rope.scaling.attn_factor", 1.0)?;
        rope.freq_factors = f32_vector(file, "rope_factors_short.weight")?;
        rope.mscale = mscale;
        rope_long = Some(LongRope {
            original_context: m.usize("rope.scaling.original_context_length")?,
            rope: RopeConfig {
                freq_factors: Some(long),
                ..rope.clone()
            },
        });
    }

    let window = m.usize_or_zero("attention.sliding_window")?;
    let layer_attention = vec![
        if window > 0 {
            LayerAttention::Sliding { window }
        } else {
            LayerAttention::Global
        };
        n_layers
    ];
    let n_experts = m.usize_or_zero("expert_count")?;
    let moe = if n_experts > 0 {
        // llama.cpp renormalises Qwen3-MoE's and Mixtral's top-k weights, not Qwen2-MoE's.
        let qwen2moe = arch == "qwen2moe";
        // A layer routes where it has a router; the converter writes the others (Qwen-MoE's
        // `mlp_only_layers`) as dense FFNs, which llama.cpp itself does not load.
        let dense_layers = (0..n_layers)
            .filter(|i| {
                file.tensor(&format!("blk.{i}.ffn_gate_inp.weight"))
                    .is_none()
            })
            .collect();
        Some(MoeConfig {
            n_experts,
            top_k: m.usize("expert_used_count")?,
            normalize_top_k: file
                .get_bool(&format!("{arch}.expert_weights_norm"))
                .unwrap_or(!qwen2moe),
            expert_ffn_dim: m.usize_or("expert_feed_forward_length", common.ffn_dim)?,
            // llama.cpp: the shared expert's width defaults to the FFN's.
            shared_ffn_dim: qwen2moe
                .then(|| m.usize_or("expert_shared_feed_forward_length", common.ffn_dim))
                .transpose()?,
            dense_layers,
        })
    } else {
        None
    };
    let rope_kind = if arch == "llama" {
        RopeKind::Normal
    } else {
        RopeKind::Neox
    };
    common
        .build(rope_kind, rope, rope_long, None, layer_attention, moe)
        .map_err(|detail| bad("", detail))
}

/// A Hugging Face decoder of this lineage: its configuration and how its tensors are named.
pub(crate) fn hf_config(c: &HfConfig) -> Result<(DecoderConfig, &'static NameTable), ModelError> {
    let model_type = c.model_type()?.to_string();
    let d_model = c.usize("hidden_size")?;
    let n_layers = c.usize("num_hidden_layers")?;
    let n_heads = c.usize("num_attention_heads")?;
    let head_dim = c.usize_or("head_dim", d_model / n_heads)?;
    let partial = c.f32_or("partial_rotary_factor", 1.0)?;
    let rope_dim = if partial == 1.0 {
        head_dim
    } else {
        ((head_dim as f32 * partial) as usize) & !1
    };
    let context_length = c.usize("max_position_embeddings")?;
    let mut common = Common {
        arch: model_type.clone(),
        vocab_size: c.usize("vocab_size")?,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads: c.usize_or("num_key_value_heads", n_heads)?,
        head_dim,
        ffn_dim: c.usize("intermediate_size")?,
        norm_eps: c.f32("rms_norm_eps")?,
        context_length,
        rope_dim,
    };
    let act = c.str_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(c.error(
            "hidden_act",
            format!("activation \"{act}\" is not supported (this family uses silu)"),
        ));
    }

    let (rope, rope_long, dynamic, scaled_context) = hf_rope(c, rope_dim, context_length)?;
    common.context_length = scaled_context;
    let layer_attention = hf_layer_attention(c, &model_type, n_layers)?;
    let (moe, table) = match model_type.as_str() {
        "qwen3_moe" | "qwen2_moe" => {
            let moe = MoeConfig {
                n_experts: c.usize_any(EXPERT_COUNT)?,
                top_k: c.usize("num_experts_per_tok")?,
                normalize_top_k: c.bool_or("norm_topk_prob", false)?,
                expert_ffn_dim: c.usize("moe_intermediate_size")?,
                shared_ffn_dim: if model_type == "qwen2_moe" {
                    Some(c.usize("shared_expert_intermediate_size")?)
                } else {
                    None
                },
                dense_layers: qwen_dense_layers(c, n_layers)?,
            };
            (Some(moe), &names::LLAMA)
        }
        "mixtral" => {
            let moe = MoeConfig {
                n_experts: c.usize_any(EXPERT_COUNT)?,
                top_k: c.usize("num_experts_per_tok")?,
                normalize_top_k: true,
                expert_ffn_dim: c.usize("intermediate_size")?,
                shared_ffn_dim: None,
                dense_layers: Vec::new(),
            };
            (Some(moe), &names::MIXTRAL)
        }
        _ => (None, &names::LLAMA),
    };
    let config = common
        .build(
            RopeKind::Neox,
            rope,
            rope_long,
            dynamic,
            layer_attention,
            moe,
        )
        .map_err(|detail| c.error("", detail))?;
    Ok((config, table))
}

/// YaRN from GGUF metadata, as llama.cpp reads it: `rope.scaling.factor`,
/// `rope.scaling.original_context_length` (default: the context length), the attention factor
/// `0.1 ln(factor) + 1` (DeepSeek's `yarn_log_multiplier` makes it a ratio) times
/// `rope.scaling.attn_factor`. Unlike llama.cpp 0c1e570, kiln also reads the keys the converter
/// copies from `config.json` when they are there (`yarn_beta_fast`, `yarn_beta_slow`,
/// `yarn_attn_factor`), so that a GGUF computes what its checkpoint did; without them both
/// agree. The divisors multiply any `rope_freqs` factors already in `rope`. Returns the
/// extended context, `original × factor`.
fn gguf_yarn(
    m: &Meta<'_>,
    rope: &mut RopeConfig,
    rope_dim: usize,
    context_length: usize,
) -> Result<usize, String> {
    let err = |e: ModelError| e.to_string();
    let factor = f64::from(m.f32("rope.scaling.factor").map_err(err)?);
    let original = m
        .usize_or("rope.scaling.original_context_length", context_length)
        .map_err(err)?;
    let mut y = yarn::Yarn::new(factor, original as f64);
    y.beta_fast = f64::from(m.f32_or("rope.scaling.yarn_beta_fast", 32.0).map_err(err)?);
    y.beta_slow = f64::from(m.f32_or("rope.scaling.yarn_beta_slow", 1.0).map_err(err)?);
    y.check()?;
    let log_mul = f64::from(
        m.f32_or("rope.scaling.yarn_log_multiplier", 0.0)
            .map_err(err)?,
    );
    let attention = if m.has("rope.scaling.yarn_attn_factor") {
        f64::from(m.f32("rope.scaling.yarn_attn_factor").map_err(err)?)
    } else if log_mul != 0.0 {
        yarn::mscale(factor, 1.0) / yarn::mscale(factor, log_mul)
    } else {
        yarn::mscale(factor, 1.0)
    };
    let attn_factor = f64::from(m.f32_or("rope.scaling.attn_factor", 1.0).map_err(err)?);
    rope.mscale = (attention * attn_factor) as f32;
    let divisors = y.divisors(rope_dim, f64::from(rope.base));
    rope.freq_factors = Some(match rope.freq_factors.as_deref() {
        None => divisors.into(),
        Some(e) if e.len() == divisors.len() => {
            e.iter().zip(&divisors).map(|(a, b)| a * b).collect()
        }
        Some(e) => {
            return Err(format!(
                "rope_freqs has {} factors for {} rotary pairs",
                e.len(),
                divisors.len()
            ))
        }
    });
    Ok((original as f64 * factor) as usize)
}

/// The dense layers of a Qwen-MoE config, as transformers decides them: layer `i` routes when
/// it is not in `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`.
fn qwen_dense_layers(c: &HfConfig, n_layers: usize) -> Result<Vec<usize>, ModelError> {
    // At least 1: `usize` refuses 0.
    let step = c.usize_or("decoder_sparse_step", 1)?;
    let only = match c.raw("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_u64().and_then(|i| usize::try_from(i).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| c.error("mlp_only_layers", "must be a list of layer indices"))?,
        Some(_) => return Err(c.error("mlp_only_layers", "must be a list of layer indices")),
    };
    Ok((0..n_layers)
        .filter(|i| only.contains(i) || (i + 1) % step != 0)
        .collect())
}

/// The rope scaling dictionary (`rope_parameters` in transformers 5, `rope_scaling` before) and
/// the base, which transformers 5 moved inside it; with the longest context the scaling runs
/// (see [`rope_from_params`]; dynamic NTK: `max_position_embeddings × factor`, vLLM's rule).
fn hf_rope(
    c: &HfConfig,
    rope_dim: usize,
    context_length: usize,
) -> Result<(RopeConfig, Option<LongRope>, Option<DynamicNtk>, usize), ModelError> {
    let (key, params) = hf_rope_params(c);
    let base = match params
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
    {
        Some(b) => b as f32,
        None => c.f32_or("rope_theta", 10_000.0)?,
    };
    if rope_type(params) == "dynamic" {
        let factor = params
            .and_then(|p| p.get("factor"))
            .and_then(Value::as_f64)
            .filter(|f| f.is_finite() && *f >= 1.0)
            .ok_or_else(|| c.error(key, "\"dynamic\" scaling needs a \"factor\" of at least 1"))?;
        if rope_dim <= 2 {
            return Err(c.error(key, "\"dynamic\" scaling needs more than 2 rotary dims"));
        }
        let dynamic = DynamicNtk {
            factor: factor as f32,
            original_context: context_length,
        };
        let scaled_context = (context_length as f64 * factor) as usize;
        return Ok((RopeConfig::plain(base), None, Some(dynamic), scaled_context));
    }
    let (rope, long, scaled_context) =
        rope_from_params(c, key, params, base, rope_dim, context_length)?;
    Ok((rope, long, None, scaled_context))
}

/// The scaling dictionary of a `config.json` (`rope_parameters` in transformers 5,
/// `rope_scaling` before) and the key it is under.
fn hf_rope_params(c: &HfConfig) -> (&'static str, Option<&serde_json::Map<String, Value>>) {
    ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find_map(|k| match c.raw(k) {
            Some(Value::Object(o)) => Some((k, Some(o))),
            _ => None,
        })
        .unwrap_or(("rope_scaling", None))
}

/// A scaling dictionary's `rope_type` (or the older `type`), `default` without one.
fn rope_type(params: Option<&serde_json::Map<String, Value>>) -> &str {
    params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default")
}

/// The rope that one scaling dictionary (`params`, found under `key` of `config.json`; `None`:
/// no scaling) describes for base `base`, as transformers computes it, and the longest context
/// it runs: YaRN's `original × factor` where that exceeds `context_length`
/// (`max_position_embeddings`; Qwen2.5 publishes 32,768 with factor 4 for 131,072), as vLLM
/// derives its maximum length; `context_length` for the other scalings.
pub(super) fn rope_from_params(
    c: &HfConfig,
    key: &str,
    params: Option<&serde_json::Map<String, Value>>,
    base: f32,
    rope_dim: usize,
    context_length: usize,
) -> Result<(RopeConfig, Option<LongRope>, usize), ModelError> {
    let num = |name: &str| params.and_then(|p| p.get(name)).and_then(Value::as_f64);
    let mut rope = RopeConfig::plain(base);
    let mut scaled_context = context_length;
    let kind = rope_type(params);
    let need = |name: &str| {
        num(name).ok_or_else(|| c.error(key, format!("\"{kind}\" scaling needs \"{name}\"")))
    };
    let pairs = rope_dim / 2;
    // Rotary frequencies as transformers computes them (f32 exponent, then the reciprocal).
    let inv_freq = |i: usize| 1.0 / (base as f64).powf((2 * i) as f64 / rope_dim as f64);
    let mut long = None;
    match kind {
        "default" => {}
        "linear" => rope.freq_scale = 1.0 / need("factor")? as f32,
        "llama3" => {
            let factor = need("factor")?;
            let low = need("low_freq_factor")?;
            let high = need("high_freq_factor")?;
            let old_ctx = need("original_max_position_embeddings")?;
            let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
            let factors = (0..pairs)
                .map(|i| {
                    let wavelen = 2.0 * PI / inv_freq(i);
                    if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        factor as f32
                    } else {
                        let smooth = (old_ctx / wavelen - low) / (high - low);
                        (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                    }
                })
                .collect();
            rope.freq_factors = Some(factors);
        }
        "yarn" => {
            // transformers: `original_max_position_embeddings` at the top level wins, then the
            // dictionary's, then `max_position_embeddings`; a null factor means their ratio.
            let original = match c.raw("original_max_position_embeddings") {
                Some(Value::Number(_)) => c.usize("original_max_position_embeddings")? as f64,
                _ => num("original_max_position_embeddings").unwrap_or(context_length as f64),
            };
            let factor = num("factor").unwrap_or(context_length as f64 / original);
            let mut y = yarn::Yarn::new(factor, original);
            // `or` in transformers: absent, null or 0 mean the default.
            let nonzero = |name: &str| num(name).filter(|&v| v != 0.0);
            y.beta_fast = nonzero("beta_fast").unwrap_or(y.beta_fast);
            y.beta_slow = nonzero("beta_slow").unwrap_or(y.beta_slow);
            y.truncate = params
                .and_then(|p| p.get("truncate"))
                .and_then(Value::as_bool)
                .unwrap_or(true);
            y.check().map_err(|detail| c.error(key, detail))?;
            rope.mscale = match (
                num("attention_factor"),
                nonzero("mscale"),
                nonzero("mscale_all_dim"),
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) => yarn::mscale(factor, m) / yarn::mscale(factor, all),
                _ => yarn::mscale(factor, 1.0),
            } as f32;
            rope.freq_factors = Some(y.divisors(rope_dim, f64::from(base)).into());
            scaled_context = context_length.max((original * factor) as usize);
        }
        "longrope" | "su" => {
            let list = |name: &str| -> Result<Arc<[f32]>, ModelError> {
                params
                    .and_then(|p| p.get(name))
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(|v| v.as_f64().map(|x| x as f32)).collect())
                    .ok_or_else(|| c.error(key, format!("\"{kind}\" scaling needs \"{name}\"")))
            };
            let original = match num("original_max_position_embeddings") {
                Some(o) => o as usize,
                None => c.usize("original_max_position_embeddings")?,
            };
            let factor = num("factor").unwrap_or(context_length as f64 / original as f64);
            rope.mscale = match num("attention_factor") {
                Some(a) => a as f32,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt() as f32,
            };
            rope.freq_factors = Some(list("short_factor")?);
            long = Some(LongRope {
                original_context: original,
                rope: RopeConfig {
                    freq_factors: Some(list("long_factor")?),
                    ..rope.clone()
                },
            });
        }
        other => {
            return Err(c.error(
                key,
                format!(
                    "rope scaling \"{other}\" is not supported \
                     (supported: default, linear, llama3, longrope, yarn)"
                ),
            ))
        }
    }
    Ok((rope, long, scaled_context))
}

/// Each layer's attention as `layer_types` lists it (`full_attention`, `sliding_attention`
/// with `window`), `None` when the config has no such list.
pub(super) fn hf_layer_types(
    c: &HfConfig,
    n_layers: usize,
    window: Option<usize>,
) -> Result<Option<Vec<LayerAttention>>, ModelError> {
    let Some(types) = c.raw("layer_types").and_then(Value::as_array) else {
        return Ok(None);
    };
    if types.len() != n_layers {
        return Err(c.error(
            "layer_types",
            format!("{} entries for {n_layers} layers", types.len()),
        ));
    }
    types
        .iter()
        .map(|t| match (t.as_str(), window) {
            (Some("full_attention"), _) => Ok(LayerAttention::Global),
            (Some("sliding_attention"), Some(window)) => Ok(LayerAttention::Sliding { window }),
            _ => Err(c.error(
                "layer_types",
                format!("layer type {t} is not supported (or no sliding_window is given)"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Which layers attend through a sliding window: `layer_types` when the config lists them,
/// otherwise the family's rule for `sliding_window`.
fn hf_layer_attention(
    c: &HfConfig,
    model_type: &str,
    n_layers: usize,
) -> Result<Vec<LayerAttention>, ModelError> {
    let window = match c.raw("sliding_window") {
        None | Some(Value::Null) => None,
        Some(_) => Some(c.usize("sliding_window")?),
    };
    if let Some(types) = hf_layer_types(c, n_layers, window)? {
        return Ok(types);
    }
    let sliding_from = match model_type {
        // Qwen: only with `use_sliding_window`, and only from `max_window_layers` on.
        "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => {
            if c.bool_or("use_sliding_window", false)? {
                c.usize_or("max_window_layers", 0)?
            } else {
                n_layers
            }
        }
        _ => 0,
    };
    Ok((0..n_layers)
        .map(|i| match window {
            Some(window) if i >= sliding_from => LayerAttention::Sliding { window },
            _ => LayerAttention::Global,
        })
        .collect())
}
