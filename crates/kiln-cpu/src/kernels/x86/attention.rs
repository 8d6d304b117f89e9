//! The AVX2+FMA bodies of the attention tile kernels (`kernels::attention`), with the operations
//! of the portable code in the same order. `B` and `T` are the block and tile sizes of the
//! score matrix (`kernels::attention::{BLOCK, TILE}`); `E` the cache's element type, widened
//! eight at a time with [`KvElem::load8`].
//!
//! Every function is `#[inline(always)]` and only called from functions built with AVX2, FMA and
//! F16C on a CPU that has them: inlined there, the intrinsics compile to those instructions.

use std::arch::x86_64::*;

use crate::kernels::KvElem;

/// Query vectors per micro-kernel call (one ymm accumulator per vector and key).
const MQ: usize = 4;
/// Keys per micro-kernel call: `MQ × KEYS` accumulators, `KEYS` key loads, `MQ` query
/// loads per chunk.
const KEYS: usize = 3;

/// `s[m][j] = Σ_c q[m][8c..8c+8] · k[j][8c..8c+8]` over `c < n8`, reduced as in
/// `kernels::attention::dot`. Keys outer, query groups inner, so that the few key rows in use stay in L1
/// while the block's queries pass them.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; each pointer addresses `8·n8` readable values; `q.len()
/// ≤ B`, `k.len() ≤ T`. Only called (inlined) from functions built with those
/// features.
#[inline(always)]
pub(in crate::kernels) unsafe fn scores<E: KvElem, const B: usize, const T: usize>(
    q: &[*const f32],
    k: &[*const E],
    n8: usize,
    s: &mut [[f32; T]; B],
) {
    let mut j = 0;
    while j < k.len() {
        let nj = KEYS.min(k.len() - j);
        let mut m = 0;
        while m < q.len() {
            let nm = MQ.min(q.len() - m);
            match (nm, nj) {
                (4, 3) => tile::<4, 3, E, B, T>(q, k, m, j, n8, s),
                (4, 2) => tile::<4, 2, E, B, T>(q, k, m, j, n8, s),
                (4, _) => tile::<4, 1, E, B, T>(q, k, m, j, n8, s),
                (3, 3) => tile::<3, 3, E, B, T>(q, k, m, j, n8, s),
                (3, 2) => tile::<3, 2, E, B, T>(q, k, m, j, n8, s),
                (3, _) => tile::<3, 1, E, B, T>(q, k, m, j, n8, s),
                (2, 3) => tile::<2, 3, E, B, T>(q, k, m, j, n8, s),
                (2, 2) => tile::<2, 2, E, B, T>(q, k, m, j, n8, s),
                (2, _) => tile::<2, 1, E, B, T>(q, k, m, j, n8, s),
                (_, 3) => tile::<1, 3, E, B, T>(q, k, m, j, n8, s),
                (_, 2) => tile::<1, 2, E, B, T>(q, k, m, j, n8, s),
                (_, _) => tile::<1, 1, E, B, T>(q, k, m, j, n8, s),
            }
            m += nm;
        }
        j += nj;
    }
}

/// The `M × J` dots of queries `m0..m0 + M` and keys `j0..j0 + J` into `s`.
///
/// # Safety
/// As [`scores`], and `m0 + M ≤ q.len()`, `j0 + J ≤ k.len()`.
#[inline(always)]
unsafe fn tile<const M: usize, const J: usize, E: KvElem, const B: usize, const T: usize>(
    q: &[*const f32],
    k: &[*const E],
    m0: usize,
    j0: usize,
    n8: usize,
    s: &mut [[f32; T]; B],
) {
    let qp: [*const f32; M] = std::array::from_fn(|m| q[m0 + m]);
    let kp: [*const E; J] = std::array::from_fn(|j| k[j0 + j]);
    let mut acc = [[_mm256_setzero_ps(); J]; M];
    for c in 0..n8 {
        // SAFETY (loop): `c < n8`: each load reads values `[8c, 8c + 8)` of its row.
        let mut kv = [_mm256_setzero_ps(); J];
        for j in 0..J {
            kv[j] = E::load8(kp[j].add(8 * c));
        }
        for m in 0..M {
            let qv = _mm256_loadu_ps(qp[m].add(8 * c));
            for j in 0..J {
                acc[m][j] = _mm256_fmadd_ps(qv, kv[j], acc[m][j]);
            }
        }
    }
    for m in 0..M {
        for j in 0..J {
            let a = acc[m][j];
            // h = a₀₋₃ + a₄₋₇; then (h₀ + h₂, h₁ + h₃); then their sum.
            let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            s[m0 + m][j0 + j] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
    }
}

// The trees below are written for a tile of 16.
const _: () = assert!(crate::kernels::TILE == 16);

/// `kernels::attention::tile_sum`: `t[j] + t[j + 8]`, then `+ [j + 4]`, `+ [j + 2]`, `+ [j + 1]`,
/// one vector addition per level.
///
/// # Safety
/// The CPU has AVX2; only called (inlined) from functions built with it.
#[inline(always)]
pub(in crate::kernels) unsafe fn tile_sum(t: &[f32; 16]) -> f32 {
    let p = t.as_ptr();
    let h8 = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
    let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)))
}

