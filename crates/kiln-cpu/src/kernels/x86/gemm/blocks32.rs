//! Tile kernels of the 32-element formats: Q4_0, Q5_0, Q8_0 against Q8_0 activations, Q4_1, Q5_1
//! against Q8_1 activations.
//!
//! Panel block: the 8 chunks of quants, then `d` of the 8 rows (f32), then `m` (the `_1`
//! formats). Activation factors per block: `d` (f32 bits), then the offset shares of the whole
//! block as an i16 pair (Q4_0, Q5_0) or the f32 bits of `s = d * sum(a)` (Q4_1, Q5_1). The VNNI
//! variant (`Blocks32Vnni`) differs as the `gemm` module docs say.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};

use kiln_core::GgmlType;
use kiln_quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK8_0};

use super::super::{
    bits_to_bytes32, hsum_ps, legacy, load32, nibbles32, prefetch_ahead, read_f16_bits, read_u32,
};
use super::{
    broadcast4, half, offset_shares, prefetch_share, store_columns, store_halves, store_piece,
    sum_lanes_per_half, transpose, Call, Format, Line, Shape, PANEL_ROWS, PIECE,
};
use crate::kernels::VecDotFn;

mod interleaved;

pub(super) use interleaved::Q5Layout;

/// A 32-element weight format.
pub(super) trait Legacy {
    const TYPE: GgmlType;
    const W_BLOCK: usize;
    /// Bytes of an activation block, and where its quants start (Q8_0: 34 and 2; Q8_1: 36 and 4).
    const A_BLOCK: usize;
    const A_QS: usize;
    /// Chunks whose `maddubs` results are added as i16 before widening (see the bounds at each
    /// format): 8, the whole block, or 4 for 5-bit quants without offset, 1 for signed Q8_0.
    const GROUP: usize;
    /// Whether the quants are signed (Q8_0), dotted through the sign trick.
    const SIGNED: bool;
    /// The weight is `d * (q - OFFSET)`: Q4_0 8, Q5_0 16, else 0.
    const OFFSET: i16;
    /// Where the f16 minimum `m` of the `_1` formats is (`w = d * q + m`).
    const MIN_AT: Option<usize>;
    /// The AVX2 row dot.
    const ROW_DOT: VecDotFn;

    /// The 32 quants of the block at `p` in element order (unsigned unless `SIGNED`).
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `p` points at a readable block.
    unsafe fn quants(p: *const u8) -> __m256i;

    /// [`Legacy::quants`] where AVX-512 is there too (the 5th bits of Q5_0 by mask register).
    ///
    /// # Safety
    /// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI; `p` points at a readable block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn quants_avx512(p: *const u8) -> __m256i {
        Self::quants(p)
    }
}

/// The tile format of a `Legacy` weight format.
pub(super) struct Blocks32<L>(PhantomData<L>);

impl<L: Legacy> Format for Blocks32<L> {
    const TYPE: GgmlType = L::TYPE;
    const QK: usize = QK8_0;
    const W_BLOCK: usize = L::W_BLOCK;
    const A_BLOCK: usize = L::A_BLOCK;
    const PANEL_LINES: usize = PIECE / 32 + 1 + L::MIN_AT.is_some() as usize;
    const FACTOR_WORDS: usize = 2;
    const SHAPE: Shape = Shape::Narrow;
    const VNNI: bool = false;
    // Even one activation row: unpacking a block once for 8 rows beats unpacking it per row.
    const MIN_COLS: usize = 1;
    const ROW_DOT: VecDotFn = L::ROW_DOT;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(a: *const u8, out: *mut u32) {
        const { assert!(L::OFFSET == 0 || L::GROUP == 8) };
        let extra = if L::MIN_AT.is_some() {
            half(a.add(offset_of!(BlockQ8_1, s))).to_bits()
        } else if L::OFFSET != 0 {
            let v = sum_lanes_per_half(offset_shares(a.add(L::A_QS), L::OFFSET));
            let both = _mm_add_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            _mm_cvtsi128_si32(both) as u32
        } else {
            0
        };
        *out = half(a).to_bits();
        *out.add(1) = extra;
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; PANEL_ROWS], dst: *mut u8) {
        store_piece(dst, |r| L::quants(src[r]));
        store_halves(dst.add(PIECE), src, 0);
        if let Some(at) = L::MIN_AT {
            store_halves(dst.add(PIECE + 32), src, at);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const NP: usize, const NR: usize>(
        mut acc: [[__m256; NR]; NP],
        blocks: usize,
        panels: &[*const u8; NP],
        stride: usize,
        acts: &[*const u8; NR],
        factors: &[*const u32; NR],
    ) -> [[__m256; NR]; NP] {
        let ones = _mm256_set1_epi16(1);
        for b in 0..blocks {
            let p = panels.map(|p| p.add(b * stride));
            let q = acts.map(|a| a.add(b * L::A_BLOCK + L::A_QS));
            let f = factors.map(|f| f.add(2 * b));
            let mut isum = [[_mm256_setzero_si256(); NR]; NP];
            for group in 0..8 / L::GROUP {
                let mut s16 = [[_mm256_setzero_si256(); NR]; NP];
                for c in group * L::GROUP..(group + 1) * L::GROUP {
                    let wq = p.map(|p| load32(p.add(32 * c)));
                    let wu = if L::SIGNED {
                        wq.map(|w| _mm256_sign_epi8(w, w))
                    } else {
                        wq
                    };
                    for j in 0..NR {
                        let aq = broadcast4(q[j].add(4 * c));
                        for i in 0..NP {
                            let ai = if L::SIGNED {
                                _mm256_sign_epi8(aq, wq[i])
                            } else {
                                aq
                            };
                            let prod = _mm256_maddubs_epi16(wu[i], ai);
                            s16[i][j] = _mm256_add_epi16(s16[i][j], prod);
                        }
                    }
                }
                for j in 0..NR {
                    let shares = if L::OFFSET != 0 {
                        broadcast4(f[j].add(1).cast())
                    } else {
                        _mm256_setzero_si256()
                    };
                    for i in 0..NP {
                        let exact = _mm256_sub_epi16(s16[i][j], shares);
                        let wide = _mm256_madd_epi16(exact, ones);
                        isum[i][j] = _mm256_add_epi32(isum[i][j], wide);
                    }
                }
            }
            finish_block::<L, NP, NR>(&mut acc, &isum, &p, &f);
        }
        acc
    }
}

/// The f32 step of one block of a micro-tile, shared by the AVX2 and VNNI kernels (so that
/// their results are bit-identical): `acc += isum * (d * da)`, then `acc += m * s` for the `_1`
/// formats, `isum` the exact integer dots of the block.
///
/// # Safety
/// AVX2+FMA+F16C; each `p[i]` points at a packed panel block, each `f[j]` at the activation
/// block's two factor words (`da` first; `s` second for the `_1` formats).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn finish_block<L: Legacy, const NP: usize, const NR: usize>(
    acc: &mut [[__m256; NR]; NP],
    isum: &[[__m256i; NR]; NP],
    p: &[*const u8; NP],
    f: &[*const u32; NR],
) {
    for i in 0..NP {
        let d = _mm256_loadu_ps(p[i].add(PIECE).cast());
        let m = if L::MIN_AT.is_some() {
            _mm256_loadu_ps(p[i].add(PIECE + 32).cast())
        } else {
            _mm256_setzero_ps()
        };
        for j in 0..NR {
            let da = _mm256_set1_ps(f32::from_bits(*f[j]));
            let sum = _mm256_cvtepi32_ps(isum[i][j]);
            acc[i][j] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, da), acc[i][j]);
            if L::MIN_AT.is_some() {
                let s = _mm256_set1_ps(f32::from_bits(*f[j].add(1)));
                acc[i][j] = _mm256_fmadd_ps(m, s, acc[i][j]);
            }
        }
    }
}

