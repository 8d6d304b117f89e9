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
