//! Row-dot kernels of quantized weights against quantized activations, GEMM tile kernels built on
//! the same arithmetic, and the activation quantizers, chosen once at run time (AVX2+FMA+F16C on
//! x86-64, with AVX-512 VNNI tile kernels where the CPU has them, the scalar reference of
//! kiln-quant everywhere else).
//!
//! The matmul driver asks for a kernel once per op ([`vec_dot_fn`], [`gemm_fn`], [`quantize_fn`])
//! and calls the returned plain `fn` in its hottest loop, so the kernels return no `Result` and
//! dispatch on nothing; the row dots and quantizers allocate nothing (a GEMM tile kernel keeps a
//! per-thread scratch that grows to its largest call). Invariants:
//!
//! - **Same value as the reference.** Every kernel computes what `kiln_quant::vec_dot` computes:
//!   the integer products of a block are exact in both, only the order (and fusing) of the f32
//!   additions of the per-block terms differs. The quantizers are bit-identical to
//!   `kiln_quant::quantize_activations` (rounding ties and all-zero blocks included) for finite
//!   inputs.
//! - **Lengths are the caller's contract, checked once per call.** A kernel for `n` elements needs
//!   exactly `ty.row_bytes(n)` weight bytes and `activation_bytes(vec_dot_type(ty), n)` activation
//!   bytes, `n` a whole number of blocks; a quantizer needs exactly the activation bytes of
//!   `x.len()`. Anything else panics (a bug in the caller), never reads out of bounds.
//! - **No alignment assumed.** Blocks are read with unaligned loads (an 18-byte Q4_0 block puts
//!   every other block at an odd-ish address).
//! - **Activations come from the quantizers.** The AVX2 integer dots use the `maddubs` sign trick,
//!   exact for activation quants in -127..=127 and Q8_K `bsums` that match their quants: what the
//!   quantizers produce. Weight bytes may be anything.
//! - **The SIMD level never exceeds the CPU.** Asking for a level the CPU lacks gives the kernel
//!   of the best level it has ([`SimdLevel::Avx512Vnni`] on an AVX2-only CPU gives the AVX2
//!   kernel, [`SimdLevel::Avx2`] off x86-64 the scalar one), so every returned `fn` is safe to
//!   call.
//! - **Interleaved layouts.** [`interleave`] rearranges Q8_0, Q5_0, Q4_K and Q6_K matrices of
//!   whole groups of 16 rows so that one `vpdpbusd` serves 16 rows ([`interleaved_gemm_fn`] at
//!   AVX-512 VNNI), and so that a 32-byte half of each line is a tile panel's line (Q4_K and
//!   Q5_0 at the AVX2 level, whose Q5_0 layout stores the fifth bits in another order: the
//!   layout is made for a level); [`interleaved_row`] gives any row back byte for byte. The VNNI
//!   products equal the row dots up to the order of the f32 additions, the AVX2 ones are
//!   bit-identical to the AVX2 tile kernels; both are batch-invariant by construction (each value's operations do not
//!   depend on the number of activation rows).
//! - **VNNI changes no value.** A VNNI tile kernel forms the same exact integer block sums as the
//!   AVX2 tile kernel of its format and then runs the same f32 steps in the same order, so the
//!   two are bit-identical (tested), and batch-invariant mode may mix either with the AVX2
//!   one-row products. The faster VNNI kernels outside batch-invariant mode are not: the
//!   one-row products of [`gemv_fn`] and the 32-element formats' narrow kernels (2 to 8
//!   activation rows, inside [`gemm_fn`]) add the same exact block sums in another f32 order.

use std::sync::OnceLock;

use kiln_core::GgmlType;
use kiln_quant::QuantError;