/// The VNNI tile format of a `Legacy` weight format (see the `gemm` module docs): the panels of
/// [`Blocks32`] with Q8_0's quants biased to `q + 128`, activation factors `da` and then either
/// the i32 `offset * sum(a)` (offset 8, 16 or Q8_0's bias 128; 0 for no offset) or, for the `_1`
/// formats, the f32 bits of `s`.
pub(super) struct Blocks32Vnni<L>(PhantomData<L>);

impl<L: Legacy> Blocks32Vnni<L> {
    /// What is taken off `sum(q * a)` per unit of `sum(a)`: the format's offset, or the bias of
    /// Q8_0's stored quants.
    const OFFSET: i32 = if L::SIGNED { 128 } else { L::OFFSET as i32 };
}

impl<L: Legacy> Format for Blocks32Vnni<L> {
    const TYPE: GgmlType = L::TYPE;
    const QK: usize = QK8_0;
    const W_BLOCK: usize = L::W_BLOCK;
    const A_BLOCK: usize = L::A_BLOCK;
    const PANEL_LINES: usize = <Blocks32<L> as Format>::PANEL_LINES;
    const FACTOR_WORDS: usize = 2;
    const SHAPE: Shape = Shape::Big;
    const VNNI: bool = true;
    const MIN_COLS: usize = 1;
    const ROW_DOT: VecDotFn = L::ROW_DOT;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(a: *const u8, out: *mut u32) {
        const { assert!(L::MIN_AT.is_none() || Self::OFFSET == 0) };
        let extra = if L::MIN_AT.is_some() {
            half(a.add(offset_of!(BlockQ8_1, s))).to_bits()
        } else if Self::OFFSET != 0 {
            let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), load32(a.add(L::A_QS)));
            let sum = hsum_i32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
            (sum * Self::OFFSET) as u32
        } else {
            0
        };
        *out = half(a).to_bits();
        *out.add(1) = extra;
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; PANEL_ROWS], dst: *mut u8) {
        store_piece(dst, |r| {
            let q = L::quants(src[r]);
            if L::SIGNED {
                _mm256_xor_si256(q, _mm256_set1_epi8(-128))
            } else {
                q
            }
        });
        store_halves(dst.add(PIECE), src, 0);
        if let Some(at) = L::MIN_AT {
            store_halves(dst.add(PIECE + 32), src, at);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const NP: usize, const NR: usize>(
        mut acc: [[__m256; NR]; NP],
        blocks: usize,
        panels: &[*const u8; NP],
        stride: usize,
        acts: &[*const u8; NR],
        factors: &[*const u32; NR],
    ) -> [[__m256; NR]; NP] {
        for b in 0..blocks {
            let p = panels.map(|p| p.add(b * stride));
            let q = acts.map(|a| a.add(b * L::A_BLOCK + L::A_QS));
            let f = factors.map(|f| f.add(2 * b));
            // |sum| <= 32 * 255 * 127 per lane: far inside i32.
            let mut isum = [[_mm256_setzero_si256(); NR]; NP];
            for c in 0..8 {
                let wq = p.map(|p| load32(p.add(32 * c)));
                for j in 0..NR {
                    let aq = broadcast4(q[j].add(4 * c));
                    for i in 0..NP {
                        isum[i][j] = _mm256_dpbusd_epi32(isum[i][j], wq[i], aq);
                    }
                }
            }
            if Self::OFFSET != 0 {
                for j in 0..NR {
                    let shares = _mm256_set1_epi32(*f[j].add(1) as i32);
                    for row in isum.iter_mut() {
                        row[j] = _mm256_sub_epi32(row[j], shares);
                    }
                }
            }
            finish_block::<L, NP, NR>(&mut acc, &isum, &p, &f);
        }
        acc
    }
}

/// The 5th bits of a Q5_0/Q5_1 block (the u32 at `qh`) as 16 in the bytes whose bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(qh: u32) -> __m256i {
    let unset = _mm256_cmpeq_epi8(bits_to_bytes32(qh), _mm256_setzero_si256());
    _mm256_andnot_si256(unset, _mm256_set1_epi8(16))
}

