//! The AVX-512 VNNI products over interleaved Q8_0, Q5_0, Q4_K and Q6_K weights (layouts:
//! `kernels::interleaved`; the k-quants' kernels are [`chunk_q4_k`] and [`chunk_q6_k`],
//! described there).
//!
//! Per group of 16 weight rows and block: the block's 8 quant lines are made once into 8
//! registers (Q8_0: loaded; Q5_0: 4 loads split into low and high nibbles, each line's fifth bits
//! added by one masked add from its 64-bit mask); for each activation row, 8 `vpdpbusd` of a line
//! against that row's matching 4 quants broadcast from memory, started from the row's offset
//! correction, leave the 16 rows' exact block sums in the 16 lanes, and one conversion and one
//! multiply-add by `d * da` (the 16 scales converted once per block) add them into the row's f32
//! accumulator. Activation rows go 8 at a time (8 accumulators and the 8 lines stay in
//! registers), the group's weights (11 KB for 640-element Q8_0 rows) in L1 across the chunks of 8.
//!
//! Prefetch: with 4 or more activation rows, the first chunk of a Q8_0 or Q5_0 group requests,
//! at each block, the block's worth of bytes `PREFETCH_DISTANCE` (2 KB) further on, as the file
//! layout's kernels do (`super::prefetch_ahead`). There the kernel spends about 64 `vpdpbusd`
//! on each 544-byte block, so the out-of-order window reaches only a few blocks ahead and the
//! hardware prefetcher alone leaves the stream stalled. Not at one row (the hardware does better
//! on a stream the kernel reads at memory speed) and not in the k-quant kernels (they spend more
//! arithmetic per byte, and the requests only cost there). The measurements behind each choice
//! are in docs/BENCHMARKS.md.
//!
//! Q6_K's code lines (a `ql` nibble joined with two `qh` bits) take shifts, masks and a
//! `vpternlogd`, 3-4 instructions a line; where the CPU has GFNI (and `KILN_GFNI` does not refuse
//! it) `vgf2p8affineqb` moves the bits in place with the rest zero, 2 instructions a line in
//! three quarters of four ([`chunk_q6_k_gfni`]): the same codes, so the same bits (tested), and
//! one-row products about 20 % faster in cache, where unpacking is most of the work.
//!
//! Decode (one activation row): on Intel CPUs and AMD Zen 5 each block's bytes are also
//! requested `super::row_prefetch_distance` (4 KB) ahead; there the hardware prefetcher alone
//! left the stream at half the memory's rate. The k-quant kernels request a super-block's lines
//! a quarter at a time, one quarter before each of its four chunks (Q4_K) or units (Q6_K),
//! rather than all 36 or 52 at its start: on a Zen 5 host llama-3.2-1b-shape Q4_K_M decode
//! went 5-9 % faster on two threads and 12 % on one, llama-3.1-8b's 15 % (docs/BENCHMARKS.md,
//! ninth entry of 2026-12-07).
//!
//! **AMX.** Where the operating system grants the tiles (`super::amx`), a Q4_K or Q6_K product of
//! at least 32 activation rows runs 16 rows at a time on the tiles ([`amx_q4_k`], [`amx_q6_k`])
//! over activations packed in tile order once per product (`ActivationTerms`), the rows past
//! the last whole 16 through the VNNI kernel. The tiles give the exact integer sums of the VNNI
//! kernel and the f32 step is the same, so both give the same bits and a product may mix them
//! (batch invariance holds). A task keeps a slice of `AMX_SLICE` tiles of activations in L2
//! while its groups go past it, one block at a time: a block's weight operands are made just
//! before the slice's tiles run it, and stay in L1 for all of them. The slice's f32 accumulators
//! stay in a contiguous scratch until a group's last block (in the outputs, rows a multiple of
//! 4 KB apart as in most models would put a tile's 16 rows in one L1 set).

use std::arch::x86_64::*;

use kiln_core::GgmlType;

use super::super::interleaved::{
    check_call, q4_k, q6_k, ActivationTerms, Blocking, Geometry, InterleavedGemmFn, TileLine,
    AMX_TILE_ROWS, INTERLEAVE_ROWS, Q5_0, Q8_0, TILE_LINES,
};

/// Fewest activation rows for which a Q8_0/Q5_0 chunk prefetches (see the module docs).
const PREFETCH_MIN_ROWS: usize = 4;

/// Bytes of a Q8_0 activation block.
const A_BLOCK: usize = 34;

/// The tiles of the AMX kernels: 0..4 the i32 sums of four products (16 x 16: two tiles of
/// activation rows against two weight operands), 4 and 5 the activation operands (16 rows of 64
/// quants), 6 and 7 the weight operands (16 lines of 64 bytes: 64 quants of 16 rows).
const AMX_CONFIG: super::amx::Config = super::amx::Config::new()
    .tile(0, 16, 64)
    .tile(1, 16, 64)
    .tile(2, 16, 64)
    .tile(3, 16, 64)
    .tile(4, 16, 64)
    .tile(5, 16, 64)
    .tile(6, 16, 64)
    .tile(7, 16, 64);

/// Lines of 64 bytes of one pair of accumulators' sums ([`amx_store_pair`]: two 16 x 16 i32
/// tiles).
const AMX_SUMS_LINES: usize = 2 * AMX_RUN / 64;

/// Lines of 64 bytes of the largest [`Format::amx_prepare`] output (one block of Q6_K).
const AMX_PREPARED_LINES: usize = {
    let (a, b) = (amx_q4_k::PREPARED, amx_q6_k::PREPARED);
    (if a > b { a } else { b }) / 64
};

/// A thread's scratch for the AMX kernels: one block of a group unpacked, and the stored sums of
/// both pairs of accumulators (see [`groups`]).
struct AmxScratch {
    prepared: [TileLine; AMX_PREPARED_LINES],
    sums: [[TileLine; AMX_SUMS_LINES]; 2],
    /// The f32 accumulators of a slice's rows (see [`amx_accumulator`]).
    acc: [TileLine; AMX_SLICE * AMX_TILE_ROWS],
}

/// Tiles of 16 activation rows per slice that the AMX products keep in L2 (see [`groups`]): 16
/// (512 KiB of activation tiles at k = 2048) halves the weight unpacking per tile against 8, and
/// measured 4-7 % faster on Q4_K and 13-17 % on Q6_K (whose unpacking costs more), also at
/// k = 8192 (2 MiB); 32 measured the same as 16.
const AMX_SLICE: usize = 16;

thread_local! {
    /// Each thread's [`AmxScratch`].
    static AMX_SCRATCH: std::cell::RefCell<AmxScratch> = const {
        std::cell::RefCell::new(AmxScratch {
            prepared: [TileLine([0; 64]); AMX_PREPARED_LINES],
            sums: [[TileLine([0; 64]); AMX_SUMS_LINES]; 2],
            acc: [TileLine([0; 64]); AMX_SLICE * AMX_TILE_ROWS],
        })
    };
}

/// A format's interleaved quant lines.
trait Lines {
    const GEOMETRY: Geometry;

