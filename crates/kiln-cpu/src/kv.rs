//! The CPU backend's KV cache (`Backend::Kv`): one layer's keys or values, `[rows, cols]`
//! row-major, stored as f32 or as IEEE half precision ([`KvDtype`], chosen per backend with
//! `CpuOptions::kv_dtype`; f16 by default).
//!
//! Invariants:
//!
//! - The storage holds exactly `rows * cols` elements, of one type for the cache's lifetime.
//! - Rows are only ever written by [`write_rows`], which rounds f32 to f16 to the nearest (ties
//!   to even: F16C's `vcvtps2ph` and `half`'s portable code give the same bits), and read by
//!   attention, which widens each element exactly
//!   ([`KvElem`](crate::kernels::KvElem)). So the AVX2 kernels and the
//!   portable code see the same f32 values, and results stay bit-identical across SIMD levels
//!   and thread counts, as with an f32 cache.
//! - A finite value too large for f16 (65520 and up) is refused with `BackendError::Range`
//!   before anything is written, rather than stored as an infinity that would turn attention
//!   into NaNs; a model whose keys or values reach that far needs an f32 cache.
//! - A fresh cache is zeros from a zeroed allocation: pages of a large cache are only touched
//!   (and counted in the resident size) once rows are written there.

use half::f16;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use kiln_backend::{shape_err, BackendError, KvDtype, Result};

use crate::tensor::{check_rows_fit, CpuTensor};

/// See the module docs.
pub struct CpuKv {
    pub(crate) data: KvData,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// The elements of a [`CpuKv`].
pub(crate) enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl CpuKv {
    /// `[rows, cols]` of zeros stored as `dtype`.
    pub(crate) fn zeros(rows: usize, cols: usize, dtype: KvDtype) -> Result<CpuKv> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| shape_err("kv_zeros", format!("[{rows}, {cols}] overflows")))?;
        // Zeroed vectors of primitives come from calloc: untouched pages stay unmapped.
        let data = match dtype {
            KvDtype::F32 => KvData::F32(vec![0.0; n]),
            KvDtype::F16 => KvData::F16(vec![0u16; n].reinterpret_into()),
        };
        Ok(CpuKv { data, rows, cols })
    }

    /// The type the elements are stored as.
    pub fn dtype(&self) -> KvDtype {
        match self.data {
            KvData::F32(_) => KvDtype::F32,
            KvData::F16(_) => KvDtype::F16,
        }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The stored values, widened to f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            KvData::F32(v) => v.clone(),
            KvData::F16(v) => {
                let mut out = vec![0.0; v.len()];
                v.convert_to_f32_slice(&mut out);
                out
            }
        }
    }

    /// A cache holding `data` (`rows * cols` values, rounded to `dtype`): for tests and
    /// benchmarks.
    pub fn from_f32(data: &[f32], rows: usize, cols: usize, dtype: KvDtype) -> Result<CpuKv> {
        let mut kv = CpuKv::zeros(rows, cols, dtype)?;
        let src = CpuTensor::new(data.to_vec(), rows, cols)?;
        write_rows(&mut kv, 0, &src)?;
        Ok(kv)
    }
}

/// Rows `dst_row..dst_row + src.rows` of `dst` become `src`'s, rounded to `dst`'s type.
pub(crate) fn write_rows(dst: &mut CpuKv, dst_row: usize, src: &CpuTensor) -> Result<()> {
    check_rows_fit("write_kv_rows", src, dst_row, dst.shape())?;
    let range = dst_row * dst.cols..(dst_row + src.rows) * dst.cols;
    match &mut dst.data {
        KvData::F32(d) => d[range].copy_from_slice(&src.data),
        KvData::F16(d) => {
            if let Some(x) = f16_overflow(&src.data) {
                return Err(BackendError::Range {
                    op: "write_kv_rows",
                    detail: format!(
                        "a key or value of {x:e} does not fit an f16 KV cache (largest finite \
                         value 65504); an f32 cache holds it"
                    ),
                });
            }
            d[range].convert_from_f32_slice(&src.data)
        }
    }
    Ok(())
}

