//! The one weight loader: tensors by role, from a GGUF file or a Hugging Face safetensors
//! checkpoint, checked and uploaded to a backend. Decoders and encoders load through it.
//!
//! A [`Source`] is a file seen through its family's [`NameTable`]: it answers a [`Role`] (of a
//! layer, of an expert) with the file's tensor. A [`Loader`] fetches from a source what a model
//! needs (vectors, layer norms, linear layers, fused matrices cut into their parts, experts) and
//! uploads it with `Backend::upload_weight`.
//!
//! Invariants:
//! - dims are GGUF-ordered (`dims[0]` contiguous; a PyTorch `[out, in]` matrix is `[in, out]`),
//!   and every tensor's type and dims are checked before it is uploaded; a missing tensor, a
//!   wrong shape or a type kiln cannot compute is a typed error naming the tensor as the file
//!   names it;
//! - a role the table marks optional may be absent (the loader answers `None`); any other role
//!   a model asks for must be there;
//! - fused matrices (`attn_qkv`, gate/up) and stacked experts (GGUF's 3-D `ffn_*_exps`) are cut
//!   into zero-copy row views ([`WeightData::slice_rows`]), so every part is a weight of its own
//!   and an expert is only touched when the router selects it.

use std::sync::Arc;

use kiln_backend::{Backend, GptqMatrix, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};
use kiln_formats::{GgufFile, SafetensorsModel};

use crate::gptq::GptqConfig;
use crate::names::{NameTable, Role};
use crate::ModelError;

/// The file behind a [`Source`].
enum File<'a> {
    Gguf(&'a GgufFile),
    /// A safetensors checkpoint; its names start with `prefix` (a task head's `bert.`, ...).
    Checkpoint {
        st: &'a SafetensorsModel,
        prefix: &'static str,
        gptq: Option<GptqConfig>,
    },
}

/// A model file seen through its family's name table.
pub(crate) struct Source<'a> {
    file: File<'a>,
    names: &'static NameTable,
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

impl<'a> Source<'a> {
    /// A GGUF file.
    pub(crate) fn gguf(file: &'a GgufFile, names: &'static NameTable) -> Self {
        Source {
            file: File::Gguf(file),
            names,
        }
    }

    /// A Hugging Face checkpoint, GPTQ-quantized when `gptq` is given.
    pub(crate) fn checkpoint(
        st: &'a SafetensorsModel,
        names: &'static NameTable,
        gptq: Option<GptqConfig>,
    ) -> Self {
        Source {
            file: File::Checkpoint {
                st,
                prefix: "",
                gptq,
            },
            names,
        }
    }

    /// This checkpoint with every name under `prefix` (the text model of a multimodal one).
    pub(crate) fn under(mut self, prefix: &'static str) -> Self {
        if let File::Checkpoint { prefix: p, .. } = &mut self.file {
            *p = prefix;
        }
        self
    }

    /// A Hugging Face checkpoint whose names start with whichever of `prefixes` makes its token
    /// embedding table's name.
    pub(crate) fn checkpoint_with_prefix(
        st: &'a SafetensorsModel,
        names: &'static NameTable,
        prefixes: &[&'static str],
    ) -> Result<Self, ModelError> {
        let probe = format!(
            "{}.weight",
            names
                .entry(Role::TokenEmbd)
                .and_then(|e| e.hf)
                .unwrap_or("embeddings")
        );
        let prefix = prefixes
            .iter()
            .copied()
            .find(|p| st.tensor(&format!("{p}{probe}")).is_some())
            .ok_or(ModelError::MissingTensor(probe))?;
        Ok(Source {
            file: File::Checkpoint {
                st,
                prefix,
                gptq: None,
            },
            names,
        })
    }

    /// The name pattern of `role` in this file's format.
    fn pattern(&self, role: Role) -> Option<&'static str> {
        let e = self.names.entry(role)?;
        match self.file {
            File::Gguf(_) => e.gguf,
            File::Checkpoint { .. } => e.hf,
        }
    }

    /// Whether a model may lack `role`: the table marks it optional, or the family's files of
    /// this format have no such tensor.
    fn may_lack(&self, role: Role) -> bool {
        self.names.entry(role).is_none_or(|e| e.optional) || self.pattern(role).is_none()
    }