    /// The 8 lines of one block of a group, quants as unsigned bytes (`q + offset`): line `c`
    /// holds quants `4c..4c + 4` of each row in the row's lane.
    ///
    /// # Safety
    /// The block's masks and quants are readable at `masks` and `quants`; AVX-512 F/BW.
    unsafe fn lines(masks: *const u8, quants: *const u8) -> [__m512i; 8];
}

struct Q8;
struct Q5;

impl Lines for Q8 {
    const GEOMETRY: Geometry = Q8_0;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn lines(_masks: *const u8, quants: *const u8) -> [__m512i; 8] {
        std::array::from_fn(|l| _mm512_loadu_si512(quants.add(64 * l).cast()))
    }
}

impl Lines for Q5 {
    const GEOMETRY: Geometry = Q5_0;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn lines(masks: *const u8, quants: *const u8) -> [__m512i; 8] {
        let low4 = _mm512_set1_epi8(0x0f);
        let fifth = _mm512_set1_epi8(16);
        let mask = |c: usize| masks.add(8 * c).cast::<u64>().read_unaligned();
        let mut lines = [_mm512_setzero_si512(); 8];
        for v in 0..4 {
            let packed = _mm512_loadu_si512(quants.add(64 * v).cast());
            let low = _mm512_and_si512(packed, low4);
            let high = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), low4);
            lines[v] = _mm512_mask_add_epi8(low, mask(v), low, fifth);
            lines[4 + v] = _mm512_mask_add_epi8(high, mask(4 + v), high, fifth);
        }
        lines
    }
}

/// The kernel of `ty`'s interleaved layout (see `kernels::interleaved_gemm_fn`); `gfni`: Q6_K's
/// code lines through GFNI ([`chunk_q6_k_gfni`], the same bits), only where the CPU has it.
pub(in crate::kernels) fn interleaved_gemm_fn(
    ty: GgmlType,
    gfni: bool,
) -> Option<InterleavedGemmFn> {
    match ty {
        GgmlType::Q8_0 => Some(gemm::<Q8>),
        GgmlType::Q5_0 => Some(gemm::<Q5>),
        GgmlType::Q4_K => Some(gemm::<Q4K>),
        GgmlType::Q6_K if gfni && is_x86_feature_detected!("gfni") => Some(gemm::<Q6K<true>>),
        GgmlType::Q6_K => Some(gemm::<Q6K<false>>),
        _ => None,
    }
}

/// An interleaved format's product, as [`gemm`] runs it.
trait Format {
    const BLOCKING: Blocking;
    /// Bytes of one block of a whole group.
    const GROUP_BLOCK: usize;

    /// The 16 rows of a group against `M` activation rows.
    ///
    /// # Safety
    /// `c` names a whole group, `M` activation rows and their terms, and writable outputs;
    /// AVX-512 F/BW/VL/VNNI.
    unsafe fn chunk<const M: usize>(c: &Chunk);

    /// Bytes of [`Format::amx_prepare`]'s output (one block), where the format has an AMX kernel
    /// (0: none).
    const AMX_PREPARED: usize = 0;
    /// Activation tiles (16 x 64 quants) per block.
    const AMX_TILES: usize = 0;

    /// Unpacks block `b` of the group at `c.w` into what [`amx_tile_products`] and
    /// [`Format::amx_step`] read (4 runs of the two weight operands first, 1 KiB each), at `dst`
    /// (`AMX_PREPARED` bytes, 64-byte aligned).
    ///
    /// # Safety
    /// `c` names a whole group and `b < c.blocks`; `dst` is writable for `AMX_PREPARED` bytes;
    /// AVX-512 F/BW/VL/VNNI.
    unsafe fn amx_prepare(_c: &Chunk, _b: usize, _dst: *mut u8) {
        unreachable!("no AMX kernel")
    }

    /// The f32 step of block `b` for the 16 activation rows of `c` from their sums (stored by
    /// [`amx_store_pair`] at `sums` after [`amx_tile_products`]), with the bits of `chunk::<16>`
    /// (the blocks of an output are run in order: the first starts its accumulators at zero, the
    /// others add to the accumulators of `acc`, and the last stores to the outputs).
    ///
    /// # Safety
    /// `c` names the group against 16 activation rows (a whole group, rows and their terms,
    /// writable outputs); `prepared` holds [`Format::amx_prepare`]'s output for block `b`;
    /// `sums` holds those rows' sums; `acc` the rows' accumulators (16 lines of 16 floats,
    /// 64-byte aligned and writable: see [`amx_accumulator`]), kept there by the step of block
    /// `b - 1` where `b > 0`.
    unsafe fn amx_step(
        _c: &Chunk,
        _prepared: *const u8,
        _b: usize,
        _sums: *const u8,
        _acc: *mut u8,
    ) {
        unreachable!("no AMX kernel")
    }
}

impl<L: Lines> Format for L {
    const BLOCKING: Blocking = L::GEOMETRY.blocking();
    const GROUP_BLOCK: usize = L::GEOMETRY.group_block();

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn chunk<const M: usize>(c: &Chunk) {
        chunk::<L, M>(c)
    }
}

/// The AMX items of a [`Format`] whose tile kernel is the module `$m` (its `prepare`,
/// `step` and `PREPARED`; 4 activation tiles per super-block).
macro_rules! amx_kernel {
    ($m:ident) => {
        const AMX_PREPARED: usize = $m::PREPARED;
        const AMX_TILES: usize = 4;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn amx_prepare(c: &Chunk, b: usize, dst: *mut u8) {
            $m::prepare(c, b, dst)
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn amx_step(
            c: &Chunk,
            prepared: *const u8,
            b: usize,
            sums: *const u8,
            acc: *mut u8,
        ) {
            $m::step(c, prepared, b, sums, acc)
        }
    };
}

/// Q4_K (its own kernel, [`chunk_q4_k`]).
struct Q4K;

impl Format for Q4K {
    const BLOCKING: Blocking = q4_k::BLOCKING;
    const GROUP_BLOCK: usize = q4_k::GROUP_BLOCK;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn chunk<const M: usize>(c: &Chunk) {
        chunk_q4_k::<M>(c)
    }

    amx_kernel!(amx_q4_k);
}

/// Q6_K (its own kernel, [`chunk_q6_k`]; with `GFNI`, [`chunk_q6_k_gfni`], only where the CPU
/// has GFNI: the same bits).
struct Q6K<const GFNI: bool>;

impl<const GFNI: bool> Format for Q6K<GFNI> {
    const BLOCKING: Blocking = q6_k::BLOCKING;
    const GROUP_BLOCK: usize = q6_k::BLOCK * INTERLEAVE_ROWS;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn chunk<const M: usize>(c: &Chunk) {
        if GFNI {
            chunk_q6_k_gfni::<M>(c)
        } else {
            chunk_q6_k::<M>(c)
        }
    }

    amx_kernel!(amx_q6_k);
}

/// `kernels::InterleavedGemmFn` on AVX-512 VNNI for the format `F`.
///
/// # Safety
/// As `InterleavedGemmFn`; handed out only when the CPU has AVX-512 F/BW/VL/VNNI (and AVX2,
/// FMA, F16C).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<F: Format>(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    terms: &ActivationTerms,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let blocks = check_call(F::BLOCKING, k, w, rows, a, Some(terms), cols);
    if rows == 0 || cols == 0 {
        return;
    }
    // SAFETY: the lengths are checked above (whole groups of `blocks` blocks, `cols` activation
    // rows of `blocks` blocks, the terms of each); the caller vouches for `out` and the CPU.
    unsafe {
        groups::<F>(
            blocks,
            w.as_ptr(),
            rows / INTERLEAVE_ROWS,
            a.as_ptr(),
            cols,
            terms,
            out,
            ldo,
        )
    }
}

