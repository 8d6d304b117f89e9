use std::ops::Range;
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

    /// Bytes of one row, checked against the tensor: each row a whole number of blocks of its
    /// type, and the bytes exactly its rows. A [`crate::BackendError::Weight`] naming the tensor
    /// otherwise (what every backend's `upload_weight` refuses).
    pub fn checked_row_bytes(&self) -> crate::Result<usize> {
        let werr = |detail: String| crate::BackendError::Weight {
            name: self.name.clone(),
            detail,
        };
        let (k, n) = (self.row_len(), self.n_rows());
        let row_bytes = self
            .ty
            .row_bytes(k as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                werr(format!(
                    "row of {k} is not a whole number of {} blocks",
                    self.ty
                ))
            })?;
        if row_bytes.checked_mul(n) != Some(self.bytes.len()) {
            return Err(werr(format!(
                "{} bytes for {n} rows of {row_bytes}",
                self.bytes.len()
            )));
        }
        Ok(row_bytes)
    }

    /// Rows `rows` of this tensor seen as a matrix of [`n_rows`](Self::n_rows) rows, as a 2-D
    /// weight named `name`: a zero-copy view (rows of every type are whole blocks). This is how a
    /// fused QKV or gate/up matrix, or one expert of a stacked 3-D tensor, becomes a weight of its
    /// own. `None` when the range is out of bounds or the bytes do not hold whole rows.
    pub fn slice_rows(&self, rows: Range<usize>, name: String) -> Option<WeightData> {
        if rows.start > rows.end || rows.end > self.n_rows() {
            return None;
        }
        let row_bytes = usize::try_from(self.ty.row_bytes(self.row_len() as u64)?).ok()?;
        let bytes = self
            .bytes
            .slice(rows.start * row_bytes..rows.end * row_bytes)?;
        Some(WeightData {
            name,
            ty: self.ty,
            dims: vec![self.row_len(), rows.len()],
            bytes,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_slices_are_whole_rows_of_any_type() {
        // Q8_0: 34 bytes per 32 elements; 3 experts of 2 rows of 64 elements each.
        let row = 2 * 34;
        let bytes: Vec<u8> = (0..6 * row).map(|i| i as u8).collect();
        let w = WeightData {
            name: "exps".into(),
            ty: GgmlType::Q8_0,
            dims: vec![64, 2, 3],
            bytes: SharedBytes::from_vec(bytes.clone()),
        };
        let e1 = w.slice_rows(2..4, "e1".into()).unwrap();
        assert_eq!(e1.dims, [64, 2]);
        assert_eq!(&e1.bytes[..], &bytes[2 * row..4 * row]);
        assert!(w.slice_rows(5..7, "x".into()).is_none());
        // A row length that is not a whole number of blocks has no row slices.
        let odd = WeightData {
            dims: vec![48, 4],
            ..w
        };
        assert!(odd.slice_rows(0..1, "x".into()).is_none());
    }
}
