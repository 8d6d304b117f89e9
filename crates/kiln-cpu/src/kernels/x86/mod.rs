//! AVX2+FMA+F16C kernels for x86-64.
//!
//! Soundness rests on two invariants:
//!
//! - **The CPU has AVX2, FMA and F16C.** The safe wrappers defined here execute those
//!   instructions; they are private to `kernels` and handed out only by `super::vec_dot_fn`,
//!   `super::gemm_fn` and `super::quantize_fn`, which check [`cpu_has_avx2_fma_f16c`] (cached)
//!   first. The attention kernels (`attention`) are `unsafe` and inlined into their callers:
//!   `super::attention` runs them only where its caller says the CPU has those features.
//! - **Every load stays inside its slice.** Each wrapper checks the slice lengths once, exactly as
//!   the block count requires; the kernels then read through raw pointers with unaligned loads at
//!   offsets below `blocks * block_bytes`. (Prefetch hints may name addresses past the end: they
//!   are not loads and never fault.)
//!
//! The integer dots follow llama.cpp's AVX2 techniques: `maddubs` (u8 x i8 -> i16 pairs) after
//! moving the sign of the weights onto the activations, `madd` against the per-sub-block scales,
//! and one float multiply-add per block.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use kiln_core::GgmlType;

use super::{GemmFn, QuantizeFn, RowsFn, StridedGemmFn, VecDotFn};

pub(super) use interleaved::interleaved_gemm_fn;

/// The AVX2 product over the interleaved layout of `ty`, where it has one (Q4_K, Q5_0;
/// bit-identical to the AVX2 tile kernels, see `gemm::interleaved`).
pub(super) fn interleaved_gemm_fn_avx2(ty: GgmlType) -> Option<super::InterleavedGemmFn> {
    gemm::interleaved_product(ty).map(|(gemm, _)| gemm)
}

/// The activation rows from which [`interleaved_gemm_fn_avx2`]`(ty)` packs the tile kernel's
/// panels rather than reading the activation terms (`kernels::interleaved_uses_terms`).
pub(super) fn interleaved_min_cols_avx2(ty: GgmlType) -> Option<usize> {
    gemm::interleaved_product(ty).map(|(_, min_cols)| min_cols)
}

pub(super) mod amx;
pub(super) mod attention;
mod float;
mod gemm;
mod interleaved;
mod kquants;
mod legacy;
mod quantize;

/// Whether this CPU runs the kernels of this module.
pub(super) fn cpu_has_avx2_fma_f16c() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether this CPU runs the AVX-512 float kernels: AVX-512 F, BW, VL and DQ.
pub(super) fn cpu_has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
}

/// Whether `KILN_GFNI` lets the VNNI kernels use GFNI's bit-matrix transforms (the Q6_K one does:
/// the same bits in fewer instructions; `interleaved::interleaved_gemm_fn` hands it out only
/// where the CPU has GFNI). Read once per process.
pub(super) fn gfni_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| !env_refuses(std::env::var("KILN_GFNI").ok().as_deref()))
}

/// Whether the value of a switch such as `KILN_AMX` or `KILN_GFNI` turns its feature off: `0`,
/// `off`, `false` or `no` (any case, surrounding blanks ignored); unset or anything else leaves
/// it on.
pub(super) fn env_refuses(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        )
    })
}

/// Whether this CPU also runs the VNNI tile kernels (`gemm::*_vnni`): AVX-512 F, BW, VL and VNNI.
pub(super) fn cpu_has_avx512_vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// The AVX2 kernel for weights of type `ty`, if there is one.
pub(super) fn vec_dot_fn(ty: GgmlType) -> Option<VecDotFn> {
    let kernel: VecDotFn = match ty {
        GgmlType::Q4_0 => legacy::q4_0_q8_0,
        GgmlType::Q4_1 => legacy::q4_1_q8_1,
        GgmlType::Q5_0 => legacy::q5_0_q8_0,
        GgmlType::Q5_1 => legacy::q5_1_q8_1,
        GgmlType::Q8_0 => legacy::q8_0_q8_0,
        GgmlType::Q2_K => kquants::q2_k_q8_k,
        GgmlType::Q3_K => kquants::q3_k_q8_k,
        GgmlType::Q4_K => kquants::q4_k_q8_k,
        GgmlType::Q5_K => kquants::q5_k_q8_k,
        GgmlType::Q6_K => kquants::q6_k_q8_k,
        GgmlType::Q8_K => kquants::q8_k_q8_k,
        GgmlType::F32 => float::f32_f32,
        GgmlType::F16 => float::f16_f32,
        GgmlType::BF16 => float::bf16_f32,
        _ => return None,
    };
    Some(kernel)
}

