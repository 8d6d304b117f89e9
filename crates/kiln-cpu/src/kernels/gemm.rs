//! Quantized GEMM kernels: `out[c * ldo + r] = dot(weight row r, activation row c)` for a block of
//! `rows` weight rows and `cols` activation rows, the shape of prompt processing.
//!
//! The definition is the loop [`dot_loop`] over a row-dot kernel; it is also the implementation
//! for the scalar level and for the types without a tile kernel. The AVX2 tile kernels
//! (`x86::gemm`) compute the same values up to the order of the f32 additions.
//!
//! Invariants shared by every [`GemmFn`](super::GemmFn):
//!
//! - **Lengths are the caller's contract, checked once per call** ([`gemm_shape`]): `w` is exactly
//!   `rows` rows of `ty.row_bytes(k)` bytes, `a` exactly `cols` rows of
//!   `activation_bytes(vec_dot_type(ty), k)` bytes, `ldo >= rows`, and `out` holds index
//!   `(cols - 1) * ldo + rows - 1`. Anything else panics (a bug in the caller).
//! - **Only the named outputs are written**: `out[c * ldo + r]` for `r < rows`, `c < cols`; the
//!   elements between (`rows <= r < ldo`) keep their values, so the driver can fill one tile of a
//!   larger `[m, n]` output in place.

use kiln_core::GgmlType;

use super::VecDotFn;

/// Bytes of one weight row and of one activation row of a GEMM over `k` elements of weight type
/// `ty`, after checking every length the kernels rely on (see the module invariants).
///
/// # Panics
/// When `k` is not a whole number of blocks, a slice does not have exactly the rows it should, or
/// `out`/`ldo` cannot hold the outputs: a broken caller contract.
#[allow(clippy::too_many_arguments)] // the GemmFn arguments (slices as lengths), plus the type
pub(crate) fn gemm_shape(
    ty: GgmlType,
    k: usize,
    w: usize,
    rows: usize,
    a: usize,
    cols: usize,
    out: usize,
    ldo: usize,
) -> (usize, usize) {
    let w_row = ty.row_bytes(k as u64).and_then(|b| usize::try_from(b).ok());
    let a_row = kiln_quant::vec_dot_type(ty)
        .and_then(|act| kiln_quant::activation_bytes(act, k))
        .ok();
    let (Some(w_row), Some(a_row)) = (w_row, a_row) else {
        shape_panic(
            ty,
            k,
            "k is not a whole number of blocks of a type kiln can dot",
        )
    };
    if rows.checked_mul(w_row) != Some(w) {
        shape_panic(
            ty,
            k,
            &format!("{w} weight bytes are not {rows} rows of {w_row}"),
        )
    }
    if cols.checked_mul(a_row) != Some(a) {
        shape_panic(
            ty,
            k,
            &format!("{a} activation bytes are not {cols} rows of {a_row}"),
        )
    }
    if ldo < rows {
        shape_panic(ty, k, &format!("output stride {ldo} below {rows} rows"))
    }
    if rows > 0 && cols > 0 {
        let needed = (cols - 1)
            .checked_mul(ldo)
            .and_then(|v| v.checked_add(rows));
        if needed.is_none_or(|needed| out < needed) {
            shape_panic(
                ty,
                k,
                &format!("{out} outputs cannot hold {cols} rows of {rows} at stride {ldo}"),
            )
        }
    }
    (w_row, a_row)
}

/// The panic of a GEMM called with inconsistent lengths (kept out of the hot path).
#[cold]
#[inline(never)]
fn shape_panic(ty: GgmlType, k: usize, what: &str) -> ! {
    panic!("{ty} GEMM over k = {k}: {what}")
}

/// The GEMM as a loop of row dots: `out[c * ldo + r] = dot(k, weight row r, activation row c)`.
///
/// Weight row outermost, so that each weight row is read from memory once and stays in L1 while
/// every activation row is dotted with it.
#[inline]
#[allow(clippy::too_many_arguments)] // the GemmFn signature, plus the type and its dot
pub(super) fn dot_loop(
    ty: GgmlType,
    dot: VecDotFn,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let (w_row, a_row) = gemm_shape(ty, k, w.len(), rows, a.len(), cols, out.len(), ldo);
    if w_row == 0 || a_row == 0 {
        // k == 0: every dot is empty (chunks_exact refuses a zero size).
        for c in 0..cols {
            out[c * ldo..c * ldo + rows].fill(0.0);
        }
        return;
    }
    for (r, wrow) in w.chunks_exact(w_row).enumerate() {
        for (c, arow) in a.chunks_exact(a_row).enumerate() {
            out[c * ldo + r] = dot(k, wrow, arow);
        }
    }
}