/// Every group of `w` against every activation row, 8 activation rows at a time per group.
///
/// # Safety
/// As [`gemm`] after its checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn groups<F: Format>(
    blocks: usize,
    w: *const u8,
    n_groups: usize,
    a: *const u8,
    cols: usize,
    terms: &ActivationTerms,
    out: *mut f32,
    ldo: usize,
) {
    let group_bytes = blocks * F::GROUP_BLOCK;
    let a_row = blocks * F::BLOCKING.a_block;
    let sums_row = blocks * F::BLOCKING.sums;
    let chunk_at = |g: usize, c0: usize| Chunk {
        blocks,
        w: w.add(g * group_bytes),
        a: a.add(c0 * a_row),
        a_row,
        sums: terms.sums.as_ptr().add(c0 * sums_row),
        da: terms.scales.as_ptr().add(c0 * blocks),
        out: out.add(c0 * ldo + g * INTERLEAVE_ROWS),
        ldo,
        // The first chunk of a group streams it from memory; the others find it in L1.
        prefetch: c0 == 0 && cols >= PREFETCH_MIN_ROWS,
    };
    let m_tiles = cols / AMX_TILE_ROWS;
    if F::AMX_PREPARED > 0 && !terms.tiles.is_empty() && super::amx::granted() {
        assert_eq!(
            terms.tiles.len(),
            m_tiles * blocks * F::AMX_TILES * TILE_LINES,
            "interleaved product: AMX tiles of other activations than the call's"
        );
        let tiles_at = terms.tiles.as_ptr().cast::<u8>();
        let tile_bytes = blocks * F::AMX_TILES * TILE_LINES * 64;
        // The scratch holds any format's prepared block.
        const { assert!(F::AMX_PREPARED <= 64 * AMX_PREPARED_LINES) };
        AMX_SCRATCH.with_borrow_mut(|scratch| {
            let AmxScratch {
                prepared,
                sums,
                acc,
            } = scratch;
            let prepared: *mut u8 = prepared.as_mut_ptr().cast();
            let acc: *mut u8 = acc.as_mut_ptr().cast();
            let sums_bufs = sums.each_mut().map(|s| s.as_mut_ptr().cast::<u8>());
            // SAFETY: granted above; the scratch holds a block's prepared bytes (the assertion
            // above) and two pairs' sums; the tiles' length was checked against the call's rows
            // and blocks.
            AMX_CONFIG.load();
            // A slice of the activations' tiles (`AMX_SLICE` tiles of 16 rows) stays in L2 while
            // the task's groups go past it. Each block of a group is unpacked (again per slice)
            // just before the slice's tiles run it, so its weight operands come from L1, not L2.
            // The tiles of a slice alternate between the two pairs of accumulators: a tile's
            // sums are stored after the first run of the next tile's products was issued (a
            // store waits for the products before it; right after its own it held back the
            // next tile's), and its f32 step runs after the next tile's products, so that the
            // vector units work while the tile unit does.
            for s0 in (0..m_tiles).step_by(AMX_SLICE) {
                let s1 = (s0 + AMX_SLICE).min(m_tiles);
                for g in 0..n_groups {
                    for b in 0..blocks {
                        F::amx_prepare(&chunk_at(g, 0), b, prepared);
                        // The f32 step of tile `m` from the sums of its pair `set`.
                        let step = |(m, set): (usize, usize)| {
                            let c = chunk_at(g, m * AMX_TILE_ROWS);
                            let acc = acc.add((m - s0) * AMX_TILE_ROWS * 64);
                            F::amx_step(&c, prepared, b, sums_bufs[set], acc);
                        };
                        // The tile (and its pair of accumulators) whose sums wait to be stored.
                        let mut pending: Option<(usize, usize)> = None;
                        for (i, m) in (s0..s1).enumerate() {
                            let set = i % 2;
                            let tile = tiles_at.add(m * tile_bytes);
                            amx_tile_products(tile, prepared, b, set, || {
                                if let Some((_, p_set)) = pending {
                                    amx_store_pair(p_set, sums_bufs[p_set]);
                                }
                            });
                            if let Some(p) = pending.replace((m, set)) {
                                step(p);
                            }
                        }
                        if let Some(p @ (_, p_set)) = pending {
                            amx_store_pair(p_set, sums_bufs[p_set]);
                            step(p);
                        }
                    }
                }
            }
            for g in 0..n_groups {
                vnni_chunks::<F>(cols, m_tiles * AMX_TILE_ROWS, |c0| chunk_at(g, c0));
            }
            super::amx::release();
        });
        return;
    }
    for g in 0..n_groups {
        vnni_chunks::<F>(cols, 0, |c0| chunk_at(g, c0));
    }
}

/// The activation rows `from..cols` of one group, 8 at a time through the VNNI kernel
/// (`chunk_at(c0)` names the group against the rows from `c0`).
///
/// # Safety
/// As [`groups`]: `chunk_at` names whole groups, rows and their terms, and writable outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni_chunks<F: Format>(cols: usize, from: usize, chunk_at: impl Fn(usize) -> Chunk) {
    {
        let mut c0 = from;
        while c0 < cols {
            let m = (cols - c0).min(8);
            let at = chunk_at(c0);
            match m {
                1 => F::chunk::<1>(&at),
                2 => F::chunk::<2>(&at),
                3 => F::chunk::<3>(&at),
                4 => F::chunk::<4>(&at),
                5 => F::chunk::<5>(&at),
                6 => F::chunk::<6>(&at),
                7 => F::chunk::<7>(&at),
                _ => F::chunk::<8>(&at),
            }
            c0 += m;
        }
    }
}

/// One group against `M` activation rows: where everything is.
struct Chunk {
    blocks: usize,
    /// The group's first byte.
    w: *const u8,
    /// The first activation row's first block.
    a: *const u8,
    a_row: usize,
    /// The first activation row's quant-sum terms and scales (rows `blocks * sums` and
    /// `blocks` apart, `sums` the format's terms per block).
    sums: *const i32,
    da: *const f32,
    /// Where the first activation row's 16 outputs go (rows `ldo` apart).
    out: *mut f32,
    ldo: usize,
    /// Whether the Q8_0/Q5_0 kernel requests, at each block, the weights `PREFETCH_DISTANCE`
    /// further on (`super::prefetch_ahead`).
    prefetch: bool,
}