/// The AVX2 GEMM for weights of type `ty`: a tile kernel where there is one, else the loop over
/// the AVX2 row dot.
pub(super) fn gemm_fn(ty: GgmlType) -> Option<GemmFn> {
    let kernel: GemmFn = match ty {
        GgmlType::Q4_0 => gemm::q4_0,
        GgmlType::Q4_1 => gemm::q4_1,
        GgmlType::Q5_0 => gemm::q5_0,
        GgmlType::Q5_1 => gemm::q5_1,
        GgmlType::Q8_0 => gemm::q8_0,
        GgmlType::Q4_K => gemm::q4_k,
        GgmlType::Q5_K => gemm::q5_k,
        GgmlType::Q6_K => gemm::q6_k,
        GgmlType::Q2_K => dot_loop_q2_k,
        GgmlType::Q3_K => dot_loop_q3_k,
        GgmlType::Q8_K => dot_loop_q8_k,
        GgmlType::F32 => dot_loop_f32,
        GgmlType::F16 => dot_loop_f16,
        GgmlType::BF16 => dot_loop_bf16,
        _ => return None,
    };
    Some(kernel)
}

/// The batch-invariant AVX2 GEMM for weights of type `ty`: as [`gemm_fn`], but a tile kernel
/// runs for any number of activation rows (never its row-dot loop), so that every output value
/// is computed by the same operations however many rows the call has.
pub(super) fn gemm_fn_invariant(ty: GgmlType) -> Option<GemmFn> {
    let kernel: GemmFn = match ty {
        GgmlType::Q4_0 => gemm::q4_0_always,
        GgmlType::Q4_1 => gemm::q4_1_always,
        GgmlType::Q5_0 => gemm::q5_0_always,
        GgmlType::Q5_1 => gemm::q5_1_always,
        GgmlType::Q8_0 => gemm::q8_0_always,
        GgmlType::Q4_K => gemm::q4_k_always,
        GgmlType::Q5_K => gemm::q5_k_always,
        GgmlType::Q6_K => gemm::q6_k_always,
        // The row-dot loops compute each output alone: invariant already.
        other => return gemm_fn(other),
    };
    Some(kernel)
}

/// The GEMM for weights of type `ty` on a CPU with AVX-512 VNNI (see
/// [`cpu_has_avx512_vnni`]): the VNNI tile kernel where there is one, else [`gemm_fn`].
pub(super) fn gemm_fn_vnni(ty: GgmlType) -> Option<GemmFn> {
    Some(match ty {
        GgmlType::Q4_0 => gemm::q4_0_vnni,
        GgmlType::Q4_1 => gemm::q4_1_vnni,
        GgmlType::Q5_0 => gemm::q5_0_vnni,
        GgmlType::Q5_1 => gemm::q5_1_vnni,
        GgmlType::Q8_0 => gemm::q8_0_vnni,
        GgmlType::Q4_K => gemm::q4_k_vnni,
        GgmlType::Q5_K => gemm::q5_k_vnni,
        GgmlType::Q6_K => gemm::q6_k_vnni,
        other => return gemm_fn(other),
    })
}

/// The strided narrow GEMM of `ty` (see `kernels::strided_gemm_fn`), where there is one.
pub(super) fn strided_gemm_fn_vnni(ty: GgmlType) -> Option<StridedGemmFn> {
    Some(match ty {
        GgmlType::Q4_0 => gemm::q4_0_vnni_strided,
        GgmlType::Q4_1 => gemm::q4_1_vnni_strided,
        GgmlType::Q5_0 => gemm::q5_0_vnni_strided,
        GgmlType::Q5_1 => gemm::q5_1_vnni_strided,
        GgmlType::Q8_0 => gemm::q8_0_vnni_strided,
        GgmlType::Q4_K => gemm::q4_k_vnni_strided,
        GgmlType::Q5_K => gemm::q5_k_vnni_strided,
        GgmlType::Q6_K => gemm::q6_k_vnni_strided,
        _ => return None,
    })
}

