//! GPTQ 4-bit weights (AutoGPTQ / GPTQModel checkpoints), repacked once at load into a layout
//! backends compute with directly.
//!
//! The checkpoint format (`quant_method: "gptq"`, `bits: 4`) for a linear layer of `in` inputs and
//! `out` outputs:
//! - `qweight` int32 `[in / 8, out]`: nibble `k` (bits `4k..4k+4`) of word `[i, j]` is the code of
//!   input `8i + k`, output `j`;
//! - `qzeros` int32 `[groups, out / 8]`: nibble `k` of word `[g, j]` is the zero point of group
//!   `g`, output `8j + k`, stored minus one by `checkpoint_format: "gptq"` (v1) and as is by
//!   `"gptq_v2"`;
//! - `scales` f16 `[groups, out]`;
//! - `g_idx` int32 `[in]`: the group of each input (act-order / `desc_act` checkpoints permute
//!   it; without it, input `i` is in group `i / group_size`).
//!
//! The weight is `W[j, i] = scales[g, j] · (q[i, j] − zero[g, j])` with `g = g_idx[i]`, computed in
//! f32 exactly as the reference dequantizers do (GPTQModel, llama.cpp's converter).
//!
//! [`GptqMatrix`] keeps the codes at 4 bits, one output row after another, with the inputs
//! reordered so that each group is contiguous (`perm[p]` is the input at packed position `p`);
//! a product gathers the activations once in that order and never materializes the f32 matrix.
//!
//! Invariants (checked by [`GptqMatrix::from_checkpoint`]): `in` is a multiple of 8 and of the
//! group size, `out` a multiple of 8, every group holds exactly `group_size` inputs, and every
//! array has the size its shape implies.

use half::f16;

/// Why GPTQ tensors cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("GPTQ layer {name}: {detail}")]
pub struct GptqError {
    pub name: String,
    pub detail: String,
}

/// The raw little-endian tensors of one GPTQ linear layer.
pub struct GptqTensors<'a> {
    pub qweight: &'a [u8],
    pub qzeros: &'a [u8],
    pub scales: &'a [u8],
    pub g_idx: Option<&'a [u8]>,
}

/// A GPTQ 4-bit matrix of `out_features` rows of `in_features`, repacked (see the module doc).
#[derive(Clone, Debug)]
pub struct GptqMatrix {
    pub in_features: usize,
    pub out_features: usize,
    pub group_size: usize,
    /// `perm[p]`: the input at packed position `p`; `None` when the order is the identity.
    pub perm: Option<Vec<u32>>,
    /// Per output row, `in_features / 2` bytes: the code at packed position `p` is nibble
    /// `p % 2` (low first) of byte `p / 2`.
    pub codes: Vec<u8>,
    /// Per output row, one scale per group (f16 widened to f32).
    pub scales: Vec<f32>,
    /// Per output row, one zero point per group (0..=16 once the v1 offset is applied).
    pub zeros: Vec<u8>,
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

impl GptqMatrix {
    /// Number of groups along the inputs.
    pub fn n_groups(&self) -> usize {
        self.in_features / self.group_size
    }