/// The 16 rows of a group against `M` activation rows (see the module docs).
///
/// # Safety
/// `c` names a whole group, `M` activation rows and their terms, and writable outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn chunk<L: Lines, const M: usize>(c: &Chunk) {
    let offset = L::GEOMETRY.offset;
    let mut acc = [_mm512_setzero_ps(); M];
    let group_block = L::GEOMETRY.group_block();
    let row_prefetch = if M == 1 {
        super::row_prefetch_distance()
    } else {
        0
    };
    for b in 0..c.blocks {
        if c.prefetch {
            super::prefetch_ahead(c.w.add(b * group_block), group_block.div_ceil(64));
        } else if row_prefetch > 0 {
            super::prefetch_at(
                c.w.add(b * group_block),
                row_prefetch,
                group_block.div_ceil(64),
            );
        }
        let (scales, masks, quants) = L::GEOMETRY.block_at(c.blocks, b);
        let lines = L::lines(c.w.add(masks), c.w.add(quants));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.w.add(scales).cast()));
        // The activation rows' 4-quant chunks, broadcast from memory: row `j`, line `l`.
        let chunk = |j: usize, l: usize| {
            _mm512_set1_epi32(
                c.a.add(j * c.a_row + b * A_BLOCK + 2 + 4 * l)
                    .cast::<i32>()
                    .read_unaligned(),
            )
        };
        // One chain of 8 `vpdpbusd` per activation row, the rows' chains interleaved so that
        // consecutive instructions are independent; below 4 rows each row's chain is split in
        // two (even and odd lines), for enough chains in flight.
        let mut sums: [__m512i; M] =
            std::array::from_fn(|j| _mm512_set1_epi32(-offset * *c.sums.add(j * c.blocks + b)));
        if M >= 4 {
            for (l, line) in lines.iter().enumerate() {
                for (j, sum) in sums.iter_mut().enumerate() {
                    *sum = _mm512_dpbusd_epi32(*sum, *line, chunk(j, l));
                }
            }
        } else {
            let mut odd = [_mm512_setzero_si512(); M];
            for l in (0..8).step_by(2) {
                for j in 0..M {
                    sums[j] = _mm512_dpbusd_epi32(sums[j], lines[l], chunk(j, l));
                    odd[j] = _mm512_dpbusd_epi32(odd[j], lines[l + 1], chunk(j, l + 1));
                }
            }
            for j in 0..M {
                sums[j] = _mm512_add_epi32(sums[j], odd[j]);
            }
        }
        for (j, acc) in acc.iter_mut().enumerate() {
            let factor = _mm512_mul_ps(d, _mm512_set1_ps(*c.da.add(j * c.blocks + b)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[j]), factor, *acc);
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(c.out.add(j * c.ldo), *acc);
    }
}

/// The 16 rows' 6-bit scales and minimums of one Q4_K super-block of a group, unpacked lane by
/// lane from its 3 packed lines (as ggml's `get_scale_min_k4`, one row per lane).
struct Q4kScales {
    /// Each lane: its row's scales 0..4, then 4..8, a byte each.
    scales: [__m512i; 2],
    /// i16 pairs of minimums, in the order of `q4_k::MIN_PAIRS`.
    mins: [__m512i; 4],
}

/// [`Q4kScales`] of the super-block at `base` (a group's).
///
/// # Safety
/// `base` points at a whole super-block of a group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k_scales(base: *const u8) -> Q4kScales {
    let six = _mm512_set1_epi32(0x3f3f_3f3f);
    let four = _mm512_set1_epi32(0x0f0f_0f0f);
    let two = _mm512_set1_epi32(0x0303_0303);
    let pair = _mm512_set1_epi32(0x00ff_00ff);
    let packed = |l: usize| _mm512_loadu_si512(base.add(q4_k::SCALES + 64 * l).cast());
    let (u0, u1, u2) = (packed(0), packed(1), packed(2));
    let top2 =
        |u: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u), two));
    let mins_lo = _mm512_and_si512(u1, six);
    let mins_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(u2), four), top2(u1));
    Q4kScales {
        scales: [
            _mm512_and_si512(u0, six),
            _mm512_or_si512(_mm512_and_si512(u2, four), top2(u0)),
        ],
        mins: [
            _mm512_and_si512(mins_lo, pair),
            _mm512_and_si512(_mm512_srli_epi32::<8>(mins_lo), pair),
            _mm512_and_si512(mins_hi, pair),
            _mm512_and_si512(_mm512_srli_epi32::<8>(mins_hi), pair),
        ],
    }
}

/// Scale of sub-block `j` as one i32 per lane, from [`Q4kScales::scales`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k_scale(scales: &[__m512i; 2], j: usize) -> __m512i {
    let s = scales[j / 4];
    let shifted = match j % 4 {
        0 => s,
        1 => _mm512_srli_epi32::<8>(s),
        2 => _mm512_srli_epi32::<16>(s),
        _ => _mm512_srli_epi32::<24>(s),
    };
    _mm512_and_si512(shifted, _mm512_set1_epi32(0xff))
}