/// As [`gemm_fn_invariant`], with the VNNI tile kernels (bit-identical to the AVX2 ones).
pub(super) fn gemm_fn_invariant_vnni(ty: GgmlType) -> Option<GemmFn> {
    Some(match ty {
        GgmlType::Q4_0 => gemm::q4_0_vnni_always,
        GgmlType::Q4_1 => gemm::q4_1_vnni_always,
        GgmlType::Q5_0 => gemm::q5_0_vnni_always,
        GgmlType::Q5_1 => gemm::q5_1_vnni_always,
        GgmlType::Q8_0 => gemm::q8_0_vnni_always,
        GgmlType::Q4_K => gemm::q4_k_vnni_always,
        GgmlType::Q5_K => gemm::q5_k_vnni_always,
        GgmlType::Q6_K => gemm::q6_k_vnni_always,
        other => return gemm_fn_invariant(other),
    })
}

/// The tile-exact one-row product of `ty` (see `kernels::rows_exact_fn`), where there is one.
pub(super) fn rows_exact_fn(ty: GgmlType) -> Option<RowsFn> {
    Some(match ty {
        GgmlType::Q4_0 => gemm::q4_0_rows,
        GgmlType::Q4_1 => gemm::q4_1_rows,
        GgmlType::Q5_0 => gemm::q5_0_rows,
        GgmlType::Q5_1 => gemm::q5_1_rows,
        GgmlType::Q8_0 => gemm::q8_0_rows,
        GgmlType::Q4_K => gemm::q4_k_rows,
        GgmlType::Q5_K => gemm::q5_k_rows,
        GgmlType::Q6_K => gemm::q6_k_rows,
        _ => return None,
    })
}

/// The VNNI one-row product of `ty` (see `kernels::gemv_fn`), where there is one.
pub(super) fn gemv_fn_vnni(ty: GgmlType) -> Option<RowsFn> {
    Some(match ty {
        GgmlType::Q4_0 => gemm::q4_0_rows_vnni,
        GgmlType::Q5_0 => gemm::q5_0_rows_vnni,
        GgmlType::Q8_0 => gemm::q8_0_rows_vnni,
        _ => return None,
    })
}

/// Defines `$name`, the GEMM of `$ty` as the loop over its AVX2 row dot `$dot`.
macro_rules! dot_loops {
    ($($name:ident => $ty:ident, $dot:path;)*) => {
        $(
            fn $name(
                k: usize,
                w: &[u8],
                rows: usize,
                a: &[u8],
                cols: usize,
                out: &mut [f32],
                ldo: usize,
            ) {
                super::gemm::dot_loop(GgmlType::$ty, $dot, k, w, rows, a, cols, out, ldo)
            }
        )*
    };
}

dot_loops! {
    dot_loop_q2_k => Q2_K, kquants::q2_k_q8_k;
    dot_loop_q3_k => Q3_K, kquants::q3_k_q8_k;
    dot_loop_q8_k => Q8_K, kquants::q8_k_q8_k;
    dot_loop_f32 => F32, float::f32_f32;
    dot_loop_f16 => F16, float::f16_f32;
    dot_loop_bf16 => BF16, float::bf16_f32;
}

/// The AVX2 quantizer of activations of type `act_ty`, if there is one.
pub(super) fn quantize_fn(act_ty: GgmlType) -> Option<QuantizeFn> {
    let kernel: QuantizeFn = match act_ty {
        GgmlType::Q8_0 => quantize::q8_0,
        GgmlType::Q8_1 => quantize::q8_1,
        GgmlType::Q8_K => quantize::q8_k,
        _ => return None,
    };
    Some(kernel)
}

/// The number of blocks of `block` elements in `n`, when `n` is a whole number of them and every
/// `(block_bytes, len)` pair has `len == blocks * block_bytes` exactly. The multiplication is
/// checked: an overflow fails the check instead of wrapping around to a small size.
#[inline]
fn blocks_of(n: usize, block: usize, slices: &[(usize, usize)]) -> Option<usize> {
    let blocks = n.is_multiple_of(block).then_some(n / block)?;
    slices
        .iter()
        .all(|&(block_bytes, len)| blocks.checked_mul(block_bytes) == Some(len))
        .then_some(blocks)
}

