//! Tile kernels of the k-quants Q4_K, Q5_K, Q6_K against Q8_K activations.
//!
//! A super-block of 256 weights has 8 sub-blocks of 32 (Q4_K, Q5_K) or 16 of 16 (Q6_K), each
//! with an integer scale `sc`; the i16 sums of a group of chunks are widened by `madd` against
//! `sc` (lane `r`: the scale of row `r` as an i16 pair). Q4_K and Q5_K subtract
//! `dmin * da * sum(mn * S)` in f32 (the minimums, against the activation block's sums `S` of
//! each sub-block of 32); Q6_K's quants are stored as `q + 32`, its offset shares subtracted in
//! the i16 sums.
//!
//! Panel block: 8 pieces of quants, `SUBS` lines of scales, then for the formats with minimums
//! 4 lines of minimum pairs (lane `r` of line `h`: `mn[2h], mn[2h + 1]` of row `r`, one `madd`
//! against the pair `S[2h], S[2h + 1]`) and the line of `dmin`, then the line of `d` (f32
//! lanes). Activation factors per block: Q6_K's offset shares of each sub-block as an i16 pair;
//! for the formats with minimums the 4 pairs `S[2h], S[2h + 1]` (`S[g] = bsums[2g] +
//! bsums[2g + 1]`, at most 32 * 127 in magnitude: an i16). Pairing the minimums so halves the
//! `madd`s of the minimums (8 against `(mn, mn)` and the raw `bsums` before: a tenth of the
//! multiplies of a Q4_K block, 8 of 80 per panel and activation row); the integer is the same,
//! so are the results.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};

use kiln_core::GgmlType;
use kiln_quant::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};

use super::super::{kquants, load32, prefetch_ahead, read_f32};
use super::{
    broadcast4, half, offset_shares, prefetch_share, store_columns, store_halves, store_piece,
    sum_lanes_per_half, Call, Format, Shape, PANEL_ROWS, PIECE,
};
use crate::kernels::VecDotFn;

mod interleaved;

pub(super) use interleaved::Q4Layout;

const Q8K: usize = size_of::<BlockQ8K>();
const Q8K_QS: usize = offset_of!(BlockQ8K, qs);
const Q8K_BSUMS: usize = offset_of!(BlockQ8K, bsums);

/// What one row's super-block has besides its quants and `d`, `dmin`.
pub(super) struct KScales {
    /// The integer scale of each sub-block (the first `SUBS`).
    sc: [i16; 16],
    /// The integer minimum of each sub-block of 32 (formats with minimums).
    mn: [i16; 8],
}

/// A 256-element k-quant whose quants are at most 6 bits.
pub(super) trait KQuant {
    const TYPE: GgmlType;
    const W_BLOCK: usize;
    /// Sub-blocks with their own scale: 8 of 32 elements or 16 of 16.
    const SUBS: usize;
    /// Chunks (of 4 quants) whose `maddubs` results are added as i16 before the `madd` by the
    /// sub-block scale: a divisor of the sub-block's chunks (see the bounds at each format).
    const GROUP: usize;
    /// The weight is `d * sc * (q - OFFSET)` (Q6_K: 32), or 0 for the formats with minimums.
    const OFFSET: i16;
    /// Where `d` is, and `dmin` for the formats with minimums (`w = d * sc * q - dmin * mn`).
    const D_AT: usize;
    const DMIN_AT: Option<usize>;
    /// See `Format::MIN_COLS`: a super-block's scales take a while to unpack.
    const MIN_COLS: usize;
    /// The AVX2 row dot.
    const ROW_DOT: VecDotFn;

    /// Quants `32t..32t + 32` of the super-block at `p`, unsigned, in element order.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `p` points at a readable block, `t < 8`.
    unsafe fn quants(p: *const u8, t: usize) -> __m256i;

    /// The sub-block scales (and minimums) of the super-block at `p`.
    ///
    /// # Safety
    /// `p` points at a readable block.
    unsafe fn scales(p: *const u8) -> KScales;

    /// Vectors of one Q8_K block prepared by [`KQuant::prepare`] (0: none).
    const PREPARED: usize = 0;

    /// Prepares the Q8_K block at `y` for [`KQuant::block_ints`] into `out` (`PREPARED`
    /// vectors).
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `y` points at a readable Q8_K block, `out` at `PREPARED` vectors.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prepare(_y: *const u8, _out: *mut __m256i) {}