/// The 16 rows of a Q4_K group against `M` activation rows. Per super-block: the 16 rows' 6-bit
/// scales and minimums are unpacked lane by lane from the 3 packed lines (as ggml's
/// `get_scale_min_k4`, one row per lane); per chunk of 64 codes the 8 code lines are split into
/// the low and high nibbles (sub-blocks `2c` and `2c + 1`), and for each activation row 8
/// `vpdpbusd` per sub-block leave each row's exact sub-block sum in its lane, multiplied by the
/// row's scale and summed in i32 over the super-block (at most 8 * 63 * 32 * 15 * 127, far
/// inside i32). The minimums meet the activation's sub-block sums in 4 `vpdpwssd` of i16 pairs.
/// Then `acc += d * da * sum - dmin * da * mins` in f32.
///
/// # Safety
/// `c` names a whole group, `M` activation rows and their terms, and writable outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn chunk_q4_k<const M: usize>(c: &Chunk) {
    let low4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); M];
    let row_prefetch = if M == 1 {
        super::row_prefetch_distance()
    } else {
        0
    };
    for b in 0..c.blocks {
        let base = c.w.add(b * q4_k::GROUP_BLOCK);
        let Q4kScales { scales, mins } = q4_k_scales(base);
        let scale = |j: usize| q4_k_scale(&scales, j);
        let mut sums = [_mm512_setzero_si512(); M];
        for ch in 0..4 {
            // A quarter of the super-block's lines per chunk: the same requests, spread.
            if row_prefetch > 0 {
                const PART: usize = q4_k::GROUP_BLOCK / 64 / 4;
                super::prefetch_at(base.add(64 * PART * ch), row_prefetch, PART);
            }
            let codes = base.add(q4_k::CODES + 512 * ch);
            let lines: [__m512i; 8] =
                std::array::from_fn(|v| _mm512_loadu_si512(codes.add(64 * v).cast()));
            let lo: [__m512i; 8] = std::array::from_fn(|v| _mm512_and_si512(lines[v], low4));
            let hi: [__m512i; 8] =
                std::array::from_fn(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(lines[v]), low4));
            let (s_lo, s_hi) = (scale(2 * ch), scale(2 * ch + 1));
            // Activation row `$j`'s products with the chunk, into its sum `$sum`.
            macro_rules! row {
                ($j:expr, $sum:expr) => {{
                    let (j, sum): (usize, &mut __m512i) = ($j, $sum);
                    // Activation row `j`'s codes of this chunk (after its f32 scale).
                    let ar = c.a.add(j * c.a_row + b * q4_k::A_BLOCK + 4 + 64 * ch);
                    let quad =
                        |at: usize| _mm512_set1_epi32(ar.add(at).cast::<i32>().read_unaligned());
                    // Two chains per sub-block (even and odd lines), for enough in flight.
                    let mut lo_sum = [_mm512_setzero_si512(); 2];
                    let mut hi_sum = [_mm512_setzero_si512(); 2];
                    for v in 0..8 {
                        lo_sum[v % 2] = _mm512_dpbusd_epi32(lo_sum[v % 2], lo[v], quad(4 * v));
                        hi_sum[v % 2] = _mm512_dpbusd_epi32(hi_sum[v % 2], hi[v], quad(32 + 4 * v));
                    }
                    let lo_sum = _mm512_add_epi32(lo_sum[0], lo_sum[1]);
                    let hi_sum = _mm512_add_epi32(hi_sum[0], hi_sum[1]);
                    *sum = _mm512_add_epi32(
                        *sum,
                        _mm512_add_epi32(
                            _mm512_mullo_epi32(lo_sum, s_lo),
                            _mm512_mullo_epi32(hi_sum, s_hi),
                        ),
                    );
                }};
            }
            // The rows unrolled, so that their sums stay in registers (as a loop they went
            // through the stack at every chunk: 3-6 % of the kernel at 8 or more rows).
            macro_rules! rows {
                ($($j:literal)*) => {$(
                    if $j < M {
                        row!($j, &mut sums[$j.min(M - 1)]);
                    }
                )*};
            }
            rows!(0 1 2 3 4 5 6 7);
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(q4_k::DMIN).cast()));
        for (j, (acc, sum)) in acc.iter_mut().zip(&sums).enumerate() {
            let t = c.sums.add(q4_k::TERMS * (j * c.blocks + b));
            let mut m = _mm512_setzero_si512();
            for (p, pair) in mins.iter().enumerate() {
                m = _mm512_dpwssd_epi32(m, *pair, _mm512_set1_epi32(*t.add(p)));
            }
            let da = _mm512_set1_ps(*c.da.add(j * c.blocks + b));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*sum), _mm512_mul_ps(d, da), *acc);
            *acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, da), *acc);
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(c.out.add(j * c.ldo), *acc);
    }
}

/// The 4 scale lines of the Q6_K super-block at `base` (a group's, past its `d`s): lane `r` of
/// line `q` holds row `r`'s signed scales `4q..4q + 4`, a byte each.
///
/// # Safety
/// `base` points at a whole super-block of a group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_scale_lines(base: *const u8) -> [__m512i; 4] {
    std::array::from_fn(|q| _mm512_loadu_si512(base.add(64 * q).cast()))
}

/// Scale of group `g` as one i32 per lane (sign-extended), from [`q6_k_scale_lines`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6_k_scale(lines: &[__m512i; 4], g: usize) -> __m512i {
    let l = lines[g / 4];
    _mm512_srai_epi32::<24>(match g % 4 {
        0 => _mm512_slli_epi32::<24>(l),
        1 => _mm512_slli_epi32::<16>(l),
        2 => _mm512_slli_epi32::<8>(l),
        _ => l,
    })
}

/// Sign-extended i16 scale pairs, in the order of `q6_k::SCALE_PAIRS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6_k_pairs(lines: &[__m512i; 4]) -> [__m512i; 8] {
    std::array::from_fn(|p| {
        let l = lines[p / 2];
        if p % 2 == 0 {
            _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(l))
        } else {
            _mm512_srai_epi16::<8>(l)
        }
    })
}

/// Line `jj` of a Q6_K unit's `quarter` (codes `32 * quarter + 4jj..+4` of its half and
/// group): the codes' low 4 bits (each byte `0..16`) and a line whose bits 4-5 of each byte are
/// the codes' top 2 bits (the other bits unmasked).
///
/// # Safety
/// `unit` points at a whole unit of a group's super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_parts(unit: *const u8, quarter: usize, jj: usize) -> (__m512i, __m512i) {
    let low4 = _mm512_set1_epi8(0x0f);
    let qh = _mm512_loadu_si512(unit.add(64 * jj).cast());
    let ql = _mm512_loadu_si512(unit.add(q6_k::QL + 256 * (quarter % 2) + 64 * jj).cast());
    let low = if quarter < 2 {
        _mm512_and_si512(ql, low4)
    } else {
        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4)
    };
    // Bits `2 * quarter..+2` of each `qh` byte to bits 4-5.
    let high = match quarter {
        0 => _mm512_slli_epi16::<4>(qh),
        1 => _mm512_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm512_srli_epi16::<2>(qh),
    };
    (low, high)
}

/// The f32 step of a Q6_K super-block `b` for activation row `j` of `c`: the codes' offset of 32
/// off the exact sum `sum` (`32 * sum(scale * group sum)`, 8 `vpdpwssd` of the scale `pairs`
/// against the row's group sums), then [`q6_k_accumulate`].
///
/// # Safety
/// `c` names row `j`'s terms of super-block `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_step(
    c: &Chunk,
    j: usize,
    b: usize,
    sum: __m512i,
    pairs: &[__m512i; 8],
    d: __m512,
    acc: __m512,
) -> __m512 {
    let t = c
        .sums
        .add(q4_k::TERMS * (j * c.blocks + b) + q4_k::MIN_PAIRS.len());
    let mut offset = _mm512_setzero_si512();
    for (p, pair) in pairs.iter().enumerate() {
        offset = _mm512_dpwssd_epi32(offset, *pair, _mm512_set1_epi32(*t.add(p)));
    }
    let total = _mm512_sub_epi32(sum, _mm512_slli_epi32::<5>(offset));
    q6_k_accumulate(c, j, b, total, d, acc)
}

/// `acc + d * da * total` for activation row `j` of `c` and super-block `b` (`total` its exact
/// integer sum with the codes' offset off): the f32 step that the VNNI and AMX kernels of Q6_K
/// share, so that both give the same bits.
///
/// # Safety
/// `c` names row `j`'s terms of super-block `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_accumulate(
    c: &Chunk,
    j: usize,
    b: usize,
    total: __m512i,
    d: __m512,
    acc: __m512,
) -> __m512 {
    let da = _mm512_set1_ps(*c.da.add(j * c.blocks + b));
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, da), acc)
}