pub(super) struct Q4_0;
impl Legacy for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ROW_DOT: VecDotFn = legacy::q4_0_q8_0;
    const W_BLOCK: usize = size_of::<BlockQ4_0>();
    const A_BLOCK: usize = size_of::<BlockQ8_0>();
    const A_QS: usize = offset_of!(BlockQ8_0, qs);
    // Per i16 half of a lane, 16 products: |sum (q - 8) * a| <= 16 * 8 * 127 = 16256.
    const GROUP: usize = 8;
    const SIGNED: bool = false;
    const OFFSET: i16 = 8;
    const MIN_AT: Option<usize> = None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        nibbles32(p.add(offset_of!(BlockQ4_0, qs)))
    }
}

pub(super) struct Q4_1;
impl Legacy for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ROW_DOT: VecDotFn = legacy::q4_1_q8_1;
    const W_BLOCK: usize = size_of::<BlockQ4_1>();
    const A_BLOCK: usize = size_of::<BlockQ8_1>();
    const A_QS: usize = offset_of!(BlockQ8_1, qs);
    // 16 products: sum q * a <= 16 * 15 * 127 = 30480.
    const GROUP: usize = 8;
    const SIGNED: bool = false;
    const OFFSET: i16 = 0;
    const MIN_AT: Option<usize> = Some(offset_of!(BlockQ4_1, m));

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        nibbles32(p.add(offset_of!(BlockQ4_1, qs)))
    }
}

pub(super) struct Q5_0;
impl Legacy for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ROW_DOT: VecDotFn = legacy::q5_0_q8_0;
    const W_BLOCK: usize = size_of::<BlockQ5_0>();
    const A_BLOCK: usize = size_of::<BlockQ8_0>();
    const A_QS: usize = offset_of!(BlockQ8_0, qs);
    // 16 products: |sum (q - 16) * a| <= 16 * 16 * 127 = 32512 (the unsigned sums wrap).
    const GROUP: usize = 8;
    const SIGNED: bool = false;
    const OFFSET: i16 = 16;
    const MIN_AT: Option<usize> = None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        let fifth = fifth_bits(read_u32(p.add(offset_of!(BlockQ5_0, qh))));
        _mm256_or_si256(nibbles32(p.add(offset_of!(BlockQ5_0, qs))), fifth)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn quants_avx512(p: *const u8) -> __m256i {
        // Bit i of qh adds 16 to byte i: one masked add instead of spreading the bits.
        let nibbles = nibbles32(p.add(offset_of!(BlockQ5_0, qs)));
        let qh = read_u32(p.add(offset_of!(BlockQ5_0, qh)));
        _mm256_mask_add_epi8(nibbles, qh, nibbles, _mm256_set1_epi8(16))
    }
}

pub(super) struct Q5_1;
impl Legacy for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ROW_DOT: VecDotFn = legacy::q5_1_q8_1;
    const W_BLOCK: usize = size_of::<BlockQ5_1>();
    const A_BLOCK: usize = size_of::<BlockQ8_1>();
    const A_QS: usize = offset_of!(BlockQ8_1, qs);
    // 8 products: sum q * a <= 8 * 31 * 127 = 31496.
    const GROUP: usize = 4;
    const SIGNED: bool = false;
    const OFFSET: i16 = 0;
    const MIN_AT: Option<usize> = Some(offset_of!(BlockQ5_1, m));

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        let fifth = fifth_bits(read_u32(p.add(offset_of!(BlockQ5_1, qh))));
        _mm256_or_si256(nibbles32(p.add(offset_of!(BlockQ5_1, qs))), fifth)
    }
}

pub(super) struct Q8_0;
impl Legacy for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ROW_DOT: VecDotFn = legacy::q8_0_q8_0;
    const W_BLOCK: usize = size_of::<BlockQ8_0>();
    const A_BLOCK: usize = size_of::<BlockQ8_0>();
    const A_QS: usize = offset_of!(BlockQ8_0, qs);
    // A single pair: 2 * 128 * 127 = 32512, no room for a second chunk. So each `maddubs`
    // costs a sign, a `madd` and an add beside it, and this tile runs at about half the rate of
    // the other formats' on AVX2 (46 against 91 GMAC/s for Q5_0 on Zen 3, `examples/gemm_bench`):
    // what bounds Gemma 3's tied Q8_0 output projection in batched decode there.
    const GROUP: usize = 1;
    const SIGNED: bool = true;
    const OFFSET: i16 = 0;
    const MIN_AT: Option<usize> = None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        load32(p.add(offset_of!(BlockQ8_0, qs)))
    }
}