    /// The exact integers of one super-block at `p` against the Q8_K block at `y` (prepared at
    /// `yp`), the row dot's integers (`kquants::q4_k_block_ints_paired`): the scaled quant dot (less
    /// Q6_K's offset) summed over the 8 lanes of the first, the minimums' dot over the 8 lanes
    /// of the second (zero without minimums).
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `p` points at a readable block, `y` at a Q8_K block, `yp` at what
    /// `prepare(y)` wrote.
    unsafe fn block_ints(p: *const u8, y: *const u8, yp: *const __m256i) -> (__m256i, __m256i);
}

/// The tile format of a `KQuant`.
pub(super) struct SuperBlocks<K>(PhantomData<K>);

impl<K: KQuant> SuperBlocks<K> {
    const SUB_CHUNKS: usize = 64 / K::SUBS;
    const SCALES_AT: usize = 8 * PIECE;
    const MINS_AT: usize = Self::SCALES_AT + 32 * K::SUBS;
    const DMIN_LINE_AT: usize = Self::MINS_AT + 32 * MIN_PAIRS;
    const D_LINE_AT: usize = if K::DMIN_AT.is_some() {
        Self::DMIN_LINE_AT + 32
    } else {
        Self::MINS_AT
    };

    /// Packs one super-block of each of the 8 rows at `src` into the panel block at `dst`, each
    /// sub-block scale stored as the 32-bit lane `lane(sc)`.
    ///
    /// # Safety
    /// As `Format::pack`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_scaled(src: &[*const u8; PANEL_ROWS], dst: *mut u8, lane: fn(i16) -> u32) {
        for t in 0..QK_K / 32 {
            store_piece(dst.add(t * PIECE), |r| K::quants(src[r], t));
        }
        for (r, &p) in src.iter().enumerate() {
            let s = K::scales(p);
            for g in 0..K::SUBS {
                let at = dst.add(Self::SCALES_AT + 32 * g + 4 * r);
                at.cast::<u32>().write_unaligned(lane(s.sc[g]));
            }
            if K::DMIN_AT.is_some() {
                for h in 0..MIN_PAIRS {
                    let at = dst.add(Self::MINS_AT + 32 * h + 4 * r);
                    at.cast::<u32>()
                        .write_unaligned(i16_pair(s.mn[2 * h], s.mn[2 * h + 1]));
                }
            }
        }
        if let Some(at) = K::DMIN_AT {
            store_halves(dst.add(Self::DMIN_LINE_AT), src, at);
        }
        store_halves(dst.add(Self::D_LINE_AT), src, K::D_AT);
    }

    /// The f32 step of one super-block of a micro-tile, shared by the AVX2 and VNNI kernels (so
    /// that their results are bit-identical): `acc += isum * (d * da)`, then for the formats
    /// with minimums `acc -= sum(mn * S) * (dmin * da)`.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; each `p[i]` points at a packed panel block, each `y[j]` at the Q8_K block
    /// and, for the formats with minimums, each `f[j]` at its [`min_sums`] pairs.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish_block<const NP: usize, const NR: usize>(
        acc: &mut [[__m256; NR]; NP],
        isum: &[[__m256i; NR]; NP],
        p: &[*const u8; NP],
        y: &[*const u8; NR],
        f: &[*const u32; NR],
    ) {
        for i in 0..NP {
            let d = _mm256_loadu_ps(p[i].add(Self::D_LINE_AT).cast());
            for j in 0..NR {
                let da = _mm256_set1_ps(read_f32(y[j]));
                let sum = _mm256_cvtepi32_ps(isum[i][j]);
                acc[i][j] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, da), acc[i][j]);
                if K::DMIN_AT.is_some() {
                    let mut mins = _mm256_setzero_si256();
                    for h in 0..MIN_PAIRS {
                        let pairs = load32(p[i].add(Self::MINS_AT + 32 * h));
                        let sums = broadcast4(f[j].add(h).cast());
                        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(pairs, sums));
                    }
                    let dmin = _mm256_loadu_ps(p[i].add(Self::DMIN_LINE_AT).cast());
                    let mins = _mm256_cvtepi32_ps(mins);
                    acc[i][j] = _mm256_fnmadd_ps(mins, _mm256_mul_ps(dmin, da), acc[i][j]);
                }
            }
        }
    }
}