/// The 16 rows of a Q6_K group against `M` activation rows. Per super-block, half and quarter:
/// 4 code lines made from one `ql` line's low or high nibbles and the matching bit pair of a
/// `qh` line (one shift and one `vpternlogd` each: `low | (high & 0x30)`), then for each
/// activation row 4 `vpdpbusd` give each row's exact sum over a group of 16 unsigned codes,
/// multiplied by the row's signed scale and summed in i32 over the super-block (at most
/// 16 * 128 * 16 * 63 * 127 in magnitude, inside i32). The codes' offset of 32 comes off as
/// `32 * sum(scale * group sum)`, 8 `vpdpwssd` of sign-extended scale pairs against the
/// activation's group sums. Then `acc += d * da * sum` in f32.
///
/// # Safety
/// `c` names a whole group, `M` activation rows and their terms, and writable outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn chunk_q6_k<const M: usize>(c: &Chunk) {
    chunk_q6_k_impl::<M, false>(c)
}

/// [`chunk_q6_k`] with the code lines made by GFNI's bit-matrix transforms ([`q6_k_code_gfni`]):
/// the same codes, so the same bits, in fewer instructions.
///
/// # Safety
/// As [`chunk_q6_k`], and the CPU has GFNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn chunk_q6_k_gfni<const M: usize>(c: &Chunk) {
    chunk_q6_k_impl::<M, true>(c)
}

/// Line `jj` of a Q6_K unit's `quarter` as 6-bit codes (see [`q6_k_parts`]), through GFNI:
/// `vgf2p8affineqb` moves a byte's bits where the code wants them with the others zero, so one
/// `vpternlogd` joins the parts (2 instructions a line in three quarters of four, against 3 or
/// 4 with shifts and masks).
///
/// # Safety
/// `unit` points at a whole unit of a group's super-block; the CPU has GFNI and AVX-512 BW.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn q6_k_code_gfni(unit: *const u8, quarter: usize, jj: usize) -> __m512i {
    // A byte's bit matrix: output bit i is the parity of (row byte 7 - i) & input.
    const BITS01_TO_45: i64 = 0x0102_0000;
    const BITS23_TO_45: i64 = 0x0408_0000;
    const BITS67_TO_45: i64 = 0x4080_0000;
    const HIGH_NIBBLE_DOWN: i64 = 0x1020_4080_0000_0000;
    let qh = _mm512_loadu_si512(unit.add(64 * jj).cast());
    let ql = _mm512_loadu_si512(unit.add(q6_k::QL + 256 * (quarter % 2) + 64 * jj).cast());
    // A macro, not a closure: a closure is built without the caller's target features, and
    // the intrinsics in it became calls.
    macro_rules! affine {
        ($x:expr, $m:expr) => {
            _mm512_gf2p8affine_epi64_epi8::<0>($x, _mm512_set1_epi64($m))
        };
    }
    match quarter {
        // (ql & 0x0f) | high bits 0-1 (or 2-3) at 4-5.
        0 => {
            _mm512_ternarylogic_epi32::<0xea>(ql, _mm512_set1_epi8(0x0f), affine!(qh, BITS01_TO_45))
        }
        1 => {
            _mm512_ternarylogic_epi32::<0xea>(ql, _mm512_set1_epi8(0x0f), affine!(qh, BITS23_TO_45))
        }
        // ql's high nibble moved down | (qh & 0x30).
        2 => _mm512_ternarylogic_epi32::<0xf8>(
            affine!(ql, HIGH_NIBBLE_DOWN),
            qh,
            _mm512_set1_epi8(0x30),
        ),
        // ql's high nibble moved down | qh's bits 6-7 at 4-5.
        _ => _mm512_or_si512(affine!(ql, HIGH_NIBBLE_DOWN), affine!(qh, BITS67_TO_45)),
    }
}

/// [`chunk_q6_k`]'s body; `G`: the code lines through [`q6_k_code_gfni`].
#[inline(always)]
unsafe fn chunk_q6_k_impl<const M: usize, const G: bool>(c: &Chunk) {
    let bits45 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); M];
    let blocks_at = c.w.add(c.blocks * q6_k::D);
    let row_prefetch = if M == 1 {
        super::row_prefetch_distance()
    } else {
        0
    };
    for b in 0..c.blocks {
        let base = blocks_at.add(b * q6_k::GROUP_BLOCK);
        let scale_lines = q6_k_scale_lines(base);
        let mut sums = [_mm512_setzero_si512(); M];
        for n in 0..2 {
            for jh in 0..2 {
                if row_prefetch > 0 {
                    // A quarter of the super-block's lines per unit (see `chunk_q4_k`).
                    const PART: usize = (q6_k::GROUP_BLOCK / 64).div_ceil(4);
                    let part = base.add(64 * PART * (2 * n + jh));
                    super::prefetch_at(part, row_prefetch, PART);
                }
                let unit = base.add(q6_k::UNITS + (2 * n + jh) * q6_k::UNIT);
                for quarter in 0..4 {
                    // Code lines of codes `32 * quarter + 4j..+4` of the half, j = 4jh..4jh + 4:
                    // group `8n + 2 * quarter + jh`.
                    let codes: [__m512i; 4] = std::array::from_fn(|jj| {
                        if G {
                            return q6_k_code_gfni(unit, quarter, jj);
                        }
                        let (low, high) = q6_k_parts(unit, quarter, jj);
                        // low | (high & 0x30)
                        _mm512_ternarylogic_epi32::<0xf8>(low, high, bits45)
                    });
                    let sc = q6_k_scale(&scale_lines, 8 * n + 2 * quarter + jh);
                    for (j, sum) in sums.iter_mut().enumerate() {
                        let ar = c.a.add(
                            j * c.a_row + b * q4_k::A_BLOCK + 4 + 128 * n + 32 * quarter + 16 * jh,
                        );
                        let quad = |at: usize| {
                            _mm512_set1_epi32(ar.add(at).cast::<i32>().read_unaligned())
                        };
                        let mut e = [_mm512_setzero_si512(); 2];
                        for (jj, code) in codes.iter().enumerate() {
                            e[jj % 2] = _mm512_dpbusd_epi32(e[jj % 2], *code, quad(4 * jj));
                        }
                        let group = _mm512_add_epi32(e[0], e[1]);
                        *sum = _mm512_add_epi32(*sum, _mm512_mullo_epi32(group, sc));
                    }
                }
            }
        }
        let pairs = q6_k_pairs(&scale_lines);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.w.add(b * q6_k::D).cast()));
        for (j, (acc, sum)) in acc.iter_mut().zip(&sums).enumerate() {
            *acc = q6_k_step(c, j, b, *sum, &pairs, d, *acc);
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(c.out.add(j * c.ldo), *acc);
    }
}

