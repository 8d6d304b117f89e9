//! The interleaved layouts of Q8_0 and Q5_0: groups of [`INTERLEAVE_ROWS`] weight rows stored so
//! that one 64-byte line holds the same 4 quants of every row of the group.
//!
//! A quantized matrix stores each row's blocks one after the other (a 2-byte f16 scale, then the
//! 32 quants). A one-row product over it has to reduce every block's 32 products to one number
//! before it can apply the block's scale, a row at a time, which bounded decode's products by
//! arithmetic, not memory, on a fast-memory host. In these layouts the quants of 16 rows are
//! interleaved 4 at a time: `vpdpbusd` of one 64-byte line against the matching 4 activation
//! quants (broadcast) adds 4 products into each row's own 32-bit lane, so after the 8 lines of a
//! block every lane holds its row's exact block sum, and one conversion and one multiply-add by
//! the 16 rows' scales (one 32-byte load) finish the block for all 16 rows. One thread, weights
//! in cache, Q8_0 rows of 640 (`examples/interleave_bench`): 6.6 ns per 16 rows and block for one
//! activation row against 12.3 for the file layout's one-row kernel, 3.0 against 3.7 per
//! activation row with 8 of them (the narrow kernel), 3.0 against 3.2 with 64 (the tile kernel).
//!
//! A group of 16 rows of `B` blocks takes exactly the bytes of the 16 rows in the file (`16 *
//! B * block bytes`: the interleaved matrix takes the same memory), and is one stream read front
//! to back, blocks in pairs:
//! - the 16 rows' f16 scales of the pair's first block (32 bytes, row `i`'s at `2 * i`), then
//!   those of its second block;
//! - (Q5_0) the high bits of the first block (64 bytes), then of the second: 8 little-endian
//!   u64 masks, mask `c` with bit `4 * i + t` the fifth bit of quant `4c + t` of row `i` (the
//!   byte mask of line `c` below, for one masked add);
//! - the quants of the first block, then of the second. Q8_0: 8 lines of 64 bytes, line `c`
//!   holding at `4 * i` the quants `4c..4c + 4` of row `i`, each as the unsigned byte `q + 128`
//!   (the unsigned operand of `vpdpbusd`). Q5_0: 4 lines of 64 bytes, line `v` holding at `4 * i`
//!   row `i`'s packed bytes `4v..4v + 4`, whose low nibbles are quants `4v..4v + 4` and high
//!   nibbles quants `16 + 4v..16 + 4v + 4`, unsigned `q + 16` with the fifth bit from the masks.
//!   The kernel removes the offset (128, 16) with `offset * sum(a)` per activation block.
//! - An odd `B`'s last block stands alone, its parts in the same order.
//!
//! Scales and quants in one stream matter: with each group's scales in a region of their own
//! after its quants, every group began with demand misses on scale lines that no prefetch had
//! asked for, and decode's output projection ran 30% slower than in the file layout. Nor is there
//! a software prefetch: the hardware's, on one stream, did better (the output projection 3.1-3.3
//! ms a token without, 3.5-3.8 with a prefetch 4-8 KB ahead). A group that starts 64-byte aligned
//! keeps every quant line aligned (with an even `B`).

use kiln_core::GgmlType;

/// Weight rows per group of the interleaved layout (one 32-bit lane each in a 512-bit register).
pub const INTERLEAVE_ROWS: usize = 16;

/// Quants per block of both formats.
const QK: usize = 32;
/// Bytes of a block's scales for a whole group.
const SCALES: usize = INTERLEAVE_ROWS * 2;

/// Where the parts of one format's blocks sit in the interleaved layout.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    /// Bytes of one block of one row in the file.
    pub(super) block: usize,
    /// Bytes of a block's high-bit masks for a whole group (0 for Q8_0).
    pub(super) masks: usize,
    /// Bytes of a block's quants for a whole group.
    pub(super) quants: usize,
    /// What the unsigned quants carry beyond the value: removed as `offset * sum(a)`.
    pub(super) offset: i32,
}

pub(super) const Q8_0: Geometry = Geometry {
    block: 34,
    masks: 0,
    quants: INTERLEAVE_ROWS * QK,
    offset: 128,
};

pub(super) const Q5_0: Geometry = Geometry {
    block: 22,
    masks: 64,
    quants: INTERLEAVE_ROWS * QK / 2,
    offset: 16,
};

/// The geometry of `ty`, where it has an interleaved layout.
fn geometry(ty: GgmlType) -> Option<Geometry> {
    match ty {
        GgmlType::Q8_0 => Some(Q8_0),
        GgmlType::Q5_0 => Some(Q5_0),
        _ => None,
    }
}