impl<K: KQuant> Format for SuperBlocks<K> {
    const TYPE: GgmlType = K::TYPE;
    const QK: usize = QK_K;
    const W_BLOCK: usize = K::W_BLOCK;
    const A_BLOCK: usize = Q8K;
    const PANEL_LINES: usize = Self::D_LINE_AT / 32 + 1;
    const FACTOR_WORDS: usize = if K::OFFSET != 0 {
        K::SUBS
    } else if K::DMIN_AT.is_some() {
        MIN_PAIRS
    } else {
        0
    };
    // 2 panels x 2 rows. Tried on Zen 3 (`examples/gemm_bench.rs`, Q4_K k=1024, m=512, one
    // thread, 102 GMAC/s here): 1 x 4 (`Narrow`) 90; 2 x 3 as intrinsics 80 (the compiler
    // spilled the i16 sums); 2 x 3 hand-written in `asm!` with all 16 registers planned, 99.
    // A synthetic loop of that 2 x 3 group reaches ~4 `vpmaddubsw` per ns, as this tile's loop
    // does: the broadcasts and adds beside each multiply, not the shape, bound it.
    const SHAPE: Shape = Shape::Wide;
    const VNNI: bool = false;
    const MIN_COLS: usize = K::MIN_COLS;
    const ROW_DOT: VecDotFn = K::ROW_DOT;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(a: *const u8, out: *mut u32) {
        if K::DMIN_AT.is_some() {
            return min_sums(a, out);
        }
        // One sub-block per 128-bit half of a piece: 16 sub-blocks of 16.
        const { assert!(K::OFFSET == 0 || (K::SUBS == 16 && K::GROUP == 4)) };
        for t in 0..QK_K / 32 {
            let v = sum_lanes_per_half(offset_shares(a.add(Q8K_QS + 32 * t), K::OFFSET));
            *out.add(2 * t) = _mm256_extract_epi32::<0>(v) as u32;
            *out.add(2 * t + 1) = _mm256_extract_epi32::<4>(v) as u32;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; PANEL_ROWS], dst: *mut u8) {
        Self::pack_scaled(src, dst, |sc| u32::from(sc as u16) * 0x0001_0001)
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
        for b in 0..blocks {
            let p = panels.map(|p| p.add(b * stride));
            let y = acts.map(|a| a.add(b * Q8K));
            // Dangling (never read) without factors (Q6_K has them, and the formats with
            // minimums): hence `wrapping_add`.
            let f = factors.map(|f| f.wrapping_add(b * Self::FACTOR_WORDS));
            let mut isum = [[_mm256_setzero_si256(); NR]; NP];
            for g in 0..K::SUBS {
                for group in 0..Self::SUB_CHUNKS / K::GROUP {
                    let first = g * Self::SUB_CHUNKS + group * K::GROUP;
                    let mut s16 = [[_mm256_setzero_si256(); NR]; NP];
                    for c in first..first + K::GROUP {
                        let wq = p.map(|p| load32(p.add(32 * c)));
                        for j in 0..NR {
                            let aq = broadcast4(y[j].add(Q8K_QS + 4 * c));
                            for i in 0..NP {
                                let prod = _mm256_maddubs_epi16(wq[i], aq);
                                s16[i][j] = _mm256_add_epi16(s16[i][j], prod);
                            }
                        }
                    }
                    if K::OFFSET != 0 {
                        for j in 0..NR {
                            let shares = broadcast4(f[j].add(g).cast());
                            for row in s16.iter_mut() {
                                row[j] = _mm256_sub_epi16(row[j], shares);
                            }
                        }
                    }
                    for i in 0..NP {
                        let sc = load32(p[i].add(Self::SCALES_AT + 32 * g));
                        for j in 0..NR {
                            let wide = _mm256_madd_epi16(s16[i][j], sc);
                            isum[i][j] = _mm256_add_epi32(isum[i][j], wide);
                        }
                    }
                }
            }
            Self::finish_block::<NP, NR>(&mut acc, &isum, &p, &y, &f);
        }
        acc
    }
}

/// The VNNI tile format of a `KQuant` (see the `gemm` module docs): the panels of
/// [`SuperBlocks`] with each sub-block scale as a plain i32 lane; Q6_K's activation factors are
/// the i32 `32 * bsums[g]` of its 16 sub-blocks.
pub(super) struct SuperBlocksVnni<K>(PhantomData<K>);

