use std::sync::Arc;

use kiln_core::{GgmlType, SharedBytes};

use crate::Backend;

/// A weight as it sits in a file: element type, GGUF-order dims (`dims[0]` contiguous) and bytes.
#[derive(Clone, Debug)]
pub struct WeightData {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<usize>,
    pub bytes: SharedBytes,
}

impl WeightData {
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }
    /// Length of one row (`dims[0]`), 1 for a scalar.
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }
    /// Number of rows (product of the other dims).
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product()
    }
}

/// A linear layer `y = x · Wᵀ + b` with `W` of `out_features` rows of `in_features` elements.
///
/// The weight is behind an `Arc` so that tied matrices (Gemma's output projection is its token
/// embedding) are resident once.
pub struct Linear<B: Backend> {
    pub weight: Arc<B::Weight>, // (out_features, in_features), any supported type
    pub bias: Option<B::Weight>, // (out_features), f32
    pub in_features: usize,
    pub out_features: usize,
    pub ty: GgmlType,
}

impl<B: Backend> Clone for Linear<B>
where
    B::Weight: Clone,
{
    fn clone(&self) -> Self {
        Linear {
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            in_features: self.in_features,
            out_features: self.out_features,
            ty: self.ty,
        }
    }
}