impl Geometry {
    /// Bytes of one block of a whole group (16 rows' worth of file bytes).
    pub(super) fn group_block(self) -> usize {
        self.block * INTERLEAVE_ROWS
    }

    /// Where block `b`'s scales, masks and quants start inside a group of `blocks` blocks.
    #[inline]
    pub(super) fn block_at(self, blocks: usize, b: usize) -> (usize, usize, usize) {
        let base = b / 2 * 2 * self.group_block();
        if b / 2 < blocks / 2 {
            let h = b % 2;
            let masks = base + 2 * SCALES;
            let quants = masks + 2 * self.masks;
            (
                base + SCALES * h,
                masks + self.masks * h,
                quants + self.quants * h,
            )
        } else {
            (base, base + SCALES, base + SCALES + self.masks)
        }
    }
}

/// Whether [`interleave`] takes weights of `ty` (Q8_0, Q5_0).
pub fn has_interleaved_layout(ty: GgmlType) -> bool {
    geometry(ty).is_some()
}

/// The geometry of `ty` and the blocks of a row of `k` elements; panics when `ty` has no
/// interleaved layout or `k` is not a positive multiple of 32.
fn shape(ty: GgmlType, k: usize) -> (Geometry, usize) {
    let g = geometry(ty).unwrap_or_else(|| panic!("{ty} has no interleaved layout"));
    assert!(
        k > 0 && k.is_multiple_of(QK),
        "interleaved {ty}: a row of {k} is not a whole number of blocks"
    );
    (g, k / QK)
}

/// 4 bytes of `bytes` at `at`, as a little-endian u32.
#[inline]
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Writes rows `src` of `ty` (rows of `k` elements, a multiple of [`INTERLEAVE_ROWS`] of them)
/// into `dst` in the interleaved layout. Panics when `ty` has none or the lengths disagree
/// (`dst` must be as long as `src`, and `src` whole groups of rows).
pub fn interleave(ty: GgmlType, k: usize, src: &[u8], dst: &mut [u8]) {
    let (g, blocks) = shape(ty, k);
    let group = blocks * g.group_block();
    assert!(
        src.len() == dst.len() && src.len().is_multiple_of(group),
        "interleaved {ty}: {} bytes into {} for groups of {group}",
        src.len(),
        dst.len()
    );
    let row_bytes = blocks * g.block;
    for (rows, out) in src.chunks_exact(group).zip(dst.chunks_exact_mut(group)) {
        if g.masks > 0 {
            out.fill(0); // the masks are built bit by bit
        }
        for i in 0..INTERLEAVE_ROWS {
            let row = &rows[i * row_bytes..(i + 1) * row_bytes];
            for (b, block) in row.chunks_exact(g.block).enumerate() {
                let (scales, masks, quants) = g.block_at(blocks, b);
                out[scales + 2 * i..][..2].copy_from_slice(&block[..2]);
                if g.masks == 0 {
                    for c in 0..QK / 4 {
                        let at = quants + 64 * c + 4 * i;
                        let q = word(block, 2 + 4 * c) ^ 0x8080_8080;
                        out[at..at + 4].copy_from_slice(&q.to_le_bytes());
                    }
                } else {
                    let qh = word(block, 2);
                    for c in 0..QK / 4 {
                        let bits = u64::from((qh >> (4 * c)) & 0xf) << (4 * i);
                        let at = masks + 8 * c;
                        let mask = u64::from_le_bytes(out[at..at + 8].try_into().unwrap()) | bits;
                        out[at..at + 8].copy_from_slice(&mask.to_le_bytes());
                    }
                    for v in 0..4 {
                        let at = quants + 64 * v + 4 * i;
                        out[at..at + 4].copy_from_slice(&block[6 + 4 * v..][..4]);
                    }
                }
            }
        }
    }
}