impl<K: KQuant> Format for SuperBlocksVnni<K> {
    const TYPE: GgmlType = K::TYPE;
    const QK: usize = QK_K;
    const W_BLOCK: usize = K::W_BLOCK;
    const A_BLOCK: usize = Q8K;
    const PANEL_LINES: usize = <SuperBlocks<K> as Format>::PANEL_LINES;
    const FACTOR_WORDS: usize = <SuperBlocks<K> as Format>::FACTOR_WORDS;
    const SHAPE: Shape = Shape::Big;
    const VNNI: bool = true;
    // Measured as for the AVX2 kernel (`examples/gemm_bench.rs`): at 2 rows the row dots still
    // win (0.95x for Q4_K, 0.65x for Q6_K), from 4 rows the tile does (1.6x, 1.14x).
    const MIN_COLS: usize = K::MIN_COLS;
    const ROW_DOT: VecDotFn = K::ROW_DOT;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(a: *const u8, out: *mut u32) {
        if K::DMIN_AT.is_some() {
            return min_sums(a, out);
        }
        // One sub-block of 16 per `bsums` entry.
        const { assert!(K::OFFSET == 0 || K::SUBS == 16) };
        for g in 0..K::SUBS {
            let bsum = a.add(Q8K_BSUMS + 2 * g).cast::<i16>().read_unaligned();
            *out.add(g) = (i32::from(bsum) * i32::from(K::OFFSET)) as u32;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; PANEL_ROWS], dst: *mut u8) {
        SuperBlocks::<K>::pack_scaled(src, dst, |sc| i32::from(sc) as u32)
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
        let sub_chunks = SuperBlocks::<K>::SUB_CHUNKS;
        let scales_at = SuperBlocks::<K>::SCALES_AT;
        for b in 0..blocks {
            let p = panels.map(|p| p.add(b * stride));
            let y = acts.map(|a| a.add(b * Q8K));
            // Dangling (never read) without factors (Q6_K has them, and the formats with
            // minimums): hence `wrapping_add`.
            let f = factors.map(|f| f.wrapping_add(b * Self::FACTOR_WORDS));
            // |sum| per sub-block <= 32 * 63 * 127, times a scale of at most 127 (Q6_K's are
            // signed i8; the others 6-bit): far inside i32, as is the sum over 16 sub-blocks.
            let mut isum = [[_mm256_setzero_si256(); NR]; NP];
            for g in 0..K::SUBS {
                let mut s32 = [[_mm256_setzero_si256(); NR]; NP];
                for c in g * sub_chunks..(g + 1) * sub_chunks {
                    let wq = p.map(|p| load32(p.add(32 * c)));
                    for j in 0..NR {
                        let aq = broadcast4(y[j].add(Q8K_QS + 4 * c));
                        for i in 0..NP {
                            s32[i][j] = _mm256_dpbusd_epi32(s32[i][j], wq[i], aq);
                        }
                    }
                }
                if K::OFFSET != 0 {
                    for j in 0..NR {
                        let shares = _mm256_set1_epi32(*f[j].add(g) as i32);
                        for row in s32.iter_mut() {
                            row[j] = _mm256_sub_epi32(row[j], shares);
                        }
                    }
                }
                for i in 0..NP {
                    let sc = load32(p[i].add(scales_at + 32 * g));
                    for j in 0..NR {
                        let scaled = _mm256_mullo_epi32(s32[i][j], sc);
                        isum[i][j] = _mm256_add_epi32(isum[i][j], scaled);
                    }
                }
            }
            SuperBlocks::<K>::finish_block::<NP, NR>(&mut acc, &isum, &p, &y, &f);
        }
        acc
    }
}

/// Lines of minimum pairs in a panel block, and factor words per activation block, of the
/// formats with minimums.
const MIN_PAIRS: usize = 4;

/// `(lo, hi)` as the two i16 halves of a 32-bit lane, `lo` in the low one.
fn i16_pair(lo: i16, hi: i16) -> u32 {
    u32::from(lo as u16) | (u32::from(hi as u16) << 16)
}

/// The activation factors of the formats with minimums: word `h` of `out` is the i16 pair
/// `(S[2h], S[2h + 1])` of the Q8_K block at `a`, `S[g] = bsums[2g] + bsums[2g + 1]` the sum of
/// its quants `32g..32g + 32` (|S| <= 32 * 128: no overflow, so `mn[g] * S[g]` is the row
/// dot's `mn[g] * bsums[2g] + mn[g] * bsums[2g + 1]`, `kquants::k4_min_dot`). The sum wraps
/// rather than panic on `bsums` that no quantizer wrote.
///
/// # Safety
/// `a` points at a readable Q8_K block, `out` at `MIN_PAIRS` writable words.
unsafe fn min_sums(a: *const u8, out: *mut u32) {
    let bsums: [i16; 16] = a.add(Q8K_BSUMS).cast::<[i16; 16]>().read_unaligned();
    let s = |g: usize| bsums[2 * g].wrapping_add(bsums[2 * g + 1]);
    for h in 0..MIN_PAIRS {
        *out.add(h) = i16_pair(s(2 * h), s(2 * h + 1));
    }
}

