//! Dense f32 matrix products through the `gemm` crate (packed panels, cache blocking, AVX2/FMA
//! micro-kernels chosen at run time).
//!
//! Used where both operands are float: float weights (safetensors F32/F16/BF16) times a batch of
//! activations, and attention's `Q·Kᵀ` and `P·V` inside each sequence. Quantized weights keep
//! their integer-dot path in `matmul`.
//!
//! Every call goes through [`gemm`], which checks that each strided view lies inside its slice
//! before handing raw pointers to the library; that check is what makes the `unsafe` call sound.

use kiln_backend::{shape_err, Result};

/// A strided read-only matrix view into a slice: element `(r, c)` is
/// `data[offset + r·rs + c·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `[rows, cols]` matrix filling `data`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            offset: 0,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    fn fits(&self, len: usize) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return self.offset <= len;
        }
        let last = (self.rows - 1)
            .checked_mul(self.rs)
            .and_then(|a| (self.cols - 1).checked_mul(self.cs).map(|b| (a, b)))
            .and_then(|(a, b)| a.checked_add(b))
            .and_then(|v| v.checked_add(self.offset));
        last.is_some_and(|l| l < len)
    }
}

/// A strided writable view, as [`MatRef`].
pub(crate) struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

/// Products smaller than this many multiply-adds run on the calling thread.
const PARALLEL_MIN_FLOPS: usize = 1 << 20;

/// `dst = beta · a · b` (`a: [m, k]`, `b: [k, n]`, `dst: [m, n]`), on up to `threads` threads
/// of the current rayon pool.
pub(crate) fn gemm(
    dst: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    threads: usize,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let dst_view = MatRef {
        data: &[],
        offset: dst.offset,
        rows: m,
        cols: n,
        rs: dst.rs,
        cs: dst.cs,
    };
    if b.rows != k
        || !a.fits(a.data.len())
        || !b.fits(b.data.len())
        || !dst_view.fits(dst.data.len())
    {
        return Err(shape_err(
            "gemm",
            format!(
                "[{m}, {k}] · [{}, {n}] with a view outside its buffer",
                b.rows
            ),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        for r in 0..m {
            for c in 0..n {
                dst.data[dst.offset + r * dst.rs + c * dst.cs] = 0.0;
            }
        }
        return Ok(());
    }
    let parallelism = if threads > 1 && m * n * k >= PARALLEL_MIN_FLOPS {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let stride = |v: usize| v as isize;
    // SAFETY: every element the product reads or writes is inside its slice (checked by `fits`
    // above for the largest index of each view); `dst` is borrowed mutably, so it aliases
    // neither input. With `read_dst = false` the library never reads `dst`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr().add(dst.offset),
            stride(dst.cs),
            stride(dst.rs),
            false,
            a.data.as_ptr().add(a.offset),
            stride(a.cs),
            stride(a.rs),
            b.data.as_ptr().add(b.offset),
            stride(b.cs),
            stride(b.rs),
            0.0,
            beta,
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &MatRef, b: &MatRef) -> Vec<f32> {
        let mut out = vec![0.0; a.rows * b.cols];
        for r in 0..a.rows {
            for c in 0..b.cols {
                let mut s = 0.0f64;
                for i in 0..a.cols {
                    s += a.data[a.offset + r * a.rs + i * a.cs] as f64
                        * b.data[b.offset + i * b.rs + c * b.cs] as f64;
                }
                out[r * b.cols + c] = s as f32;
            }
        }
        out
    }

    #[test]
    fn strided_products_match_a_naive_loop() {
        let data: Vec<f32> = (0..4000)
            .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0)
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for &(m, k, n) in &[(1, 1, 1), (3, 5, 7), (37, 19, 23), (64, 33, 48)] {
            // x row-major, W row-major used transposed, as the linear layers do.
            let a = MatRef::row_major(&data, m, k);
            let b = MatRef {
                offset: 17,
                ..MatRef::row_major(&data, n, k)
            }
            .t();
            let want = naive(&a, &b);
            for threads in [1, 2] {
                let mut out = vec![f32::NAN; m * n];
                let dst = MatMut {
                    data: &mut out,
                    offset: 0,
                    rs: n,
                    cs: 1,
                };
                pool.install(|| gemm(dst, a, b, 1.0, threads)).unwrap();
                for (g, w) in out.iter().zip(&want) {
                    assert!((g - w).abs() < 1e-4, "{m}x{k}x{n}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn views_outside_the_buffer_are_refused() {
        let data = vec![0.0f32; 12];
        let a = MatRef::row_major(&data, 3, 4);
        let b = MatRef::row_major(&data, 4, 4); // needs 16 elements
        let mut out = vec![0.0; 12];
        let dst = MatMut {
            data: &mut out,
            offset: 0,
            rs: 4,
            cs: 1,
        };
        assert!(gemm(dst, a, b, 1.0, 1).is_err());
    }
}
