//! [`CpuTensor`], the CPU backend's activations: a row-major `[rows, cols]` f32 matrix whose
//! storage is recycled through `buffers` when it is large, and the shape check of the ops that
//! write rows into another matrix.

use kiln_backend::{shape_err, Result};

/// A row-major `[rows, cols]` f32 tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub(crate) data: Vec<f32>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl CpuTensor {
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Result<Self> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "tensor",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        Ok(CpuTensor { data, rows, cols })
    }
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
}

/// Large tensors give their storage back for reuse (see `buffers`).
impl Drop for CpuTensor {
    fn drop(&mut self) {
        crate::buffers::give(std::mem::take(&mut self.data));
    }
}

/// Checks that `src`'s rows fit at row `dst_row` of a `[rows, cols]` destination (same width).
pub(crate) fn check_rows_fit(
    op: &'static str,
    src: &CpuTensor,
    dst_row: usize,
    (rows, cols): (usize, usize),
) -> Result<()> {
    let end = dst_row.checked_add(src.rows);
    if src.cols != cols || end.is_none_or(|end| end > rows) {
        return Err(shape_err(
            op,
            format!(
                "[{}, {}] at row {dst_row} into [{rows}, {cols}]",
                src.rows, src.cols
            ),
        ));
    }
    Ok(())
}
