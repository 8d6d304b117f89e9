//! kiln-cpu: kiln: the CPU backend (scalar reference and AVX2+FMA kernels, thread pool)