/// The 8 six-bit scales and minimums of a Q4_K/Q5_K super-block (12 packed bytes at `p`).
///
/// # Safety
/// `p..p + 12` readable.
unsafe fn k4_scales(p: *const u8) -> KScales {
    let s: [u8; 12] = p.cast::<[u8; 12]>().read_unaligned();
    let mut out = KScales {
        sc: [0; 16],
        mn: [0; 8],
    };
    for g in 0..8 {
        let (sc, mn) = if g < 4 {
            (s[g] & 63, s[g + 4] & 63)
        } else {
            (
                (s[g + 4] & 0x0f) | ((s[g - 4] >> 6) << 4),
                (s[g + 4] >> 4) | ((s[g] >> 6) << 4),
            )
        };
        out.sc[g] = i16::from(sc);
        out.mn[g] = i16::from(mn);
    }
    out
}

/// `v >> by` per 16-bit lane, then `& mask` per byte: the bits `by..` of each byte when `mask`
/// keeps at most `8 - by` bits (what moves in from the neighbouring byte is masked off).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits_at(v: __m256i, by: usize, mask: i8) -> __m256i {
    let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(by as i32));
    _mm256_and_si256(shifted, _mm256_set1_epi8(mask))
}

pub(super) struct Q4K;
impl KQuant for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ROW_DOT: VecDotFn = kquants::q4_k_q8_k;
    const MIN_COLS: usize = 3;
    const W_BLOCK: usize = size_of::<BlockQ4K>();
    const SUBS: usize = 8;
    // Per i16 half of a lane, 16 products: sum q * a <= 16 * 15 * 127 = 30480.
    const GROUP: usize = 8;
    const OFFSET: i16 = 0;
    const D_AT: usize = offset_of!(BlockQ4K, d);
    const DMIN_AT: Option<usize> = Some(offset_of!(BlockQ4K, dmin));

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8, t: usize) -> __m256i {
        // Element 64c + 32k + l is nibble k of qs[32c + l].
        let bits = load32(p.add(offset_of!(BlockQ4K, qs) + 32 * (t / 2)));
        bits_at(bits, 4 * (t % 2), 0x0f)
    }

    unsafe fn scales(p: *const u8) -> KScales {
        k4_scales(p.add(offset_of!(BlockQ4K, scales)))
    }

    const PREPARED: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prepare(y: *const u8, out: *mut __m256i) {
        kquants::k4_pair_activations(y, out)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_ints(p: *const u8, y: *const u8, yp: *const __m256i) -> (__m256i, __m256i) {
        kquants::q4_k_block_ints_paired(p, y, yp)
    }
}

pub(super) struct Q5K;
impl KQuant for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const ROW_DOT: VecDotFn = kquants::q5_k_q8_k;
    const MIN_COLS: usize = 3;
    const W_BLOCK: usize = size_of::<BlockQ5K>();
    const SUBS: usize = 8;
    // 8 products: sum q * a <= 8 * 31 * 127 = 31496.
    const GROUP: usize = 4;
    const OFFSET: i16 = 0;
    const D_AT: usize = offset_of!(BlockQ5K, d);
    const DMIN_AT: Option<usize> = Some(offset_of!(BlockQ5K, dmin));

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8, t: usize) -> __m256i {
        // As Q4_K, plus bit t of qh[l] as the 5th bit of element 32t + l.
        let bits = load32(p.add(offset_of!(BlockQ5K, qs) + 32 * (t / 2)));
        let high = bits_at(load32(p.add(offset_of!(BlockQ5K, qh))), t, 1);
        _mm256_or_si256(
            bits_at(bits, 4 * (t % 2), 0x0f),
            _mm256_slli_epi16::<4>(high),
        )
    }

    unsafe fn scales(p: *const u8) -> KScales {
        k4_scales(p.add(offset_of!(BlockQ5K, scales)))
    }

    const PREPARED: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prepare(y: *const u8, out: *mut __m256i) {
        kquants::k4_pair_activations(y, out)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_ints(p: *const u8, y: *const u8, yp: *const __m256i) -> (__m256i, __m256i) {
        kquants::q5_k_block_ints_paired(p, y, yp)
    }
}