    /// Validates and repacks a checkpoint's tensors. `v1_zeros`: the zero points are stored
    /// minus one (`checkpoint_format: "gptq"`).
    pub fn from_checkpoint(
        name: &str,
        t: &GptqTensors<'_>,
        in_features: usize,
        out_features: usize,
        group_size: usize,
        v1_zeros: bool,
    ) -> Result<GptqMatrix, GptqError> {
        let err = |detail: String| GptqError {
            name: name.to_string(),
            detail,
        };
        if in_features == 0
            || out_features == 0
            || group_size == 0
            || !in_features.is_multiple_of(8)
            || !out_features.is_multiple_of(8)
            || !in_features.is_multiple_of(group_size)
        {
            return Err(err(format!(
                "{out_features} outputs × {in_features} inputs in groups of {group_size}: \
                 both must be multiples of 8 and the inputs a multiple of the group size"
            )));
        }
        let groups = in_features / group_size;
        let size_check = |what: &str, got: usize, want: usize| {
            if got == want {
                Ok(())
            } else {
                Err(err(format!("{what} has {got} bytes, expected {want}")))
            }
        };
        size_check(
            "qweight",
            t.qweight.len(),
            in_features / 8 * out_features * 4,
        )?;
        size_check("qzeros", t.qzeros.len(), groups * out_features / 8 * 4)?;
        size_check("scales", t.scales.len(), groups * out_features * 2)?;

        // Group of each input, and the packed order that makes groups contiguous.
        let g_idx: Vec<usize> = match t.g_idx {
            Some(b) => {
                size_check("g_idx", b.len(), in_features * 4)?;
                words(b).map(|g| g as usize).collect()
            }
            None => (0..in_features).map(|i| i / group_size).collect(),
        };
        let mut counts = vec![0usize; groups];
        for (i, &g) in g_idx.iter().enumerate() {
            match counts.get_mut(g) {
                Some(c) => *c += 1,
                None => {
                    return Err(err(format!(
                        "g_idx[{i}] = {g}, but there are {groups} groups"
                    )))
                }
            }
        }
        if let Some(g) = counts.iter().position(|&c| c != group_size) {
            return Err(err(format!(
                "group {g} has {} inputs, expected {group_size}",
                counts[g]
            )));
        }
        let mut order: Vec<u32> = (0..in_features as u32).collect();
        // Stable: inputs of one group keep their order.
        order.sort_by_key(|&i| g_idx[i as usize]);
        let identity = order.iter().enumerate().all(|(p, &i)| p == i as usize);

        // Codes: qweight[i / 8, j] nibble i % 8 → row j, packed position p.
        let qw: Vec<u32> = words(t.qweight).collect();
        let half_in = in_features / 2;
        let mut codes = vec![0u8; out_features * half_in];
        for (p, &i) in order.iter().enumerate() {
            let i = i as usize;
            let (word_row, shift) = (i / 8, 4 * (i % 8));
            for j in 0..out_features {
                let q = ((qw[word_row * out_features + j] >> shift) & 15) as u8;
                codes[j * half_in + p / 2] |= q << (4 * (p % 2));
            }
        }
        // Zeros and scales, transposed to one row of groups per output.
        let qz: Vec<u32> = words(t.qzeros).collect();
        let mut zeros = vec![0u8; out_features * groups];
        let mut scales = vec![0f32; out_features * groups];
        for g in 0..groups {
            for j in 0..out_features {
                let z = ((qz[g * (out_features / 8) + j / 8] >> (4 * (j % 8))) & 15) as u8;
                zeros[j * groups + g] = z + u8::from(v1_zeros);
                let s = 2 * (g * out_features + j);
                scales[j * groups + g] =
                    f16::from_le_bytes([t.scales[s], t.scales[s + 1]]).to_f32();
            }
        }
        Ok(GptqMatrix {
            in_features,
            out_features,
            group_size,
            perm: (!identity).then_some(order),
            codes,
            scales,
            zeros,
        })
    }

    /// Code of output row `j` at packed position `p`.
    fn code(&self, j: usize, p: usize) -> u8 {
        (self.codes[j * (self.in_features / 2) + p / 2] >> (4 * (p % 2))) & 15
    }

    /// The f32 matrix `[out, in]` (inputs in their original order), as the reference
    /// dequantizers compute it: `scale · (q − zero)`.
    pub fn dequantize(&self) -> Vec<f32> {
        let (n_in, groups) = (self.in_features, self.n_groups());
        let mut w = vec![0f32; self.out_features * n_in];
        for j in 0..self.out_features {
            for p in 0..n_in {
                let g = p / self.group_size;
                let i = self.perm.as_ref().map_or(p, |perm| perm[p] as usize);
                let diff = i32::from(self.code(j, p)) - i32::from(self.zeros[j * groups + g]);
                w[j * n_in + i] = self.scales[j * groups + g] * diff as f32;
            }
        }
        w
    }
}
