//! kiln-quant: the ggml quantization formats, as plain scalar Rust.
//!
//! This crate is the *reference*: obviously-correct dequantizers and dot products that every
//! optimized kernel (kiln-cpu's SIMD paths, kiln-cuda's kernels) is tested against. Speed is not
//! its job.

pub mod blocks;