/// One activation row against `rows` weight rows, each output computed with exactly the
/// operations of lane `r` of [`Blocks32::tile`] (so bit-identical to the tile kernels at any
/// number of activation rows), but reading the weight rows where they lie instead of packing
/// them into panels: the decode (one-row) product of batch-invariant mode.
///
/// Eight rows at a time. Each row is walked from start to end (one sequential stream, as a row
/// dot reads it): the integer dot of each block is formed as in a row dot (exact: `maddubs` of
/// one chunk pair widened at once by `madd`), eight blocks' lane sums are reduced into one
/// vector (lane `j`: block `b0 + j`), kept in `sums`. A transpose then gives, per block, the
/// eight rows' block sums in one vector — the exact integers the tile kernel holds in its lanes;
/// the offset formats subtract `offset * sum(a)` (exact). What follows is the tile kernel's f32
/// step, block after block: `acc = fma(sum, d * da, acc)`, then `acc = fma(m, s, acc)` for the
/// `_1` formats.
///
/// # Safety
/// AVX2+FMA+F16C; `w` holds `rows` rows of `blocks` blocks (`blocks * W_BLOCK` bytes each), `a`
/// one activation row of `blocks` blocks, `out` has room for `rows` values; `sums` has room for
/// [`rows_exact_scratch`]`(blocks)` vectors.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_exact<L: Legacy>(
    blocks: usize,
    w: *const u8,
    rows: usize,
    a: *const u8,
    out: *mut f32,
    sums: *mut __m256i,
) {
    let w_row = blocks * L::W_BLOCK;
    let ones = _mm256_set1_epi16(1);
    let groups = blocks.div_ceil(8);
    // What each activation block contributes to every row, once per call: its scale `da`, the
    // offset formats' `offset * sum(a)` and the `_1` formats' `s`, in `blocks` words each.
    let da = sums.add(groups * PANEL_ROWS).cast::<f32>();
    let offsets = da.add(blocks).cast::<i32>();
    let s_terms = offsets.add(blocks).cast::<f32>();
    for b in 0..blocks {
        let ab = a.add(b * L::A_BLOCK);
        *da.add(b) = half(ab);
        if L::OFFSET != 0 {
            let aq = load32(ab.add(L::A_QS));
            let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), aq), ones);
            *offsets.add(b) = hsum_i32(pairs) * i32::from(L::OFFSET);
        }
        if L::MIN_AT.is_some() {
            *s_terms.add(b) = half(ab.add(offset_of!(BlockQ8_1, s)));
        }
    }
    // The exact integer dot of block `b` of `row`, in 8 i32 lanes.
    let block_dot = |row: *const u8, b: usize| {
        let aq = load32(a.add(b * L::A_BLOCK + L::A_QS));
        let wq = L::quants(row.add(b * L::W_BLOCK));
        let prod = if L::SIGNED {
            _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(aq, wq))
        } else {
            _mm256_maddubs_epi16(wq, aq)
        };
        _mm256_madd_epi16(prod, ones)
    };
    for r0 in (0..rows).step_by(PANEL_ROWS) {
        let p: [*const u8; PANEL_ROWS] =
            std::array::from_fn(|r| w.add((r0 + r).min(rows - 1) * w_row));
        for (r, &row) in p.iter().enumerate() {
            for g in 0..groups {
                prefetch_ahead(row.add(g * 8 * L::W_BLOCK), (8 * L::W_BLOCK).div_ceil(64));
                let v: [__m256i; 8] = if (g + 1) * 8 <= blocks {
                    std::array::from_fn(|j| block_dot(row, g * 8 + j))
                } else {
                    std::array::from_fn(|j| {
                        let b = g * 8 + j;
                        if b < blocks {
                            block_dot(row, b)
                        } else {
                            _mm256_setzero_si256()
                        }
                    })
                };
                *sums.add(g * PANEL_ROWS + r) = sum_rows(v);
            }
        }
        let mut acc = _mm256_setzero_ps();
        for g in 0..groups {
            let t = transpose(std::array::from_fn(|r| *sums.add(g * PANEL_ROWS + r)));
            for (j, &raw) in t.iter().enumerate().take(blocks - g * 8) {
                let b = g * 8 + j;
                let isum = if L::OFFSET != 0 {
                    _mm256_sub_epi32(raw, _mm256_set1_epi32(*offsets.add(b)))
                } else {
                    raw
                };
                let d = halves(&p, b * L::W_BLOCK);
                let da = _mm256_set1_ps(*da.add(b));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, da), acc);
                if let Some(at) = L::MIN_AT {
                    let m = halves(&p, b * L::W_BLOCK + at);
                    acc = _mm256_fmadd_ps(m, _mm256_set1_ps(*s_terms.add(b)), acc);
                }
            }
        }
        super::store_lanes(out.add(r0), acc, (rows - r0).min(PANEL_ROWS));
    }
}

/// The 32-byte vectors of scratch that [`rows_exact`] takes for `blocks` blocks: the block sums
/// of a panel, then three words per activation block.
pub(super) fn rows_exact_scratch(blocks: usize) -> usize {
    blocks.div_ceil(8) * PANEL_ROWS + (3 * blocks).div_ceil(8)
}

/// Lane `r` of the result: the sum of the 8 lanes of `v[r]` (exact, wrapping i32 adds of values
/// far from the i32 range).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sum_rows(v: [__m256i; PANEL_ROWS]) -> __m256i {
    let (lo, hi) = sum_rows_halves(v);
    _mm256_add_epi32(lo, hi)
}

