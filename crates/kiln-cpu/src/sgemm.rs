//! Packed f32 GEMM for float weights: `y[m, n] = x[m, k] · Wᵀ (+ bias)`, `W` of `n` rows of `k`.
//!
//! The BLIS loop nest with the weight packed once and the activations packed per call:
//!
//! - **Weight** ([`PackedWeight`]): packed once per weight into panels of [`NR`] output columns.
//!   Panel `j` holds `k` rows of `NR` values, `W[j·NR + c][p]` at row `p`, column `c`, each row
//!   one 64-byte aligned [`PanelRow`] of f32 (F32 weights) or one 32-byte aligned [`HalfRow`]
//!   of the file's 16-bit values (F16 and BF16 weights: half the memory; the kernels widen each
//!   row to f32 in registers, exactly, so the sums are those of a converted panel, bit for bit;
//!   tested). Columns past `n` are zero. A k-block `[k0, k0 + kc)` of a panel is therefore one
//!   contiguous run, whatever the block size.
//! - **Activations**: per (m-block, k-block), copied into panels of [`MR`] rows, `kc` steps of
//!   `MR` values each (rows past `m` are zero). The AVX-512 kernel reads them in place instead
//!   (twelve row pointers; a row past `m` repeats the last one and is dropped at the store).
//! - **Micro-kernel**: an `MR × NR` register tile, `kc` rank-1 updates (broadcast one activation,
//!   multiply-add it with the weight row); AVX2+FMA with 12 ymm accumulators where the CPU has it,
//!   a portable version of the same blocking elsewhere (and as the test reference). With AVX-512
//!   ([`Isa::Avx512`]) one call covers two activation panels by two weight panels, 12 × 32 sums
//!   in 24 of the 32 zmm registers: per k-step two weight loads and twelve broadcasts feed 24
//!   FMAs of 16 lanes (the AVX2 tile: 2 + 6 for 12 FMAs of 8 lanes); one to four rows take
//!   narrow tiles of as many accumulators (a decode product: one FMA per weight row). The
//!   packed layouts are the same for both.
//! - **BF16 on `vdpbf16ps`** ([`bf16_dot_available`], opt-out through [`Exec::new`]): the
//!   activations rounded to BF16 once per call, the same 12 × 32 tiles, two k-steps per
//!   instruction (two panel rows interleaved into pairs by one `vpermw`). Not the other kernels'
//!   results (stated there), but thread- and batch-invariant in the same way.
//!
//! Invariants:
//!
//! - **The k-blocking depends on the shape only** ([`Plan::new`] takes no thread count), and a
//!   task owns a disjoint rectangle of `y` and computes all of `k` for it (how `m` and `n` are cut
//!   into tasks, which also depends on the kernel, decides no sum). Each `y` element is
//!   therefore `((t₀ + t₁) + … + t_last) + bias`, `t_b` the FMA chain over k-block `b` in order
//!   `p = k0, k0 + 1, …`, with the same instructions whichever thread runs the task: results are
//!   bit-identical for any number of threads. The AVX2 and AVX-512 kernels run each sum's FMA
//!   chain and epilogue identically, so they give the same bits too (tested); the scalar kernel
//!   multiplies and adds separately. (The bias added in the last store equals adding it
//!   afterwards: it is the same single rounding.)
//! - **Edges are computed as full tiles.** Padding rows and columns of the packed operands take
//!   part in the arithmetic and are then dropped at the store, so a tile at the edge of `y`
//!   performs the same operations on its valid elements as an interior one.
//! - **`unsafe` is confined** to the intrinsics and to `y`: a recycled buffer of stale values
//!   (`crate::buffers`), written through a raw pointer from several tasks. [`Out::tile_fits`]
//!   checks every tile against the buffer before the kernel runs; tasks own disjoint rectangles
//!   that cover `y` ([`Plan::task`]), so no two threads touch one element; the first k-block of
//!   a task stores every element of its rectangle before any read, so no stale value survives
//!   in `y` (debug builds poison it with NaN first, which the tests would see).

use kiln_backend::{shape_err, Result};
use kiln_core::GgmlType;

use crate::kernels::SimdLevel;
use crate::team::Team;

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;

/// Rows of the register tile (activation rows per micro-kernel call).
pub(crate) const MR: usize = 6;
/// Columns of the register tile (weight rows per packed panel): two ymm registers.
pub(crate) const NR: usize = 16;
/// Largest k-block: a `KC_MAX × NR` weight panel (24 KiB) stays in L1 while the AVX2
/// micro-kernel walks the m-panels of a block past it (the AVX-512 kernel keeps a group of twelve
/// activation rows there instead, 18 KiB, while the panels stream past: see `task_blocks`).
/// 384 (not 256) keeps k = 384 in one block, so `y` is written once; on k = 1536 the two
/// measure the same.
const KC_MAX: usize = 384;
/// Largest m-block: the packed activations of an (m-block, k-block), `MC_MAX × KC_MAX`
/// (144 KiB), stay in L2 while every weight panel of the task streams past them.
const MC_MAX: usize = 96;
/// Smallest m-block worth a task of its own: each weight panel brought into L1 serves
/// `MC_MIN / MR` micro-kernel calls.
const MC_MIN: usize = 24;
/// m-blocks wanted when `m` allows it: enough equal tasks that the last ones to finish leave
/// little idle time on 2–3 threads of a shared (noisy) machine.
const M_TASKS: usize = 32;
/// Tasks wanted in all: when `m` gives fewer m-blocks (few rows), n is split as well. Each
/// n-block packs the activations of its m-block again, so n is split no more than needed.
const MIN_TASKS: usize = 16;
/// Fewest weight panels per task, so that packing stays small next to the arithmetic.
const MIN_TASK_PANELS: usize = 4;
/// Most bytes of f32 weight panels (all of `k`) per n-block, for the kernel that reads the
/// activations in place. A task's weight panels stream past each of its row groups from L2, and
/// tasks run n-block by n-block, so a thread's next task (the next m-block) finds them there
/// too, instead of streaming the whole weight from L3 again: an encoder's 1536-wide FFN weight
/// (2.3 MiB at k = 384) in three n-blocks of 768 KiB measured 4-15 % faster at m = 4096 on an
/// Emerald Rapids host (2 MiB of L2 a core; 512 KiB n-blocks measured the same, none 3-7 %
/// slower); weights of up to 1 MiB keep one n-block. The kernels that pack activations would
/// pack them again for each n-block: there the split measured 2-3 % slower, and they keep
/// whole-width tasks.
const NC_BYTES_MAX: usize = 1 << 20;
/// Products smaller than this many flops run on the calling thread: handing them to the team
/// costs more than it saves.
const PARALLEL_MIN_FLOPS: usize = 1 << 20;

/// One k-step of a packed weight panel: the `NR` weights multiplied with one activation,
/// aligned so that each is exactly one cache line (no split loads).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(64))]
pub(crate) struct PanelRow(pub(crate) [f32; NR]);

const _: () = assert!(std::mem::size_of::<PanelRow>() == NR * 4);

/// One k-step of a weight panel kept in 16 bits, as the file stores it: F16 (`BF = false`) or
/// BF16 (`BF = true`). Half the memory of [`PanelRow`]; the kernels widen each row to f32 in
/// registers (`vcvtph2ps`, or a 16-bit shift for BF16). Every F16 and BF16 value is exactly an
/// f32, so the products equal those of a panel converted while packing, bit for bit.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(32))]
pub(crate) struct HalfRow<const BF: bool>(pub(crate) [u16; NR]);

const _: () = assert!(std::mem::size_of::<HalfRow<false>>() == NR * 2);

/// A row type of packed weight panels: [`PanelRow`] (f32) or [`HalfRow`] (F16/BF16 widened on
/// load). The kernels are generic over it; each load yields exactly the f32 weight.
pub(crate) trait Panel: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// A row of zeros (the padding columns past `n`).
    const ZERO: Self;
    /// Column `c` as f32.
    fn get(&self, c: usize) -> f32;
    /// Columns `8h .. 8h + 8` as f32.
    ///
    /// # Safety
    /// `row` points to a readable, aligned row; `h` is 0 or 1. Only called from functions built
    /// with AVX2, FMA and F16C, into which it is inlined.
    #[cfg(target_arch = "x86_64")]
    unsafe fn ymm(row: *const Self, h: usize) -> std::arch::x86_64::__m256;
    /// All 16 columns as f32.
    ///
    /// # Safety
    /// `row` points to a readable, aligned row. Only called from functions built with AVX-512 F,
    /// into which it is inlined.
    #[cfg(target_arch = "x86_64")]
    unsafe fn zmm(row: *const Self) -> std::arch::x86_64::__m512;
}

impl Panel for PanelRow {
    const ZERO: Self = PanelRow([0.0; NR]);
    #[inline(always)]
    fn get(&self, c: usize) -> f32 {
        self.0[c]
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ymm(row: *const Self, h: usize) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_load_ps(row.cast::<f32>().add(8 * h))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn zmm(row: *const Self) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_load_ps(row.cast::<f32>())
    }
}