/// `kernels::attention::tile_max` by the tree of [`tile_sum`]: each step `maxps(upper, lower)`,
/// which is `upper > lower ? upper : lower`.
///
/// # Safety
/// As [`tile_sum`].
#[inline(always)]
pub(in crate::kernels) unsafe fn tile_max(t: &[f32; 16]) -> f32 {
    let p = t.as_ptr();
    let h8 = _mm256_max_ps(_mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p));
    let h4 = _mm_max_ps(_mm256_extractf128_ps::<1>(h8), _mm256_castps256_ps128(h8));
    let h2 = _mm_max_ps(_mm_movehl_ps(h4, h4), h4);
    _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(h2), h2))
}

/// For the `n` rows of `hd` at `acc` and the 16-value chunks of a head: `acc = alpha[m] ·
/// acc + Σ_j p[m][j] · v[j]` over `j < v.len()` in order. Chunks outer, groups of four
/// vectors inner: the chunk of each value row in use stays in L1 while the block passes it.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `acc` addresses `n ≤ B` rows of `hd` writable
/// values that nothing else accesses; each `v[j]` addresses `hd` readable values; `v.len() ≤
/// T`. Only called (inlined) from functions built with those features.
#[inline(always)]
pub(in crate::kernels) unsafe fn weighted_values<E: KvElem, const B: usize, const T: usize>(
    acc: *mut f32,
    n: usize,
    hd: usize,
    alpha: &[f32; B],
    p: &[[f32; T]; B],
    v: &[*const E],
) {
    for c in 0..hd / 16 {
        let mut m = 0;
        while m < n {
            let nm = MQ.min(n - m);
            match nm {
                4 => chunk::<4, E, B, T>(acc, hd, m, c, alpha, p, v),
                3 => chunk::<3, E, B, T>(acc, hd, m, c, alpha, p, v),
                2 => chunk::<2, E, B, T>(acc, hd, m, c, alpha, p, v),
                _ => chunk::<1, E, B, T>(acc, hd, m, c, alpha, p, v),
            }
            m += nm;
        }
    }
}

/// Chunk `c` (values `[16c, 16c + 16)`) of rows `m0..m0 + M`.
///
/// # Safety
/// As [`weighted_values`], and `m0 + M ≤ n`, `16c + 16 ≤ hd`.
#[inline(always)]
unsafe fn chunk<const M: usize, E: KvElem, const B: usize, const T: usize>(
    acc: *mut f32,
    hd: usize,
    m0: usize,
    c: usize,
    alpha: &[f32; B],
    p: &[[f32; T]; B],
    v: &[*const E],
) {
    let mut s = [[_mm256_setzero_ps(); 2]; M];
    for m in 0..M {
        let o = acc.add((m0 + m) * hd + 16 * c);
        let a = _mm256_set1_ps(alpha[m0 + m]);
        s[m][0] = _mm256_mul_ps(_mm256_loadu_ps(o), a);
        s[m][1] = _mm256_mul_ps(_mm256_loadu_ps(o.add(8)), a);
    }
    for (j, &row) in v.iter().enumerate() {
        let v0 = E::load8(row.add(16 * c));
        let v1 = E::load8(row.add(16 * c + 8));
        for m in 0..M {
            let w = _mm256_set1_ps(p[m0 + m][j]);
            s[m][0] = _mm256_fmadd_ps(w, v0, s[m][0]);
            s[m][1] = _mm256_fmadd_ps(w, v1, s[m][1]);
        }
    }
    for (m, sm) in s.iter().enumerate() {
        let o = acc.add((m0 + m) * hd + 16 * c);
        _mm256_storeu_ps(o, sm[0]);
        _mm256_storeu_ps(o.add(8), sm[1]);
    }
}