pub(crate) use attention::{
    prefetch_rows, prefetch_rows_l2, read_rows, scores, tile_max, tile_sum, weighted_values, widen,
    ATTN_AVX2, ATTN_AVX512, ATTN_PORTABLE, BLOCK, TILE,
};
pub use interleaved::{
    activation_terms, has_interleaved_layout, interleave, interleaved_gemm_fn,
    interleaved_gemm_fn_gfni, interleaved_row, interleaved_uses_amx, interleaved_uses_terms,
    ActivationTerms, InterleavedGemmFn, INTERLEAVE_ROWS,
};
pub(crate) use kv_elem::KvElem;

mod attention;
mod gemm;
mod interleaved;
mod kv_elem;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::amx::{cpu_has_amx_bf16, SplitTiles, SPLIT_TILE_BYTES};

/// The instruction sets a kernel may use, each level including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust: kiln-quant's reference.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// AVX2 plus AVX-512 F, BW, VL and DQ (Skylake-SP and later Xeons, Zen 4): the float kernels
    /// (the dense GEMM of `sgemm`, packed encoder attention, decoder attention) run in 512-bit
    /// registers,
    /// 32 of them. Every integer kernel is the AVX2 one.
    Avx512,
    /// AVX-512 as above plus VNNI (Zen 4, Ice Lake and later Xeons): the integer GEMM
    /// tiles use `vpdpbusd` (four u8 x i8 products added into an i32 lane in one instruction)
    /// on 256-bit vectors and the 32 vector registers of AVX-512. Every other kernel is the AVX2
    /// one.
    Avx512Vnni,
}

impl SimdLevel {
    /// Whether kernels of this level may use AVX2+FMA+F16C (true from [`SimdLevel::Avx2`] up).
    pub fn has_avx2(self) -> bool {
        self >= SimdLevel::Avx2
    }

    /// Whether float kernels of this level may use AVX-512 F/BW/VL/DQ (true from
    /// [`SimdLevel::Avx512`] up).
    pub fn has_avx512(self) -> bool {
        self >= SimdLevel::Avx512
    }

    /// The level named `scalar`, `avx2`, `avx512` or `avx512vnni` (any case), as `KILN_SIMD` takes it.
    pub fn parse(name: &str) -> Option<SimdLevel> {
        match name.to_ascii_lowercase().as_str() {
            "scalar" => Some(SimdLevel::Scalar),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            "avx512vnni" => Some(SimdLevel::Avx512Vnni),
            _ => None,
        }
    }
}

/// The best level this CPU supports, detected once.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    if x86::cpu_has_avx2_fma_f16c() {
        if x86::cpu_has_avx512() {
            if x86::cpu_has_avx512_vnni() {
                return SimdLevel::Avx512Vnni;
            }
            return SimdLevel::Avx512;
        }
        return SimdLevel::Avx2;
    }
    SimdLevel::Scalar
}

/// Whether the AVX-512 VNNI products over interleaved weights use Intel AMX tiles in this
/// process: the CPU has AMX-TILE and AMX-INT8, `KILN_AMX` is not `0`/`off`, and the operating
/// system granted the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once per process).
/// The tile products give the VNNI kernels' bits, so this changes speed, never results. Where
/// it is false, nothing runs a tile instruction.
pub fn amx_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::amx::granted();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `level`, lowered to what this CPU really has: handing out an AVX2 kernel on a CPU without AVX2
/// would be undefined behaviour.
fn usable(level: SimdLevel) -> SimdLevel {
    level.min(simd_level())
}

/// Signature of a row-dot kernel: (n elements, weight row bytes, activation row bytes) -> dot.
///
/// The activation row is quantized to `kiln_quant::vec_dot_type(ty)`. Panics when the slice
/// lengths do not match `n` (see the module invariants).
pub type VecDotFn = fn(usize, &[u8], &[u8]) -> f32;

/// The fastest kernel for `ty` at `level` (Scalar = a thin wrapper over `kiln_quant::vec_dot`).
/// Err for types kiln-quant cannot dot.
pub fn vec_dot_fn(ty: GgmlType, level: SimdLevel) -> Result<VecDotFn, QuantError> {
    let reference = scalar::vec_dot_fn(ty)?;
    Ok(match usable(level) {
        SimdLevel::Scalar => reference,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => {
            x86::vec_dot_fn(ty).unwrap_or(reference)
        }
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => reference,
    })
}