pub(super) struct Q6K;
impl KQuant for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ROW_DOT: VecDotFn = kquants::q6_k_q8_k;
    const MIN_COLS: usize = 4;
    const W_BLOCK: usize = size_of::<BlockQ6K>();
    const SUBS: usize = 16;
    // A sub-block, 8 products per i16 half: |sum (q - 32) * a| <= 8 * 32 * 127 = 32512 (the
    // unsigned sums wrap).
    const GROUP: usize = 4;
    const OFFSET: i16 = 32;
    const D_AT: usize = offset_of!(BlockQ6K, d);
    const DMIN_AT: Option<usize> = None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8, t: usize) -> __m256i {
        // Element 128h + 32k + l: 4 low bits from nibble k / 2 of ql[64h + 32 (k % 2) + l], 2 high
        // bits from bits 2k..2k + 2 of qh[32h + l].
        let (h, k) = (t / 4, t % 4);
        let ql = load32(p.add(offset_of!(BlockQ6K, ql) + 64 * h + 32 * (k % 2)));
        let qh = load32(p.add(offset_of!(BlockQ6K, qh) + 32 * h));
        let high = bits_at(qh, 2 * k, 3);
        _mm256_or_si256(bits_at(ql, 4 * (k / 2), 0x0f), _mm256_slli_epi16::<4>(high))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_ints(p: *const u8, y: *const u8, _: *const __m256i) -> (__m256i, __m256i) {
        (kquants::q6_k_block_ints(p, y), _mm256_setzero_si256())
    }

    unsafe fn scales(p: *const u8) -> KScales {
        let s: [u8; 16] = p
            .add(offset_of!(BlockQ6K, scales))
            .cast::<[u8; 16]>()
            .read_unaligned();
        KScales {
            sc: s.map(|v| i16::from(v as i8)),
            mn: [0; 8],
        }
    }
}

/// One activation row against `rows` weight rows, each output computed with exactly the
/// operations of lane `r` of [`SuperBlocks::tile`] (bit-identical to the tile kernels at any
/// number of activation rows) without packing the weights: the decode product of
/// batch-invariant mode (see `blocks32::rows_exact`).
///
/// First the activation row is prepared once per call ([`KQuant::prepare`]: Q4_K/Q5_K pair its
/// sub-blocks' lanes, see `kquants::k4_pair_activations`) into `sums` after the block sums.
/// Then eight rows at a time. Each row is walked from start to end (one sequential stream, as
/// its row dot reads it), its integers formed as the row dot forms them
/// ([`KQuant::block_ints`]: exact, whatever the order of the additions) and kept in
/// `sums` (vectors `2 (8b + r)` and `2 (8b + r) + 1`: the quant dot and the minimums' dot of
/// block `b` of row `r`, 8 lanes each, reduced only after the row). Then, block after block, the
/// eight rows' lane sums are gathered into one vector (lane `r`: row `r`) and the tile kernel's
/// f32 step follows: `acc = fma(sum, d * da, acc)`, and `acc = fnmadd(mins, dmin * da, acc)`.
/// The integer work is at most the row dot's (`examples/kernel_bench --exact`).
///
/// # Safety
/// AVX2+FMA+F16C; `w` holds `rows` rows of `blocks` super-blocks, `a` one Q8_K row of `blocks`
/// blocks, `out` has room for `rows` values, `sums` for `(16 + K::PREPARED) * blocks` vectors.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_exact<K: KQuant>(
    blocks: usize,
    w: *const u8,
    rows: usize,
    a: *const u8,
    out: *mut f32,
    sums: *mut __m256i,
) {
    let w_row = blocks * K::W_BLOCK;
    let prepared = sums.add(2 * blocks * PANEL_ROWS);
    for b in 0..blocks {
        K::prepare(a.add(b * Q8K), prepared.add(b * K::PREPARED));
    }
    for r0 in (0..rows).step_by(PANEL_ROWS) {
        let p: [*const u8; PANEL_ROWS] =
            std::array::from_fn(|r| w.add((r0 + r).min(rows - 1) * w_row));
        for (r, row) in p.iter().enumerate() {
            for b in 0..blocks {
                let x = row.add(b * K::W_BLOCK);
                prefetch_ahead(x, K::W_BLOCK.div_ceil(64));
                let (sum, mins) = K::block_ints(x, a.add(b * Q8K), prepared.add(b * K::PREPARED));
                *sums.add(2 * (b * PANEL_ROWS + r)) = sum;
                if K::DMIN_AT.is_some() {
                    *sums.add(2 * (b * PANEL_ROWS + r) + 1) = mins;
                }
            }
        }
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            let y = a.add(b * Q8K);
            let ints: [__m256i; PANEL_ROWS] =
                std::array::from_fn(|r| *sums.add(2 * (b * PANEL_ROWS + r)));
            let isum = super::blocks32::sum_rows(ints);
            let mins = if K::DMIN_AT.is_some() {
                let ints: [__m256i; PANEL_ROWS] =
                    std::array::from_fn(|r| *sums.add(2 * (b * PANEL_ROWS + r) + 1));
                super::blocks32::sum_rows(ints)
            } else {
                _mm256_setzero_si256()
            };
            let d = super::blocks32::halves(&p, b * K::W_BLOCK + K::D_AT);
            let da = _mm256_set1_ps(read_f32(y));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, da), acc);
            if let Some(at) = K::DMIN_AT {
                let dmin = super::blocks32::halves(&p, b * K::W_BLOCK + at);
                let mins = _mm256_cvtepi32_ps(mins);
                acc = _mm256_fnmadd_ps(mins, _mm256_mul_ps(dmin, da), acc);
            }
        }
        super::store_lanes(out.add(r0), acc, (rows - r0).min(PANEL_ROWS));
    }
}