    /// The file's name of `role`'s `suffix` (`weight`, `bias`, ...) in layer `layer`, expert
    /// `expert`.
    pub(crate) fn name(
        &self,
        role: Role,
        layer: usize,
        expert: usize,
        suffix: &str,
    ) -> Option<String> {
        let p = self
            .pattern(role)?
            .replace("{i}", &layer.to_string())
            .replace("{e}", &expert.to_string());
        Some(match self.file {
            File::Gguf(_) => format!("{p}.{suffix}"),
            File::Checkpoint { prefix, .. } => format!("{prefix}{p}.{suffix}"),
        })
    }

    /// The error for a required tensor the file does not have.
    fn missing(&self, role: Role, layer: usize, suffix: &str) -> ModelError {
        ModelError::MissingTensor(self.name(role, layer, 0, suffix).unwrap_or_else(|| {
            format!(
                "{role:?} {suffix} of layer {layer} (no name in the {} table for this format)",
                self.names.family
            )
        }))
    }

    /// Whether the file has the weight of `role` in layer `layer`.
    pub(crate) fn has(&self, role: Role, layer: usize) -> bool {
        self.name(role, layer, 0, "weight")
            .is_some_and(|n| self.has_name(&n))
    }

    /// Whether the file has a tensor named `name`.
    fn has_name(&self, name: &str) -> bool {
        match &self.file {
            File::Gguf(f) => f.tensor(name).is_some(),
            File::Checkpoint { st, .. } => st.tensor(name).is_some(),
        }
    }

    /// The tensor named `name`, `None` when the file has none.
    fn by_name(&self, name: &str) -> Result<Option<WeightData>, ModelError> {
        match &self.file {
            File::Gguf(f) => {
                let Some(info) = f.tensor(name) else {
                    return Ok(None);
                };
                Ok(Some(WeightData {
                    name: name.to_string(),
                    ty: info.ty,
                    dims: usize_dims(name, &info.dims)?,
                    bytes: f.tensor_data(info),
                }))
            }
            File::Checkpoint { st, .. } => {
                let Some(t) = st.tensor(name) else {
                    return Ok(None);
                };
                let ty = t.ggml_type().ok_or_else(|| ModelError::UnsupportedDtype {
                    name: name.into(),
                    dtype: format!("{:?}", t.dtype),
                })?;
                Ok(Some(WeightData {
                    name: name.into(),
                    ty,
                    dims: t.ggml_dims(),
                    bytes: t.bytes.clone(),
                }))
            }
        }
    }

    /// `role`'s `suffix` of layer `layer` (unchecked), `None` when the file has none.
    pub(crate) fn tensor(
        &self,
        role: Role,
        layer: usize,
        suffix: &str,
    ) -> Result<Option<WeightData>, ModelError> {
        match self.name(role, layer, 0, suffix) {
            Some(name) => self.by_name(&name),
            None => Ok(None),
        }
    }

