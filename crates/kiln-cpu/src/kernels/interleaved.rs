//! The interleaved Q8_0 layout: groups of [`INTERLEAVE_ROWS`] weight rows stored so that one
//! 64-byte line holds the same 4 quants of every row of the group.
//!
//! A Q8_0 matrix stores each row's blocks one after the other (a 2-byte f16 scale, then 32 i8
//! quants). A one-row product over it has to reduce every block's 32 products to one number
//! before it can apply the block's scale, a row at a time: about 5 vector instructions per block
//! on AVX-512 VNNI, which bounded decode's output projection by arithmetic, not memory, on a
//! fast-memory host. In this layout the quants of 16 rows are interleaved 4 bytes at a time:
//! `vpdpbusd` of one 64-byte line against the matching 4 activation quants (broadcast) adds
//! 4 products into each row's own 32-bit lane, so after the 8 lines of a block every lane holds
//! its row's exact block sum, and one conversion and one multiply-add by the 16 rows' scales (one
//! 32-byte load) finish the block for all 16 rows. About 13 instructions per 16 blocks instead
//! of 80.
//!
//! Layout of a group of 16 rows of `B` blocks (`B * 544` bytes, exactly the bytes of the 16 rows
//! in the file, so the interleaved matrix takes the same memory as the original), one stream
//! read front to back, blocks in pairs of 1088 bytes (17 cache lines):
//! - the 16 rows' f16 scales of the pair's first block (32 bytes, row `i`'s at `2 * i`), then
//!   those of its second block;
//! - the quants of the first block (512 bytes), then of the second: line `c` (`0..8`, 64 bytes)
//!   holds at `64 * c + 4 * i` the quants `4c..4c + 4` of row `i`'s block, each as the unsigned
//!   byte `q + 128` (the unsigned operand of `vpdpbusd`; the kernel removes the bias with
//!   `128 * sum(a)` per activation block).
//! - An odd `B`'s last block stands alone: its scales, then its quants.
//!
//! Scales and quants in one stream matter: with each group's scales in a region of their own
//! after its quants, every group began with demand misses on scale lines that no prefetch had
//! asked for, and decode's output projection ran 30% slower than in the original layout. A
//! group that starts 64-byte aligned keeps every quant line aligned (with an even `B`).

/// Weight rows per group of the interleaved layout (one 32-bit lane each in a 512-bit register).
pub const INTERLEAVE_ROWS: usize = 16;

/// Bytes of a Q8_0 block.
const BLOCK: usize = 34;
/// Quants per Q8_0 block.
const QK: usize = 32;
/// Bytes of one block's quants for a whole group.
const GROUP_QUANTS: usize = INTERLEAVE_ROWS * QK;
/// Bytes of one block's scales for a whole group.
const GROUP_SCALES: usize = INTERLEAVE_ROWS * 2;

/// Bytes of a full pair of blocks of a group: both blocks' scales, then both blocks' quants.
const PAIR: usize = 2 * (GROUP_SCALES + GROUP_QUANTS);

/// Where block `b`'s 16 scales and its 512 quant bytes start inside a group of `blocks` blocks.
#[inline]
pub(super) fn block_at(blocks: usize, b: usize) -> (usize, usize) {
    let base = b / 2 * PAIR;
    if b / 2 < blocks / 2 {
        (
            base + GROUP_SCALES * (b % 2),
            base + 2 * GROUP_SCALES + GROUP_QUANTS * (b % 2),
        )
    } else {
        (base, base + GROUP_SCALES)
    }
}

/// 4 quants with their top bit flipped: `q` (i8) to `q + 128` (u8) and back.
#[inline]
fn flip(chunk: &[u8]) -> [u8; 4] {
    let v = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    (v ^ 0x8080_8080).to_le_bytes()
}

/// The blocks of a row of `k` elements; panics unless `k` is a positive multiple of 32.
fn blocks_of(k: usize) -> usize {
    assert!(
        k > 0 && k.is_multiple_of(QK),
        "interleaved Q8_0: a row of {k} is not a whole number of blocks"
    );
    k / QK
}

/// Writes Q8_0 rows `src` (rows of `k` elements, a multiple of [`INTERLEAVE_ROWS`] of them) into
/// `dst` in the interleaved layout. Panics when the lengths disagree (`dst` must be as long as
/// `src`, and `src` whole groups of rows).
pub fn interleave_q8_0(k: usize, src: &[u8], dst: &mut [u8]) {
    let blocks = blocks_of(k);
    let group = blocks * BLOCK * INTERLEAVE_ROWS;
    assert!(
        src.len() == dst.len() && src.len().is_multiple_of(group),
        "interleaved Q8_0: {} bytes into {} for groups of {group}",
        src.len(),
        dst.len()
    );
    let row_bytes = blocks * BLOCK;
    for (rows, out) in src.chunks_exact(group).zip(dst.chunks_exact_mut(group)) {
        for i in 0..INTERLEAVE_ROWS {
            let row = &rows[i * row_bytes..(i + 1) * row_bytes];
            for (b, block) in row.chunks_exact(BLOCK).enumerate() {
                let (scales, quants) = block_at(blocks, b);
                out[scales + 2 * i..][..2].copy_from_slice(&block[..2]);
                for (c, chunk) in block[2..].chunks_exact(4).enumerate() {
                    let at = quants + 64 * c + 4 * i;
                    out[at..at + 4].copy_from_slice(&flip(chunk));
                }
            }
        }
    }
}

