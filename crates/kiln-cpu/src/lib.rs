//! kiln-cpu: the CPU backend.
//!
//! `kernels` holds the SIMD inner loops (AVX2+FMA or AVX-512 VNNI, chosen at run time; the scalar
//! reference of kiln-quant otherwise); the rest of the crate implements `kiln_backend::Backend`
//! on top of them and splits work across a persistent team of threads (`team`: one per backend
//! instance, built once; no thread is spawned per op). The thread that calls an op takes part in
//! it: there is no hand-off to a pool thread and back, because a hand-off per forward pass cost
//! more than it saved (docs/BENCHMARKS.md).
//!
//! Memory: tensors of 1 MiB and more recycle their storage through a process-wide pool
//! (`buffers`), as ONNX Runtime's arena does, instead of a fresh memory map (and a page fault per
//! 4 KiB) per op; ops that overwrite their whole output take it from there.
//!
//! Determinism: every output element is computed by one thread with the same instruction sequence
//! whatever the number of threads, so results are bit-identical across `--threads` settings.

mod attention;
mod backend;
mod buffers;
mod context;
pub mod kernels;
mod kv;
mod math;
mod matmul;
mod ops;
mod options;
mod packed_attention;
mod probe;
mod sgemm;
mod team;
mod tensor;
mod weight;

pub use backend::CpuBackend;
pub use kv::CpuKv;
pub use options::{CpuOptions, INTERLEAVE_TYPES};
pub use probe::{
    memory_bandwidth, memory_bandwidth_quick, memory_bandwidth_with, Bandwidth, Pages,
};
pub use tensor::CpuTensor;
pub use weight::CpuWeight;