    /// Expert `e` of `n_experts` of the expert role `role` (`FfnUpExps`, ...) of layer `layer`:
    /// a 2-D weight of `[in, out]`, cut from GGUF's stacked tensor or a checkpoint's own.
    fn expert(
        &self,
        role: Role,
        layer: usize,
        e: usize,
        n_experts: usize,
    ) -> Result<Option<WeightData>, ModelError> {
        let Some(name) = self.name(role, layer, e, "weight") else {
            return Ok(None);
        };
        let Some(all) = self.by_name(&name)? else {
            return Ok(None);
        };
        if let File::Checkpoint { .. } = self.file {
            return Ok(Some(all));
        }
        if all.dims.len() != 3 || all.dims[2] != n_experts {
            return Err(ModelError::Shape {
                name,
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

    /// The linear `role` of layer `layer` as a GPTQ matrix, when the file stores it so.
    fn gptq(
        &self,
        role: Role,
        layer: usize,
        in_features: usize,
        out_features: usize,
    ) -> Result<Option<GptqMatrix>, ModelError> {
        let File::Checkpoint {
            st,
            gptq: Some(cfg),
            ..
        } = &self.file
        else {
            return Ok(None);
        };
        let Some(name) = self.name(role, layer, 0, "weight") else {
            return Ok(None);
        };
        cfg.matrix(
            st,
            name.trim_end_matches(".weight"),
            in_features,
            out_features,
        )
    }
}

/// Where a linear layer's bias comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bias {
    /// Whenever the file has one (the decoder families: Qwen2's QKV biases).
    IfPresent,
    /// Always (the configuration says the layer has one).
    Required,
    /// Never.
    Absent,
}

impl Bias {
    /// [`Bias::Required`] when `has`, else [`Bias::Absent`].
    pub(crate) fn when(has: bool) -> Bias {
        if has {
            Bias::Required
        } else {
            Bias::Absent
        }
    }
}

/// Fetches tensors from a source and uploads them to a backend, checking every shape.
pub(crate) struct Loader<'a, B: Backend> {
    pub backend: &'a B,
    pub source: &'a Source<'a>,
}

impl<B: Backend> Loader<'_, B> {
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

    /// The weight of `role` in layer `layer`, unchecked (to see which tensors a file has).
    pub(crate) fn peek(&self, role: Role, layer: usize) -> Result<Option<WeightData>, ModelError> {
        self.source.tensor(role, layer, "weight")
    }

    /// `role`'s `suffix` with dims `expected`, `None` when the file has none.
    fn lookup(
        &self,
        role: Role,
        layer: usize,
        suffix: &str,
        expected: &[usize],
    ) -> Result<Option<WeightData>, ModelError> {
        self.source
            .tensor(role, layer, suffix)?
            .map(|d| self.checked(d, expected))
            .transpose()
    }

    /// `role`'s `suffix` with dims `expected` (`[row_len, rows]`, 1-D as `[n]`).
    pub(crate) fn required(
        &self,
        role: Role,
        layer: usize,
        suffix: &str,
        expected: &[usize],
    ) -> Result<WeightData, ModelError> {
        self.lookup(role, layer, suffix, expected)?
            .ok_or_else(|| self.source.missing(role, layer, suffix))
    }

    /// The weight of `role`, `None` when it is absent and the table says a model may lack it.
    pub(crate) fn optional(
        &self,
        role: Role,
        layer: usize,
        expected: &[usize],
    ) -> Result<Option<WeightData>, ModelError> {
        match self.lookup(role, layer, "weight", expected)? {
            Some(d) => Ok(Some(d)),
            None if self.source.may_lack(role) => Ok(None),
            None => Err(self.source.missing(role, layer, "weight")),
        }
    }

    pub(crate) fn upload(&self, data: &WeightData) -> Result<B::Weight, ModelError> {
        Ok(self.backend.upload_weight(data)?)
    }

    /// The 1-D weight of `role` in layer `layer`, of `len` elements (a decoder's norm weight:
    /// see [`Loader::norm_scale`]).
    pub(crate) fn vector(
        &self,
        role: Role,
        layer: usize,
        len: usize,
    ) -> Result<B::Weight, ModelError> {
        self.upload(&self.norm_scale(self.required(role, layer, "weight", &[len])?)?)
    }

    /// [`Loader::vector`] of an optional role.
    pub(crate) fn optional_vector(
        &self,
        role: Role,
        layer: usize,
        len: usize,
    ) -> Result<Option<B::Weight>, ModelError> {
        self.optional(role, layer, &[len])?
            .map(|d| self.upload(&self.norm_scale(d)?))
            .transpose()
    }

    /// An RMSNorm weight as the scale kiln multiplies by: as stored, or for a checkpoint of a
    /// family that stores `w` for `1 + w` (Gemma) the f32 values `1 + w`, computed in f32 as
    /// transformers does.
    fn norm_scale(&self, data: WeightData) -> Result<WeightData, ModelError> {
        if !(self.source.names.hf_norm_plus_one
            && matches!(self.source.file, File::Checkpoint { .. }))
        {
            return Ok(data);
        }
        let mut values = vec![0.0f32; data.n_elements()];
        kiln_quant::dequantize(data.ty, &data.bytes, &mut values).map_err(|e| {
            ModelError::File {
                file: data.name.clone(),
                detail: e.to_string(),
            }
        })?;
        let bytes = values
            .iter()
            .flat_map(|w| (1.0 + w).to_le_bytes())
            .collect();
        Ok(WeightData {
            ty: GgmlType::F32,
            bytes: SharedBytes::from_vec(bytes),
            ..data
        })
    }

    /// The layer norm `role` of `d` elements: its weight, and its bias when `bias`. Older BERT
    /// exports name them `gamma` and `beta`.
    pub(crate) fn layer_norm(
        &self,
        role: Role,
        layer: usize,
        d: usize,
        bias: bool,
    ) -> Result<(B::Weight, Option<B::Weight>), ModelError> {
        let gamma = self
            .source
            .name(role, layer, 0, "gamma")
            .is_some_and(|n| self.source.has_name(&n));
        let (w, b) = if gamma {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        let weight = self.upload(&self.required(role, layer, w, &[d])?)?;
        let bias = if bias {
            Some(self.upload(&self.required(role, layer, b, &[d])?)?)
        } else {
            None
        };
        Ok((weight, bias))
    }

    pub(crate) fn make_linear(
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

    /// The linear layer `role` of layer `layer`, `out_features × in_features`: a float or
    /// GGUF-quantized weight, or a GPTQ matrix, with its bias as `bias` says.
    pub(crate) fn linear(
        &self,
        role: Role,
        layer: usize,
        in_features: usize,
        out_features: usize,
        bias: Bias,
    ) -> Result<Linear<B>, ModelError> {
        let early = match bias {
            Bias::IfPresent => self.lookup(role, layer, "bias", &[out_features])?,
            Bias::Required | Bias::Absent => None,
        };
        let w = self.lookup(role, layer, "weight", &[in_features, out_features])?;
        let matrix = match w {
            Some(_) => None,
            None => Some(
                self.source
                    .gptq(role, layer, in_features, out_features)?
                    .ok_or_else(|| self.source.missing(role, layer, "weight"))?,
            ),
        };
        let b = match bias {
            Bias::Required => Some(self.required(role, layer, "bias", &[out_features])?),
            Bias::IfPresent | Bias::Absent => early,
        };
        match (w, matrix) {
            (Some(w), _) => self.make_linear(&w, b.as_ref()),
            (None, Some(matrix)) => {
                let name = self
                    .source
                    .name(role, layer, 0, "weight")
                    .unwrap_or_default();
                Ok(Linear {
                    weight: Arc::new(self.backend.upload_gptq(&name, Arc::new(matrix))?),
                    bias: b.map(|b| self.upload(&b)).transpose()?,
                    in_features,
                    out_features,
                    ty: kiln_core::GgmlType::I32,
                })
            }
            (None, None) => Err(self.source.missing(role, layer, "weight")),
        }
    }

    /// Consecutive row blocks of `outs` rows each of the fused linear `role` (weight, and bias
    /// as `bias` says), as separate layers.
    pub(crate) fn split_linear(
        &self,
        role: Role,
        layer: usize,
        in_features: usize,
        outs: &[usize],
        bias: Bias,
    ) -> Result<Vec<Linear<B>>, ModelError> {
        let total: usize = outs.iter().sum();
        let w = self.required(role, layer, "weight", &[in_features, total])?;
        let b = match bias {
            Bias::IfPresent => self.lookup(role, layer, "bias", &[total])?,
            Bias::Required => Some(self.required(role, layer, "bias", &[total])?),
            Bias::Absent => None,
        };
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

    /// Expert `e` of `n_experts` of the expert role `role` of layer `layer`,
    /// `in_features → out_features`.
    pub(crate) fn expert(
        &self,
        role: Role,
        layer: usize,
        (e, n_experts): (usize, usize),
        in_features: usize,
        out_features: usize,
    ) -> Result<Linear<B>, ModelError> {
        let w = self
            .source
            .expert(role, layer, e, n_experts)?
            .ok_or_else(|| match self.source.name(role, layer, e, "weight") {
                Some(name) => ModelError::MissingTensor(format!("{name} (expert {e})")),
                None => self.source.missing(role, layer, "weight"),
            })?;
        let w = self.checked(w, &[in_features, out_features])?;
        self.make_linear(&w, None)
    }
}
