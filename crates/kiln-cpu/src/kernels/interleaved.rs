//! The interleaved layouts of Q8_0, Q5_0, Q4_K and Q6_K: groups of [`INTERLEAVE_ROWS`] weight
//! rows stored so that one 64-byte line holds the same 4 quants of every row of the group. Q8_0
//! and Q5_0 are described here; the k-quants, whose super-blocks carry scales per group of 32 or
//! 16 quants, in `q4_k` and `q6_k` below.
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
//! - (Q5_0) the high bits of the first block (64 bytes), then of the second, in one of two
//!   forms ([`MaskForm`], chosen by the SIMD level the layout is made for):
//!   - for the AVX-512 VNNI kernels, 8 little-endian u64 masks, mask `c` with bit `4 * i + t`
//!     the fifth bit of quant `4c + t` of row `i` (the byte mask of line `c` below, for one
//!     masked add);
//!   - for the AVX2 kernels, the same bits transposed: 32 bytes per half `h` of the group (rows
//!     `8h..8h + 8`), byte `4 * r + t` holding in bit `c` the fifth bit of quant `4c + t` of row
//!     `8h + r`, so that one 16-bit shift and one `and` put chunk `c`'s bits at bit 4 of the
//!     bytes of its panel line (spreading 32 bits to 32 bytes took four vector instructions);
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
//! a software prefetch at one activation row: the hardware's, on one stream, did better (the
//! output projection 3.1-3.3 ms a token without, 3.5-3.8 with a prefetch 4-8 KB ahead). With 4
//! or more rows the Q8_0/Q5_0 kernel does request its weights ahead (`kernels::x86::interleaved`
//! says why and what it gained). A group that starts 64-byte aligned
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
    pub(super) const fn group_block(self) -> usize {
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

/// Whether [`interleave`] takes weights of `ty` (Q8_0, Q5_0, Q4_K, Q6_K).
pub fn has_interleaved_layout(ty: GgmlType) -> bool {
    geometry(ty).is_some() || super_block(ty).is_some()
}

/// The file bytes of one super-block of `ty` and its byte map, for the k-quants with an
/// interleaved layout (Q4_K, Q6_K).
fn super_block(ty: GgmlType) -> Option<(usize, q4_k::PiecesFn)> {
    match ty {
        GgmlType::Q4_K => Some((q4_k::BLOCK, q4_k::pieces)),
        GgmlType::Q6_K => Some((q6_k::BLOCK, q6_k::pieces)),
        _ => None,
    }
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

/// The form of Q5_0's fifth-bit masks in the interleaved layout (the module docs describe both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MaskForm {
    /// A u64 mask per chunk of 4 quants of 16 rows (AVX-512 masked adds).
    Chunks,
    /// Per half of the group, a byte per quant position holding the 8 chunks' bits (AVX2).
    Transposed,
}

impl MaskForm {
    /// The form the products of `level` read: the VNNI kernels', else the AVX2 kernels'.
    fn of(level: super::SimdLevel) -> MaskForm {
        if super::usable(level) == super::SimdLevel::Avx512Vnni {
            MaskForm::Chunks
        } else {
            MaskForm::Transposed
        }
    }

    /// Adds row `i`'s fifth bits `qh` (bit `q` for quant `q`) to a block's `masks` (zeroed
    /// before the group's first row).
    fn put(self, masks: &mut [u8], i: usize, qh: u32) {
        match self {
            MaskForm::Chunks => {
                for c in 0..QK / 4 {
                    let bits = u64::from((qh >> (4 * c)) & 0xf) << (4 * i);
                    let at = 8 * c;
                    let mask = u64::from_le_bytes(masks[at..at + 8].try_into().unwrap()) | bits;
                    masks[at..at + 8].copy_from_slice(&mask.to_le_bytes());
                }
            }
            MaskForm::Transposed => {
                let at = 32 * (i / PANEL) + 4 * (i % PANEL);
                for t in 0..4 {
                    masks[at + t] = every_fourth_bit(qh >> t);
                }
            }
        }
    }

    /// Row `i`'s fifth bits from a block's `masks`, as [`MaskForm::put`] stored them.
    fn get(self, masks: &[u8], i: usize) -> u32 {
        match self {
            MaskForm::Chunks => (0..QK / 4).fold(0, |qh, c| {
                let mask = u64::from_le_bytes(masks[8 * c..8 * c + 8].try_into().unwrap());
                qh | (((mask >> (4 * i)) & 0xf) as u32) << (4 * c)
            }),
            MaskForm::Transposed => {
                let at = 32 * (i / PANEL) + 4 * (i % PANEL);
                (0..4).fold(0, |qh, t| qh | spread_to_every_fourth(masks[at + t]) << t)
            }
        }
    }
}

/// Bits 0, 4, 8, ..., 28 of `x` as bits 0..8.
fn every_fourth_bit(x: u32) -> u8 {
    let y = x & 0x1111_1111;
    let y = (y | (y >> 3)) & 0x0303_0303;
    let y = (y | (y >> 6)) & 0x000f_000f;
    ((y | (y >> 12)) & 0xff) as u8
}

/// The inverse of [`every_fourth_bit`]: bit `c` of `b` as bit `4c`.
fn spread_to_every_fourth(b: u8) -> u32 {
    let y = u32::from(b);
    let y = (y | (y << 12)) & 0x000f_000f;
    let y = (y | (y << 6)) & 0x0303_0303;
    (y | (y << 3)) & 0x1111_1111
}

/// Rows per half of a group (one 32-bit lane each in a 256-bit register).
const PANEL: usize = INTERLEAVE_ROWS / 2;

/// Writes rows `src` of `ty` (rows of `k` elements, a multiple of [`INTERLEAVE_ROWS`] of them)
/// into `dst` in the interleaved layout that the products of `level`
/// ([`interleaved_gemm_fn`]) read: the same for every level but in Q5_0's masks (see the module
/// docs). Panics when `ty` has none or the lengths disagree (`dst` must be as long as `src`,
/// and `src` whole groups of rows).
pub fn interleave(ty: GgmlType, level: super::SimdLevel, k: usize, src: &[u8], dst: &mut [u8]) {
    interleave_in(ty, MaskForm::of(level), k, src, dst);
}

/// [`interleave`] with Q5_0's masks in `form`.
fn interleave_in(ty: GgmlType, form: MaskForm, k: usize, src: &[u8], dst: &mut [u8]) {
    if let Some((block, pieces)) = super_block(ty) {
        let (group, blocks) = q4_k::check(ty, block, k, src.len(), dst.len());
        // The same map for every group: made once.
        let map: Vec<_> = (0..INTERLEAVE_ROWS)
            .flat_map(|i| pieces(blocks, i))
            .collect();
        for (rows, out) in src.chunks_exact(group).zip(dst.chunks_exact_mut(group)) {
            for &(from, to, len) in &map {
                out[to..to + len].copy_from_slice(&rows[from..from + len]);
            }
        }
        return;
    }
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
            out.fill(0); // the masks are built row by row
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
                    form.put(&mut out[masks..masks + g.masks], i, word(block, 2));
                    for v in 0..4 {
                        let at = quants + 64 * v + 4 * i;
                        out[at..at + 4].copy_from_slice(&block[6 + 4 * v..][..4]);
                    }
                }
            }
        }
    }
}