/// Signature of a GEMM kernel: `out[c * ldo + r] = dot(weight row r, activation row c)` for
/// `r < rows`, `c < cols`.
///
/// Arguments: `(k, w, rows, a, cols, out, ldo)`. `w` holds `rows` consecutive weight rows of
/// `ty.row_bytes(k)` bytes; `a` holds `cols` consecutive activation rows of
/// `activation_bytes(vec_dot_type(ty), k)` bytes, as the quantizers write them; `out` is row-major
/// `[activation row][weight row]` with stride `ldo >= rows`, so a driver writes straight into
/// `y[m, n]`. Only the named elements of `out` are written. Same contract style as [`VecDotFn`]:
/// lengths checked once per call, panics on a broken contract; same values as the row dots up to
/// the order of the f32 additions.
pub type GemmFn =
    fn(k: usize, w: &[u8], rows: usize, a: &[u8], cols: usize, out: &mut [f32], ldo: usize);

/// The GEMM kernel for `ty` at `level`: the AVX2 tile kernel where there is one (Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), else the loop over [`vec_dot_fn`]`(ty, level)`. Scalar is
/// exactly that loop over `kiln_quant::vec_dot`. At [`SimdLevel::Avx512Vnni`] the same types get
/// the VNNI tile kernels, and the 32-element formats a narrow kernel for 2 to 8 activation rows
/// (batched decode); the tiles and the k-quants' narrow kernels are bit-identical to the AVX2
/// tile kernels, the 32-element formats' narrow kernels equal up to the order of the f32
/// additions. Err for types kiln-quant cannot dot.
///
/// A tile kernel is never slower than the row-dot loop, whatever `cols`: below its measured
/// crossover (fewer than 3 activation rows for Q4_K and Q5_K, 4 for Q6_K) it runs that loop
/// itself, so a driver may call it for every `m`, decode included.
pub fn gemm_fn(ty: GgmlType, level: SimdLevel) -> Result<GemmFn, QuantError> {
    let reference = scalar::gemm_fn(ty)?;
    Ok(match usable(level) {
        SimdLevel::Scalar => reference,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => x86::gemm_fn(ty).unwrap_or(reference),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => x86::gemm_fn_vnni(ty).unwrap_or(reference),
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => reference,
    })
}

/// As [`gemm_fn`], batch-invariant: each output value is computed by the same operations
/// whatever the number of activation rows (`cols`), so that a row's results do not depend on
/// the rows it is batched with. Slower than [`gemm_fn`] for one or two rows of K-quant weights.
pub fn gemm_fn_invariant(ty: GgmlType, level: SimdLevel) -> Result<GemmFn, QuantError> {
    let reference = scalar::gemm_fn(ty)?;
    Ok(match usable(level) {
        SimdLevel::Scalar => reference,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => x86::gemm_fn_invariant(ty).unwrap_or(reference),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => x86::gemm_fn_invariant_vnni(ty).unwrap_or(reference),
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => reference,
    })
}

/// Signature of a GEMM of a few activation rows that writes straight into an output shared with
/// other threads: `(panel, k, w, rows, a, cols, out, ldo)`, the last seven as [`GemmFn`], `out`
/// a raw pointer, so that the tasks of one product may each write their own weight rows' columns
/// of `y[m, n]` (strided, interleaved with the other tasks' columns) without a private tile and a
/// copy. Returns false,
/// writing nothing, when it does not take this case (`cols` outside its kernel's range, no
/// blocks): the caller then runs [`gemm_fn`]. Same values as [`gemm_fn`] at the same `cols`.
/// Panics on inconsistent lengths as [`GemmFn`] does.
///
/// `panel` keys the packed activations: the tasks of one product pass the same nonzero key (and
/// the same `k`, `a` and `cols`), and each thread packs them once for all its tasks; 0 packs
/// them at every call.
///
/// # Safety
/// `out + c * ldo + r` is writable for every `r < rows`, `c < cols`, and nothing else reads or
/// writes those elements during the call. A nonzero `panel` names one activation matrix for the
/// whole process: every call with that key, on any thread, passes the same `k`, `cols` and
/// bytes of `a`, with the same weight type (keys from [`panel_key`] are never reused).
pub type StridedGemmFn = unsafe fn(
    panel: u64,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    out: *mut f32,
    ldo: usize,
) -> bool;