/// Query vectors per AVX-512 score call (two where a call has no more).
const MQ512: usize = 4;
/// Key pairs per AVX-512 score call (two keys per zmm, eight keys a call).
const PAIRS512: usize = 4;

/// [`scores`] in 512-bit registers, with its bits: each zmm accumulator holds two keys' 8-lane
/// chains for one query (lanes 0..8 key `2p`, lanes 8..16 key `2p + 1`), each lane the same FMA
/// chain as the AVX2 kernel's. The sixteen accumulators of a call (4 queries x 8 keys) are then
/// reduced together by shuffles, each result by the additions of `kernels::attention::dot` in
/// its order: (1) `a_i + a_{i+4}` (the 128-bit halves of each key's 8 lanes, two accumulators
/// per `vshuff32x4` pair), (2) `h_0 + h_2`, `h_1 + h_3` (64-bit halves, two rows of four keys
/// per pair), (3) their sum (two queries per pair), then one permutation puts each query's 8
/// keys in order. A call past the last query or key reads the last one again and stores only
/// the real ones.
///
/// # Safety
/// The CPU has AVX-512 F/DQ/VL, AVX2, FMA and F16C; each pointer addresses `8·n8` readable
/// values; `q.len() ≤ B`, `k.len() ≤ T`. Only called (inlined) from functions built with those
/// features.
#[inline(always)]
pub(in crate::kernels) unsafe fn scores512<E: KvElem, const B: usize, const T: usize>(
    q: &[*const f32],
    k: &[*const E],
    n8: usize,
    s: &mut [[f32; T]; B],
) {
    let mut j = 0;
    while j < k.len() {
        let nj = (2 * PAIRS512).min(k.len() - j);
        let mut m = 0;
        while m < q.len() {
            let nm = MQ512.min(q.len() - m);
            // Two queries or one (a GQA group of two, a last pair) take a tile of two: a tile
            // of four would compute two of them twice over.
            if nm <= 2 {
                tile512::<E, B, T, 2>(q, k, m, nm, j, nj, n8, s);
            } else {
                tile512::<E, B, T, MQ512>(q, k, m, nm, j, nj, n8, s);
            }
            m += nm;
        }
        j += nj;
    }
}