/// Row `r` of an interleaved matrix `w` of `ty` (rows of `k` elements, laid out for the products
/// of `level` as [`interleave`] writes them), written back as the row it came from into `dst`
/// (one row's bytes). Panics when `r` is not a row of `w` or the lengths disagree.
pub fn interleaved_row(
    ty: GgmlType,
    level: super::SimdLevel,
    k: usize,
    w: &[u8],
    r: usize,
    dst: &mut [u8],
) {
    row_in(ty, MaskForm::of(level), k, w, r, dst);
}

/// [`interleaved_row`] of a layout with Q5_0's masks in `form`.
fn row_in(ty: GgmlType, form: MaskForm, k: usize, w: &[u8], r: usize, dst: &mut [u8]) {
    if let Some((block, pieces)) = super_block(ty) {
        let (group, blocks) = q4_k::check(ty, block, k, w.len(), w.len());
        assert!(
            dst.len() == blocks * block && r < w.len() / group * INTERLEAVE_ROWS,
            "interleaved {ty}: row {r} of {} bytes into {}",
            w.len(),
            dst.len()
        );
        let grp = &w[r / INTERLEAVE_ROWS * group..][..group];
        let i = r % INTERLEAVE_ROWS;
        // `from` counts from the group's first row: row `i` starts `i` rows in.
        let start = i * blocks * block;
        for (from, to, len) in pieces(blocks, i) {
            dst[from - start..][..len].copy_from_slice(&grp[to..to + len]);
        }
        return;
    }
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
            let qh = form.get(&grp[masks..masks + g.masks], i);
            block[2..6].copy_from_slice(&qh.to_le_bytes());
            for v in 0..4 {
                block[6 + 4 * v..][..4].copy_from_slice(&grp[quants + 64 * v + 4 * i..][..4]);
            }
        }
    }
}