/// The first finite value of `x` that f16 cannot hold (it would round to infinity), if any.
/// Infinities and NaNs are passed through as they are: an f32 cache would hold them too.
fn f16_overflow(x: &[f32]) -> Option<f32> {
    // Values from 65520 up round past f16's largest finite value, 65504.
    let overflows = |v: f32| v.abs() >= 65520.0 && v.is_finite();
    // A branch-free pass per chunk (it vectorizes), then a look for the culprit.
    let over = |c: &[f32]| c.iter().fold(false, |o, &v| o | overflows(v));
    x.chunks(256)
        .find(|c| over(c))
        .and_then(|c| c.iter().copied().find(|&v| overflows(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rows_round_to_nearest_and_widen_exactly() {
        let vals = [
            1.0,
            -2.5,
            1.0 + 1.0 / 2048.0,
            65504.0,
            1e-8,
            2.71,
            1.0 + 3.0 / 2048.0,
            -0.0,
        ];
        let mut kv = CpuKv::zeros(3, 8, KvDtype::F16).unwrap();
        let src = CpuTensor::new(vals.to_vec(), 1, 8).unwrap();
        write_rows(&mut kv, 1, &src).unwrap();
        let got = kv.to_f32();
        assert!(got[..8].iter().chain(&got[16..]).all(|&x| x == 0.0));
        let want: Vec<f32> = vals.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        assert_eq!(got[8..16], want[..]);
        // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10, 1 + 3·2^-11 halfway
        // between 1 + 2^-10 and 1 + 2^-9.
        assert_eq!(got[10], 1.0);
        assert_eq!(got[14], 1.0 + 1.0 / 512.0);
        assert_eq!(got[13], 2.7109375);
        assert_eq!(kv.dtype(), KvDtype::F16);
    }

    #[test]
    fn f32_rows_are_kept_exactly() {
        let vals: Vec<f32> = (0..12).map(|i| i as f32 * 0.1 - 0.3).collect();
        let kv = CpuKv::from_f32(&vals, 3, 4, KvDtype::F32).unwrap();
        assert_eq!(kv.to_f32(), vals);
        assert_eq!(kv.shape(), (3, 4));
    }

    #[test]
    fn values_too_large_for_f16_are_refused_by_name() {
        let mut kv = CpuKv::zeros(2, 4, KvDtype::F16).unwrap();
        // 65519 still rounds to 65504; infinities and NaNs pass as they would in f32.
        let fits = [65519.0, -65504.0, f32::INFINITY, f32::NAN];
        write_rows(&mut kv, 0, &CpuTensor::new(fits.to_vec(), 1, 4).unwrap()).unwrap();
        let got = kv.to_f32();
        assert_eq!(got[..2], [65504.0, -65504.0]);
        assert!(got[2].is_infinite() && got[3].is_nan());
        let big = CpuTensor::new(vec![1.0, 2.0, -7.0e4, 3.0], 1, 4).unwrap();
        let err = write_rows(&mut kv, 1, &big).unwrap_err();
        assert!(
            err.to_string()
                .contains("-7e4 does not fit an f16 KV cache"),
            "{err}"
        );
        assert!(
            kv.to_f32()[4..].iter().all(|&x| x == 0.0),
            "nothing written"
        );
        let mut wide = CpuKv::zeros(2, 4, KvDtype::F32).unwrap();
        write_rows(&mut wide, 1, &big).unwrap();
        assert_eq!(wide.to_f32()[6], -7.0e4);
    }

    #[test]
    fn out_of_range_writes_are_errors_that_change_nothing() {
        let mut kv = CpuKv::zeros(2, 4, KvDtype::F16).unwrap();
        let src = CpuTensor::new(vec![1.0; 8], 2, 4).unwrap();
        assert!(write_rows(&mut kv, 1, &src).is_err());
        assert!(write_rows(&mut kv, usize::MAX, &src).is_err());
        let wide = CpuTensor::new(vec![1.0; 5], 1, 5).unwrap();
        assert!(write_rows(&mut kv, 0, &wide).is_err());
        assert!(kv.to_f32().iter().all(|&x| x == 0.0));
        assert!(CpuKv::zeros(usize::MAX, 2, KvDtype::F32).is_err());
    }
}