/// Lane `r` of the first result: the sum of lanes 0..4 of `v[r]`; of the second: of lanes
/// 4..8 (exact as [`sum_rows`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sum_rows_halves(v: [__m256i; PANEL_ROWS]) -> (__m256i, __m256i) {
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t2 = _mm256_hadd_epi32(v[4], v[5]);
    let t3 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit half: the sums of that half's lanes of rows 0..4 (u0) and 4..8 (u1).
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    (
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// The sum of the 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The halves at `p[r] + at`, widened to f32 (exact), in lane `r`.
///
/// # Safety
/// Each `p[r] + at` has 2 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn halves(p: &[*const u8; PANEL_ROWS], at: usize) -> __m256 {
    // Gathered in two general registers: eight 2-byte stores read back as one 16-byte load
    // would stall on store forwarding.
    let (mut lo, mut hi) = (0u64, 0u64);
    for r in 0..4 {
        lo |= u64::from(read_f16_bits(p[r].add(at))) << (16 * r);
        hi |= u64::from(read_f16_bits(p[r + 4].add(at))) << (16 * r);
    }
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// 32-byte lines of the narrow kernel's activation panel per pair of blocks: 8 chunk lines of
/// 64 bytes (see `narrow_pack`), then three 64-byte lines with activation row `j` in lanes `2j`
/// (the pair's first block) and `2j + 1` (its second): the negated `OFFSET * sum(a)` (i32;
/// Q4_0, Q5_0, and 128 for Q8_0's biased quants), `da` (f32) and `s` (f32; Q4_1, Q5_1).
const PAIR_LINES: usize = 2 * PANEL_ROWS + 6;

/// Lines of scratch per block of the narrow kernel: a pair's lines per block, with room for the
/// half-empty last pair of an odd number of blocks.
pub(in crate::kernels::x86) const NARROW_LINES: usize = PAIR_LINES;

/// Weight rows taken at once by the narrow kernel: independent `vpdpbusd` chains that hide its
/// latency, sharing each load of the activation panel.
const NARROW_ROWS: usize = 8;

/// Which 4-quant chunk of each block the qword `t` of a pair's unpacked weights holds (their
/// dword interleave, `unpacklo`/`unpackhi` per 128-bit half, puts chunk `c` of both blocks side
/// by side in this order).
const PAIR_CHUNK: [usize; PANEL_ROWS] = [0, 1, 4, 5, 2, 3, 6, 7];

/// The weights against 2 to 8 activation rows with the roles of the tile kernel swapped: the
/// activations are packed once per call into one panel (activation row `j` in lanes `2j` and
/// `2j + 1`; rows past `cols` repeat the last one, computed and never stored) and the weights
/// are read where they lie, 8 rows at a time, two blocks at a time. Each pair of blocks' quants
/// is unpacked once, interleaved by 4-quant chunks, so that one qword holds chunk `c` of both
/// blocks; broadcast, it meets a 512-bit panel line holding chunk `c` of every activation row's
/// first block in the even lanes and of its second block in the odd ones, in one `vpdpbusd`.
/// After the 8 chunks, lane `2j` holds activation row `j`'s whole sum over the first block and
/// lane `2j + 1` over the second: one f32 step (`cvt`, `mul`, `fma`) on 16 lanes serves two
/// blocks. (With one block per 512-bit step, lanes held half-block sums and the f32 step ran
/// once per block: 131 GMAC/s at 8 rows on one core for Q8_0, 112 for Q5_0, 129 for Q4_0;
/// now 142, 116 and 135, `examples/gemm_bench`, alternating runs. Chunk lines of 8 lanes and
/// 256-bit `vpdpbusd`, which would also have made each lane a whole block, ran at 104.) No
/// weight panels: the weights stream from memory in order, the next 8 rows requested a few
/// lines per pair, where the tile kernel's packing stalled on them (batched decode, whose
/// products read every weight once per step).
///
/// The quants are the `u8` operand (Q8_0's biased to `q + 128`, as its VNNI tile stores them) and
/// the activations the `i8` one; each pair's `vpdpbusd` chain starts from the negated
/// `OFFSET * sum(a)` (8 for Q4_0, 16 for Q5_0, 128 for Q8_0) of the lane's block, so each lane
/// holds the exact integer sum `(q - OFFSET) * a` of its block. Then `acc = fma(sum, d * da,
/// acc)` (and `fma(m, s, acc)` for the `_1` formats), the lane pairs added once per row at the
/// end. The second block of an odd count's last pair is zeros on both sides (and its factors
/// 0): its lanes add nothing, and no weight byte past the row is read. Same values as the tile
/// kernel up to the order of the f32 additions (not bit-identical: batch-invariant mode runs the
/// tiles).
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI; of `call`'s fields, `w` holds `rows` rows of
/// `blocks` blocks (`w_row` bytes each), `a` `cols` rows of `blocks` activation blocks (`a_row`
/// bytes each), `cols` in
/// 2..=8; `out + c * ldo + r` is writable for `r < rows`, `c < cols`; `scratch` has room for
/// `blocks * NARROW_LINES` lines.
///
/// The kernel is two steps, [`narrow_pack`] (the activation panel) and [`narrow_rows_all`] (the
/// weight rows against it): the tasks of one product share its activations, so a thread packs
/// them once for all its tasks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn narrow_pack<L: Legacy>(call: &Call, scratch: *mut u8) {
    let Call {
        blocks,
        a,
        a_row,
        cols,
        ..
    } = *call;
    let line = PAIR_LINES * 32;
    for pair in 0..blocks.div_ceil(2) {
        let dst = scratch.add(pair * line);
        // The pair's blocks of activation row `j`: the second `None` past the last block.
        let block = |j: usize, half: usize| {
            let b = 2 * pair + half;
            (b < blocks).then(|| a.add(j.min(cols - 1) * a_row + b * L::A_BLOCK))
        };
        // Chunk line `t` (64 bytes): dword `2j + h` = chunk `PAIR_CHUNK[t]` of activation row
        // `j`'s block `h` of the pair (zeros for a missing block).
        for (t, &c) in PAIR_CHUNK.iter().enumerate() {
            for j in 0..PANEL_ROWS {
                for h in 0..2 {
                    let q = block(j, h)
                        .map_or(0, |y| y.add(L::A_QS + 4 * c).cast::<u32>().read_unaligned());
                    dst.add(64 * t + 8 * j + 4 * h)
                        .cast::<u32>()
                        .write_unaligned(q);
                }
            }
        }
        // The offset's share of each lane, so that each lane's sum is its block's exact
        // `(q - OFFSET) * a`.
        let mut shares = _mm512_setzero_si512();
        if Blocks32Vnni::<L>::OFFSET != 0 {
            let offset = _mm512_set1_epi8(Blocks32Vnni::<L>::OFFSET as u8 as i8);
            for t in 0..PANEL_ROWS {
                let chunks = _mm512_loadu_si512(dst.add(64 * t).cast());
                shares = _mm512_dpbusd_epi32(shares, offset, chunks);
            }
        }
        let start = _mm512_sub_epi32(_mm512_setzero_si512(), shares);
        _mm512_storeu_si512(dst.add(PIECE + 256).cast(), start);
        // `da` (and `s` of the `_1` formats) of each activation block, in the lanes of its sums.
        let (mut da, mut s) = ([0f32; 16], [0f32; 16]);
        for j in 0..PANEL_ROWS {
            for h in 0..2 {
                if let Some(y) = block(j, h) {
                    da[2 * j + h] = half(y);
                    if L::MIN_AT.is_some() {
                        s[2 * j + h] = half(y.add(offset_of!(BlockQ8_1, s)));
                    }
                }
            }
        }
        _mm512_storeu_ps(dst.add(PIECE + 320).cast(), _mm512_loadu_ps(da.as_ptr()));
        _mm512_storeu_ps(dst.add(PIECE + 384).cast(), _mm512_loadu_ps(s.as_ptr()));
    }
}