/// The panic of a row dot called with lengths that do not match (kept out of the hot path).
#[cold]
#[inline(never)]
fn wrong_lengths(kernel: &str, n: usize, w: usize, a: usize) -> ! {
    panic!("{kernel}: {n} elements do not match {w} weight and {a} activation bytes")
}

/// Defines the safe row-dot wrapper `$name(n, w, a)` around the AVX2 kernel
/// `$kernel(blocks, w_ptr, a_ptr)`, whose blocks hold `$qk` elements in `$w_bytes` weight bytes
/// and `$a_bytes` activation bytes.
macro_rules! row_dot {
    ($(#[$doc:meta])* $name:ident => $kernel:ident, $qk:expr, $w_bytes:expr, $a_bytes:expr) => {
        $(#[$doc])*
        pub(in crate::kernels) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let Some(blocks) =
                super::blocks_of(n, $qk, &[($w_bytes, w.len()), ($a_bytes, a.len())])
            else {
                super::wrong_lengths(stringify!($name), n, w.len(), a.len())
            };
            // SAFETY: the CPU has AVX2+FMA+F16C (module invariant: this fn is handed out only
            // after detection), and the check above gives the kernel exactly `blocks` whole blocks
            // in each slice, the only bytes it reads.
            unsafe { $kernel(blocks, w.as_ptr(), a.as_ptr()) }
        }
    };
}
use row_dot;

// ---- helpers shared by the kernels (inlined into them: same target features) ----

/// 32 bytes at `p`, unaligned.
///
/// # Safety
/// `p..p + 32` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// 16 bytes at `p`, unaligned.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// The little-endian `u32` at `p`, unaligned.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn read_u32(p: *const u8) -> u32 {
    u32::from_le(p.cast::<u32>().read_unaligned())
}

/// The raw bits of the IEEE half at `p`, unaligned.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn read_f16_bits(p: *const u8) -> u16 {
    u16::from_le(p.cast::<u16>().read_unaligned())
}

/// The IEEE half at `p` (unaligned), widened to f32 (exact) in all 8 lanes.
///
/// Converting a broadcast keeps every lane in use: converting a lone half lets the compiler
/// insert it into whatever register it likes (only lane 0 would matter), often a multiply-add
/// accumulator, which chains each block to the latency of the previous one.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_splat(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(read_f16_bits(p) as i16))
}

/// The two adjacent IEEE halves at `p` (unaligned), widened to f32 (exact) in lanes 0 and 1.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_pair(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(read_u32(p) as i32))
}

/// The f32 at `p`, unaligned.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn read_f32(p: *const u8) -> f32 {
    f32::from_bits(read_u32(p))
}

/// How far ahead of the block being read the weights are prefetched. A decode pass streams every
/// weight matrix from memory once per token; a software prefetch about 2 KB ahead keeps more
/// cache lines in flight than the hardware prefetcher alone, which raises the bandwidth of a
/// thread streaming a matrix larger than the caches and costs little when the matrix already
/// sits in cache (`examples/kernel_bench.rs` measures both).
const PREFETCH_DISTANCE: usize = 2048;

/// How far ahead (bytes) the VNNI products over interleaved weights prefetch their weights at
/// one activation row (decode), 0 for no prefetch: `KILN_ROW_PREFETCH` where set (bytes), else
/// 4096 on Intel CPUs and on AMD Zen 5 and later (family 0x1A on), 0 elsewhere. Measured
/// (docs/BENCHMARKS.md): on an Intel Xeon (a VM with AMX, 2 cores) llama-3.2-1b-shape Q4_K_M
/// decode went from 15-17 to 24 tok/s with 4 KB (2 KB: 22, 8 KB: 23), the hardware prefetcher
/// alone leaving the stream at half the memory's rate; on a Zen 5 EPYC the same decode went from
/// 40-44 to 63-65 tok/s on a quiet minute (2 KB: 47-63); on Zen 4 the hardware did better alone
/// (Q8_0's one-row product 10-20 % slower with 4-8 KB), so Zen 4 and older AMD cores keep none.
/// Read once per process.
pub(super) fn row_prefetch_distance() -> usize {
    static DISTANCE: OnceLock<usize> = OnceLock::new();
    *DISTANCE.get_or_init(|| {
        let set = std::env::var("KILN_ROW_PREFETCH").ok();
        set.and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| default_row_prefetch(cpu_vendor(), cpu_family()))
    })
}

