//! Tensor lookup by role, with type and shape checks, and upload to the backend.
//!
//! GGUF names are the same for every family (llama.cpp's `LLM_TENSOR_*` table), so one table
//! serves all decoders; tensors a family may lack are marked optional.

use std::sync::Arc;

use kiln_backend::{Backend, Linear, WeightData};
use kiln_core::config::DecoderConfig;
use kiln_formats::GgufFile;

use crate::{Decoder, DecoderLayer, ModelError};

/// Fetches tensors from a GGUF file and uploads them, checking every shape against the config.
struct Loader<'a, B: Backend> {
    backend: &'a B,
    file: &'a GgufFile,
}

impl<'a, B: Backend> Loader<'a, B> {
    fn data(&self, name: &str) -> Result<Option<WeightData>, ModelError> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        if !info.ty.is_supported() {
            return Err(ModelError::UnsupportedType {
                name: name.to_string(),
                ty: info.ty,
            });
        }
        let dims = info
            .dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ModelError::Shape {
                name: name.into(),
                expected: vec![],
                found: vec![],
            })?;
        Ok(Some(WeightData {
            name: name.to_string(),
            ty: info.ty,
            dims,
            bytes: self.file.tensor_data(info),
        }))
    }

    /// A tensor that may be absent, with GGUF dims `expected` (`[row_len, rows]`, 1-D as `[n]`).
    fn optional(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<Option<(B::Weight, WeightData)>, ModelError> {
        let Some(data) = self.data(name)? else {
            return Ok(None);
        };
        if data.dims != expected {
            return Err(ModelError::Shape {
                name: name.into(),
                expected: expected.to_vec(),
                found: data.dims,
            });
        }
        Ok(Some((self.backend.upload_weight(&data)?, data)))
    }

    fn required(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<(B::Weight, WeightData), ModelError> {
        self.optional(name, expected)?
            .ok_or_else(|| ModelError::MissingTensor(name.into()))
    }

    fn vector(&self, name: &str, len: usize) -> Result<B::Weight, ModelError> {
        Ok(self.required(name, &[len])?.0)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<B::Weight>, ModelError> {
        Ok(self.optional(name, &[len])?.map(|(w, _)| w))
    }

    /// A linear layer `out_features × in_features`, with an optional bias `<prefix>.bias`.
    fn linear(
        &self,
        prefix: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Linear<B>, ModelError> {
        let (weight, data) =
            self.required(&format!("{prefix}.weight"), &[in_features, out_features])?;
        let bias = self.optional_vector(&format!("{prefix}.bias"), out_features)?;
        Ok(Linear {
            weight: Arc::new(weight),
            bias,
            in_features,
            out_features,
            ty: data.ty,
        })
    }
}

pub(crate) fn load_decoder<B: Backend>(
    backend: &B,
    file: &GgufFile,
    config: DecoderConfig,
) -> Result<Decoder<B>, ModelError> {
    let l = Loader { backend, file };
    let c = &config;
    let (d, vocab) = (c.d_model, c.vocab_size);
    let (embd, embd_data) = l.required("token_embd.weight", &[d, vocab])?;
    let token_embd = Arc::new(embd);
    let output = match l.optional("output.weight", &[d, vocab])? {
        Some((w, data)) => Linear {
            weight: Arc::new(w),
            bias: None,
            in_features: d,
            out_features: vocab,
            ty: data.ty,
        },
        None => Linear {
            weight: token_embd.clone(),
            bias: None,
            in_features: d,
            out_features: vocab,
            ty: embd_data.ty,
        },
    };
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let p = |role: &str| format!("blk.{i}.{role}");
        layers.push(DecoderLayer {
            attn_norm: l.vector(&p("attn_norm.weight"), d)?,
            q: l.linear(&p("attn_q"), d, c.q_dim())?,
            k: l.linear(&p("attn_k"), d, c.kv_dim())?,
            v: l.linear(&p("attn_v"), d, c.v_dim())?,
            q_norm: l.optional_vector(&p("attn_q_norm.weight"), c.head_dim)?,
            k_norm: l.optional_vector(&p("attn_k_norm.weight"), c.head_dim)?,
            o: l.linear(&p("attn_output"), c.n_heads * c.head_dim_v, d)?,
            post_attn_norm: l.optional_vector(&p("post_attention_norm.weight"), d)?,
            ffn_norm: l.vector(&p("ffn_norm.weight"), d)?,
            gate: l.linear(&p("ffn_gate"), d, c.ffn_dim)?,
            up: l.linear(&p("ffn_up"), d, c.ffn_dim)?,
            down: l.linear(&p("ffn_down"), c.ffn_dim, d)?,
            post_ffn_norm: l.optional_vector(&p("post_ffw_norm.weight"), d)?,
        });
    }
    let output_norm = l.vector("output_norm.weight", d)?;
    Ok(Decoder {
        config,
        token_embd,
        layers,
        output_norm,
        output,
    })
}