impl<const BF: bool> Panel for HalfRow<BF> {
    const ZERO: Self = HalfRow([0; NR]);
    #[inline(always)]
    fn get(&self, c: usize) -> f32 {
        if BF {
            f32::from_bits(u32::from(self.0[c]) << 16)
        } else {
            half::f16::from_bits(self.0[c]).to_f32()
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ymm(row: *const Self, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let v = _mm_load_si128(row.cast::<u16>().add(8 * h).cast());
        if BF {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
        } else {
            _mm256_cvtph_ps(v)
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn zmm(row: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let v = _mm256_load_si256(row.cast());
        if BF {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
        } else {
            _mm512_cvtph_ps(v)
        }
    }
}

/// F16 weight panel rows.
pub(crate) type F16Row = HalfRow<false>;
/// BF16 weight panel rows.
pub(crate) type Bf16Row = HalfRow<true>;

/// A float weight `[n, k]` packed for the micro-kernel (see the module docs for the layout).
#[derive(Clone, PartialEq)]
pub(crate) struct PackedWeight {
    n: usize,
    k: usize,
    /// `n.div_ceil(NR)` panels of `k` rows, in the weight's own float width.
    panels: Panels,
}

/// The panels of a [`PackedWeight`]: F32 weights as f32, F16 and BF16 ones in 16 bits.
#[derive(Clone, PartialEq)]
enum Panels {
    F32(Vec<PanelRow>),
    F16(Vec<F16Row>),
    Bf16(Vec<Bf16Row>),
    /// F32 weights split into BF16 parts for the AMX tiles (`amx`).
    #[cfg(target_arch = "x86_64")]
    Split(amx::SplitPanels),
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight [{}, {}]", self.n, self.k)
    }
}

impl PackedWeight {
    /// [`PackedWeight::pack_for`] without the split: the f32 kernels' panels.
    #[cfg(test)]
    pub(crate) fn pack(
        team: &Team,
        ty: GgmlType,
        bytes: &[u8],
        n: usize,
        k: usize,
        row_bytes: usize,
    ) -> std::result::Result<Self, String> {
        Self::pack_for(None, team, ty, bytes, n, k, row_bytes)
    }

    /// Packs `n` rows of `k` elements of type `ty` (F32, F16 or BF16, `row_bytes` each, as
    /// stored in the file), in parallel on `team`: panels for the f32 kernels, or with
    /// `split = Some(isa)` an F32 weight split into BF16 parts for the AMX products (`amx`) where
    /// they are available to `isa`.
    pub(crate) fn pack_for(
        split: Option<Isa>,
        team: &Team,
        ty: GgmlType,
        bytes: &[u8],
        n: usize,
        k: usize,
        row_bytes: usize,
    ) -> std::result::Result<Self, String> {
        if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(format!("{ty} is not a float type"));
        }
        let width = if ty == GgmlType::F32 { 4 } else { 2 };
        if n == 0
            || k == 0
            || k.checked_mul(width) != Some(row_bytes)
            || n.checked_mul(row_bytes) != Some(bytes.len())
        {
            return Err(format!(
                "{} bytes for {n} rows of {k} {ty} ({row_bytes} bytes each)",
                bytes.len()
            ));
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = split.filter(|_| ty == GgmlType::F32) {
            if let Some(p) = amx::SplitPanels::pack(isa, team, bytes, n, k, row_bytes) {
                return Ok(PackedWeight {
                    n,
                    k,
                    panels: Panels::Split(p),
                });
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = split;
        let panels = match ty {
            GgmlType::F16 => Panels::F16(pack_halves(team, bytes, n, k, row_bytes)),
            GgmlType::BF16 => Panels::Bf16(pack_halves(team, bytes, n, k, row_bytes)),
            _ => {
                let mut rows = vec![PanelRow::ZERO; n.div_ceil(NR) * k];
                team.for_each_chunk(&mut rows, k, |panel, dst| {
                    for c in 0..NR.min(n - panel * NR) {
                        let r = panel * NR + c;
                        let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        for (d, v) in dst.iter_mut().zip(src.chunks_exact(4)) {
                            d.0[c] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                        }
                    }
                });
                Panels::F32(rows)
            }
        };
        Ok(PackedWeight { n, k, panels })
    }

    /// The memory the panels take, in bytes.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(r) => std::mem::size_of_val(&r[..]),
            Panels::F16(r) => std::mem::size_of_val(&r[..]),
            Panels::Bf16(r) => std::mem::size_of_val(&r[..]),
            #[cfg(target_arch = "x86_64")]
            Panels::Split(p) => p.bytes(),
        }
    }
}

/// `n` rows of `k` 16-bit floats (`row_bytes` = `2k` each, checked by the caller) as panels of
/// [`HalfRow`]s, the bits copied unchanged; panels filled in parallel on `team`.
fn pack_halves<const BF: bool>(
    team: &Team,
    bytes: &[u8],
    n: usize,
    k: usize,
    row_bytes: usize,
) -> Vec<HalfRow<BF>> {
    let mut rows = vec![HalfRow::<BF>::ZERO; n.div_ceil(NR) * k];
    team.for_each_chunk(&mut rows, k, |panel, dst| {
        for c in 0..NR.min(n - panel * NR) {
            let r = panel * NR + c;
            let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
            for (d, v) in dst.iter_mut().zip(src.chunks_exact(2)) {
                d.0[c] = u16::from_le_bytes([v[0], v[1]]);
            }
        }
    });
    rows
}

/// Rows `[k0, k0 + kc)` of panel `panel` of a weight of `k` steps.
fn block<P>(rows: &[P], k: usize, panel: usize, k0: usize, kc: usize) -> &[P] {
    let start = panel * k + k0;
    &rows[start..start + kc]
}

/// Which micro-kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Portable Rust: the same tiles, separate multiply and add.
    Scalar,
    /// AVX2 + FMA intrinsics. Only constructed where the CPU has both (see [`Isa::for_level`]).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 F intrinsics: tiles of two activation panels by two weight panels (12 × 32 sums
    /// in 24 zmm registers), each sum the same FMA chain as the AVX2 kernel's (identical bits).
    /// Only constructed where the CPU has AVX-512 F/BW/VL/DQ and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// Whether the kernel copies the activations into panels (per task and k-block); the AVX-512
    /// kernel reads them in place.
    fn packs_activations(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self != Isa::Avx512
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            true
        }
    }

    /// The best kernel `level` allows on this CPU (the level is lowered to what the CPU has).
    pub(crate) fn for_level(level: SimdLevel) -> Isa {
        let level = level.min(crate::kernels::simd_level());
        #[cfg(target_arch = "x86_64")]
        {
            if level.has_avx512() {
                return Isa::Avx512;
            }
            if level.has_avx2() {
                return Isa::Avx2;
            }
        }
        let _ = level;
        Isa::Scalar
    }
}

/// The blocking of one product: k-blocks of `kc`, m-blocks of `mc` rows, n-blocks of
/// `nc_panels` weight panels. The k-blocks, which decide every sum, depend on the shape only; the
/// n-blocks also on whether the kernel packs activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
    mc: usize,
    nc_panels: usize,
    m_blocks: usize,
    n_blocks: usize,
}

impl Plan {
    /// The blocking of `[m, k] · [n, k]ᵀ` for a kernel that packs activations (`packs`) or reads
    /// them in place.
    pub(crate) fn new(m: usize, n: usize, k: usize, packs: bool) -> Plan {
        Plan::with_rows(m, n, k, packs, MR)
    }

    /// [`Plan::new`] with m-blocks of a multiple of `unit` rows (the kernel's tile height).
    fn with_rows(m: usize, n: usize, k: usize, packs: bool, unit: usize) -> Plan {
        let (m1, n1, k1) = (m.max(1), n.max(1), k.max(1));
        // Equal k-blocks (the last one shorter by less than one step per block).
        let kc = k1.div_ceil(k1.div_ceil(KC_MAX));
        // Equal m-blocks of whole register tiles, as many as `M_TASKS` while they keep at least
        // `MC_MIN` rows, more when `MC_MAX` asks for it.
        let m_target = m1.div_ceil(MC_MAX).max(M_TASKS.min(m1.div_ceil(MC_MIN)));
        let mc = m1.div_ceil(m_target).next_multiple_of(unit);
        let m_blocks = m1.div_ceil(mc);
        let panels = n1.div_ceil(NR);
        // n-blocks of at most `NC_BYTES_MAX` when the kernel reads activations in place (an even
        // number of panels, as it takes them in pairs), more when few m-blocks leave too few
        // tasks.
        let cap = if packs {
            usize::MAX - 1
        } else {
            (NC_BYTES_MAX / (NR * 4 * k1)).max(2) & !1
        };
        let n_blocks = (MIN_TASKS / m_blocks)
            .min(panels.div_ceil(MIN_TASK_PANELS))
            .max(panels.div_ceil(cap))
            .max(1);
        let mut nc_panels = panels.div_ceil(n_blocks);
        if panels > cap {
            // Still at most `cap`: `cap` is even and `n_blocks` ≥ panels / cap.
            nc_panels = nc_panels.next_multiple_of(2);
        }
        let n_blocks = panels.div_ceil(nc_panels);
        Plan {
            m,
            n,
            k,
            kc,
            mc,
            nc_panels,
            m_blocks,
            n_blocks,
        }
    }

    pub(crate) fn tasks(&self) -> usize {
        self.m_blocks * self.n_blocks
    }

    /// The rectangle of `y` task `t` computes: rows `[r0, r1)` and weight panels `[p0, p1)`.
    /// Distinct tasks get disjoint rectangles that together cover `y`. Tasks go n-block by
    /// n-block (every m-block of the first, then of the next), so that the tasks a thread takes in
    /// turn share their weight panels.
    pub(crate) fn task(&self, t: usize) -> (usize, usize, usize, usize) {
        let (mb, nb) = (t % self.m_blocks, t / self.m_blocks);
        let r0 = (mb * self.mc).min(self.m);
        let r1 = (r0 + self.mc).min(self.m);
        let panels = self.n.div_ceil(NR);
        let p0 = (nb * self.nc_panels).min(panels);
        let p1 = (p0 + self.nc_panels).min(panels);
        (r0, r1, p0, p1)
    }
}

/// Where and how a product runs: the micro-kernel, and the team it may split into tasks.
#[derive(Clone, Copy)]
pub(crate) struct Exec<'a> {
    pub(crate) isa: Isa,
    /// A team of one thread runs every task on the calling thread.
    pub(crate) team: &'a Team,
    /// BF16 weights go through `vdpbf16ps` (see [`bf16_dot_available`]). Only true where the
    /// CPU has AVX-512 F/BW and AVX512_BF16 and `isa` is [`Isa::Avx512`] ([`Exec::new`]).
    bf16_dot: bool,
}