/// The dots of queries `m0..m0 + nm` and keys `j0..j0 + nj` into `s` (see [`scores512`]).
///
/// # Safety
/// As [`scores512`], `QN` even, and `1 ≤ nm ≤ QN`, `1 ≤ nj ≤ 2·PAIRS512`, `m0 + nm ≤ q.len()`,
/// `j0 + nj ≤ k.len()`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile512<E: KvElem, const B: usize, const T: usize, const QN: usize>(
    q: &[*const f32],
    k: &[*const E],
    m0: usize,
    nm: usize,
    j0: usize,
    nj: usize,
    n8: usize,
    s: &mut [[f32; T]; B],
) {
    let qp: [*const f32; QN] = std::array::from_fn(|m| q[m0 + m.min(nm - 1)]);
    let kp: [*const E; 2 * PAIRS512] = std::array::from_fn(|j| k[j0 + j.min(nj - 1)]);
    let mut acc = [[_mm512_setzero_ps(); PAIRS512]; QN];
    for c in 0..n8 {
        // SAFETY (loop): `c < n8`: each load reads values `[8c, 8c + 8)` of its row.
        // A plain loop, not `std::array::from_fn`: in the dev profile (debug assertions on, as
        // the tests build it) that closure is not inlined, so it loses this function's target
        // features and calls the f16 widening intrinsics out of line, halving the speed.
        let mut kv = [_mm512_setzero_ps(); PAIRS512];
        for (p, kv) in kv.iter_mut().enumerate() {
            *kv = E::load8x2(kp[2 * p].add(8 * c), kp[2 * p + 1].add(8 * c));
        }
        for m in 0..QN {
            let qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(qp[m].add(8 * c)));
            for p in 0..PAIRS512 {
                acc[m][p] = _mm512_fmadd_ps(qv, kv[p], acc[m][p]);
            }
        }
    }
    // (1) Per query, keys 0..4 and 4..8: 128-bit block `i` of `w[m][h]` holds key `4h + i`'s
    // `a_i + a_{i+4}` (i < 4).
    let halves = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xdd>(a, b),
        )
    };
    let w: [[__m512; 2]; QN] =
        std::array::from_fn(|m| [halves(acc[m][0], acc[m][1]), halves(acc[m][2], acc[m][3])]);
    // (2) Block `i` of `x[m]`: key `i`'s `h_0 + h_2`, `h_1 + h_3`, then key `4 + i`'s.
    let x: [__m512; QN] = std::array::from_fn(|m| {
        let (a, b) = (_mm512_castps_pd(w[m][0]), _mm512_castps_pd(w[m][1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    });
    // (3) Block `i` of queries `2r`, `2r + 1`: their keys `i` and `4 + i`, then in key order.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mask = ((1u16 << nj) - 1) as u8;
    for r in 0..QN / 2 {
        let (a, b) = (x[2 * r], x[2 * r + 1]);
        let sum = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(a, b),
            _mm512_shuffle_ps::<0xdd>(a, b),
        );
        let sum = _mm512_permutexvar_ps(order, sum);
        for h in 0..2 {
            let m = 2 * r + h;
            if m < nm {
                let row = if h == 0 {
                    _mm512_castps512_ps256(sum)
                } else {
                    _mm512_extractf32x8_ps::<1>(sum)
                };
                _mm256_mask_storeu_ps(s[m0 + m].as_mut_ptr().add(j0), mask, row);
            }
        }
    }
}

/// Query vectors per AVX-512 weighted-values call.
const MQ512_VALUES: usize = 8;

/// [`weighted_values`] in 512-bit registers, with its bits (each element the same multiply and
/// fused multiply-adds in key order): chunks of 32 head dims (two zmm per vector), a last chunk
/// of 16 where the head has one, eight vectors at a time. Covers the head's first `hd / 16 *
/// 16` dims, as the AVX2 kernel does.
///
/// # Safety
/// As [`weighted_values`], and the CPU has AVX-512 F (and DQ, VL); only called (inlined) from
/// functions built with those features.
#[inline(always)]
pub(in crate::kernels) unsafe fn weighted_values512<E: KvElem, const B: usize, const T: usize>(
    acc: *mut f32,
    n: usize,
    hd: usize,
    alpha: &[f32; B],
    p: &[[f32; T]; B],
    v: &[*const E],
) {
    let mut d = 0;
    while d + 16 <= hd {
        let wide = d + 32 <= hd;
        let mut m = 0;
        while m < n {
            let nm = MQ512_VALUES.min(n - m);
            macro_rules! go {
                ($($k:literal)*) => {
                    match (nm, wide) {
                        $(($k, true) => chunk512::<$k, 2, E, B, T>(acc, hd, m, d, alpha, p, v),
                          ($k, false) => chunk512::<$k, 1, E, B, T>(acc, hd, m, d, alpha, p, v),)*
                        _ => unreachable!(),
                    }
                };
            }
            go!(1 2 3 4 5 6 7 8);
            m += nm;
        }
        d += if wide { 32 } else { 16 };
    }
}

/// Head dims `d..d + 16·W` of rows `m0..m0 + M` (see [`weighted_values512`]).
///
/// # Safety
/// As [`weighted_values512`], and `m0 + M ≤ n`, `d + 16·W ≤ hd`.
#[inline(always)]
unsafe fn chunk512<const M: usize, const W: usize, E: KvElem, const B: usize, const T: usize>(
    acc: *mut f32,
    hd: usize,
    m0: usize,
    d: usize,
    alpha: &[f32; B],
    p: &[[f32; T]; B],
    v: &[*const E],
) {
    let mut s = [[_mm512_setzero_ps(); W]; M];
    for (m, sm) in s.iter_mut().enumerate() {
        let o = acc.add((m0 + m) * hd + d);
        let a = _mm512_set1_ps(alpha[m0 + m]);
        for (h, x) in sm.iter_mut().enumerate() {
            *x = _mm512_mul_ps(_mm512_loadu_ps(o.add(16 * h)), a);
        }
    }
    for (j, &row) in v.iter().enumerate() {
        // A plain loop for the reason given in `tile512`.
        let mut vj = [_mm512_setzero_ps(); W];
        for (h, vh) in vj.iter_mut().enumerate() {
            *vh = E::load16(row.add(d + 16 * h));
        }
        for (m, sm) in s.iter_mut().enumerate() {
            let w = _mm512_set1_ps(p[m0 + m][j]);
            for (x, vh) in sm.iter_mut().zip(&vj) {
                *x = _mm512_fmadd_ps(w, *vh, *x);
            }
        }
    }
    for (m, sm) in s.iter().enumerate() {
        let o = acc.add((m0 + m) * hd + d);
        for (h, x) in sm.iter().enumerate() {
            _mm512_storeu_ps(o.add(16 * h), *x);
        }
    }
}