/// What the interleaved products need of activation rows beyond their quants, made once per
/// product by [`activation_terms`] and shared by its tasks. Of Q8_0 rows (for Q8_0 and Q5_0
/// weights), per block: the sum of its quants (the kernels remove the weights' offset with it)
/// and its scale as f32, `[c * blocks + b]`. Of Q8_K rows (for Q4_K and Q6_K weights), per
/// super-block: its scale, `scales[c * blocks + b]`, and `q4_k::TERMS` i32 sums at
/// `sums[TERMS * (c * blocks + b)..]`, each a pair of i16: first the sums of its 8 sub-blocks of
/// 32 in the order of Q4_K's minimums (`q4_k::MIN_PAIRS`), then its 16 group sums in the order of
/// Q6_K's scale pairs (`q6_k::SCALE_PAIRS`).
///
/// Where the AMX products run (`kernels::amx_granted`) and there are at least
/// 32 Q8_K rows, also their quants in the AMX products' tile order: per 16
/// rows (a whole 16 only; the rows after the last one are left to the VNNI kernel) and
/// super-block, its 4 runs of 64 quants of the 16 rows one after the other, 1 KiB each, row
/// `j`'s at `64 * j` (`tiles`; made once per product, where every task's tile loads then read
/// whole lines in order instead of 16 rows thousands of bytes apart).
#[derive(Clone, Debug, Default)]
pub struct ActivationTerms {
    pub(super) sums: Vec<i32>,
    pub(super) scales: Vec<f32>,
    pub(super) tiles: Vec<TileLine>,
}

/// Activation rows of one AMX tile.
pub(super) const AMX_TILE_ROWS: usize = 16;

/// A 64-byte aligned line: of [`ActivationTerms`]' tiles, and of the AMX kernels' scratch.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(super) struct TileLine(pub(super) [u8; 64]);

/// Quants of one activation row in one AMX tile, and lines of the tile.
pub(super) const TILE_QUANTS: usize = 64;
pub(super) const TILE_LINES: usize = AMX_TILE_ROWS;

impl ActivationTerms {
    /// Whether these are the empty terms (of no blocks, or made for a product that reads none).
    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }
}

/// The [`ActivationTerms`] of the `cols` activation rows `a` of `act_ty` (Q8_0 or Q8_K, whole
/// blocks: a trailing partial block is ignored, and the product's length check then fails).
/// Another format has no terms: empty ones, which every product's length check refuses.
pub fn activation_terms(act_ty: GgmlType, a: &[u8], cols: usize) -> ActivationTerms {
    let mut terms = ActivationTerms::default();
    if act_ty == GgmlType::Q8_K && cols >= 2 * AMX_TILE_ROWS && super::amx_granted() {
        terms.tiles = amx_tiles(a, cols);
    }
    // Q8_0: each block's f16 scale gathered as bits and widened in one slice conversion (F16C
    // where the CPU has it; a conversion call per block cost more than the block's sum), the
    // sums by `sum_i8`. Both formats push into vectors reserved to their final length.
    match act_ty {
        GgmlType::Q8_0 => {
            const QS: usize = 32;
            const { assert!(Q8_0.block == 2 + QS) };
            let n = a.len() / Q8_0.block;
            terms.sums.reserve_exact(n);
            let mut scale_bits = Vec::with_capacity(n);
            for block in a.chunks_exact(Q8_0.block) {
                let (d, qs) = block.split_at(2);
                let qs: &[u8; QS] = qs.try_into().unwrap();
                terms.sums.push(sum_i8(qs));
                scale_bits.push(u16::from_le_bytes([d[0], d[1]]));
            }
            use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
            terms.scales = vec![0.0; n];
            scale_bits
                .reinterpret_cast::<half::f16>()
                .convert_to_f32_slice(&mut terms.scales);
        }
        GgmlType::Q8_K => {
            let n = a.len() / q4_k::A_BLOCK;
            terms
                .sums
                .reserve_exact(n * (q4_k::MIN_PAIRS.len() + q6_k::SCALE_PAIRS.len()));
            terms.scales.reserve_exact(n);
            for block in a.chunks_exact(q4_k::A_BLOCK) {
                terms
                    .scales
                    .push(f32::from_le_bytes(block[..4].try_into().unwrap()));
                let bsums: &[u8; 32] = block[q4_k::A_BSUMS..][..32].try_into().unwrap();
                let bsum = |g: usize| i16::from_le_bytes([bsums[2 * g], bsums[2 * g + 1]]);
                // A sub-block's sum of 32 codes of at most 128 fits an i16 (4096).
                let sub = |j: usize| bsum(2 * j).wrapping_add(bsum(2 * j + 1)) as u16;
                let pair = |lo: u16, hi: u16| (u32::from(lo) | (u32::from(hi) << 16)) as i32;
                for (lo, hi) in q4_k::MIN_PAIRS {
                    terms.sums.push(pair(sub(lo), sub(hi)));
                }
                for (lo, hi) in q6_k::SCALE_PAIRS {
                    terms.sums.push(pair(bsum(lo) as u16, bsum(hi) as u16));
                }
            }
        }
        _ => {}
    }
    terms
}