impl<'a> Exec<'a> {
    /// `isa` on `team`; with `bf16_dot`, BF16 weights through `vdpbf16ps` where
    /// [`bf16_dot_available`] says this CPU and `isa` have it (exact f32 products elsewhere).
    pub(crate) fn new(isa: Isa, team: &'a Team, bf16_dot: bool) -> Exec<'a> {
        Exec {
            isa,
            team,
            bf16_dot: bf16_dot && bf16_dot_available(isa),
        }
    }
}

/// Whether products of BF16 weights can run on `vdpbf16ps` with `isa`: the AVX-512 kernel on a
/// CPU with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later).
///
/// That path rounds each activation to BF16 (round to nearest even, subnormals flushed to
/// zero, as `vcvtneps2bf16` does) and multiplies pairs of BF16 values, each product exact,
/// added into the f32 sum one at a time: twice the products per instruction of the f32 FMA,
/// with an activation error of at most 2⁻⁹ relative, as llama.cpp's BF16 path has. Its results
/// are therefore not those of the other kernels (which widen the weights and keep the
/// activations in f32); they are the same for any thread count and batch.
pub(crate) fn bf16_dot_available(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx512 && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// `y = x · Wᵀ (+ bias)` as a new row-major `[m, w.n]` vector (`x` row-major `[m, w.k]`), on
/// `exec.team` when it has several threads and the product is large enough (same result either
/// way).
///
/// `y` comes from the recycled buffers (`crate::buffers`) with stale contents, and every element
/// is written by the first k-block of the task that owns it: zeroing it first (or `calloc`'s
/// page-zeroing on the calling thread) measured 5% (1 thread) to 8% (2 threads) of an encoder
/// FFN product.
pub(crate) fn sgemm(
    exec: Exec<'_>,
    x: &[f32],
    m: usize,
    w: &PackedWeight,
    bias: Option<&[f32]>,
    gelu: bool,
) -> Result<Vec<f32>> {
    let (n, k) = (w.n, w.k);
    let len = m.checked_mul(n);
    if Some(x.len()) != m.checked_mul(k) || len.is_none() || bias.is_some_and(|b| b.len() != n) {
        return Err(shape_err(
            "sgemm",
            format!(
                "x of {} values for [{m}, {k}], bias of {:?} for {n}",
                x.len(),
                bias.map(<[f32]>::len)
            ),
        ));
    }
    let len = m * n;
    let mut y = crate::buffers::take(len);
    if m == 0 {
        return Ok(y);
    }
    // Debug builds (and so the tests) poison `y`, so that an element read before its first
    // write, or never written, shows as NaN.
    #[cfg(debug_assertions)]
    y.fill(f32::NAN);
    let plan = Plan::new(m, n, k, exec.isa.packs_activations());
    let out = Out {
        ptr: y.as_mut_ptr(),
        len,
        ld: n,
    };
    match &w.panels {
        Panels::F32(rows) => run_tasks(exec, &plan, x, rows, bias, gelu, &out),
        Panels::F16(rows) => run_tasks(exec, &plan, x, rows, bias, gelu, &out),
        #[cfg(target_arch = "x86_64")]
        Panels::Bf16(rows) if exec.bf16_dot => {
            bf16_dot::run(exec, &plan, x, rows, bias, gelu, &out)
        }
        Panels::Bf16(rows) => run_tasks(exec, &plan, x, rows, bias, gelu, &out),
        #[cfg(target_arch = "x86_64")]
        Panels::Split(p) => amx::run(exec, x, (m, n, k), p, bias, gelu, &out),
    }
    // Every element has been written: the tasks' rectangles cover `y` (`Plan::task`), and a
    // task's first k-block stores every element of each tile of its rectangle
    // (`Epilogue::first`, in `store_tile` and the AVX2 kernel).
    Ok(y)
}

/// Every task of `plan` over the weight panels `w`, on the team when the product is large enough.
fn run_tasks<P: Panel>(
    exec: Exec<'_>,
    plan: &Plan,
    x: &[f32],
    w: &[P],
    bias: Option<&[f32]>,
    gelu: bool,
    out: &Out,
) {
    each_task(exec, plan, |t| {
        task(exec.isa, plan, t, x, w, bias, gelu, out)
    });
}

/// `run(t)` for every task of `plan`, on the team when the product is large enough.
fn each_task(exec: Exec<'_>, plan: &Plan, run: impl Fn(usize) + Sync) {
    let flops = (plan.m * plan.n).saturating_mul(plan.k).saturating_mul(2);
    if exec.team.threads() > 1 && flops >= PARALLEL_MIN_FLOPS && plan.tasks() > 1 {
        exec.team.run(plan.tasks(), run);
    } else {
        (0..plan.tasks()).for_each(run);
    }
}

/// `y` as the tasks see it: a row-major `[len / ld, ld]` buffer, of stale contents until the
/// first k-block writes it, accessed only through this raw pointer (no reference to it exists while the
/// tasks run).
struct Out {
    ptr: *mut f32,
    len: usize,
    ld: usize,
}

// SAFETY: `Out` is only built in `sgemm` from a buffer it borrows mutably for longer than every
// task runs (the team call returns after all of them), and each task accesses only the rectangle
// `Plan::task` gives it; those rectangles are disjoint, so no element is accessed by two threads.
unsafe impl Sync for Out {}

impl Out {
    /// Requests the cache lines of the `rows × cols` block at `(r0, c0)` (inside the buffer)
    /// before a kernel computes it. Where `y` is larger than the last-level cache its lines
    /// come from memory when the tile is stored (a store needs the line first), and the stores
    /// of a tile waited on them: requested before the tile's k-loop, they arrive during it.
    /// MiniLM's FFN products at m = 4096 (a 25 MB `y`) on a Zen 5 host: the AVX-512 kernel
    /// went from 84-87 % to 89-90 % of the FMA peak on one thread, 465-475 to 490-497 GFLOP/s on
    /// two (`examples/dense_bench`), and the 128-token embedding bench 2-4 % faster. The AVX2
    /// kernel (half the arithmetic rate, its stores less exposed) measured the same either way.
    #[inline(always)]
    fn prefetch_block(&self, r0: usize, c0: usize, rows: usize, cols: usize) {
        #[cfg(target_arch = "x86_64")]
        for i in 0..rows {
            let at = (r0 + i) * self.ld + c0;
            // Every 64-byte line of the row's `cols` values: one request per 16 values, and
            // the last value's line (a row that does not start on a line ends on one more).
            for c in (0..cols).step_by(NR).chain(cols.checked_sub(1)) {
                // SAFETY: a prefetch is a hint: it never faults and changes no memory (and the
                // address lies inside the buffer by the caller's bound).
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        self.ptr.wrapping_add(at + c).cast(),
                    )
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (r0, c0, rows, cols);
    }

    /// Whether every `MR × NR` sub-tile of the wide `rows × cols` tile at `(r0, c0)` (up to
    /// `2·MR × 2·NR`, as the AVX-512 kernels store it) lies inside the buffer.
    fn wide_tile_fits(&self, r0: usize, c0: usize, rows: usize, cols: usize) -> bool {
        (1..=2 * NR).contains(&cols)
            && (0..rows.div_ceil(MR)).all(|i| {
                (0..cols.div_ceil(NR)).all(|j| {
                    self.tile_fits(
                        r0 + i * MR,
                        c0 + j * NR,
                        (rows - i * MR).min(MR),
                        (cols - j * NR).min(NR),
                    )
                })
            })
    }

    /// Whether the `rows × cols` tile at `(r0, c0)` lies inside the buffer.
    fn tile_fits(&self, r0: usize, c0: usize, rows: usize, cols: usize) -> bool {
        (1..=MR).contains(&rows) && (1..=NR).contains(&cols) && self.block_fits(r0, c0, rows, cols)
    }

    /// Whether the `rows × cols` block at `(r0, c0)` (at least one of each) lies inside the
    /// buffer.
    fn block_fits(&self, r0: usize, c0: usize, rows: usize, cols: usize) -> bool {
        rows >= 1
            && cols >= 1
            && c0 + cols <= self.ld
            && (r0 + rows - 1)
                .checked_mul(self.ld)
                .and_then(|v| v.checked_add(c0 + cols))
                .is_some_and(|end| end <= self.len)
    }
}

/// How a tile's sums are combined with `y`.
#[derive(Clone, Copy)]
struct Epilogue<'a> {
    /// First k-block: overwrite `y` (its previous contents are never read).
    first: bool,
    /// Last k-block: add these `NR` (or fewer, at the edge) bias values after the sum.
    bias: Option<&'a [f32]>,
    /// Last k-block: exact GELU of each finished value (after the bias).
    gelu: bool,
}

/// One task: every k-block of the rectangle `plan.task(t)`.
#[allow(clippy::too_many_arguments)]
fn task<P: Panel>(
    isa: Isa,
    plan: &Plan,
    t: usize,
    x: &[f32],
    w: &[P],
    bias: Option<&[f32]>,
    gelu: bool,
    out: &Out,
) {
    let (r0, r1, p0, p1) = plan.task(t);
    let len = if isa.packs_activations() {
        (r1 - r0).div_ceil(MR) * MR * plan.kc
    } else {
        0
    };
    APACK.with_borrow_mut(|scratch| {
        // Grown, never shrunk or cleared: `pack_activations` writes every value of the panels
        // that the tiles below read.
        if scratch.len() < len {
            scratch.resize(len, 0.0);
        }
        let apack = &mut scratch[..len];
        task_blocks(isa, plan, x, w, bias, gelu, out, (r0, r1, p0, p1), apack)
    });
}

thread_local! {
    /// Each thread's packed activations of its current task: at most `MC_MAX × KC_MAX` values
    /// (144 KiB), reused from task to task (allocating and zeroing them per task measured 1.5 %
    /// of an encoder's time).
    static APACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The k-blocks of one task's rectangle, with `apack` holding the task's activation panels.
#[allow(clippy::too_many_arguments)]
fn task_blocks<P: Panel>(
    isa: Isa,
    plan: &Plan,
    x: &[f32],
    w: &[P],
    bias: Option<&[f32]>,
    gelu: bool,
    out: &Out,
    (r0, r1, p0, p1): (usize, usize, usize, usize),
    apack: &mut [f32],
) {
    let k = plan.k;
    let mpanels = (r1 - r0).div_ceil(MR);
    for k0 in (0..k).step_by(plan.kc) {
        let kc = plan.kc.min(k - k0);
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // The AVX-512 kernel broadcasts activations straight from the rows of `x`: no
            // packing, 1-5 % faster on MiniLM. (The AVX2 kernel reading in place measured up to
            // 13 % slower: it packs.) Tiles of twelve rows (fewer at the end) by two weight
            // panels, row group by row group: a group's rows (18 KiB at kc = 384) stay in L1
            // while the n-block's weight panels stream past from L2, one sequential run per
            // panel. Panel pair by panel pair instead, the pair's block (48 KiB, all of L1) was
            // read again from L2 for every row group beside twelve strided activation streams:
            // 10-13 % slower on MiniLM's 1152- and 1536-wide products, the same on the others.
            // (The AVX2 kernel's block, 24 KiB, stays in L1: it keeps the panel-outer order.)
            for row in (r0..r1).step_by(2 * MR) {
                let n_rows = (r1 - row).min(2 * MR);
                let a = Rows {
                    x,
                    ld: k,
                    first: row,
                    rows: n_rows,
                    k0,
                };
                for panel in (p0..p1).step_by(2) {
                    let (c0, cols, ep, b) = panel_pair(plan, w, (panel, p1), (k0, kc), bias, gelu);
                    tile_in_place(kc, a, b, out, row, c0, n_rows, cols, ep);
                }
            }
            continue;
        }
        pack_activations(isa, x, k, r0, r1, k0, kc, apack);
        // The AVX2 and scalar kernels: packed activation panels.
        for panel in p0..p1 {
            let b = block(w, k, panel, k0, kc);
            let c0 = panel * NR;
            let cols = NR.min(plan.n - c0);
            let last = k0 + kc == k;
            let ep = Epilogue {
                first: k0 == 0,
                bias: bias.filter(|_| last).map(|b| &b[c0..c0 + cols]),
                gelu: gelu && last,
            };
            for (ip, a) in apack.chunks_exact(MR * kc).take(mpanels).enumerate() {
                let row = r0 + ip * MR;
                tile(isa, kc, a, b, out, row, c0, MR.min(r1 - row), cols, ep);
            }
        }
    }
}

/// The tile columns of weight panels `panel` and `panel + 1` (`panel` alone when it is the last
/// before `p1`) in k-block `[k0, k0 + kc)`: the first column, the width, the epilogue (bias and
/// GELU in the last k-block) and the two panels' blocks (the one panel twice when alone).
fn panel_pair<'a, P>(
    plan: &Plan,
    w: &'a [P],
    (panel, p1): (usize, usize),
    (k0, kc): (usize, usize),
    bias: Option<&'a [f32]>,
    gelu: bool,
) -> (usize, usize, Epilogue<'a>, [&'a [P]; 2]) {
    let np = (p1 - panel).min(2);
    let c0 = panel * NR;
    let cols = (np * NR).min(plan.n - c0);
    let last = k0 + kc == plan.k;
    let ep = Epilogue {
        first: k0 == 0,
        bias: bias.filter(|_| last).map(|b| &b[c0..c0 + cols]),
        gelu: gelu && last,
    };
    let b = [
        block(w, plan.k, panel, k0, kc),
        block(w, plan.k, panel + np - 1, k0, kc),
    ];
    (c0, cols, ep, b)
}