/// The accumulator of activation row `j`'s 16 outputs before an AMX step adds block `b`: the
/// VNNI kernels keep theirs in registers from zero; the AMX steps keep them in a line of the
/// thread's scratch, `acc` (the same values: +0 first, then the same operations), and store
/// them to the outputs at the last block ([`amx_put`]). Not in the outputs themselves: an
/// output row is often a multiple of 4 KB long, so the 16 rows of a tile would share one set of
/// the L1 cache.
///
/// # Safety
/// `acc` addresses 16 lines of 16 floats (64-byte aligned), line `j` written by [`amx_put`] for
/// block `b - 1` where `b > 0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn amx_accumulator(acc: *const u8, j: usize, b: usize) -> __m512 {
    if b == 0 {
        _mm512_setzero_ps()
    } else {
        _mm512_load_ps(acc.add(64 * j).cast())
    }
}

/// Keeps row `j`'s accumulator after block `b` (see [`amx_accumulator`]): in line `j` of `acc`,
/// or in the row's outputs after the last block.
///
/// # Safety
/// As [`amx_accumulator`], with `acc` writable; `c` names writable outputs for row `j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn amx_put(c: &Chunk, acc: *mut u8, j: usize, b: usize, v: __m512) {
    if b + 1 == c.blocks {
        _mm512_storeu_ps(c.out.add(j * c.ldo), v)
    } else {
        _mm512_store_ps(acc.add(64 * j).cast(), v)
    }
}

/// Bytes of one run of 64 quants of a block's 16 weight rows or 16 activation rows as one tile
/// operand (16 lines of 64 bytes).
const AMX_RUN: usize = 1024;

/// Block `b` of a group against one tile of 16 activation rows (`tile`: its packed activations)
/// on the AMX tiles, into the pair of accumulators `set` (tiles `2 set` and `2 set + 1`, from
/// zero), for the formats whose prepared block starts with 4 runs of two weight operands (`lo`,
/// unsigned bytes, then `hi`, signed bytes, per run): the exact sums of both operands' products
/// with the activation quants over the super-block. The activation operand goes to tile
/// `4 + set`, the weight operands to 6 and 7. `between` runs after the first run's products: the
/// other pair's stores go there, so that they wait on products issued long before.
///
/// # Safety
/// `tile` points at the tile's packed activations (`ActivationTerms`); `prepared` holds
/// [`Format::amx_prepare`]'s output for block `b` of the group; the tile configuration
/// [`AMX_CONFIG`] is loaded on this thread.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn amx_tile_products(
    tile: *const u8,
    prepared: *const u8,
    b: usize,
    set: usize,
    between: impl FnOnce(),
) {
    use super::amx;
    amx::zero_pair(set);
    let mut between = Some(between);
    for run in 0..4 {
        amx::load(4 + set, tile.add((b * 4 + run) * AMX_RUN), 64);
        amx::load(6, prepared.add(2 * AMX_RUN * run), 64);
        amx::load(7, prepared.add(2 * AMX_RUN * run + AMX_RUN), 64);
        amx::product(set, 0);
        amx::product(set, 1);
        if let Some(f) = between.take() {
            f();
        }
    }
}

/// Stores the pair of accumulators `set` (see [`amx_tile_products`]) at `sums`: `lo`'s 16 x 16
/// i32 and then `hi`'s.
///
/// # Safety
/// The tile configuration [`AMX_CONFIG`] is loaded on this thread; `sums` is writable for
/// `2 * AMX_RUN` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn amx_store_pair(set: usize, sums: *mut u8) {
    use super::amx;
    amx::store(2 * set, sums, 64);
    amx::store(2 * set + 1, sums.add(AMX_RUN), 64);
}

/// The AMX kernel of Q4_K: the exact super-block sums of [`chunk_q4_k`] from tiles.
///
/// `chunk_q4_k` forms, per super-block and row pair, `sum over sub-blocks s of scale[s] * (sum
/// of 32 code x quant products)`. Splitting each 6-bit scale as `16 * hi + lo` (`lo < 16`,
/// `hi < 4`) makes two weight operands of bytes, `code * lo` (at most 225) and `code * hi` (at
/// most 45), whose plain products with the activation quants over the whole super-block are
/// `S_lo` and `S_hi`, and the sum is exactly `S_lo + 16 * S_hi`: no scaling per sub-block, so
/// one tile product covers 64 quants (two sub-blocks) and a super-block is 4 of them per operand,
/// accumulated in the tiles ([`amx_tile_products`]; `hi` is below 128, so its signed product is
/// the same). `prepare` makes both operands of a group's block once per slice
/// of activation rows (a byte times a small factor per 32-bit lane is one `vpmulld`: no product
/// carries into the next byte) with the minimums' i16 pairs and `d`, `dmin` as `chunk_q4_k`
/// makes them; `step` then does `chunk_q4_k`'s exact integer and f32 steps from the stored
/// sums, so every output has its bits.
mod amx_q4_k {
    use std::arch::x86_64::*;

    use super::{q4_k, q4_k_scale, q4_k_scales, Chunk, Q4kScales, AMX_RUN as RUN};

    /// Where the minimum pairs (4 vectors), `d` and `dmin` start: after 4 runs of both
    /// operands (`lo` then `hi` per run).
    const MINS: usize = 8 * RUN;
    const D: usize = MINS + 4 * 64;
    const DMIN: usize = D + 64;
    /// Bytes of one prepared super-block.
    pub(super) const PREPARED: usize = DMIN + 64;

    /// Makes the weight operands of block `b` of the group (see the module docs).
    ///
    /// # Safety
    /// `c` names a whole group and `b < c.blocks`; `dst` is 64-byte aligned and writable for
    /// `PREPARED` bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn prepare(c: &Chunk, b: usize, dst: *mut u8) {
        let low4 = _mm512_set1_epi8(0x0f);
        let nib = _mm512_set1_epi32(0x0f);
        let base = c.w.add(b * q4_k::GROUP_BLOCK);
        let put = |at: usize, v: __m512i| _mm512_store_si512(dst.add(at).cast(), v);
        let Q4kScales { scales, mins } = q4_k_scales(base);
        let scale = |j: usize| q4_k_scale(&scales, j);
        for run in 0..4 {
            let codes = base.add(q4_k::CODES + 512 * run);
            // Sub-blocks `2 run` (low nibbles: lines 0..8 of the operands) and `2 run + 1`
            // (high nibbles: lines 8..16).
            for (half, sc) in [scale(2 * run), scale(2 * run + 1)].into_iter().enumerate() {
                let (lo, hi) = (_mm512_and_si512(sc, nib), _mm512_srli_epi32::<4>(sc));
                for v in 0..8 {
                    let line = _mm512_loadu_si512(codes.add(64 * v).cast());
                    let q = if half == 0 {
                        _mm512_and_si512(line, low4)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(line), low4)
                    };
                    let at = 2 * RUN * run + 64 * (8 * half + v);
                    put(at, _mm512_mullo_epi32(q, lo));
                    put(at + RUN, _mm512_mullo_epi32(q, hi));
                }
            }
        }
        for (p, pair) in mins.iter().enumerate() {
            put(MINS + 64 * p, *pair);
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(q4_k::DMIN).cast()));
        _mm512_store_ps(dst.add(D).cast(), d);
        _mm512_store_ps(dst.add(DMIN).cast(), dmin);
    }

    /// The f32 step of block `b` for the 16 rows of `c`: `chunk_q4_k`'s, from the sums.
    ///
    /// # Safety
    /// As `Format::amx_step`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn step(
        c: &Chunk,
        prepared: *const u8,
        b: usize,
        sums: *const u8,
        acc: *mut u8,
    ) {
        let vec = |p: *const u8, at: usize| _mm512_load_si512(p.add(at).cast());
        let blocks = c.blocks;
        let d = _mm512_load_ps(prepared.add(D).cast());
        let dmin = _mm512_load_ps(prepared.add(DMIN).cast());
        let pairs: [__m512i; 4] = std::array::from_fn(|p| vec(prepared, MINS + 64 * p));
        for j in 0..16 {
            let sum = _mm512_add_epi32(
                vec(sums, 64 * j),
                _mm512_slli_epi32::<4>(vec(sums, RUN + 64 * j)),
            );
            let t = c.sums.add(q4_k::TERMS * (j * blocks + b));
            let mut mins = _mm512_setzero_si512();
            for (p, pair) in pairs.iter().enumerate() {
                mins = _mm512_dpwssd_epi32(mins, *pair, _mm512_set1_epi32(*t.add(p)));
            }
            let da = _mm512_set1_ps(*c.da.add(j * blocks + b));
            let v = super::amx_accumulator(acc, j, b);
            let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, da), v);
            let v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, da), v);
            super::amx_put(c, acc, j, b, v);
        }
    }
}