/// The CPU's vendor string from CPUID leaf 0 (`GenuineIntel`, `AuthenticAMD`, ...).
fn cpu_vendor() -> [u8; 12] {
    let id = __cpuid(0);
    let mut v = [0u8; 12];
    for (i, r) in [id.ebx, id.edx, id.ecx].into_iter().enumerate() {
        v[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
    }
    v
}

/// The CPU's family from CPUID leaf 1: the base family, plus the extended family where the base
/// is 0xF (as both vendors define it).
fn cpu_family() -> u32 {
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xf;
    if base == 0xf {
        base + ((eax >> 20) & 0xff)
    } else {
        base
    }
}

/// [`row_prefetch_distance`]'s default for a vendor and family.
fn default_row_prefetch(vendor: [u8; 12], family: u32) -> usize {
    match &vendor {
        b"GenuineIntel" => 4096,
        b"AuthenticAMD" if family >= 0x1a => 4096,
        _ => 0,
    }
}

/// Asks for the `lines` cache lines `distance` bytes past `p`, a hint as [`prefetch_ahead`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch_at(p: *const u8, distance: usize, lines: usize) {
    for line in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(distance + 64 * line).cast());
    }
}

/// Asks for the `lines` cache lines at `PREFETCH_DISTANCE` bytes past `p`. A hint only: it never
/// faults, even past the end of the weights (hence `wrapping_add`: the address may lie outside
/// the slice), and reads nothing the program can observe.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch_ahead(p: *const u8, lines: usize) {
    for line in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_DISTANCE + 64 * line).cast());
    }
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_ps(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_movehdup_ps(x));
    _mm_cvtss_f32(x)
}

/// Sum of the 4 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_epi32_128(x: __m128i) -> i32 {
    let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01));
    _mm_cvtsi128_si32(x)
}

/// `u * s` summed in adjacent pairs of 4 bytes to 8 i32 lanes (`u` unsigned, `s` signed bytes;
/// exact while each pair sum of two products fits i16, true for `u` <= 128 and `s` in -127..=127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// `x * y` for signed bytes, summed in groups of 4 to 8 i32 lanes. `x` may hold any byte, `y` must
/// stay in -127..=127: the sign of `x` moves onto `y` so that `maddubs` sees `|x|` (0..=128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// 32 nibbles (16 bytes at `p`) as 32 bytes 0..16: low nibbles first, then high nibbles, the
/// element order of the 32-element ggml blocks.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // The 16 bytes in both halves (a plain load), the high half shifted right by 4 with a
    // per-lane variable shift: one shuffle-free instruction instead of shift + insert.
    let both = _mm256_broadcastsi128_si256(load16(p));
    let shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
}

/// The 32 bits of `bits` spread to 32 bytes: byte `i` keeps bit `i % 8` of byte `i / 8` of
/// `bits` in place (so it is nonzero exactly when bit `i` is set) and clears the others.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits_to_bytes32(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    _mm256_and_si256(spread, _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_prefetch_defaults_by_vendor_and_family() {
        assert_eq!(default_row_prefetch(*b"GenuineIntel", 6), 4096);
        // Zen 3 and Zen 4 (family 0x19) keep the hardware prefetcher alone; Zen 5 (0x1A) does not.
        assert_eq!(default_row_prefetch(*b"AuthenticAMD", 0x17), 0);
        assert_eq!(default_row_prefetch(*b"AuthenticAMD", 0x19), 0);
        assert_eq!(default_row_prefetch(*b"AuthenticAMD", 0x1a), 4096);
        assert_eq!(default_row_prefetch(*b"HygonGenuine", 0x18), 0);
        // This host's vendor string is printable and its family a real one.
        assert!(cpu_vendor().iter().all(|b| b.is_ascii_graphic()));
        assert!(cpu_family() >= 6);
    }
}