/// Copies rows `[r0, r1)`, columns `[k0, k0 + kc)` of `x` (`[.., k]`) into `MR`-row panels of
/// `kc` steps: `dst[panel·MR·kc + p·MR + i] = x[r0 + panel·MR + i][k0 + p]`, zero past `r1`.
#[allow(clippy::too_many_arguments)]
fn pack_activations(
    isa: Isa,
    x: &[f32],
    k: usize,
    r0: usize,
    r1: usize,
    k0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    for (ip, panel) in dst.chunks_exact_mut(MR * kc).enumerate() {
        let first = r0 + ip * MR;
        if first >= r1 {
            break;
        }
        let row = |i: usize| {
            let r = first + i;
            (r < r1).then(|| &x[r * k + k0..r * k + k0 + kc])
        };
        let rows: [Option<&[f32]>; MR] = std::array::from_fn(row);
        match rows {
            [Some(a), Some(b), Some(c), Some(d), Some(e), Some(f)] => {
                pack_rows(isa, &[a, b, c, d, e, f], panel)
            }
            // The last panel of a block: rows past `r1` are zero.
            _ => {
                for (p, step) in panel.chunks_exact_mut(MR).enumerate() {
                    for (d, src) in step.iter_mut().zip(&rows) {
                        *d = src.map_or(0.0, |s| s[p]);
                    }
                }
            }
        }
    }
}