/// Lines of the narrow kernel's activation panel per super-block: 64 chunk lines, the line of
/// the activations' `d` (f32), then 16 lines of Q6_K's offset shares (i32 `32 * bsums[g]`) or 8
/// lines of the `(bsums[2g], bsums[2g + 1])` i16 pairs that the minimums of Q4_K and Q5_K take.
pub(in crate::kernels::x86) const NARROW_LINES: usize = QK_K / 4 + 1 + 16;

/// Weight rows taken at once by the narrow kernel.
const NARROW_ROWS: usize = 4;

/// Bytes of the chunk lines of one super-block of the narrow panel (64 lines).
const CHUNK_BYTES: usize = QK_K / 4 * 32;

/// The k-quant counterpart of `blocks32::narrow_pack` (see there): activations packed into the
/// lanes once per call, weights read where they lie, each super-block's quants unpacked once into a
/// buffer that is read back as 4-quant broadcasts, its scales unpacked once. Per sub-block the
/// `vpdpbusd` sum less Q6_K's offset shares is multiplied by the sub-block's scale, as in the
/// VNNI tile; the minimums and the f32 steps are the tile's `finish_block` with the roles of the
/// lanes swapped. Bit-identical to the tile kernels.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI; of `call`'s fields, `w` holds `rows` rows of
/// `blocks` super-blocks (`w_row` bytes each), `a` `cols` rows of `blocks` Q8_K blocks (`a_row`
/// bytes each), `cols` in 1..=8; `out + c * ldo + r` is writable for `r < rows`, `c < cols`; `scratch` has room for
/// `blocks * NARROW_LINES` lines.
///
/// Two steps, as `blocks32`'s: [`narrow_pack`] packs the panel, [`narrow_rows_all`] runs the
/// weight rows against it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn narrow_pack<K: KQuant>(call: &Call, scratch: *mut u8) {
    let Call {
        blocks,
        a,
        a_row,
        cols,
        ..
    } = *call;
    let line = NARROW_LINES * 32;
    for b in 0..blocks {
        let src: [*const u8; PANEL_ROWS] =
            std::array::from_fn(|j| a.add(j.min(cols - 1) * a_row + b * Q8K));
        let dst = scratch.add(b * line);
        for t in 0..QK_K / 32 {
            store_piece(dst.add(t * PIECE), |j| load32(src[j].add(Q8K_QS + 32 * t)));
        }
        let da: [f32; PANEL_ROWS] = src.map(|p| read_f32(p));
        _mm256_storeu_ps(dst.add(CHUNK_BYTES).cast(), _mm256_loadu_ps(da.as_ptr()));
        let extra = dst.add(CHUNK_BYTES + 32).cast::<u32>();
        for (j, &y) in src.iter().enumerate() {
            if K::OFFSET != 0 {
                // The VNNI tile's factors: Q6_K's offset shares of each sub-block.
                let mut shares = [0u32; 16];
                <SuperBlocksVnni<K> as Format>::factors(y, shares.as_mut_ptr());
                for (g, &share) in shares.iter().enumerate().take(K::SUBS) {
                    *extra.add(8 * g + j) = share;
                }
            } else if K::DMIN_AT.is_some() {
                for g in 0..8 {
                    let pair = y.add(Q8K_BSUMS + 4 * g).cast::<u32>().read_unaligned();
                    *extra.add(8 * g + j) = pair;
                }
            }
        }
    }
}