/// Row `r` of an interleaved matrix `w` of rows of `k` elements, written back as the Q8_0 row it
/// came from into `dst` (one row's bytes). Panics when `r` is not a row of `w` or the lengths
/// disagree.
pub fn interleaved_row_q8_0(k: usize, w: &[u8], r: usize, dst: &mut [u8]) {
    let blocks = blocks_of(k);
    let group = blocks * BLOCK * INTERLEAVE_ROWS;
    assert!(
        dst.len() == blocks * BLOCK
            && w.len().is_multiple_of(group)
            && r < w.len() / group * INTERLEAVE_ROWS,
        "interleaved Q8_0: row {r} of {} bytes into {}",
        w.len(),
        dst.len()
    );
    let g = &w[r / INTERLEAVE_ROWS * group..][..group];
    let i = r % INTERLEAVE_ROWS;
    for (b, block) in dst.chunks_exact_mut(BLOCK).enumerate() {
        let (scales, quants) = block_at(blocks, b);
        block[..2].copy_from_slice(&g[scales + 2 * i..][..2]);
        for (c, chunk) in block[2..].chunks_exact_mut(4).enumerate() {
            let at = quants + 64 * c + 4 * i;
            chunk.copy_from_slice(&flip(&g[at..at + 4]));
        }
    }
}

/// Signature of a product of interleaved Q8_0 weights with Q8_0 activations:
/// `(k, w, rows, a, cols, out, ldo)` writes `out[c * ldo + r] = dot(weight row r, activation row
/// c)` for `r < rows`, `c < cols`, any `cols` (`w` holds `rows` rows in the interleaved layout,
/// `rows` a multiple of [`INTERLEAVE_ROWS`]; `a` holds `cols` Q8_0 rows as the quantizers write
/// them). Same values as the row dot up to the order of the f32 additions of the block terms.
/// Panics when the lengths disagree.
///
/// # Safety
/// `out + c * ldo + r` is writable for every `r < rows`, `c < cols`, and nothing else reads or
/// writes those elements during the call (the tasks of one product each write their own rows'
/// columns of a shared `y[m, n]`).
pub type InterleavedGemmFn =
    unsafe fn(k: usize, w: &[u8], rows: usize, a: &[u8], cols: usize, out: *mut f32, ldo: usize);

/// The product over interleaved Q8_0 weights at `level`: AVX-512 VNNI only (`None` below it,
/// where the original layout's kernels are the fast ones, so there is no reason to interleave).
pub fn interleaved_gemm_fn(level: super::SimdLevel) -> Option<InterleavedGemmFn> {
    match super::usable(level) {
        #[cfg(target_arch = "x86_64")]
        super::SimdLevel::Avx512Vnni => Some(super::x86::q8_0x16_gemm),
        _ => None,
    }
}

/// Checks the lengths of an [`InterleavedGemmFn`] call; returns the blocks per row.
pub(super) fn check_call(k: usize, w: &[u8], rows: usize, a: &[u8], cols: usize) -> usize {
    let blocks = blocks_of(k);
    let row_bytes = blocks * BLOCK;
    assert!(
        rows.is_multiple_of(INTERLEAVE_ROWS)
            && w.len() == rows * row_bytes
            && a.len() == cols * row_bytes,
        "interleaved Q8_0 product: {rows} rows in {} bytes, {cols} activation rows in {}, k {k}",
        w.len(),
        a.len()
    );
    blocks
}

/// Per activation block: the correction `-128 * sum(quants)` that removes the weights' bias, and
/// the scale as f32, `[c * blocks + b]`.
pub(super) fn activation_terms(a: &[u8], blocks: usize, start: &mut Vec<i32>, da: &mut Vec<f32>) {
    start.clear();
    da.clear();
    for block in a.chunks_exact(BLOCK) {
        let sum: i32 = block[2..].iter().map(|&q| i32::from(q as i8)).sum();
        start.push(-128 * sum);
        da.push(half::f16::from_le_bytes([block[0], block[1]]).to_f32());
    }
    debug_assert_eq!(start.len() % blocks.max(1), 0);
}