/// The weight rows of [`narrow_pack`]'s kernel against the panel that it packed for `call`'s
/// activations.
///
/// # Safety
/// As [`narrow_pack`], with the panel packed in `scratch` from the same activations.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn narrow_rows_all<L: Legacy>(call: &Call, scratch: *mut u8) {
    let rows = call.rows;
    let mut r = 0;
    while r + NARROW_ROWS <= rows {
        narrow_rows::<L, NARROW_ROWS>(call, r, scratch);
        r += NARROW_ROWS;
    }
    while r < rows {
        narrow_rows::<L, 1>(call, r, scratch);
        r += 1;
    }
}

/// Rows `r0..r0 + R` of the kernel of [`narrow_pack`], against the packed activation panel at
/// `panel`.
///
/// # Safety
/// As `narrow_pack`, with `r0 + R <= rows` and the panel packed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn narrow_rows<L: Legacy, const R: usize>(call: &Call, r0: usize, panel: *const u8) {
    let Call {
        blocks,
        w,
        w_row,
        cols,
        out,
        ldo,
        ..
    } = *call;
    let rows: [*const u8; R] = std::array::from_fn(|i| w.add((r0 + i) * w_row));
    let mut acc = [_mm512_setzero_ps(); R];
    let pairs = blocks.div_ceil(2);
    // The next rows' bytes, requested a few lines per pair (see `drive` for why spread out).
    let next = w.wrapping_add((r0 + R) * w_row);
    let lines = (R * w_row).div_ceil(64);
    let per_pair = lines.div_ceil(pairs);
    // Unpacked quants of the current pair of blocks of each row, chunk-interleaved, read back 8
    // bytes at a time.
    let mut unpacked = [[Line([0; 32]); 2]; R];
    for pair in 0..blocks / 2 {
        prefetch_share(next, lines, per_pair, pair);
        narrow_pair::<L, R, true>(&rows, 2 * pair, panel, &mut unpacked, &mut acc);
    }
    if blocks % 2 == 1 {
        narrow_pair::<L, R, false>(&rows, blocks - 1, panel, &mut unpacked, &mut acc);
    }
    // Lane pair (2j, 2j + 1) -> lane j.
    let folded = acc.map(|v| {
        let v = _mm512_castps_si512(v);
        let odd = _mm512_castsi512_ps(_mm512_srli_epi64::<32>(v));
        let sum = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(v), odd));
        _mm256_castsi256_ps(_mm512_cvtepi64_epi32(sum))
    });
    store_columns(folded, out, ldo, r0, cols);
}