/// The weight rows of [`narrow_pack`]'s kernel against the panel that it packed for `call`'s
/// activations.
///
/// # Safety
/// As [`narrow_pack`], with the panel packed in `scratch` from the same activations.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn narrow_rows_all<K: KQuant>(call: &Call, scratch: *mut u8) {
    let rows = call.rows;
    let mut r = 0;
    while r + NARROW_ROWS <= rows {
        narrow_rows::<K, NARROW_ROWS>(call, r, scratch);
        r += NARROW_ROWS;
    }
    while r < rows {
        narrow_rows::<K, 1>(call, r, scratch);
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
unsafe fn narrow_rows<K: KQuant, const R: usize>(call: &Call, r0: usize, panel: *const u8) {
    let Call {
        blocks,
        w,
        w_row,
        cols,
        out,
        ldo,
        ..
    } = *call;
    let sub_chunks = SuperBlocks::<K>::SUB_CHUNKS;
    let rows: [*const u8; R] = std::array::from_fn(|i| w.add((r0 + i) * w_row));
    let mut acc = [_mm256_setzero_ps(); R];
    let next = w.wrapping_add((r0 + R) * w_row);
    let lines = (R * w_row).div_ceil(64);
    let per_block = lines.div_ceil(blocks);
    let mut unpacked = [[0u8; QK_K]; R];
    for b in 0..blocks {
        prefetch_share(next, lines, per_block, b);
        let p = panel.add(b * NARROW_LINES * 32);
        let extra = p.add(CHUNK_BYTES + 32);
        let wb = rows.map(|row| row.add(b * K::W_BLOCK));
        let scales = wb.map(|x| K::scales(x));
        for i in 0..R {
            for t in 0..QK_K / 32 {
                let dst = unpacked[i].as_mut_ptr().add(32 * t);
                _mm256_storeu_si256(dst.cast(), K::quants(wb[i], t));
            }
        }
        // See `blocks32::narrow_rows`: the chunks are re-read as broadcasts from memory.
        std::arch::asm!("/* {0} */", in(reg) unpacked.as_ptr(), options(nostack, preserves_flags));
        let mut isum = [_mm256_setzero_si256(); R];
        for g in 0..K::SUBS {
            let mut s32 = [_mm256_setzero_si256(); R];
            for c in g * sub_chunks..(g + 1) * sub_chunks {
                let act = load32(p.add(32 * c));
                for i in 0..R {
                    let wq = broadcast4(unpacked[i].as_ptr().add(4 * c));
                    s32[i] = _mm256_dpbusd_epi32(s32[i], wq, act);
                }
            }
            let shares = if K::OFFSET != 0 {
                load32(extra.add(32 * g))
            } else {
                _mm256_setzero_si256()
            };
            for i in 0..R {
                let exact = _mm256_sub_epi32(s32[i], shares);
                let sc = _mm256_set1_epi32(i32::from(scales[i].sc[g]));
                isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(exact, sc));
            }
        }
        let da = _mm256_loadu_ps(p.add(CHUNK_BYTES).cast());
        for i in 0..R {
            let d = _mm256_set1_ps(half(wb[i].add(K::D_AT)));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_mul_ps(d, da), acc[i]);
            if let Some(at) = K::DMIN_AT {
                let mut mins = _mm256_setzero_si256();
                for g in 0..8 {
                    let mn = u32::from(scales[i].mn[g] as u16) * 0x0001_0001;
                    let pairs = _mm256_set1_epi32(mn as i32);
                    let bsums = load32(extra.add(32 * g));
                    mins = _mm256_add_epi32(mins, _mm256_madd_epi16(pairs, bsums));
                }
                let dmin = _mm256_set1_ps(half(wb[i].add(at)));
                let mins = _mm256_cvtepi32_ps(mins);
                acc[i] = _mm256_fnmadd_ps(mins, _mm256_mul_ps(dmin, da), acc[i]);
            }
        }
    }
    store_columns(acc, out, ldo, r0, cols);
}