/// The sum of 32 signed bytes. On x86-64 (SSE2, always there): biased to unsigned, summed by
/// `psadbw`, the bias taken off; the compiler kept the plain loop scalar, a byte at a time.
#[inline]
fn sum_i8(qs: &[u8; 32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the two loads read the 32 bytes of `qs`.
        unsafe {
            let bias = _mm_set1_epi8(i8::MIN);
            let lo = _mm_xor_si128(_mm_loadu_si128(qs.as_ptr().cast()), bias);
            let hi = _mm_xor_si128(_mm_loadu_si128(qs.as_ptr().add(16).cast()), bias);
            let zero = _mm_setzero_si128();
            let s = _mm_add_epi64(_mm_sad_epu8(lo, zero), _mm_sad_epu8(hi, zero));
            let biased = _mm_cvtsi128_si64(s) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
            biased as i32 - 128 * 32
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        qs.iter().map(|&q| i32::from(q as i8)).sum()
    }
}

/// The AMX tiles of `cols` Q8_K rows `a` (see [`ActivationTerms`]); none where the rows are not
/// whole super-blocks of equal length.
fn amx_tiles(a: &[u8], cols: usize) -> Vec<TileLine> {
    let row = a.len() / cols;
    if !a.len().is_multiple_of(cols) || !row.is_multiple_of(q4_k::A_BLOCK) {
        return Vec::new();
    }
    let blocks = row / q4_k::A_BLOCK;
    let runs = q4_k::QK_K / TILE_QUANTS;
    let n = cols / AMX_TILE_ROWS * blocks * runs;
    // Pushed line by line: filling a zeroed vector first wrote every byte twice.
    let mut tiles = Vec::with_capacity(n * TILE_LINES);
    for t in 0..n {
        let (chunk, rest) = (t / (blocks * runs), t % (blocks * runs));
        let (b, run) = (rest / runs, rest % runs);
        for j in 0..TILE_LINES {
            let at = (chunk * AMX_TILE_ROWS + j) * row + b * q4_k::A_BLOCK + 4 + TILE_QUANTS * run;
            tiles.push(TileLine(a[at..at + TILE_QUANTS].try_into().unwrap()));
        }
    }
    tiles
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

/// The product over interleaved weights of `ty` at `level`: Q8_0, Q5_0, Q4_K and Q6_K at AVX-512
/// VNNI; Q4_K and Q5_0 at AVX2 and AVX-512 without VNNI (bit-identical to the AVX2 tile kernels:
/// `kernels::x86::gemm::interleaved`). `None` elsewhere, where the file layout's kernels are as
/// fast, so there is no reason to interleave.
///
/// At AVX-512 VNNI the Q6_K product uses GFNI where the CPU has it and `KILN_GFNI` does not
/// refuse it (see [`interleaved_gemm_fn_gfni`]).
pub fn interleaved_gemm_fn(ty: GgmlType, level: super::SimdLevel) -> Option<InterleavedGemmFn> {
    #[cfg(target_arch = "x86_64")]
    let gfni = super::x86::gfni_usable();
    #[cfg(not(target_arch = "x86_64"))]
    let gfni = false;
    interleaved_gemm_fn_gfni(ty, level, gfni)
}

/// [`interleaved_gemm_fn`] with GFNI's bit-matrix transforms asked for or not (`gfni`; granted
/// only where the CPU has GFNI): at AVX-512 VNNI the Q6_K product then makes its 6-bit codes
/// with `vgf2p8affineqb` (2 instructions a code line in three quarters of four, against 3 or 4;
/// one-row products about 20 % faster in cache). Both give the same bits (tested); this entry
/// lets tests and benches run either.
pub fn interleaved_gemm_fn_gfni(
    ty: GgmlType,
    level: super::SimdLevel,
    gfni: bool,
) -> Option<InterleavedGemmFn> {
    match super::usable(level) {
        #[cfg(target_arch = "x86_64")]
        super::SimdLevel::Avx512Vnni => super::x86::interleaved_gemm_fn(ty, gfni),
        #[cfg(target_arch = "x86_64")]
        super::SimdLevel::Avx2 | super::SimdLevel::Avx512 => {
            super::x86::interleaved_gemm_fn_avx2(ty)
        }
        _ => {
            let _ = (ty, gfni);
            None
        }
    }
}

/// Whether the product of [`interleaved_gemm_fn`]`(ty, level)` over `cols` activation rows reads
/// their [`activation_terms`]: the VNNI products always; the AVX2 ones only below the rows from
/// which they pack the tile kernel's panels, which take the tile's own factors instead. Where it
/// does not, the product takes empty terms: making them is serial work before the product's
/// job (a 256-row Q5_0 product of 512 activation rows ran 1.4x as long with them, Zen 3).
pub fn interleaved_uses_terms(ty: GgmlType, level: super::SimdLevel, cols: usize) -> bool {
    match super::usable(level) {
        #[cfg(target_arch = "x86_64")]
        super::SimdLevel::Avx2 | super::SimdLevel::Avx512 => {
            super::x86::interleaved_min_cols_avx2(ty).is_none_or(|min| cols < min)
        }
        _ => {
            let _ = (ty, cols);
            true
        }
    }
}

/// Whether the product of [`interleaved_gemm_fn`]`(ty, level)` over `cols` activation rows runs
/// on AMX tiles (given terms made by [`activation_terms`] for those rows): Q4_K and Q6_K at the
/// AVX-512 VNNI level, from `2 * AMX_TILE_ROWS` rows, where [`super::amx_granted`].
pub fn interleaved_uses_amx(ty: GgmlType, level: super::SimdLevel, cols: usize) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
        && super::usable(level) == super::SimdLevel::Avx512Vnni
        && cols >= 2 * AMX_TILE_ROWS
        && super::amx_granted()
}

/// What the length check of an [`InterleavedGemmFn`] call needs to know of its format.
#[derive(Clone, Copy, Debug)]
pub(super) struct Blocking {
    /// Elements per block (32, or 256 for a super-block).
    pub(super) elements: usize,
    /// Bytes of one block of one weight row, and of one activation block.
    pub(super) block: usize,
    pub(super) a_block: usize,
    /// Quant-sum terms per activation block.
    pub(super) sums: usize,
}

impl Geometry {
    /// The blocking of a 32-element format (Q8_0 activations, one sum a block).
    pub(super) const fn blocking(self) -> Blocking {
        Blocking {
            elements: QK,
            block: self.block,
            a_block: Q8_0.block,
            sums: 1,
        }
    }
}

/// Checks the lengths of an [`InterleavedGemmFn`] call of a format blocked as `f` (of `terms`
/// too where the call reads them: `Some`); returns the blocks per row.
pub(super) fn check_call(
    f: Blocking,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    terms: Option<&ActivationTerms>,
    cols: usize,
) -> usize {
    assert!(
        k > 0 && k.is_multiple_of(f.elements),
        "interleaved product: a row of {k} is not a whole number of blocks of {}",
        f.elements
    );
    let blocks = k / f.elements;
    assert!(
        rows.is_multiple_of(INTERLEAVE_ROWS)
            && w.len() == rows * blocks * f.block
            && a.len() == cols * blocks * f.a_block
            && terms.is_none_or(|t| {
                t.sums.len() == f.sums * cols * blocks && t.scales.len() == cols * blocks
            }),
        "interleaved product: {rows} rows in {} bytes, {cols} activation rows in {} ({:?} \
         terms), k {k}",
        w.len(),
        a.len(),
        terms.map(|t| t.sums.len())
    );
    blocks
}

/// The interleaved layout of Q4_K (super-blocks of 256: f16 `d` and `dmin`, 12 bytes of packed
/// 6-bit scales and minimums, 128 bytes of 4-bit codes). A group of 16 rows stores its
/// super-blocks one after the other (super-block `b` of every row at `b * GROUP_BLOCK`), each
/// in 2304 bytes, the 16 rows' file bytes:
/// - `[0, 32)`: the 16 rows' `d`, row `i`'s at `2 * i`; `[32, 64)`: their `dmin`;
/// - `[64, 256)`: the packed scales as 3 lines, line `w` holding at `4 * i` bytes `4w..4w + 4`
///   of row `i`'s 12 (each lane unpacks its own row's 8 scales and 8 minimums);
/// - `[256, 2304)`: the codes as 4 chunks of 8 lines, line `v` of chunk `c` holding at `4 * i`
///   row `i`'s code bytes `32c + 4v..32c + 4v + 4`: low nibbles are codes `4v..4v + 4` of
///   sub-block `2c`, high nibbles those of sub-block `2c + 1` (unsigned, 0..16, as `vpdpbusd`
///   takes them).
///
/// With a group starting 64-byte aligned every line is aligned (2304 = 36 lines). One thread,
/// in cache, rows of 1024 (`examples/interleave_bench`): 4.2 ns per 16 rows x 32 elements for
/// one activation row against 15.3 for the file layout's row dots, 2.9 against 6.9 per
/// activation row with 8 of them (the narrow kernel), 2.9 against 3.4 with 512 (the tile
/// kernel).
pub(super) mod q4_k {
    use super::INTERLEAVE_ROWS;

    /// Elements per super-block.
    pub(in crate::kernels) const QK_K: usize = 256;
    /// Bytes of one super-block of one row in the file.
    pub(in crate::kernels) const BLOCK: usize = 144;
    /// Bytes of one super-block of a whole group.
    pub(in crate::kernels) const GROUP_BLOCK: usize = BLOCK * INTERLEAVE_ROWS;
    /// Where the `dmin`, the packed scales and the codes start in a group's super-block.
    pub(in crate::kernels) const DMIN: usize = 32;
    pub(in crate::kernels) const SCALES: usize = 64;
    pub(in crate::kernels) const CODES: usize = 256;
    /// Bytes of a Q8_K activation block, and where its group sums start.
    pub(in crate::kernels) const A_BLOCK: usize = 292;
    pub(in crate::kernels) const A_BSUMS: usize = 260;
    /// The sub-blocks whose minimums the kernel pairs, in the order of the activation terms:
    /// unpacked 4 to a 32-bit lane, minimums `(0, 2)` and `(1, 3)` come apart as i16 pairs with
    /// one mask, as do `(4, 6)` and `(5, 7)`.
    pub(in crate::kernels) const MIN_PAIRS: [(usize, usize); 4] = [(0, 2), (1, 3), (4, 6), (5, 7)];
    /// Activation terms per Q8_K block: Q4_K's 4 pairs, then Q6_K's 8 (see [`ActivationTerms`]).
    ///
    /// [`ActivationTerms`]: super::ActivationTerms
    pub(in crate::kernels) const TERMS: usize = MIN_PAIRS.len() + super::q6_k::SCALE_PAIRS.len();
    /// For the length check of a product.
    pub(in crate::kernels) const BLOCKING: super::Blocking = super::Blocking {
        elements: QK_K,
        block: BLOCK,
        a_block: A_BLOCK,
        sums: TERMS,
    };

    /// A k-quant's byte map: `pieces(blocks, i)` (see [`pieces`]).
    pub(super) type PiecesFn = fn(usize, usize) -> Box<dyn Iterator<Item = (usize, usize, usize)>>;

    /// Checks an interleave of rows of `k` of `ty` (super-blocks of `block` bytes) from `src`
    /// bytes into `dst` bytes: returns the bytes of a group and the super-blocks per row.
    pub(super) fn check(
        ty: kiln_core::GgmlType,
        block: usize,
        k: usize,
        src: usize,
        dst: usize,
    ) -> (usize, usize) {
        assert!(
            k > 0 && k.is_multiple_of(QK_K),
            "interleaved {ty}: a row of {k} is not a whole number of blocks"
        );
        let blocks = k / QK_K;
        let group = blocks * block * INTERLEAVE_ROWS;
        assert!(
            src == dst && src.is_multiple_of(group),
            "interleaved {ty}: {src} bytes into {dst} for groups of {group}"
        );
        (group, blocks)
    }

    /// Where the bytes of row `i` of a group go: `(from, to, len)` with `from` counted from the
    /// group's first byte in the file layout and `to` in the interleaved one.
    pub(super) fn pieces(
        blocks: usize,
        i: usize,
    ) -> Box<dyn Iterator<Item = (usize, usize, usize)>> {
        Box::new((0..blocks).flat_map(move |b| block_pieces(blocks, i, b)))
    }

    /// [`pieces`] of super-block `b` of row `i`.
    fn block_pieces(
        blocks: usize,
        i: usize,
        b: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> {
        let from = (i * blocks + b) * BLOCK;
        let to = b * GROUP_BLOCK;
        let scales = (0..2).map(move |h| (from + 2 * h, to + DMIN * h + 2 * i, 2));
        let packed = (0..3).map(move |w| (from + 4 + 4 * w, to + SCALES + 64 * w + 4 * i, 4));
        let codes = (0..32).map(move |l| (from + 16 + 4 * l, to + CODES + 64 * l + 4 * i, 4));
        scales.chain(packed).chain(codes)
    }
}

/// The interleaved layout of Q6_K (super-blocks of 256: 128 bytes of low code nibbles `ql`, 64
/// of high code bit pairs `qh`, 16 signed 8-bit scales, one per group of 16 codes, and an f16
/// `d`; a value is `d * scale * (code - 32)`, `code` 0..64). A group of 16 rows of `B`
/// super-blocks, `3360 * B` bytes, the 16 rows' file bytes:
/// - `[0, 32 * B)`: the 16 rows' `d` of every super-block, super-block `b`'s at `32 * b`, row
///   `i`'s at `2 * i` in it;
/// - then each super-block in 3328 bytes: its scales as 4 lines, line `q` holding at `4 * i`
///   row `i`'s scales `4q..4q + 4`; then for each half `n` of 128 codes and each `h` of 0, 1,
///   a unit of 12 lines: the `qh` lines `j` = `4h..4h + 4`, line `j` holding at `4 * i` row
///   `i`'s bytes `32n + 4j..32n + 4j + 4` of `qh`, then the `ql` lines `j` = `4h..4h + 4`, then
///   `8 + 4h..8 + 4h + 4`, line `j` holding row `i`'s bytes `64n + 4j..64n + 4j + 4` of `ql`.
///
/// In ggml's order, byte `l` (0..32) of half `n`'s `qh` holds the high bits of codes `128n + l`
/// (bits 0-1), `+ 32` (2-3), `+ 64` (4-5) and `+ 96` (6-7); byte `l` of its `ql` the low nibble
/// of code `128n + l` (low) and `+ 64` (high), byte `32 + l` those of `+ 32` and `+ 96`. So one
/// `qh` line and the two `ql` lines `j` and `j + 8` make the 4 code lines of codes `4j..4j + 4`
/// of the half's 4 quarters. The codes are unsigned (0..64, as `vpdpbusd` takes them); the
/// kernel removes the offset as `32 * sum(scale * group sum of the activations)`. A unit holds
/// the lines of 4 groups of 16 codes and is read front to back: with the lines in the file's
/// order instead (each half's `qh`, then its `ql`), the kernel's reads hop back and forth inside
/// each half and stream slower than the file layout's kernel. With a group starting 64-byte
/// aligned and `B` even, every line is aligned. It beats the file layout's row dots at one and a
/// few activation rows; with hundreds the tile kernel, which shares its unpacking among more
/// rows, wins (`examples/gemv_bench`, `examples/interleave_bench`; docs/BENCHMARKS.md).
pub(super) mod q6_k {
    use super::INTERLEAVE_ROWS;

    /// Bytes of one super-block of one row in the file.
    pub(in crate::kernels) const BLOCK: usize = 210;
    /// Bytes of one super-block of a whole group, past the region of `d`s.
    pub(in crate::kernels) const GROUP_BLOCK: usize = BLOCK * INTERLEAVE_ROWS - D;
    /// Bytes of one super-block's `d`s for a whole group.
    pub(in crate::kernels) const D: usize = 2 * INTERLEAVE_ROWS;
    /// Where the units start in a super-block, their bytes, and where their `ql` lines start.
    pub(in crate::kernels) const UNITS: usize = 256;
    pub(in crate::kernels) const UNIT: usize = 768;
    pub(in crate::kernels) const QL: usize = 256;
    /// The scale groups the kernel pairs for the offset's `vpdpwssd`, in the order of the
    /// activation terms: a 32-bit lane of scale line `q` holds scales `4q..4q + 4`, and its
    /// i16 halves sign-extended give `(4q, 4q + 2)`, shifted `(4q + 1, 4q + 3)`.
    pub(in crate::kernels) const SCALE_PAIRS: [(usize, usize); 8] = [
        (0, 2),
        (1, 3),
        (4, 6),
        (5, 7),
        (8, 10),
        (9, 11),
        (12, 14),
        (13, 15),
    ];
    /// For the length check of a product.
    pub(in crate::kernels) const BLOCKING: super::Blocking = super::Blocking {
        elements: super::q4_k::QK_K,
        block: BLOCK,
        a_block: super::q4_k::A_BLOCK,
        sums: super::q4_k::TERMS,
    };

    /// As `q4_k::pieces`.
    pub(super) fn pieces(
        blocks: usize,
        i: usize,
    ) -> Box<dyn Iterator<Item = (usize, usize, usize)>> {
        Box::new((0..blocks).flat_map(move |b| {
            let from = (i * blocks + b) * BLOCK;
            let to = blocks * D + b * GROUP_BLOCK;
            let d = std::iter::once((from + 208, b * D + 2 * i, 2));
            let scales = (0..4).map(move |q| (from + 192 + 4 * q, to + 64 * q + 4 * i, 4));
            // Unit `(n, j % 8 / 4)` of the line of `qh` or `ql` bytes `j` of half `n`.
            let unit = move |n: usize, j: usize| to + UNITS + (2 * n + j % 8 / 4) * UNIT + 4 * i;
            let halves = (0..2).flat_map(move |n| {
                let qh = (0..8).map(move |j| {
                    let at = unit(n, j) + 64 * (j % 4);
                    (from + 128 + 32 * n + 4 * j, at, 4)
                });
                let ql = (0..16).map(move |j| {
                    let at = unit(n, j) + QL + 256 * (j / 8) + 64 * (j % 4);
                    (from + 64 * n + 4 * j, at, 4)
                });
                qh.chain(ql)
            });
            d.chain(scales).chain(halves)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms of Q5_0's masks give every row back (the public round trip tests only the
    /// form of the host's level), each bit lands where its kernels read it, and the forms differ.
    #[test]
    fn q5_0_masks_round_trip_in_both_forms() {
        let (k, rows) = (3 * QK, 2 * INTERLEAVE_ROWS);
        let row_bytes = k / QK * Q5_0.block;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let w: Vec<u8> = (0..rows * row_bytes)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let mut layouts = Vec::new();
        for form in [MaskForm::Chunks, MaskForm::Transposed] {
            let mut il = vec![0u8; w.len()];
            interleave_in(GgmlType::Q5_0, form, k, &w, &mut il);
            let mut back = vec![0u8; row_bytes];
            for r in 0..rows {
                row_in(GgmlType::Q5_0, form, k, &il, r, &mut back);
                assert_eq!(back, w[r * row_bytes..][..row_bytes], "{form:?} row {r}");
            }
            layouts.push(il);
        }
        assert_ne!(layouts[0], layouts[1]);
        // Row 9 (half 1, lane 1), quant 4 * 5 + 2 (chunk 5, position 2) of block 0.
        let qh = word(&w, 9 * row_bytes + 2);
        let (_, masks, _) = Q5_0.block_at(k / QK, 0);
        let bit = |il: &[u8], byte: usize, bit: usize| (il[masks + byte] >> bit) & 1;
        let want = ((qh >> 22) & 1) as u8;
        assert_eq!(
            bit(&layouts[0], 8 * 5 + (4 * 9 + 2) / 8, (4 * 9 + 2) % 8),
            want
        );
        assert_eq!(bit(&layouts[1], 32 + 4 + 2, 5), want);
    }

    #[test]
    fn every_fourth_bit_and_its_inverse() {
        for c in 0..8 {
            assert_eq!(every_fourth_bit(1 << (4 * c)), 1 << c);
            assert_eq!(every_fourth_bit(!(1u32 << (4 * c))), !(1u8 << c));
            assert_eq!(spread_to_every_fourth(1 << c), 1 << (4 * c));
        }
        for x in [0u32, 0xffff_ffff, 0x1234_5678, 0x8765_4321, 0xdead_beef] {
            let b = every_fourth_bit(x);
            assert_eq!(spread_to_every_fourth(b), x & 0x1111_1111, "{x:#x}");
        }
    }
}
