//! kiln-cpu: the CPU backend.
//!
//! `kernels` holds the SIMD inner loops (AVX2+FMA chosen at run time, the scalar reference of
//! kiln-quant otherwise); the rest of the crate implements `kiln_backend::Backend` on top of them
//! and splits work across a persistent thread pool (rayon, one pool per backend instance, built
//! once; no thread is spawned per op).
//!
//! Determinism: every output element is computed by one thread with the same instruction sequence
//! whatever the number of threads, so results are bit-identical across `--threads` settings.

mod attention;
mod backend;
pub mod kernels;
mod matmul;
mod ops;

pub use backend::{CpuBackend, CpuTensor, CpuWeight};
