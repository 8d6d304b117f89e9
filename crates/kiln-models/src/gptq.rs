//! GPTQ 4-bit checkpoints: the `quantization_config` of `config.json` and the packed tensors of
//! one linear layer (`<layer>.qweight`, `.qzeros`, `.scales`, optional `.g_idx`).
//!
//! Invariants: only 4-bit GPTQ is accepted (any other quantization is a config error naming
//! `quantization_config`); every packed tensor's dtype and shape are checked against the layer's
//! size before the matrix is built, and a mismatch names the tensor.

use kiln_backend::{GptqMatrix, GptqTensors};
use kiln_formats::safetensors::Dtype;
use kiln_formats::SafetensorsModel;
use serde_json::Value;

use crate::hf::HfConfig;
use crate::ModelError;

/// `quantization_config` of a GPTQ checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GptqConfig {
    /// Inputs per group; `None`: one group over all inputs (`group_size: -1`).
    pub group_size: Option<usize>,
    /// Zero points stored minus one (`checkpoint_format: "gptq"`, not `"gptq_v2"`).
    pub v1_zeros: bool,
}

impl GptqConfig {
    /// The GPTQ settings of `config.json`; `None` for an unquantized checkpoint, an error for
    /// any quantization kiln does not run.
    pub(crate) fn read(hf: &HfConfig) -> Result<Option<GptqConfig>, ModelError> {
        let Some(q) = hf.raw("quantization_config") else {
            return Ok(None);
        };
        let key = "quantization_config";
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        if method != "gptq" {
            return Err(hf.error(
                key,
                format!("{method} quantization is not supported (kiln runs GPTQ 4-bit)"),
            ));
        }
        let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(0);
        if bits != 4 {
            return Err(hf.error(key, format!("GPTQ with {bits} bits: kiln runs 4-bit only")));
        }
        let group_size = match q.get("group_size").and_then(Value::as_i64) {
            Some(-1) => None,
            Some(g) if g > 0 => Some(g as usize),
            other => return Err(hf.error(key, format!("group_size {other:?}: expected -1 or > 0"))),
        };
        let v1_zeros = match q.get("checkpoint_format").and_then(Value::as_str) {
            None | Some("gptq") => true,
            Some("gptq_v2") => false,
            Some(other) => return Err(hf.error(key, format!("GPTQ checkpoint format \"{other}\""))),
        };
        Ok(Some(GptqConfig {
            group_size,
            v1_zeros,
        }))
    }

    /// The linear layer `p` (its name without `.weight`) of `st` as a GPTQ matrix of
    /// `out_features × in_features`; `None` when the checkpoint has no `<p>.qweight`.
    pub(crate) fn matrix(
        &self,
        st: &SafetensorsModel,
        p: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Option<GptqMatrix>, ModelError> {
        let Some(qweight) = st.tensor(&format!("{p}.qweight")) else {
            return Ok(None);
        };
        let group_size = self.group_size.unwrap_or(in_features);
        let groups = in_features / group_size.max(1);
        let get = |suffix: &str, dtype: Dtype, shape: &[usize]| {
            let name = format!("{p}.{suffix}");
            let t = st
                .tensor(&name)
                .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
            if t.dtype != dtype || t.shape != shape {
                return Err(ModelError::File {
                    file: name,
                    detail: format!(
                        "{:?} {:?}, expected {dtype:?} {shape:?} for a {out_features}×\
                         {in_features} GPTQ layer in groups of {group_size}",
                        t.dtype, t.shape
                    ),
                });
            }
            Ok(t)
        };
        let qweight =
            get("qweight", Dtype::I32, &[in_features / 8, out_features]).map(|_| qweight)?;
        let qzeros = get("qzeros", Dtype::I32, &[groups, out_features / 8])?;
        let scales = get("scales", Dtype::F16, &[groups, out_features])?;
        let g_idx = match st.tensor(&format!("{p}.g_idx")) {
            Some(_) => Some(get("g_idx", Dtype::I32, &[in_features])?),
            None => None,
        };
        let tensors = GptqTensors {
            qweight: &qweight.bytes,
            qzeros: &qzeros.bytes,
            scales: &scales.bytes,
            g_idx: g_idx.map(|t| &t.bytes[..]),
        };
        GptqMatrix::from_checkpoint(
            p,
            &tensors,
            in_features,
            out_features,
            group_size,
            self.v1_zeros,
        )
        .map(Some)
        .map_err(|e| ModelError::File {
            file: p.to_string(),
            detail: e.detail,
        })
    }
}