/// Blocks `b` and `b + 1` (only `b` unless `FULL`: the last of an odd count, its partner zeros)
/// of rows `rows` into `acc`, against the pair's panel lines (see [`narrow_pack`]).
///
/// # Safety
/// As `narrow_rows`; `b + 1 < blocks` when `FULL`, else `b + 1 == blocks`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn narrow_pair<L: Legacy, const R: usize, const FULL: bool>(
    rows: &[*const u8; R],
    b: usize,
    panel: *const u8,
    unpacked: &mut [[Line; 2]; R],
    acc: &mut [__m512; R],
) {
    let p = panel.add(b / 2 * PAIR_LINES * 32);
    let bias = _mm256_set1_epi8(if L::SIGNED { -128 } else { 0 });
    for i in 0..R {
        let first = rows[i].add(b * L::W_BLOCK);
        let q0 = _mm256_xor_si256(L::quants_avx512(first), bias);
        let q1 = if FULL {
            _mm256_xor_si256(L::quants_avx512(first.add(L::W_BLOCK)), bias)
        } else {
            _mm256_setzero_si256()
        };
        // Per 128-bit half: dwords (0, 1) and (4, 5) of both blocks interleaved, then (2, 3) and
        // (6, 7): qword `t` holds chunk `PAIR_CHUNK[t]` of each.
        _mm256_storeu_si256(
            unpacked[i][0].0.as_mut_ptr().cast(),
            _mm256_unpacklo_epi32(q0, q1),
        );
        _mm256_storeu_si256(
            unpacked[i][1].0.as_mut_ptr().cast(),
            _mm256_unpackhi_epi32(q0, q1),
        );
    }
    // An empty block that may read and write memory: the compiler must reload the chunks below,
    // as broadcasts from memory (load units), instead of forwarding the stores into shuffles,
    // which saturated the shuffle units.
    std::arch::asm!("/* {0} */", in(reg) unpacked.as_ptr(), options(nostack, preserves_flags));
    let start = if Blocks32Vnni::<L>::OFFSET != 0 {
        _mm512_loadu_si512(p.add(PIECE + 256).cast())
    } else {
        _mm512_setzero_si512()
    };
    let mut wide = [start; R];
    for t in 0..PANEL_ROWS {
        let act = _mm512_loadu_si512(p.add(64 * t).cast());
        for i in 0..R {
            let chunks = unpacked[i][t / 4]
                .0
                .as_ptr()
                .add(8 * (t % 4))
                .cast::<i64>()
                .read_unaligned();
            wide[i] = _mm512_dpbusd_epi32(wide[i], _mm512_set1_epi64(chunks), act);
        }
    }
    let da = _mm512_loadu_ps(p.add(PIECE + 320).cast());
    // The rows' two factors as f32 pairs (0 for a missing second block), 8 rows converted at
    // once when there are 8, interleaved into pairs (row `i`'s at `PAIR_AT[i]`) and broadcast
    // from memory.
    const PAIR_AT: [usize; PANEL_ROWS] = [0, 2, 8, 10, 4, 6, 12, 14];
    let mut d = [0f32; 2 * PANEL_ROWS];
    let mut m = [0f32; 2 * PANEL_ROWS];
    let at = b * L::W_BLOCK;
    if R == PANEL_ROWS {
        let all0: [*const u8; PANEL_ROWS] = std::array::from_fn(|i| rows[i].add(at));
        let interleave = |dst: &mut [f32; 2 * PANEL_ROWS], field: usize| {
            let d0 = halves(&all0, field);
            let d1 = if FULL {
                let all1: [*const u8; PANEL_ROWS] = all0.map(|p| p.add(L::W_BLOCK));
                halves(&all1, field)
            } else {
                _mm256_setzero_ps()
            };
            _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_unpacklo_ps(d0, d1));
            _mm256_storeu_ps(dst.as_mut_ptr().add(PANEL_ROWS), _mm256_unpackhi_ps(d0, d1));
        };
        interleave(&mut d, 0);
        if let Some(min_at) = L::MIN_AT {
            interleave(&mut m, min_at);
        }
    } else {
        d[0] = half(rows[0].add(at));
        if FULL {
            d[1] = half(rows[0].add(at + L::W_BLOCK));
        }
        if let Some(min_at) = L::MIN_AT {
            m[0] = half(rows[0].add(at + min_at));
            if FULL {
                m[1] = half(rows[0].add(at + L::W_BLOCK + min_at));
            }
        }
    }
    for i in 0..R {
        let pair = |v: &[f32; 2 * PANEL_ROWS]| {
            _mm512_castpd_ps(_mm512_set1_pd(
                v.as_ptr().add(PAIR_AT[i]).cast::<f64>().read_unaligned(),
            ))
        };
        acc[i] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(wide[i]),
            _mm512_mul_ps(pair(&d), da),
            acc[i],
        );
        if L::MIN_AT.is_some() {
            let s = _mm512_loadu_ps(p.add(PIECE + 384).cast());
            acc[i] = _mm512_fmadd_ps(pair(&m), s, acc[i]);
        }
    }
}

/// Blocks of the activation row prepared at once by [`rows_vnni`] (its stack scratch): longer
/// rows are taken in slices of this many blocks, each slice's dot added to `out`.
const VNNI_ROW_SLICE: usize = 64;

