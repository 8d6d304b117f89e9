//! A tensor's header entry ([`TensorInfo`]) and the shape rules every GGUF tensor obeys
//! ([`tensor_n_bytes`]), shared by the parser and the writer.
//!
//! A tensor has 0 to [`MAX_DIMS`] dims (none: a scalar, one element), no dim is 0, the element
//! count fits an i64, and the row length `dims[0]` is a whole number of blocks of its type.

use kiln_core::GgmlType;

use super::error::ShapeError;
use super::MAX_DIMS;

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length (ne0). Empty for a scalar.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Relative to the data section, as stored.
    pub offset: u64,
    /// Computed from `dims` and `ty`; validated to lie inside the file.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of the dims (1 for a scalar); cannot overflow for a parsed tensor.
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// Bytes of a tensor of shape `dims` and type `ty`, checking every rule of the module doc.
pub(crate) fn tensor_n_bytes(dims: &[u64], ty: GgmlType) -> Result<u64, ShapeError> {
    if dims.len() > MAX_DIMS {
        return Err(ShapeError::TooManyDims {
            n_dims: dims.len() as u64,
        });
    }
    if let Some(axis) = dims.iter().position(|&d| d == 0) {
        return Err(ShapeError::ZeroDimension { axis });
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or(ShapeError::ElementCountOverflow)?;
    let row_len = dims.first().copied().unwrap_or(1);
    let block_size = ty.block_size() as u64;
    if row_len % block_size != 0 {
        return Err(ShapeError::RowNotBlockMultiple {
            row_len,
            ty,
            block_size,
        });
    }
    let row_bytes = ty.row_bytes(row_len).ok_or(ShapeError::ByteSizeOverflow)?;
    // row_len >= 1 (no zero dims), so the division is exact and safe.
    (n_elements / row_len)
        .checked_mul(row_bytes)
        .ok_or(ShapeError::ByteSizeOverflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_rules() {
        assert_eq!(tensor_n_bytes(&[640, 3], GgmlType::Q8_0), Ok(3 * 20 * 34));
        assert_eq!(tensor_n_bytes(&[], GgmlType::F32), Ok(4));
        assert_eq!(
            tensor_n_bytes(&[4, 0], GgmlType::F32),
            Err(ShapeError::ZeroDimension { axis: 1 })
        );
        assert_eq!(
            tensor_n_bytes(&[1 << 32, 1 << 31], GgmlType::F32),
            Err(ShapeError::ElementCountOverflow)
        );
        assert_eq!(
            tensor_n_bytes(&[1 << 62], GgmlType::F32),
            Err(ShapeError::ByteSizeOverflow)
        );
        assert!(matches!(
            tensor_n_bytes(&[640], GgmlType::Q4_K),
            Err(ShapeError::RowNotBlockMultiple { row_len: 640, .. })
        ));
        assert_eq!(
            tensor_n_bytes(&[1, 1, 1, 1, 1], GgmlType::F32),
            Err(ShapeError::TooManyDims { n_dims: 5 })
        );
    }
}
