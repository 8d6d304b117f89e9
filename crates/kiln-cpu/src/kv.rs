//! The CPU backend's KV cache (`Backend::Kv`): one layer's keys or values, `[rows, cols]`
//! row-major, stored as f32, as IEEE half precision, or in llama.cpp's Q8_0 / Q4_0 blocks of 32
//! ([`KvDtype`], chosen per backend with `CpuOptions::kv_dtype`; f16 by default).
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
//! - Block types: each row is `cols / 32` blocks quantized exactly as ggml's reference
//!   (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, through `kiln_quant::quantize`), so a
//!   row holds what llama.cpp's cache would; attention dequantizes the rows it reads
//!   (`x = d · q`, `x = d · (q − 8)`) in scalar code, the same on every SIMD level. A
//!   non-finite key or value has no block encoding: it is refused with `BackendError::Range`,
//!   nothing written. `cols` must be whole blocks.
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
    /// Rows of `cols / 32` blocks of `ty` (Q8_0 or Q4_0), as bytes in 16-bit words (the
    /// blocks' alignment).
    Blocks {
        ty: KvDtype,
        words: Vec<u16>,
    },
}

/// `words` as bytes.
pub(crate) fn word_bytes(words: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and u8 alignment 1; the slice borrows `words`.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

fn word_bytes_mut(words: &mut [u16]) -> &mut [u8] {
    // SAFETY: as `word_bytes`, and every byte pattern is a valid u16.
    unsafe {
        std::slice::from_raw_parts_mut(
            words.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(words),
        )
    }
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
            KvDtype::Q8_0 | KvDtype::Q4_0 => {
                dtype.check_whole_blocks("kv_zeros", "rows", cols)?;
                // All-zero blocks are zeros (scale 0; Q4_0's codes then read as 0 · (0 − 8)).
                KvData::Blocks {
                    ty: dtype,
                    words: vec![0u16; rows * dtype.row_bytes(cols) / 2],
                }
            }
        };
        Ok(CpuKv { data, rows, cols })
    }

    /// The type the elements are stored as.
    pub fn dtype(&self) -> KvDtype {
        match self.data {
            KvData::F32(_) => KvDtype::F32,
            KvData::F16(_) => KvDtype::F16,
            KvData::Blocks { ty, .. } => ty,
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
            KvData::Blocks { ty, words } => {
                let mut out = vec![0.0; self.rows * self.cols];
                let row_bytes = ty.row_bytes(self.cols);
                for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
                    let bytes = &word_bytes(words)[r * row_bytes..(r + 1) * row_bytes];
                    dequantize_row(*ty, bytes, row);
                }
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
        KvData::Blocks { ty, words } => {
            let (ty, cols) = (*ty, dst.cols);
            if let Some(x) = src.data.iter().find(|v| !v.is_finite()) {
                return Err(BackendError::Range {
                    op: "write_kv_rows",
                    detail: format!("a key or value of {x} has no {ty} encoding"),
                });
            }
            let g = ty.ggml_type();
            let row_bytes = ty.row_bytes(cols);
            let bytes = word_bytes_mut(words);
            for (i, row) in src.data.chunks_exact(cols.max(1)).enumerate() {
                let at = (dst_row + i) * row_bytes;
                kiln_quant::quantize(g, row, &mut bytes[at..at + row_bytes])
                    .map_err(|e| shape_err("write_kv_rows", e.to_string()))?;
            }
        }
    }
    Ok(())
}

/// Dequantizes one row's blocks (`bytes`, whole blocks of `ty`) into `out`: `x = d · q` (Q8_0),
/// `x = d · (q − 8)` (Q4_0), in f32, the scale widened from f16 exactly. Attention reads the
/// rows of a block cache through this, so every path computes with the same values.
#[inline]
pub(crate) fn dequantize_row(ty: KvDtype, bytes: &[u8], out: &mut [f32]) {
    match ty {
        KvDtype::Q8_0 => {
            for (b, o) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                for (o, &q) in o.iter_mut().zip(&b[2..34]) {
                    *o = d * (q as i8) as f32;
                }
            }
        }
        KvDtype::Q4_0 => {
            for (b, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                let (lo, hi) = o.split_at_mut(16);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[2..18]) {
                    *l = d * ((q & 0x0f) as i32 - 8) as f32;
                    *h = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        KvDtype::F32 | KvDtype::F16 => unreachable!("dequantize_row of a float type"),
    }
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
    use kiln_core::GgmlType;

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

    #[test]
    fn block_rows_hold_what_ggml_quantizes() {
        let vals: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for (dtype, g) in [
            (KvDtype::Q8_0, GgmlType::Q8_0),
            (KvDtype::Q4_0, GgmlType::Q4_0),
        ] {
            let mut kv = CpuKv::zeros(3, 64, dtype).unwrap();
            assert!(kv.to_f32().iter().all(|&x| x == 0.0), "zeros");
            write_rows(&mut kv, 1, &CpuTensor::new(vals.clone(), 2, 64).unwrap()).unwrap();
            // kiln-quant's quantizer and dequantizer (the GGUF path) give the same values.
            let mut bytes = vec![0u8; kiln_quant::quantized_size(g, 128).unwrap()];
            kiln_quant::quantize(g, &vals, &mut bytes).unwrap();
            let mut want = vec![0.0; 128];
            kiln_quant::dequantize(g, &bytes, &mut want).unwrap();
            let got = kv.to_f32();
            assert_eq!(got[64..192], want[..], "{dtype}");
            assert!(got[..64].iter().all(|&x| x == 0.0));
            assert_eq!(kv.dtype(), dtype);
            // Close to the input: a step of the scale at most.
            let worst = got[64..192]
                .iter()
                .zip(&vals)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                worst <= 7.2 / if dtype == KvDtype::Q8_0 { 127.0 } else { 7.0 },
                "{dtype} {worst}"
            );
            let nan = CpuTensor::new(vec![f32::NAN; 64], 1, 64).unwrap();
            let err = write_rows(&mut kv, 0, &nan).unwrap_err();
            assert!(err.to_string().contains("no q"), "{err}");
            assert!(
                kv.to_f32()[..64].iter().all(|&x| x == 0.0),
                "nothing written"
            );
            let err = CpuKv::zeros(2, 48, dtype).err().unwrap();
            assert!(
                err.to_string().contains("whole blocks of 32 values"),
                "{err}"
            );
        }
    }
}
