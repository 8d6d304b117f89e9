//! AVX2 products over the interleaved layouts (`kernels::interleaved`), bit-identical to the
//! AVX2 tile kernels of their formats, hence to the tile-exact one-row products: batch-invariant
//! mode may mix them, and at the AVX2 level a weight can be held in the layout.
//!
//! The layouts' 64-byte lines hold the same 4 quants of 16 rows, 4 bytes a row: each 32-byte
//! half of a line is, once its quants are unpacked, a line of a tile panel (8 rows, one per
//! 32-bit lane). So a product runs one of two ways ([`gemm`]):
//!
//! - **Few activation rows** (decode: below the tile's `MIN_COLS`): [`Layout::direct`] reads
//!   each group's lines where they lie, unpacks them in registers and runs the tile's arithmetic
//!   on them for one activation row, both halves of the group side by side (each broadcast of
//!   activation quants serves 16 rows). The file layout's one-row kernel instead reduces each
//!   row's 8 lanes per block and gathers the rows' scales one by one (`rows_exact`): about
//!   twice the vector instructions per weight, which bound decode by arithmetic, not memory.
//! - **More rows**: [`Layout::pack`] unpacks a group into the two 8-row panels that the tile
//!   format's `pack` makes of the same rows in the file layout (no transposes: the layout is
//!   already the panels'), and the tile kernel runs on them.
//!
//! Both form the tile's exact i32 sums and then its f32 steps in its order, so every value has
//! the tile's bits (`tests/gemm.rs` compares them bit for bit). The layouts' kernels are in
//! `superblocks::interleaved` (Q4_K) and `blocks32::interleaved` (Q5_0), the formats whose
//! kernels here beat the file layout's (docs/BENCHMARKS.md has what Q6_K's gave, and what
//! Q5_0's gave before its fifth bits were stored transposed). Activation terms
//! (`kernels::interleaved_uses_terms`) are read by the direct kernels alone.

use std::arch::x86_64::*;

use kiln_core::GgmlType;

use super::{tiles, Call, Format, Line, Shape, PANEL_ROWS, SCRATCH};
use crate::kernels::interleaved::{check_call, ActivationTerms, Blocking, INTERLEAVE_ROWS};
use crate::kernels::InterleavedGemmFn;

/// The AVX2 product over `ty`'s interleaved layout (`kernels::InterleavedGemmFn`; to be handed
/// out only on a CPU with AVX2, FMA and F16C) and the activation rows from which it packs panels
/// (and reads no activation terms), where `ty` has one: Q4_K, Q5_0 (in its AVX2 form).
pub(in crate::kernels::x86) fn product(ty: GgmlType) -> Option<(InterleavedGemmFn, usize)> {
    fn of<L: Layout>() -> (InterleavedGemmFn, usize) {
        (gemm::<L>, L::MIN_COLS)
    }
    match ty {
        GgmlType::Q4_K => Some(of::<super::superblocks::Q4Layout>()),
        GgmlType::Q5_0 => Some(of::<super::blocks32::Q5Layout>()),
        _ => None,
    }
}

/// Activation rows per tile pass over a packed group: their quants over one slice of the panels
/// stay in L2 (as `matmul`'s `ACT_TILE` keeps the file layout's tile calls).
const COL_TILE: usize = 128;

/// An interleaved layout with AVX2 kernels.
pub(super) trait Layout {
    /// The tile format whose bits the products give: an AVX2 one, of two panels a tile
    /// (`Shape::Wide`: one panel a half of the group, both run at once) or of one
    /// (`Shape::Narrow`: the halves run one after the other).
    type F: Format;
    const BLOCKING: Blocking;
    /// Fewest activation rows that go through the packed panels and the tile kernel.
    const MIN_COLS: usize;

    /// Unpacks half `h` (rows `8h..8h + 8`) of block `b` of the group at `group` (of `blocks`
    /// blocks) into the tile panel block at `dst`: the bytes the tile format's `pack` writes
    /// for those 8 rows in the file layout.
    ///
    /// # Safety
    /// AVX2; `group` points at a whole group, `b < blocks`, `dst` at `PANEL_LINES` writable
    /// lines.
    unsafe fn pack(group: *const u8, blocks: usize, b: usize, h: usize, dst: *mut u8);

    /// The 16 rows of the group at `group` against one activation row: `out[8h..8h + 8]` for
    /// both halves `h`.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `group` points at a whole group of `blocks` blocks; `a` at the activation
    /// row's `blocks` blocks, `terms` are the call's, `t0` the index of the row's first block in
    /// them; `out..out + 16` writable.
    unsafe fn direct(
        group: *const u8,
        blocks: usize,
        a: *const u8,
        terms: &ActivationTerms,
        t0: usize,
        out: *mut f32,
    );
}