/// Packs six rows as one activation panel: `dst[p·MR + i] = rows[i][p]` for
/// `p < dst.len() / MR` (each row at least that long); the GEMM's full panels and attention's
/// query and probability panels.
fn pack_rows(isa: Isa, rows: &[&[f32]; MR], dst: &mut [f32]) {
    let kc = dst.len() / MR;
    assert!(rows.iter().all(|r| r.len() >= kc), "short activation row");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` exists only where the CPU has AVX2; lengths are checked above.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::pack_panel(rows, dst) },
        Isa::Scalar => {
            for (p, step) in dst.chunks_exact_mut(MR).enumerate() {
                for (d, r) in step.iter_mut().zip(rows) {
                    *d = r[p];
                }
            }
        }
    }
}

/// The `rows × cols` tile of `y` at `(r0, c0)` from `kc` steps of an activation panel `a`
/// (`kc × MR`) and a weight block `b` (`kc` rows).
#[allow(clippy::too_many_arguments)]
fn tile<P: Panel>(
    isa: Isa,
    kc: usize,
    a: &[f32],
    b: &[P],
    out: &Out,
    r0: usize,
    c0: usize,
    rows: usize,
    cols: usize,
    ep: Epilogue<'_>,
) {
    assert!(
        kc >= 1
            && a.len() >= kc * MR
            && b.len() >= kc
            && out.tile_fits(r0, c0, rows, cols)
            && ep.bias.is_none_or(|v| v.len() >= cols),
        "sgemm tile out of bounds"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => {
            // SAFETY: `Isa::Avx2`/`Avx512` exist only where the CPU has AVX2 and FMA; the assert
            // above proves `a` holds `kc·MR` values, `b` `kc` rows, and the tile (and bias) lies
            // inside `out`, which no other task writes.
            unsafe { avx2::tile(kc, a.as_ptr(), b.as_ptr(), out, r0, c0, rows, cols, ep) }
        }
        Isa::Scalar => {
            let mut acc = [[0.0f32; NR]; MR];
            for (ap, bp) in a.chunks_exact(MR).zip(&b[..kc]) {
                for (acc_row, &av) in acc.iter_mut().zip(ap) {
                    for (col, c) in acc_row.iter_mut().enumerate() {
                        *c += av * bp.get(col);
                    }
                }
            }
            store_tile(&acc, out, r0, c0, rows, cols, ep);
        }
    }
}

/// Activation rows `[first, first + rows)` of `x` (row-major, `ld` wide) from column `k0`, as
/// the AVX-512 kernel reads them in place.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Rows<'a> {
    x: &'a [f32],
    ld: usize,
    first: usize,
    rows: usize,
    k0: usize,
}

/// The AVX-512 tile: `rows` (1 to 12) activation rows read in place, `b` one weight block twice
/// or two neighbouring ones (`cols` ≤ 16 or ≤ 32), stored at `(r0, c0)` of `y` as `ep` says.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn tile_in_place<P: Panel>(
    kc: usize,
    a: Rows<'_>,
    b: [&[P]; 2],
    out: &Out,
    r0: usize,
    c0: usize,
    rows: usize,
    cols: usize,
    ep: Epilogue<'_>,
) {
    let (mp, np) = (rows.div_ceil(MR), cols.div_ceil(NR));
    assert!(
        kc >= 1
            && (1..=2 * MR).contains(&rows)
            && a.rows == rows
            && a.k0 + kc <= a.ld
            && (a.first + rows - 1)
                .checked_mul(a.ld)
                .is_some_and(|start| start + a.ld <= a.x.len())
            && (1..=2).contains(&np)
            && b.iter().all(|b| b.len() >= kc)
            && out.wide_tile_fits(r0, c0, rows, cols)
            && ep.bias.is_none_or(|v| v.len() >= cols),
        "sgemm tile out of bounds"
    );
    // Rows past the last are the last one again: computed, then dropped at the store.
    let src: [*const f32; 2 * MR] = std::array::from_fn(|i| {
        let r = a.first + i.min(rows - 1);
        a.x[r * a.ld + a.k0..].as_ptr()
    });
    let (b0, b1) = (b[0].as_ptr(), b[1].as_ptr());
    // SAFETY: `Isa::Avx512` (the only caller) exists only where the CPU has AVX-512 F and FMA;
    // the assert proves each source row holds `kc` values from `k0`, each weight block `kc`
    // rows, and every 6 × 16 sub-tile (and the bias) lies inside `out`, which no other task
    // writes.
    unsafe {
        match (rows, np) {
            // Few rows (decode): tiles of as many accumulators as rows, so a one-row product
            // does one FMA per weight row, not six.
            (1, 1) => avx512::narrow::<P, 1, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (1, _) => avx512::narrow::<P, 1, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (2, 1) => avx512::narrow::<P, 2, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (2, _) => avx512::narrow::<P, 2, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (3 | 4, 1) => avx512::narrow::<P, 4, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (3 | 4, _) => avx512::narrow::<P, 4, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            _ => {}
        }
        match (mp, np) {
            _ if rows <= 4 => {}
            (1, 1) => avx512::tile::<P, 1, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (1, _) => avx512::tile::<P, 1, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            (_, 1) => avx512::tile::<P, 2, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            _ => avx512::tile::<P, 2, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
        }
    }
}

/// Combines a finished tile of sums with `y` as `ep` says, element by element (edge tiles of the
/// AVX2 kernel come here too, so both paths round identically).
fn store_tile(
    acc: &[[f32; NR]; MR],
    out: &Out,
    r0: usize,
    c0: usize,
    rows: usize,
    cols: usize,
    ep: Epilogue<'_>,
) {
    assert!(out.tile_fits(r0, c0, rows, cols) && ep.bias.is_none_or(|v| v.len() >= cols));
    for (i, acc_row) in acc.iter().enumerate().take(rows) {
        let start = (r0 + i) * out.ld + c0;
        for (j, &s) in acc_row.iter().enumerate().take(cols) {
            // SAFETY: `tile_fits` proves `start + j < out.len`; this task is the only one that
            // accesses the element (see `Out`), and it reads it only after its first k-block
            // has written it.
            unsafe {
                let y = out.ptr.add(start + j);
                let v = if ep.first { s } else { y.read() + s };
                let v = match ep.bias {
                    Some(b) => v + b[j],
                    None => v,
                };
                y.write(if ep.gelu { crate::math::gelu(v) } else { v });
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{store_tile, Epilogue, Out, Panel, MR, NR};

    /// One activation panel: `dst[p·MR + i] = rows[i][p]` for `p < kc`, `kc = dst.len() / MR`,
    /// transposing 6 × 8 blocks in registers (unpack, shuffle, then 4 + 2 value stores per
    /// step).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pack_panel(rows: &[&[f32]; MR], dst: &mut [f32]) {
        let kc = dst.len() / MR;
        assert!(rows.iter().all(|r| r.len() >= kc), "short activation row");
        let d = dst.as_mut_ptr();
        let src = rows.map(|r| r.as_ptr());
        let mut p = 0;
        // SAFETY (loop): reads `[p, p + 8)` of each row and writes `[p·MR, (p + 8)·MR)` of
        // `dst`, both inside by the loop condition and the assert above.
        while p + 8 <= kc {
            let v: [__m256; MR] = std::array::from_fn(|i| _mm256_loadu_ps(src[i].add(p)));
            // Row pairs interleaved: t01 = a0 b0 a1 b1 | a4 b4 a5 b5, and so on.
            let t01 = _mm256_unpacklo_ps(v[0], v[1]);
            let t01h = _mm256_unpackhi_ps(v[0], v[1]);
            let t23 = _mm256_unpacklo_ps(v[2], v[3]);
            let t23h = _mm256_unpackhi_ps(v[2], v[3]);
            let t45 = _mm256_unpacklo_ps(v[4], v[5]);
            let t45h = _mm256_unpackhi_ps(v[4], v[5]);
            // Rows 0..4 of steps j and j + 4 (one per 128-bit lane).
            let q = [
                _mm256_shuffle_ps::<0x44>(t01, t23),
                _mm256_shuffle_ps::<0xEE>(t01, t23),
                _mm256_shuffle_ps::<0x44>(t01h, t23h),
                _mm256_shuffle_ps::<0xEE>(t01h, t23h),
            ];
            for (lane, step0) in [(false, p), (true, p + 4)] {
                let half = |v: __m256| {
                    if lane {
                        _mm256_extractf128_ps::<1>(v)
                    } else {
                        _mm256_castps256_ps128(v)
                    }
                };
                // Rows 4 and 5 of steps step0 .. step0 + 4, two steps per register.
                let pairs = [half(t45), half(t45h)];
                for (j, &qj) in q.iter().enumerate() {
                    let out = d.add((step0 + j) * MR);
                    _mm_storeu_ps(out, half(qj));
                    let pair = pairs[j / 2];
                    let pair = if j % 2 == 0 {
                        pair
                    } else {
                        _mm_movehl_ps(pair, pair)
                    };
                    _mm_storeu_si64(out.add(4).cast::<u8>(), _mm_castps_si128(pair));
                }
            }
            p += 8;
        }
        for p in p..kc {
            for (i, r) in rows.iter().enumerate() {
                dst[p * MR + i] = r[p];
            }
        }
    }

    /// The sums of the micro-kernel: `acc[2i + h]` holds `Σ_p a[p·MR + i] · b[p][8h .. 8h + 8]`,
    /// one FMA per step in order `p = 0, 1, …` (so `f32::mul_add` in the same order gives the
    /// same bits).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `a` points to `kc·MR` readable values and `b` to `kc` rows.
    /// Only called from functions built with AVX2 and FMA enabled, into which it is inlined
    /// (a function of its own with the features could not be forced inline).
    #[inline(always)]
    pub(crate) unsafe fn accumulate<P: Panel>(
        kc: usize,
        a: *const f32,
        b: *const P,
    ) -> [__m256; 2 * MR] {
        let mut acc = [_mm256_setzero_ps(); 2 * MR];
        let (mut a, mut b) = (a, b);
        // One k-step `s` past the current position: two aligned weight loads (widened to f32
        // for 16-bit panels), then six broadcasts, each feeding two FMAs.
        macro_rules! step {
            ($s:expr) => {
                let b0 = P::ymm(b.add($s), 0);
                let b1 = P::ymm(b.add($s), 1);
                for i in 0..MR {
                    let ai = _mm256_broadcast_ss(&*a.add($s * MR + i));
                    acc[2 * i] = _mm256_fmadd_ps(ai, b0, acc[2 * i]);
                    acc[2 * i + 1] = _mm256_fmadd_ps(ai, b1, acc[2 * i + 1]);
                }
            };
        }
        // The caller guarantees `kc` steps of `a` and `b`; each loop below advances both by the
        // steps it has read, so every load stays inside them. Unrolled by four to keep the loop
        // counter and pointer updates off the FMA pipes' way.
        for _ in 0..kc / 4 {
            step!(0);
            step!(1);
            step!(2);
            step!(3);
            a = a.add(4 * MR);
            b = b.add(4);
        }
        for _ in 0..kc % 4 {
            step!(0);
            a = a.add(MR);
            b = b.add(1);
        }
        acc
    }

    /// The AVX2+FMA micro-kernel: 6 × 16 sums in 12 ymm accumulators; per k-step two weight
    /// loads, six broadcasts, twelve FMAs.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `a` points to `kc·MR` readable values and `b` to `kc` rows;
    /// the `rows × cols` tile at `(r0, c0)` fits `out` (`Out::tile_fits`), `ep.bias` holds at
    /// least `cols` values, and no other thread accesses that tile.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<P: Panel>(
        kc: usize,
        a: *const f32,
        b: *const P,
        out: &Out,
        r0: usize,
        c0: usize,
        rows: usize,
        cols: usize,
        ep: Epilogue<'_>,
    ) {
        out.prefetch_block(r0, c0, rows, cols);
        let acc = accumulate(kc, a, b);
        if rows == MR && cols == NR {
            let bias = ep.bias.map(|v| v.as_ptr());
            for i in 0..MR {
                let y = out.ptr.add((r0 + i) * out.ld + c0);
                let mut lo = acc[2 * i];
                let mut hi = acc[2 * i + 1];
                if !ep.first {
                    lo = _mm256_add_ps(_mm256_loadu_ps(y), lo);
                    hi = _mm256_add_ps(_mm256_loadu_ps(y.add(8)), hi);
                }
                if let Some(bv) = bias {
                    lo = _mm256_add_ps(lo, _mm256_loadu_ps(bv));
                    hi = _mm256_add_ps(hi, _mm256_loadu_ps(bv.add(8)));
                }
                if ep.gelu {
                    // Through a 16-value row: `gelu_slice` compiles to 8-lane code here, with
                    // the same roundings as the scalar `math::gelu` of `store_tile`.
                    let mut row = [0.0f32; NR];
                    _mm256_storeu_ps(row.as_mut_ptr(), lo);
                    _mm256_storeu_ps(row.as_mut_ptr().add(8), hi);
                    let mut g = [0.0f32; NR];
                    crate::math::gelu_slice(&row, &mut g);
                    lo = _mm256_loadu_ps(g.as_ptr());
                    hi = _mm256_loadu_ps(g.as_ptr().add(8));
                }
                _mm256_storeu_ps(y, lo);
                _mm256_storeu_ps(y.add(8), hi);
            }
        } else {
            let mut sums = [[0.0f32; NR]; MR];
            for (i, row) in sums.iter_mut().enumerate() {
                _mm256_storeu_ps(row.as_mut_ptr(), acc[2 * i]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[2 * i + 1]);
            }
            store_tile(&sums, out, r0, c0, rows, cols, ep);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{store_tile, Epilogue, Out, Panel, MR, NR};

    /// The sums of [`tile`], by value (kept in registers: with the accumulators in a variable
    /// that the stores later borrow, every FMA was followed by a store to the stack).
    ///
    /// # Safety
    /// As [`tile`]'s.
    #[inline(always)]
    unsafe fn accumulate_wide<P: Panel, const MP: usize, const NP: usize>(
        kc: usize,
        a: [*const f32; 2 * MR],
        b0: *const P,
        b1: *const P,
    ) -> [[[__m512; NP]; MR]; MP] {
        let mut acc = [[[_mm512_setzero_ps(); NP]; MR]; MP];
        // One k-step `p`: the weight rows of the `NP` panels (widened to f32 for 16-bit
        // panels), then one broadcast per activation row, each feeding `NP` FMAs.
        macro_rules! step {
            ($p:expr) => {
                let w = [
                    P::zmm(b0.add($p)),
                    P::zmm(b1.add(if NP == 2 { $p } else { 0 })),
                ];
                for (m, rows) in acc.iter_mut().enumerate() {
                    for (i, sums) in rows.iter_mut().enumerate() {
                        let ai = _mm512_set1_ps(*a[m * MR + i].add($p));
                        for (j, s) in sums.iter_mut().enumerate() {
                            *s = _mm512_fmadd_ps(ai, w[j], *s);
                        }
                    }
                }
            };
        }
        let mut p = 0;
        while p + 2 <= kc {
            step!(p);
            step!(p + 1);
            p += 2;
        }
        if p < kc {
            step!(p);
        }
        acc
    }

    /// The AVX-512 micro-kernel: `6·MP × 16·NP` sums in `6·MP·NP` zmm accumulators (24 for the
    /// full 12 × 32 tile); per k-step `NP` aligned weight loads and `6·MP` broadcasts (from the
    /// activation rows in place), each
    /// feeding `NP` FMAs. Sum `(i, c)` is the FMA chain over `p = 0, 1, …` from zero, exactly as
    /// in the AVX2 kernel. The sub-tiles are then stored 6 × 16 at a time: full ones here, with
    /// the AVX2 kernel's roundings, the others through `store_tile`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and FMA; `a[i]` points to `kc` readable values of activation row
    /// `i` (the first `6·MP` are read), `b0` and `b1` to `kc` rows each (`b1` is
    /// read only when `NP == 2`); `rows` ≤ `6·MP` and `cols` ≤ `16·NP`, with every sub-tile
    /// inside `out` (`Out::tile_fits`) and not accessed by another thread; `ep.bias` holds at
    /// least `cols` values.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<P: Panel, const MP: usize, const NP: usize>(
        kc: usize,
        a: &[*const f32; 2 * MR],
        b0: *const P,
        b1: *const P,
        out: &Out,
        r0: usize,
        c0: usize,
        rows: usize,
        cols: usize,
        ep: Epilogue<'_>,
    ) {
        out.prefetch_block(r0, c0, rows, cols);
        let acc = accumulate_wide::<P, MP, NP>(kc, *a, b0, b1);
        store(&acc, out, r0, c0, rows, cols, ep);
    }

    /// The tile of `R` rows or fewer (`rows` ≤ `R` ≤ 6, one or two weight panels): `R·NP`
    /// accumulators, each sum the FMA chain of [`tile`] (identical bits), so a decode product
    /// costs one FMA per weight row and activation row rather than a full tile's six.
    ///
    /// # Safety
    /// As [`tile`]'s, with `rows` ≤ `R` ≤ 6 (`a[i]` read for `i < R`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn narrow<P: Panel, const R: usize, const NP: usize>(
        kc: usize,
        a: &[*const f32; 2 * MR],
        b0: *const P,
        b1: *const P,
        out: &Out,
        r0: usize,
        c0: usize,
        rows: usize,
        cols: usize,
        ep: Epilogue<'_>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NP]; R];
        macro_rules! step {
            ($p:expr) => {
                let w = [
                    P::zmm(b0.add($p)),
                    P::zmm(b1.add(if NP == 2 { $p } else { 0 })),
                ];
                for (i, sums) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*a[i].add($p));
                    for (j, s) in sums.iter_mut().enumerate() {
                        *s = _mm512_fmadd_ps(ai, w[j], *s);
                    }
                }
            };
        }
        let mut p = 0;
        while p + 4 <= kc {
            step!(p);
            step!(p + 1);
            step!(p + 2);
            step!(p + 3);
            p += 4;
        }
        while p < kc {
            step!(p);
            p += 1;
        }
        // Rows past `R` are never stored (`rows` ≤ `R`).
        let mut full = [[[_mm512_setzero_ps(); NP]; MR]; 1];
        full[0][..R].copy_from_slice(&acc);
        store(&full, out, r0, c0, rows, cols, ep);
    }

    /// Stores the `6·MP × 16·NP` sums of a wide tile at `(r0, c0)` of `y` as `ep` says: full
    /// 6 × 16 sub-tiles here, with the AVX2 kernel's roundings, the others through
    /// `store_tile`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `rows` ≤ `6·MP` and `cols` ≤ `16·NP`, every sub-tile inside `out`
    /// (`Out::tile_fits`) and not accessed by another thread; `ep.bias` holds at least `cols`
    /// values. Only called from functions built with AVX-512 F, into which it is inlined.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn store<const MP: usize, const NP: usize>(
        acc: &[[[__m512; NP]; MR]; MP],
        out: &Out,
        r0: usize,
        c0: usize,
        rows: usize,
        cols: usize,
        ep: Epilogue<'_>,
    ) {
        for (m, sub_rows) in acc.iter().enumerate() {
            let (row0, nrows) = (r0 + m * MR, rows.saturating_sub(m * MR).min(MR));
            for j in 0..NP {
                let (col0, ncols) = (c0 + j * NR, cols.saturating_sub(j * NR).min(NR));
                if nrows == 0 || ncols == 0 {
                    continue;
                }
                let ep = Epilogue {
                    bias: ep.bias.map(|v| &v[j * NR..]),
                    ..ep
                };
                if nrows == MR && ncols == NR {
                    for (i, sums) in sub_rows.iter().enumerate() {
                        let y = out.ptr.add((row0 + i) * out.ld + col0);
                        let mut v = sums[j];
                        if !ep.first {
                            v = _mm512_add_ps(_mm512_loadu_ps(y), v);
                        }
                        if let Some(bv) = ep.bias {
                            v = _mm512_add_ps(v, _mm512_loadu_ps(bv.as_ptr()));
                        }
                        if ep.gelu {
                            let mut row = [0.0f32; NR];
                            _mm512_storeu_ps(row.as_mut_ptr(), v);
                            let mut g = [0.0f32; NR];
                            crate::math::gelu_slice(&row, &mut g);
                            v = _mm512_loadu_ps(g.as_ptr());
                        }
                        _mm512_storeu_ps(y, v);
                    }
                } else {
                    let mut sums = [[0.0f32; NR]; MR];
                    for (dst, src) in sums.iter_mut().zip(sub_rows) {
                        _mm512_storeu_ps(dst.as_mut_ptr(), src[j]);
                    }
                    store_tile(&sums, out, row0, col0, nrows, ncols, ep);
                }
            }
        }
    }
}

/// Products of BF16 weights on `vdpbf16ps` (see [`bf16_dot_available`]): the activations are
/// rounded to BF16 once per call; each task then walks its rectangle as the AVX-512 kernel does
/// (12 × 32 tiles, activations read in place), two k-steps per instruction.
#[cfg(target_arch = "x86_64")]
mod bf16_dot {
    use std::arch::x86_64::*;

    use super::{each_task, Bf16Row, Epilogue, Exec, Out, Plan, MR, NR};

    /// `y = x · Wᵀ (+ bias)` for BF16 panels `w`, as [`super::sgemm`] runs it.
    pub(super) fn run(
        exec: Exec<'_>,
        plan: &Plan,
        x: &[f32],
        w: &[Bf16Row],
        bias: Option<&[f32]>,
        gelu: bool,
        out: &Out,
    ) {
        assert!(exec.bf16_dot && x.len() == plan.m * plan.k && w.len() >= plan.k);
        let xb = to_bf16(x);
        each_task(exec, plan, |t| task(plan, t, &xb, w, bias, gelu, out));
    }

    /// `x` rounded to BF16 as `vcvtneps2bf16` rounds (nearest even, subnormals to zero).
    fn to_bf16(x: &[f32]) -> Vec<u16> {
        let mut dst = vec![0u16; x.len()];
        // SAFETY: `run` is only reached with `Exec::bf16_dot`, which `Exec::new` sets only where
        // the CPU has AVX512_BF16 and `isa` is `Isa::Avx512` (AVX-512 F/BW/VL/DQ); the lengths
        // are equal.
        unsafe { super::amx::split_avx512(x, &mut dst, None) };
        dst
    }

    /// Every k-block of the rectangle `plan.task(t)`, in tiles of two weight panels by twelve
    /// rows (fewer at the ends).
    fn task(
        plan: &Plan,
        t: usize,
        xb: &[u16],
        w: &[Bf16Row],
        bias: Option<&[f32]>,
        gelu: bool,
        out: &Out,
    ) {
        let (r0, r1, p0, p1) = plan.task(t);
        let k = plan.k;
        for k0 in (0..k).step_by(plan.kc) {
            let kc = plan.kc.min(k - k0);
            for panel in (p0..p1).step_by(2) {
                let (c0, cols, ep, b) =
                    super::panel_pair(plan, w, (panel, p1), (k0, kc), bias, gelu);
                for row in (r0..r1).step_by(2 * MR) {
                    let rows = (r1 - row).min(2 * MR);
                    tile(kc, xb, k, row, k0, b, out, c0, cols, rows, ep);
                }
            }
        }
    }

    /// The tile of rows `[r0, r0 + rows)` and columns `[c0, c0 + cols)` of `y` (`b[0]` the
    /// panel of column `c0`, `b[1]` the next one or `b[0]` again) over steps `[k0, k0 + kc)`.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        kc: usize,
        xb: &[u16],
        k: usize,
        r0: usize,
        k0: usize,
        b: [&[Bf16Row]; 2],
        out: &Out,
        c0: usize,
        cols: usize,
        rows: usize,
        ep: Epilogue<'_>,
    ) {
        let (mp, np) = (rows.div_ceil(MR), cols.div_ceil(NR));
        assert!(
            kc >= 1
                && (1..=2 * MR).contains(&rows)
                && k0 + kc <= k
                && (r0 + rows)
                    .checked_mul(k)
                    .is_some_and(|end| end <= xb.len())
                && (1..=2).contains(&np)
                && b.iter().all(|b| b.len() >= kc)
                && out.wide_tile_fits(r0, c0, rows, cols)
                && ep.bias.is_none_or(|v| v.len() >= cols),
            "bf16 tile out of bounds"
        );
        // Rows past the last are the last one again: computed, then dropped at the store.
        let src: [*const u16; 2 * MR] =
            std::array::from_fn(|i| xb[(r0 + i.min(rows - 1)) * k + k0..].as_ptr());
        let (b0, b1) = (b[0].as_ptr(), b[1].as_ptr());
        // SAFETY: `Exec::bf16_dot` (checked in `run`) exists only where the CPU has AVX-512
        // F/BW and AVX512_BF16; the assert proves each source row holds `kc` values from `k0`,
        // each weight block `kc` rows, and every 6 × 16 sub-tile (and the bias) lies inside
        // `out`, which no other task writes.
        unsafe {
            match (mp, np) {
                (1, 1) => wide::<1, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
                (1, _) => wide::<1, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
                (_, 1) => wide::<2, 1>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
                _ => wide::<2, 2>(kc, &src, b0, b1, out, r0, c0, rows, cols, ep),
            }
        }
    }

    /// Lane `2c` ← column `c` of the first of two 16-value rows, lane `2c + 1` ← column `c` of
    /// the second: the pairs `vdpbf16ps` multiplies.
    const PAIRS: [u16; 32] = {
        let mut idx = [0u16; 32];
        let mut l = 0;
        while l < 32 {
            idx[l] = if l % 2 == 0 {
                (l / 2) as u16
            } else {
                16 + (l / 2) as u16
            };
            l += 1;
        }
        idx
    };

    /// The `6·MP × 16·NP` tile: per pair of k-steps, `NP` weight loads (two panel rows each,
    /// interleaved into column pairs by one `vpermw`) and `6·MP` broadcasts of an activation
    /// pair, each feeding `NP` `vdpbf16ps`; an odd last step pairs with zeros. Then the AVX-512
    /// kernel's stores.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW and AVX512_BF16; `a[i]` points to `kc` readable values, `b0`
    /// and `b1` to `kc` rows each (`b1` read only when `NP == 2`); `rows` ≤ `6·MP`, `cols` ≤
    /// `16·NP`, every sub-tile inside `out` and not accessed by another thread; `ep.bias` holds
    /// at least `cols` values.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn wide<const MP: usize, const NP: usize>(
        kc: usize,
        a: &[*const u16; 2 * MR],
        b0: *const Bf16Row,
        b1: *const Bf16Row,
        out: &Out,
        r0: usize,
        c0: usize,
        rows: usize,
        cols: usize,
        ep: Epilogue<'_>,
    ) {
        let acc = accumulate::<MP, NP>(kc, *a, b0, b1);
        super::avx512::store(&acc, out, r0, c0, rows, cols, ep);
    }

    /// The sums of [`wide`], by value (kept in registers).
    ///
    /// # Safety
    /// As [`wide`]'s; inlined into it.
    #[inline(always)]
    unsafe fn accumulate<const MP: usize, const NP: usize>(
        kc: usize,
        a: [*const u16; 2 * MR],
        b0: *const Bf16Row,
        b1: *const Bf16Row,
    ) -> [[[__m512; NP]; MR]; MP] {
        let mut acc = [[[_mm512_setzero_ps(); NP]; MR]; MP];
        let pairs = _mm512_loadu_si512(PAIRS.as_ptr().cast());
        let b = [b0, b1];
        let mut p = 0;
        while p + 2 <= kc {
            // Rows p and p + 1 of each panel: 64 contiguous bytes.
            let w: [__m512i; 2] = std::array::from_fn(|j| {
                let row = b[if NP == 2 { j } else { 0 }].add(p);
                _mm512_permutexvar_epi16(pairs, _mm512_loadu_si512(row.cast()))
            });
            for (m, rows) in acc.iter_mut().enumerate() {
                for (i, sums) in rows.iter_mut().enumerate() {
                    let pair = a[m * MR + i].add(p).cast::<i32>().read_unaligned();
                    let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    for (j, s) in sums.iter_mut().enumerate() {
                        let wj: __m512bh = std::mem::transmute(w[j]);
                        *s = _mm512_dpbf16_ps(*s, ai, wj);
                    }
                }
            }
            p += 2;
        }
        if p < kc {
            // The odd last step: each weight with a zero above it, each activation likewise.
            let w: [__m512i; 2] = std::array::from_fn(|j| {
                let row = b[if NP == 2 { j } else { 0 }].add(p);
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.cast()))
            });
            for (m, rows) in acc.iter_mut().enumerate() {
                for (i, sums) in rows.iter_mut().enumerate() {
                    let one = i32::from(a[m * MR + i].add(p).read());
                    let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(one));
                    for (j, s) in sums.iter_mut().enumerate() {
                        let wj: __m512bh = std::mem::transmute(w[j]);
                        *s = _mm512_dpbf16_ps(*s, ai, wj);
                    }
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn pack_f32(w: &[f32], n: usize, k: usize) -> PackedWeight {
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        PackedWeight::pack(&team(1), GgmlType::F32, &bytes, n, k, 4 * k).unwrap()
    }

    fn team(threads: usize) -> Team {
        Team::new(threads, "sgemm-test").unwrap()
    }

    fn exec(team: &Team, isa: Isa) -> Exec<'_> {
        Exec::new(isa, team, false)
    }

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        for level in [SimdLevel::Avx2, SimdLevel::Avx512] {
            let isa = Isa::for_level(level);
            if !v.contains(&isa) {
                v.push(isa);
            }
        }
        v
    }

    /// Checks `y` against an f64 product. The bound is the classic one for a sum of `k + 1`
    /// f32 terms (k products, then the bias): `γ_{k+2} · (Σ|x·w| + |bias|)`, γ_j = j·u/(1 - j·u)
    /// with u = 2⁻²⁴; blocking and FMA only tighten it. A wrong index is off by O(1).
    fn check(y: &[f32], x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) {
        check_within(y, x, w, bias, (m, n, k), gamma(k + 2));
    }

    /// γ_j = j·u/(1 - j·u), u = 2⁻²⁴: the bound of a chain of `j` f32 roundings.
    fn gamma(j: usize) -> f64 {
        let u = f64::powi(2.0, -24);
        j as f64 * u / (1.0 - j as f64 * u)
    }

    /// [`check`] with the bound `rel · (Σ|x·w| + |bias|)`.
    fn check_within(
        y: &[f32],
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        (m, n, k): (usize, usize, usize),
        rel: f64,
    ) {
        for r in 0..m {
            for c in 0..n {
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let t = x[r * k + p] as f64 * w[c * k + p] as f64;
                    sum += t;
                    mag += t.abs();
                }
                if let Some(b) = bias {
                    sum += b[c] as f64;
                    mag += (b[c] as f64).abs();
                }
                let got = y[r * n + c] as f64;
                assert!(
                    (got - sum).abs() <= rel * mag + f64::MIN_POSITIVE,
                    "[{m}, {k}] x [{n}, {k}]ᵀ at ({r}, {c}): {got} vs {sum}"
                );
            }
        }
    }

    #[test]
    fn the_plan_covers_y_once_with_disjoint_tasks() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 17, 3),
            (64, 384, 384),
            (257, 100, 1000),
            (800, 1536, 384),
            (8000, 384, 1536),
            (4096, 1536, 384),
            (4096, 1152, 384),
            (1, 32000, 2048),
            (30, 4100, 4096),
        ] {
            for packs in [false, true] {
                let plan = Plan::new(m, n, k, packs);
                assert!(plan.kc <= KC_MAX && plan.mc <= MC_MAX && plan.mc.is_multiple_of(MR));
                // A wide weight is cut into n-blocks of at most `NC_BYTES_MAX`, whole panel pairs,
                // for the kernel that reads activations in place.
                if !packs && n.div_ceil(NR) * NR * k * 4 > NC_BYTES_MAX {
                    assert!(plan.nc_panels * NR * k * 4 <= NC_BYTES_MAX.max(2 * NR * k * 4));
                    assert!(plan.nc_panels.is_multiple_of(2), "{plan:?}");
                }
                assert!(k.div_ceil(plan.kc) == k.div_ceil(KC_MAX), "k-blocks of {k}");
                let panels = n.div_ceil(NR);
                let mut owner = vec![usize::MAX; m * panels];
                for t in 0..plan.tasks() {
                    let (r0, r1, p0, p1) = plan.task(t);
                    assert!(r0 < r1 && p0 < p1, "empty task {t} of {plan:?}");
                    for r in r0..r1 {
                        for p in p0..p1 {
                            assert_eq!(owner[r * panels + p], usize::MAX, "{plan:?}");
                            owner[r * panels + p] = t;
                        }
                    }
                }
                assert!(owner.iter().all(|&o| o != usize::MAX), "{plan:?}");
            }
        }
    }

    #[test]
    fn packing_puts_weight_rows_in_panel_columns_and_pads_with_zeros() {
        let (n, k) = (19, 5);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32).collect();
        let p = pack_f32(&w, n, k);
        let Panels::F32(rows) = &p.panels else {
            panic!("F32 weights packed as {:?}", p)
        };
        assert_eq!(rows.len(), 2 * k);
        for panel in 0..2 {
            for (step, row) in block(rows, k, panel, 0, k).iter().enumerate() {
                for c in 0..NR {
                    let j = panel * NR + c;
                    let want = if j < n { w[j * k + step] } else { 0.0 };
                    assert_eq!(row.0[c], want, "panel {panel} step {step} col {c}");
                }
            }
        }
        // Half-precision weights keep their 16 bits, in the same places: half the memory, and
        // each value read back is the f32 one (these small integers are exact in both).
        for ty in [GgmlType::F16, GgmlType::BF16] {
            let h = pack_half(ty, &w, n, k);
            assert_eq!(2 * h.bytes(), p.bytes());
            let get = |panel: usize, step: usize, c: usize| match &h.panels {
                Panels::F16(r) => block(r, k, panel, 0, k)[step].get(c),
                Panels::Bf16(r) => block(r, k, panel, 0, k)[step].get(c),
                _ => panic!("{ty} not packed in 16 bits"),
            };
            for panel in 0..2 {
                for step in 0..k {
                    for c in 0..NR {
                        assert_eq!(get(panel, step, c), rows[panel * k + step].0[c], "{ty}");
                    }
                }
            }
        }
    }

    /// `w` rounded to `ty` (F16 or BF16) and packed from those bytes.
    fn pack_half(ty: GgmlType, w: &[f32], n: usize, k: usize) -> PackedWeight {
        let bytes: Vec<u8> = if ty == GgmlType::F16 {
            w.iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect()
        } else {
            w.iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect()
        };
        PackedWeight::pack(&team(1), ty, &bytes, n, k, 2 * k).unwrap()
    }

    /// `w` rounded to `ty` (F16 or BF16), back in f32.
    fn rounded(ty: GgmlType, w: &[f32]) -> Vec<f32> {
        w.iter()
            .map(|&v| {
                if ty == GgmlType::F16 {
                    half::f16::from_f32(v).to_f32()
                } else {
                    half::bf16::from_f32(v).to_f32()
                }
            })
            .collect()
    }

    #[test]
    fn half_panels_give_the_bits_of_panels_converted_to_f32() {
        let (one, three) = (team(1), team(3));
        // Edge tiles in m and n, one to three k-blocks, every epilogue, 1 and 3 threads, every
        // kernel; F16 values include subnormals (|w| < 2⁻¹⁴ after the scaling).
        for (m, n, k) in [
            (1, 1, 1),
            (3, 48, 385),
            (5, 17, 9),
            (13, 33, 384),
            (25, 48, 385),
            (40, 100, 1000),
        ] {
            let x = values(m * k, 21);
            let w: Vec<f32> = values(n * k, 22)
                .iter()
                .enumerate()
                .map(|(i, &v)| if i % 7 == 0 { v * 1e-5 } else { v })
                .collect();
            let bias = values(n, 23);
            for ty in [GgmlType::F16, GgmlType::BF16] {
                let wide = pack_f32(&rounded(ty, &w), n, k);
                let half = pack_half(ty, &w, n, k);
                for isa in isas() {
                    for (b, gelu) in [(None, false), (Some(&bias[..]), true)] {
                        let want = sgemm(exec(&one, isa), &x, m, &wide, b, gelu).unwrap();
                        for t in [&one, &three] {
                            let got = sgemm(exec(t, isa), &x, m, &half, b, gelu).unwrap();
                            assert!(
                                want.iter()
                                    .zip(&got)
                                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                                "{ty} {isa:?} [{m}, {n}, {k}] gelu {gelu}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn packing_refuses_other_types_and_wrong_sizes() {
        let bytes = vec![0u8; 4 * 6];
        assert!(PackedWeight::pack(&team(1), GgmlType::Q8_0, &bytes, 2, 3, 12).is_err());
        assert!(PackedWeight::pack(&team(1), GgmlType::F32, &bytes, 3, 3, 12).is_err());
        assert!(PackedWeight::pack(&team(1), GgmlType::F32, &bytes, 2, 0, 0).is_err());
        assert!(PackedWeight::pack(&team(1), GgmlType::F32, &bytes, 2, 3, 12).is_ok());
        // Rows of the wrong width for the type.
        assert!(PackedWeight::pack(&team(1), GgmlType::F32, &bytes, 2, 2, 12).is_err());
        assert!(PackedWeight::pack(&team(1), GgmlType::F16, &bytes, 2, 3, 12).is_err());
        assert!(PackedWeight::pack(&team(1), GgmlType::BF16, &bytes, 2, 6, 12).is_ok());
    }

    #[test]
    fn every_edge_of_m_n_and_k_matches_f64_on_every_kernel() {
        let one = team(1);
        for k in [1, 7, 255, 256, 257, 1000] {
            for n in [1, 15, 16, 17, 100] {
                let w = values(n * k, (n * 31 + k) as u64);
                let packed = pack_f32(&w, n, k);
                let bias = values(n, 5);
                for m in (1..=13).chain([64, 257]) {
                    let x = values(m * k, (m * 7 + k) as u64);
                    for isa in isas() {
                        let with_bias = m % 2 == 0;
                        let b = with_bias.then_some(&bias[..]);
                        let y = sgemm(exec(&one, isa), &x, m, &packed, b, false).unwrap();
                        check(&y, &x, &w, b, m, n, k);
                    }
                }
            }
        }
    }

    #[test]
    fn results_are_bit_identical_for_any_thread_count() {
        let (m, n, k) = (301, 200, 600);
        let (x, w, bias) = (values(m * k, 1), values(n * k, 2), values(n, 3));
        let packed = pack_f32(&w, n, k);
        assert!(Plan::new(m, n, k, true).tasks() > 3);
        for isa in isas() {
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 2, 3] {
                let threads_team = team(threads);
                let y =
                    sgemm(exec(&threads_team, isa), &x, m, &packed, Some(&bias), false).unwrap();
                match &first {
                    None => {
                        check(&y, &x, &w, Some(&bias), m, n, k);
                        first = Some(y);
                    }
                    Some(f) => assert!(
                        f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?}: {threads} threads differ from 1"
                    ),
                }
            }
        }
    }

    #[test]
    fn gelu_epilogue_equals_gelu_of_the_product() {
        let team2 = team(2);
        // One and two k-blocks (the GELU only after the last), edge tiles in m and n.
        for (m, n, k) in [(13, 40, 384), (50, 17, 600)] {
            let (x, w, bias) = (values(m * k, 7), values(n * k, 8), values(n, 9));
            let packed = pack_f32(&w, n, k);
            for isa in isas() {
                let plain = sgemm(exec(&team2, isa), &x, m, &packed, Some(&bias), false).unwrap();
                let fused = sgemm(exec(&team2, isa), &x, m, &packed, Some(&bias), true).unwrap();
                let want: Vec<f32> = plain.iter().map(|&v| crate::math::gelu(v)).collect();
                assert!(
                    fused
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} [{m}, {n}, {k}]"
                );
            }
        }
    }

    #[test]
    fn avx512_and_avx2_kernels_give_identical_bits() {
        let (a2, a512) = (
            Isa::for_level(SimdLevel::Avx2),
            Isa::for_level(SimdLevel::Avx512),
        );
        if a512 != Isa::for_level(SimdLevel::Avx512Vnni) || a2 == a512 {
            eprintln!("skipped: this CPU lacks AVX-512 ({a2:?}, {a512:?})");
            return;
        }
        let (one, three) = (team(1), team(3));
        // Odd and even panel counts in m and n, partial tiles, one to three k-blocks, bias and
        // GELU epilogues.
        // One to four rows take the narrow tiles (alone, or as the last rows of a product).
        for (m, n, k) in [
            (1, 1, 1),
            (2, 40, 384),
            (3, 17, 9),
            (4, 33, 385),
            (5, 17, 9),
            (13, 33, 384),
            (16, 48, 385),
            (25, 48, 385),
            (96, 100, 1000),
        ] {
            let (x, w, bias) = (values(m * k, 11), values(n * k, 12), values(n, 13));
            let packed = pack_f32(&w, n, k);
            for (b, gelu) in [
                (None, false),
                (Some(&bias[..]), false),
                (Some(&bias[..]), true),
            ] {
                let want = sgemm(exec(&one, a2), &x, m, &packed, b, gelu).unwrap();
                for t in [&one, &three] {
                    let got = sgemm(exec(t, a512), &x, m, &packed, b, gelu).unwrap();
                    assert!(
                        want.iter()
                            .zip(&got)
                            .all(|(p, q)| p.to_bits() == q.to_bits()),
                        "[{m}, {n}, {k}] bias {} gelu {gelu}",
                        b.is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn bf16_dot_matches_f64_with_activations_rounded_to_bf16() {
        let isa = Isa::for_level(SimdLevel::Avx512Vnni);
        if !bf16_dot_available(isa) {
            eprintln!("skipped: this CPU lacks AVX512_BF16 ({isa:?})");
            return;
        }
        assert!(!bf16_dot_available(Isa::Scalar) && !Exec::new(isa, &team(1), false).bf16_dot);
        let (one, three) = (team(1), team(3));
        // Odd and even k (an odd step at the end of a k-block), one to three k-blocks, edge
        // tiles in m and n, partial two-panel tiles.
        for (m, n, k) in [
            (1, 1, 1),
            (5, 17, 9),
            (7, 20, 2),
            (13, 33, 384),
            (25, 48, 385),
            (40, 100, 1000),
        ] {
            let (x, w, bias) = (values(m * k, 31), values(n * k, 32), values(n, 33));
            let packed = pack_half(GgmlType::BF16, &w, n, k);
            let xr = rounded(GgmlType::BF16, &x);
            let wr = rounded(GgmlType::BF16, &w);
            for b in [None, Some(&bias[..])] {
                let y = sgemm(Exec::new(isa, &one, true), &x, m, &packed, b, false).unwrap();
                check(&y, &xr, &wr, b, m, n, k);
                let y3 = sgemm(Exec::new(isa, &three, true), &x, m, &packed, b, false).unwrap();
                assert!(
                    y.iter().zip(&y3).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "[{m}, {n}, {k}]: 3 threads differ from 1"
                );
                let fused = sgemm(Exec::new(isa, &three, true), &x, m, &packed, b, true).unwrap();
                assert!(
                    fused
                        .iter()
                        .zip(&y)
                        .all(|(g, v)| g.to_bits() == crate::math::gelu(*v).to_bits()),
                    "[{m}, {n}, {k}]: fused GELU"
                );
                if k >= 384 {
                    // The activations' rounding shows: this is not the exact f32 path.
                    let exact = sgemm(exec(&one, isa), &x, m, &packed, b, false).unwrap();
                    assert!(exact.iter().zip(&y).any(|(p, q)| p != q), "[{m}, {n}, {k}]");
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let one = team(1);
        let packed = pack_f32(&values(12, 1), 4, 3);
        let x = values(6, 2);
        let run = |m: usize, bias: Option<&[f32]>| {
            sgemm(exec(&one, Isa::Scalar), &x, m, &packed, bias, false)
        };
        assert_eq!(run(2, None).unwrap().len(), 8);
        assert!(run(0, None).is_err());
        assert!(run(3, None).is_err());
        assert!(run(2, Some(&[0.0; 3])).is_err());
        assert!(run(2, Some(&[0.0; 4])).is_ok());
    }

    #[test]
    fn split_parts_hold_sixteen_significant_bits() {
        let bf = |b: u16| f32::from_bits(u32::from(b) << 16);
        for (i, v) in values(4096, 41).into_iter().enumerate() {
            let v = v * f32::powi(2.0, i as i32 % 40 - 20);
            let (hi, lo) = amx_split(v);
            let err = (f64::from(v) - f64::from(bf(hi)) - f64::from(bf(lo))).abs();
            assert!(
                err <= f64::powi(2.0, -17) * f64::from(v).abs(),
                "{v}: {hi:#x} {lo:#x}"
            );
            assert_eq!(bf(hi), half::bf16::from_f32(v).to_f32(), "{v}: hi");
        }
        // A BF16 value is its hi part alone.
        assert_eq!(amx_split(1.5), (0x3fc0, 0));
        assert_eq!(amx_split(-0.0), (0x8000, 0));
    }

    /// The split of `v` (`amx::split`, portable, so the test runs on every host).
    fn amx_split(v: f32) -> (u16, u16) {
        let hi = half::bf16::from_f32(v);
        let lo = half::bf16::from_f32(v - hi.to_f32());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(amx::split(v), (hi.to_bits(), lo.to_bits()));
        (hi.to_bits(), lo.to_bits())
    }

    /// The split products (where this host grants AMX-BF16 tiles): within their bound of f64
    /// (`2⁻¹⁵·(1 + 2⁻⁸) + γ_{3k+2}` of the terms' magnitudes), on edges of m, n and k, with
    /// bias and GELU; the same bits on one thread and two, and for each row alone.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_split_products_are_within_their_bound_and_invariant() {
        if !amx::available(Isa::Avx512) {
            eprintln!("skipped: this host has no AMX-BF16 tiles granted (or no AVX-512 BF16)");
            return;
        }
        let (one, two) = (team(1), team(2));
        for (i, &(m, n, k)) in [
            (1, 1, 1),
            (3, 17, 31),
            (32, 32, 32),
            (33, 48, 33),
            (70, 100, 384),
            (64, 16, 1543),
            (200, 50, 64),
            (97, 1152, 384),
        ]
        .iter()
        .enumerate()
        {
            let w = values(n * k, 3 + i as u64);
            let x = values(m * k, 50 + i as u64);
            let bias = values(n, 90 + i as u64);
            let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            let packed =
                PackedWeight::pack_for(Some(Isa::Avx512), &one, GgmlType::F32, &bytes, n, k, 4 * k)
                    .unwrap();
            assert!(matches!(packed.panels, Panels::Split(_)), "split packing");
            assert_eq!(
                packed.bytes(),
                n.div_ceil(NR) * NR * k.next_multiple_of(32) * 4
            );
            let rel = f64::powi(2.0, -15) * (1.0 + f64::powi(2.0, -8)) + gamma(3 * k + 2);
            let e = |t| exec(t, Isa::Avx512);
            let plain = sgemm(e(&one), &x, m, &packed, Some(&bias), false).unwrap();
            check_within(&plain, &x, &w, Some(&bias), (m, n, k), rel);
            let gelu = sgemm(e(&two), &x, m, &packed, Some(&bias), true).unwrap();
            for (g, p) in gelu.iter().zip(&plain) {
                assert_eq!(
                    g.to_bits(),
                    crate::math::gelu(*p).to_bits(),
                    "[{m}, {n}, {k}] gelu"
                );
            }
            let y2 = sgemm(e(&two), &x, m, &packed, None, false).unwrap();
            check_within(&y2, &x, &w, None, (m, n, k), rel);
            for r in [0, m / 2, m - 1] {
                let alone =
                    sgemm(e(&one), &x[r * k..(r + 1) * k], 1, &packed, None, false).unwrap();
                assert_eq!(
                    alone,
                    y2[r * n..(r + 1) * n],
                    "[{m}, {n}, {k}] row {r} alone"
                );
            }
            let y1 = sgemm(e(&one), &x, m, &packed, None, false).unwrap();
            assert_eq!(y1, y2, "[{m}, {n}, {k}]: one thread vs two");
        }
        // Without the request (or for other types) the f32 panels.
        let bytes = vec![0u8; 4 * 16 * 8];
        let p = PackedWeight::pack_for(None, &one, GgmlType::F32, &bytes, 16, 8, 32);
        assert!(matches!(p.unwrap().panels, Panels::F32(_)));
        let p = PackedWeight::pack_for(Some(Isa::Avx2), &one, GgmlType::F32, &bytes, 16, 8, 32);
        assert!(matches!(p.unwrap().panels, Panels::F32(_)));
    }
}