/// The AMX kernel of Q6_K: the exact super-block sums of [`chunk_q6_k`] from tiles.
///
/// `chunk_q6_k` forms, per super-block and row pair, `sum over groups g of scale[g] * (sum of 16
/// code x quant products)`, the codes 6-bit (`0..64`, the quant plus 32) and the scales signed
/// bytes, and takes the codes' offset off as `32 * sum(scale * group sum)`. Here each weight is
/// `p = (code - 32) * scale` (at most 4096 in magnitude), split as `p = 128 * hi + lo` (`lo =
/// p & 127`, `hi = p >> 7` in `-32..=32`) into two weight operands of bytes, `lo` unsigned
/// (`tdpbsud`) and `hi` signed (`tdpbssd`), whose plain products with the activation quants over
/// the whole super-block are exact with no scaling per group: `S_lo + 128 * S_hi` is
/// `chunk_q6_k`'s integer total (its sum less the offset) exactly, with no offset term to take
/// off. 8 tile products per super-block and tile of activation rows, as Q4_K's
/// ([`amx_tile_products`]). `prepare` makes both operands of a group's block once per slice of
/// activation rows (each code less 32 times its row's scale in 16-bit lanes, split into the two
/// bytes) and `d`; `step` then does `chunk_q6_k`'s f32 step, so every output has its bits.
mod amx_q6_k {
    use std::arch::x86_64::*;

    use super::{q6_k, q6_k_accumulate, q6_k_parts, q6_k_scale, q6_k_scale_lines};
    use super::{Chunk, AMX_RUN as RUN};

    /// Where `d` starts: after 4 runs of both operands (`lo` then `hi` per run).
    const D: usize = 8 * RUN;
    /// Bytes of one prepared super-block.
    pub(super) const PREPARED: usize = D + 64;

    /// Makes the weight operands of block `b` of the group (see the module docs).
    ///
    /// # Safety
    /// `c` names a whole group and `b < c.blocks`; `dst` is 64-byte aligned and writable for
    /// `PREPARED` bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn prepare(c: &Chunk, b: usize, dst: *mut u8) {
        let bits45 = _mm512_set1_epi8(0x30);
        let low16 = _mm512_set1_epi32(0xffff);
        let even = _mm512_set1_epi16(0x00ff);
        let offset = _mm512_set1_epi16(32);
        let low7 = _mm512_set1_epi8(0x7f);
        let blocks_at = c.w.add(c.blocks * q6_k::D);
        let base = blocks_at.add(b * q6_k::GROUP_BLOCK);
        let put = |at: usize, v: __m512i| _mm512_store_si512(dst.add(at).cast(), v);
        let scale_lines = q6_k_scale_lines(base);
        for run in 0..4 {
            // Quants `64 run..+64` of the super-block: half `n`, quarters `2 (run % 2)` and
            // the next; line `v` of the run holds quants `64 run + 4v..+4`, of group
            // `4 run + v / 4`.
            let n = run / 2;
            for v in 0..16 {
                let (quarter, jh, jj) = (2 * (run % 2) + v / 8, (v / 4) % 2, v % 4);
                let unit = base.add(q6_k::UNITS + (2 * n + jh) * q6_k::UNIT);
                let (ql, high) = q6_k_parts(unit, quarter, jj);
                let code = _mm512_ternarylogic_epi32::<0xf8>(ql, high, bits45);
                // The row's scale in both 16-bit halves of its lane.
                let sc = q6_k_scale(&scale_lines, 4 * run + v / 4);
                let sc = _mm512_ternarylogic_epi32::<0xf8>(_mm512_slli_epi32::<16>(sc), sc, low16);
                // The even and odd quants' products in 16-bit lanes (`|p| <= 4096`).
                let qe = _mm512_sub_epi16(_mm512_and_si512(code, even), offset);
                let qo = _mm512_sub_epi16(_mm512_srli_epi16::<8>(code), offset);
                let pe = _mm512_mullo_epi16(qe, sc);
                let po = _mm512_mullo_epi16(qo, sc);
                // Bytes back in place: `p & 127` (blend by `even`: the even product's low
                // byte, the odd one's shifted up) and `p >> 7` (bits 7..15 of each).
                let lo = _mm512_ternarylogic_epi32::<0xd8>(_mm512_slli_epi16::<8>(po), pe, even);
                let hi = _mm512_ternarylogic_epi32::<0xd8>(
                    _mm512_slli_epi16::<1>(po),
                    _mm512_srli_epi16::<7>(pe),
                    even,
                );
                let at = 2 * RUN * run + 64 * v;
                put(at, _mm512_and_si512(lo, low7));
                put(at + RUN, hi);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.w.add(b * q6_k::D).cast()));
        _mm512_store_ps(dst.add(D).cast(), d);
    }

    /// The f32 step of block `b` for the 16 rows of `c`: `chunk_q6_k`'s (`acc + d * da *
    /// total`), from the sums.
    ///
    /// # Safety
    /// As `Format::amx_step`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn step(
        c: &Chunk,
        prepared: *const u8,
        b: usize,
        sums: *const u8,
        acc: *mut u8,
    ) {
        let vec = |p: *const u8, at: usize| _mm512_load_si512(p.add(at).cast());
        let d = _mm512_load_ps(prepared.add(D).cast());
        for j in 0..16 {
            let total = _mm512_add_epi32(
                vec(sums, 64 * j),
                _mm512_slli_epi32::<7>(vec(sums, RUN + 64 * j)),
            );
            let v = q6_k_accumulate(c, j, b, total, d, super::amx_accumulator(acc, j, b));
            super::amx_put(c, acc, j, b, v);
        }
    }
}