/// Row `r` of an interleaved matrix `w` of `ty` (rows of `k` elements), written back as the row
/// it came from into `dst` (one row's bytes). Panics when `r` is not a row of `w` or the lengths
/// disagree.
pub fn interleaved_row(ty: GgmlType, k: usize, w: &[u8], r: usize, dst: &mut [u8]) {
    let (g, blocks) = shape(ty, k);
    let group = blocks * g.group_block();
    assert!(
        dst.len() == blocks * g.block
            && w.len().is_multiple_of(group)
            && r < w.len() / group * INTERLEAVE_ROWS,
        "interleaved {ty}: row {r} of {} bytes into {}",
        w.len(),
        dst.len()
    );
    let grp = &w[r / INTERLEAVE_ROWS * group..][..group];
    let i = r % INTERLEAVE_ROWS;
    for (b, block) in dst.chunks_exact_mut(g.block).enumerate() {
        let (scales, masks, quants) = g.block_at(blocks, b);
        block[..2].copy_from_slice(&grp[scales + 2 * i..][..2]);
        if g.masks == 0 {
            for c in 0..QK / 4 {
                let q = word(grp, quants + 64 * c + 4 * i) ^ 0x8080_8080;
                block[2 + 4 * c..][..4].copy_from_slice(&q.to_le_bytes());
            }
        } else {
            let mut qh = 0u32;
            for c in 0..QK / 4 {
                let at = masks + 8 * c;
                let mask = u64::from_le_bytes(grp[at..at + 8].try_into().unwrap());
                qh |= (((mask >> (4 * i)) & 0xf) as u32) << (4 * c);
            }
            block[2..6].copy_from_slice(&qh.to_le_bytes());
            for v in 0..4 {
                block[6 + 4 * v..][..4].copy_from_slice(&grp[quants + 64 * v + 4 * i..][..4]);
            }
        }
    }
}

/// What the interleaved products need of Q8_0 activation rows beyond their quants, made once
/// per product by [`activation_terms`] and shared by its tasks: per block, the sum of its quants
/// (the kernels remove the weights' offset with it) and its scale as f32, `[c * blocks + b]`.
#[derive(Clone, Debug, Default)]
pub struct ActivationTerms {
    pub(super) sums: Vec<i32>,
    pub(super) scales: Vec<f32>,
}

/// The [`ActivationTerms`] of Q8_0 activation rows `a` (whole blocks; a trailing partial block
/// is ignored, and the product's length check then fails).
pub fn activation_terms(a: &[u8]) -> ActivationTerms {
    let blocks = a.chunks_exact(Q8_0.block);
    let mut terms = ActivationTerms {
        sums: Vec::with_capacity(blocks.len()),
        scales: Vec::with_capacity(blocks.len()),
    };
    for block in blocks {
        let sum: i32 = block[2..].iter().map(|&q| i32::from(q as i8)).sum();
        terms.sums.push(sum);
        terms
            .scales
            .push(half::f16::from_le_bytes([block[0], block[1]]).to_f32());
    }
    terms
}

/// Signature of a product of interleaved weights with Q8_0 activations:
/// `(k, w, rows, a, terms, cols, out, ldo)` writes `out[c * ldo + r] = dot(weight row r,
/// activation row c)` for `r < rows`, `c < cols`, any `cols` (`w` holds `rows` rows in the
/// interleaved layout of the kernel's format, `rows` a multiple of [`INTERLEAVE_ROWS`]; `a` holds
/// `cols` Q8_0 rows as the quantizers write them, `terms` their [`activation_terms`]). Same values
/// as the row dot up to the order of the f32 additions of the block terms; each value is computed
/// by the same operations whatever `cols` is (batch-invariant). Panics when the lengths disagree.
///
/// # Safety
/// `out + c * ldo + r` is writable for every `r < rows`, `c < cols`, and nothing else reads or
/// writes those elements during the call (the tasks of one product each write their own rows'
/// columns of a shared `y[m, n]`).
pub type InterleavedGemmFn = unsafe fn(
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    terms: &ActivationTerms,
    cols: usize,
    out: *mut f32,
    ldo: usize,
);

/// The product over interleaved weights of `ty` at `level`: Q8_0 and Q5_0 at AVX-512 VNNI only
/// (`None` elsewhere, where the file layout's kernels are the fast ones, so there is no reason to
/// interleave).
pub fn interleaved_gemm_fn(ty: GgmlType, level: super::SimdLevel) -> Option<InterleavedGemmFn> {
    match super::usable(level) {
        #[cfg(target_arch = "x86_64")]
        super::SimdLevel::Avx512Vnni => super::x86::interleaved_gemm_fn(ty),
        _ => {
            let _ = ty;
            None
        }
    }
}

/// Checks the lengths of an [`InterleavedGemmFn`] call for `g`; returns the blocks per row.
pub(super) fn check_call(
    g: Geometry,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    terms: &ActivationTerms,
    cols: usize,
) -> usize {
    assert!(
        k > 0 && k.is_multiple_of(QK),
        "interleaved product: a row of {k} is not a whole number of blocks"
    );
    let blocks = k / QK;
    assert!(
        rows.is_multiple_of(INTERLEAVE_ROWS)
            && w.len() == rows * blocks * g.block
            && a.len() == cols * blocks * Q8_0.block
            && terms.sums.len() == cols * blocks
            && terms.scales.len() == cols * blocks,
        "interleaved product: {rows} rows in {} bytes, {cols} activation rows in {} ({} terms), \
         k {k}",
        w.len(),
        a.len(),
        terms.sums.len()
    );
    blocks
}