/// A fresh key for the activation panel of one product (see [`StridedGemmFn`]): never 0, never
/// handed out twice in a process.
pub fn panel_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The strided GEMM of `ty` at `level` (see [`StridedGemmFn`]): the narrow kernels of the VNNI
/// level (2 to 8 activation rows; from the tile crossover for the k-quants). `None` elsewhere.
pub fn strided_gemm_fn(ty: GgmlType, level: SimdLevel) -> Option<StridedGemmFn> {
    match usable(level) {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => x86::strided_gemm_fn_vnni(ty),
        _ => None,
    }
}

/// A one-row product over many weight rows: `(k, weight rows, rows, one activation row, out)`,
/// `out[r]` the dot of weight row `r`. Same contract style as [`GemmFn`].
pub type RowsFn = fn(k: usize, w: &[u8], rows: usize, a: &[u8], out: &mut [f32]);

/// The one-row product of `ty` that computes every output exactly as
/// [`gemm_fn_invariant`]`(ty, level)` does at any number of activation rows, without packing
/// the weights (the decode product of batch-invariant mode): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q4_K, Q5_K and Q6_K at the AVX2 level. `None` elsewhere (the invariant GEMM serves one row
/// too, slower for lack of this kernel; at the scalar level it is the row-dot loop already).
pub fn rows_exact_fn(ty: GgmlType, level: SimdLevel) -> Option<RowsFn> {
    match usable(level) {
        SimdLevel::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => x86::rows_exact_fn(ty),
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => None,
    }
}

/// The fastest one-row product of `ty` over many weight rows, where it beats the loop over
/// [`vec_dot_fn`]: at [`SimdLevel::Avx512Vnni`], Q4_0, Q5_0 and Q8_0 (one `vpdpbusd` per block,
/// the activation row's offset sums and factors prepared once per call instead of once per
/// weight row); at the AVX2 and AVX-512 levels, the tile-exact product of [`rows_exact_fn`]
/// (eight rows at a time, each block's f32 step done for the eight rows in one vector: 5 to 15 %
/// faster than the row-dot loop on one thread, `examples/kernel_bench --exact`), so that there a
/// one-row product costs the same with or without batch invariance. `None` elsewhere: the
/// caller loops over the row dot. Same values as the row dot up to the order of the f32
/// additions; batch-invariant only where it is [`rows_exact_fn`].
pub fn gemv_fn(ty: GgmlType, level: SimdLevel) -> Option<RowsFn> {
    match usable(level) {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => x86::gemv_fn_vnni(ty),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => x86::rows_exact_fn(ty),
        _ => None,
    }
}

/// Signature of an activation quantizer: (f32 activations, output bytes).
///
/// Panics when `x.len()` is not a whole number of blocks or the output is not exactly
/// `kiln_quant::activation_bytes(act_ty, x.len())` long.
pub type QuantizeFn = fn(&[f32], &mut [u8]);

/// Activation quantizer for `act_ty` (Q8_0, Q8_1, Q8_K, F32) at `level`; its output is
/// bit-identical to `kiln_quant::quantize_activations`.
pub fn quantize_fn(act_ty: GgmlType, level: SimdLevel) -> Result<QuantizeFn, QuantError> {
    let reference = scalar::quantize_fn(act_ty)?;
    Ok(match usable(level) {
        SimdLevel::Scalar => reference,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => {
            x86::quantize_fn(act_ty).unwrap_or(reference)
        }
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Avx512Vnni => reference,
    })
}