/// One activation row against `rows` weight rows of a format without minimum (Q4_0, Q5_0, Q8_0)
/// on AVX-512 VNNI: the fast one-row product of decode (`kernels::gemv_fn`). Same value as the
/// row dot up to the order of the f32 additions; not bit-identical to the tiles.
///
/// Everything that depends on the activation row alone is prepared once per call, not once per
/// weight row: the activation quants of each pair of blocks side by side in one 64-byte line,
/// each lane's `offset * (sum of its 4 quants)`, negated, which becomes the starting accumulator
/// of the pair's `vpdpbusd` (so the unsigned quants need no correction afterwards), and each
/// block's `da` as f32. Per weight row, two blocks at a time: their 64 quants unsigned (Q8_0
/// biased by 128) in one 512-bit register, one `vpdpbusd` against the pair's line (lanes 0-7
/// the first block, 8-15 the second), and one f32 multiply-add by the factors `d * da` of each
/// block in its half, four blocks' factors converted at once and two accumulators in flight. A
/// last odd block takes the 256-bit step alone.
///
/// Half the instructions per byte of a block at a time (one 256-bit step each): decode streams
/// the weights from memory, and fewer instructions between the loads let the core run further
/// ahead of them.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI; `w` holds `rows` rows of `blocks` blocks
/// (`blocks * W_BLOCK` bytes each), `a` one Q8_0 row of `blocks` blocks, `out` has room for
/// `rows` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_vnni<L: Legacy>(
    blocks: usize,
    w: *const u8,
    rows: usize,
    a: *const u8,
    out: *mut f32,
) {
    const { assert!(L::MIN_AT.is_none()) };
    const PAIRS: usize = VNNI_ROW_SLICE / 2;
    let offset = Blocks32Vnni::<L>::OFFSET;
    let w_row = blocks * L::W_BLOCK;
    let bias = _mm512_set1_epi8(if L::SIGNED { -128 } else { 0 });
    // Per pair of the slice: the two activation blocks' quants, and the starting accumulators.
    let mut act = [_mm512_setzero_si512(); PAIRS];
    let mut start = [_mm512_setzero_si512(); PAIRS];
    let mut da = [0f32; VNNI_ROW_SLICE];
    for s0 in (0..blocks).step_by(VNNI_ROW_SLICE) {
        let n = VNNI_ROW_SLICE.min(blocks - s0);
        let a = a.add(s0 * L::A_BLOCK);
        for p in 0..n.div_ceil(2) {
            let first = load32(a.add(2 * p * L::A_BLOCK + L::A_QS));
            let second = if 2 * p + 1 < n {
                load32(a.add((2 * p + 1) * L::A_BLOCK + L::A_QS))
            } else {
                _mm256_setzero_si256()
            };
            act[p] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second);
            // offset * a summed per lane of 4 quants: |.| <= 4 * 128 * 127, exact.
            let shares = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(),
                _mm512_set1_epi8(offset as u8 as i8),
                act[p],
            );
            start[p] = _mm512_sub_epi32(_mm512_setzero_si512(), shares);
        }
        for (b, d) in da.iter_mut().enumerate().take(n) {
            *d = half(a.add(b * L::A_BLOCK));
        }
        for r in 0..rows {
            let row = w.add(r * w_row + s0 * L::W_BLOCK);
            let mut acc = [_mm512_setzero_ps(); 2];
            let mut b = 0;
            while b + 4 <= n {
                prefetch_ahead(row.add(b * L::W_BLOCK), (4 * L::W_BLOCK).div_ceil(64));
                let mut bits = 0u64;
                for j in 0..4 {
                    bits |= u64::from(read_f16_bits(row.add((b + j) * L::W_BLOCK))) << (16 * j);
                }
                let d = _mm_mul_ps(
                    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)),
                    _mm_loadu_ps(da.as_ptr().add(b)),
                );
                let d = _mm512_castps128_ps512(d);
                // Block b's factor in lanes 0-7 and b + 1's in 8-15; then b + 2 and b + 3.
                let d01 = _mm512_permutexvar_ps(
                    _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                    d,
                );
                let d23 = _mm512_permutexvar_ps(
                    _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
                    d,
                );
                acc[0] = _mm512_fmadd_ps(d01, pair_dot::<L>(row, b, bias, &start, &act), acc[0]);
                acc[1] =
                    _mm512_fmadd_ps(d23, pair_dot::<L>(row, b + 2, bias, &start, &act), acc[1]);
                b += 4;
            }
            if b + 2 <= n {
                let d0 = half(row.add(b * L::W_BLOCK)) * da[b];
                let d1 = half(row.add((b + 1) * L::W_BLOCK)) * da[b + 1];
                let d = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
                acc[0] = _mm512_fmadd_ps(d, pair_dot::<L>(row, b, bias, &start, &act), acc[0]);
                b += 2;
            }
            let total = _mm512_add_ps(acc[0], acc[1]);
            let high = _mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(total));
            let mut total = _mm256_add_ps(_mm512_castps512_ps256(total), _mm256_castsi256_ps(high));
            if b < n {
                // The last of an odd count: its lanes 0-7 of the pair step.
                let p = row.add(b * L::W_BLOCK);
                let q = _mm256_xor_si256(L::quants_avx512(p), _mm512_castsi512_si256(bias));
                let sum = _mm256_dpbusd_epi32(
                    _mm512_castsi512_si256(start[b / 2]),
                    q,
                    _mm512_castsi512_si256(act[b / 2]),
                );
                let d = half(p) * da[b];
                total = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum), total);
            }
            let dot = hsum_ps(total);
            *out.add(r) = if s0 == 0 { dot } else { *out.add(r) + dot };
        }
    }
}

/// Blocks `b` and `b + 1` of the weight row at `row` ([`rows_vnni`]): their 64 quants unsigned
/// (`bias` applied), dotted with the pair's activation line from its starting accumulator, as
/// f32 (lanes 0-7 block `b`, 8-15 block `b + 1`). |sum| <= 32 * 255 * 127 per lane: far inside
/// i32.
///
/// # Safety
/// As `rows_vnni`, with both blocks inside the row and `b / 2` a prepared pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_dot<L: Legacy>(
    row: *const u8,
    b: usize,
    bias: __m512i,
    start: &[__m512i],
    act: &[__m512i],
) -> __m512 {
    let p = row.add(b * L::W_BLOCK);
    let q = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(L::quants_avx512(p)),
        L::quants_avx512(p.add(L::W_BLOCK)),
    );
    let q = _mm512_xor_si512(q, bias);
    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start[b / 2], q, act[b / 2]))
}