/// The product of layout `L` (`kernels::InterleavedGemmFn`): [`Layout::direct`] below
/// `L::MIN_COLS` activation rows, else the packed panels through the tile kernel.
///
/// # Safety
/// As `InterleavedGemmFn`, on a CPU with AVX2, FMA and F16C.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<L: Layout>(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    terms: &ActivationTerms,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    const { assert!(!matches!(L::F::SHAPE, Shape::Big) && !L::F::VNNI) };
    // The terms are read by the direct kernel alone.
    let direct = cols < L::MIN_COLS;
    let blocks = check_call(L::BLOCKING, k, w, rows, a, direct.then_some(terms), cols);
    if rows == 0 || cols == 0 {
        return;
    }
    let groups = rows / INTERLEAVE_ROWS;
    let group_bytes = blocks * L::BLOCKING.block * INTERLEAVE_ROWS;
    let a_row = blocks * L::F::A_BLOCK;
    let fw = L::F::FACTOR_WORDS;
    if direct {
        for g in 0..groups {
            for c in 0..cols {
                // SAFETY: `check_call` checked that `w` holds `groups` groups of `blocks` blocks,
                // `a` `cols` activation rows of as many blocks and `terms` theirs; the caller
                // vouches for `out` and the CPU.
                unsafe {
                    L::direct(
                        w.as_ptr().add(g * group_bytes),
                        blocks,
                        a.as_ptr().add(c * a_row),
                        terms,
                        c * blocks,
                        out.add(c * ldo + g * INTERLEAVE_ROWS),
                    )
                };
            }
        }
        return;
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let words = cols * blocks * fw;
        if scratch.factors.len() < words {
            scratch.factors.resize(words, 0);
        }
        let factors = scratch.factors.as_mut_ptr();
        // SAFETY: as above; the factors were just sized for `cols` rows of `blocks` blocks.
        unsafe {
            for c in 0..cols {
                for b in 0..blocks {
                    let y = a.as_ptr().add(c * a_row + b * L::F::A_BLOCK);
                    L::F::factors(y, factors.add((c * blocks + b) * fw));
                }
            }
        }
        let panel_block = L::F::PANEL_LINES * 32;
        let lines = 2 * blocks * L::F::PANEL_LINES;
        if scratch.panels.len() < lines {
            scratch.panels.resize(lines, Line([0; 32]));
        }
        let accs = COL_TILE.min(cols) * 2;
        if scratch.accs.len() < accs {
            scratch.accs.resize(accs, Line([0; 32]));
        }
        let panels: *mut u8 = scratch.panels.as_mut_ptr().cast();
        let accs: *mut __m256 = scratch.accs.as_mut_ptr().cast();
        // SAFETY: as above; the scratch was just sized for two panels of `blocks` blocks and
        // `COL_TILE` rows' sums of two panels.
        unsafe {
            // Two panels a tile: block `b`'s two halves side by side; one: each half's blocks
            // in a run of their own (the tile kernels' panel order). A group's panels are
            // packed once for every activation row (repacking them per slice of `COL_TILE` rows,
            // as the file layout's tile calls do, made a one-panel format's products at 512
            // rows 1.15x as long).
            let wide = L::F::SHAPE.panels() == 2;
            let at = |b: usize, h: usize| if wide { 2 * b + h } else { h * blocks + b };
            for g in 0..groups {
                let group = w.as_ptr().add(g * group_bytes);
                for b in 0..blocks {
                    for h in 0..2 {
                        L::pack(group, blocks, b, h, panels.add(at(b, h) * panel_block));
                    }
                }
                for c0 in (0..cols).step_by(COL_TILE) {
                    let f = factors.add(c0 * blocks * fw);
                    let call = |h: usize, rows: usize| Call {
                        blocks,
                        w: std::ptr::null(),
                        w_row: 0,
                        rows,
                        a: a.as_ptr().add(c0 * a_row),
                        a_row,
                        cols: COL_TILE.min(cols - c0),
                        out: out.add(c0 * ldo + g * INTERLEAVE_ROWS + h * PANEL_ROWS),
                        ldo,
                    };
                    if wide {
                        tiles_avx2::<L::F, 2, 2>(&call(0, INTERLEAVE_ROWS), panels, f, accs);
                    } else {
                        for h in 0..2 {
                            let half = panels.add(at(0, h) * panel_block);
                            tiles_avx2::<L::F, 1, 4>(&call(h, PANEL_ROWS), half, f, accs);
                        }
                    }
                }
            }
        }
    })
}

/// The tile passes over packed panels of a group (both halves at once, NP = 2, or one half,
/// NP = 1), compiled for AVX2 so that the tile kernel inlines.
///
/// # Safety
/// As `tiles::<F, NP, NR>` with `r0 = 0`: `call` describes the rows of the panels (16 or 8),
/// the activation rows and outputs; `panels` holds their packed panels; `factors` and `accs`
/// are sized.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<F: Format, const NP: usize, const NR: usize>(
    call: &Call,
    panels: *const u8,
    factors: *const u32,
    accs: *mut __m256,
) {
    tiles::<F, NP, NR>(call, panels, factors, 0, accs)
}
