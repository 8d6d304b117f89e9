//! The attention tile kernels that `crate::attention` runs per key tile: the scores of a block
//! of query vectors against a tile of keys ([`scores`]), the weighted sum of the tile's value
//! rows ([`weighted_values`]), and the reads that bring K/V rows into cache ([`read_rows`],
//! [`prefetch_rows`]). Rows hold any [`KvElem`] (f32 or f16), widened exactly as they load.
//!
//! Invariant: each kernel has a portable body, an AVX2+FMA one and an AVX-512 one
//! (`x86::attention`), selected by its `ISA` parameter ([`ATTN_PORTABLE`], [`ATTN_AVX2`],
//! [`ATTN_AVX512`]), that perform the same operations in the same order (fused multiply-adds as
//! `f32::mul_add`, the same lane reductions), so all give identical bits. `ISA = ATTN_AVX2` only
//! where the caller is built with AVX2, FMA and F16C on a CPU that has them, `ATTN_AVX512` only
//! where it is also built with AVX-512 F/BW/VL/DQ; the kernels are `#[inline(always)]` so that
//! they compile with the caller's features.

#[cfg(target_arch = "x86_64")]
use super::x86::attention as x86;
use super::KvElem;

/// The `ISA` parameter of the kernels: the portable body.
pub(crate) const ATTN_PORTABLE: u8 = 0;
/// The AVX2+FMA(+F16C) body.
pub(crate) const ATTN_AVX2: u8 = 1;
/// The AVX-512 body (F/BW/VL/DQ, with AVX2, FMA and F16C).
pub(crate) const ATTN_AVX512: u8 = 2;

/// Query vectors processed together against each key tile: each K/V row brought from memory or
/// L3 serves this many of them (8 query rows of Gemma's 4-head groups).
pub(crate) const BLOCK: usize = 32;
/// Keys per tile: a tile's key and value rows (32 KiB at head_dim 256) and the block's scores stay
/// in L1/L2 while the block passes them. A power of two (the fixed summation tree of
/// `crate::attention`'s softmax update).
pub(crate) const TILE: usize = 16;

/// Hints the CPU to bring each cache line of `rows` into L1 (a no-op off x86-64).
#[inline(always)]
pub(crate) fn prefetch_rows<E: KvElem>(rows: &[&[E]]) {
    prefetch_lines::<E, 3>(rows) // _MM_HINT_T0
}

/// Hints the CPU to bring each cache line of `rows` into L2 but not L1 (a no-op off x86-64): for
/// rows wanted a while later, which would only push the current work out of L1.
#[inline(always)]
pub(crate) fn prefetch_rows_l2<E: KvElem>(rows: &[&[E]]) {
    prefetch_lines::<E, 2>(rows) // _MM_HINT_T1
}

/// Every cache line of `rows`, with the `_mm_prefetch` hint `HINT`: a line per `E::PER_LINE`
/// values, and the last value's line too when a row does not start on a line (it then ends in
/// one more).
#[inline(always)]
fn prefetch_lines<E: KvElem, const HINT: i32>(rows: &[&[E]]) {
    #[cfg(target_arch = "x86_64")]
    for row in rows {
        let unaligned = !(row.as_ptr() as usize).is_multiple_of(64);
        let tail = row.last().filter(|_| unaligned).map(std::slice::from_ref);
        for line in row.chunks(E::PER_LINE).chain(tail) {
            // SAFETY: a prefetch is a hint: it never faults and changes no memory (and `line`
            // is a live slice anyway).
            unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}

/// Loads one value of every 64-byte line of `rows`, one row after the other, and returns a value
/// that depends on all of them (for `black_box`, so that the loads are not optimised away):
/// brings the rows into the core's caches at the speed of a sequential stream (see
/// `crate::attention`'s `attend_keys`).
#[inline(always)]
pub(crate) fn read_rows<'a, E: KvElem>(rows: impl Iterator<Item = &'a [E]>) -> u32 {
    let mut acc = 0u32;
    for row in rows {
        for x in row.iter().step_by(E::PER_LINE) {
            acc = acc.wrapping_add(x.bits());
        }
    }
    acc
}

/// `s[m][j] = q[m] · keys[j]` for the block's vectors and the tile's keys (all rows of one
/// length). Each dot product is eight lanes of fused multiply-adds over the whole chunks, the
/// lanes reduced as `((a₀ + a₄) + (a₂ + a₆)) + ((a₁ + a₅) + (a₃ + a₇))`, then the tail one product
/// at a time: the AVX2 and AVX-512 kernels perform exactly the operations of [`dot`].
#[inline(always)]
pub(crate) fn scores<const ISA: u8, E: KvElem>(
    q: &[&[f32]],
    keys: &[&[E]],
    s: &mut [[f32; TILE]; BLOCK],
) {
    let len = q.first().map_or(0, |r| r.len());
    assert!(
        q.len() <= BLOCK
            && keys.len() <= TILE
            && q.iter().all(|r| r.len() == len)
            && keys.iter().all(|r| r.len() == len),
        "scores: bad operands"
    );
    let n8 = len / 8;
    #[cfg(target_arch = "x86_64")]
    if ISA != ATTN_PORTABLE {
        let mut qp = [std::ptr::null(); BLOCK];
        for (p, r) in qp.iter_mut().zip(q) {
            *p = r.as_ptr();
        }
        let mut kp = [std::ptr::null(); TILE];
        for (p, r) in kp.iter_mut().zip(keys) {
            *p = r.as_ptr();
        }
        // SAFETY: `ATTN_AVX2` and `ATTN_AVX512` instances run only inside functions built with
        // their features on a CPU that has them (`crate::attention`'s `attend_keys_avx2` and
        // `attend_keys_avx512`); the assert proves every row holds `len ≥ 8·n8` values.
        unsafe {
            if ISA == ATTN_AVX512 {
                x86::scores512(&qp[..q.len()], &kp[..keys.len()], n8, s)
            } else {
                x86::scores(&qp[..q.len()], &kp[..keys.len()], n8, s)
            }
        };
        if n8 * 8 < len {
            for (row, qm) in s.iter_mut().zip(q) {
                for (o, kj) in row.iter_mut().zip(keys) {
                    for d in n8 * 8..len {
                        *o = qm[d].mul_add(kj[d].get(), *o);
                    }
                }
            }
        }
        return;
    }
    for (row, qm) in s.iter_mut().zip(q) {
        for (o, kj) in row.iter_mut().zip(keys) {
            *o = dot(qm, kj);
        }
    }
}

/// One dot product in the operation order of [`scores`].
#[inline(always)]
fn dot<E: KvElem>(q: &[f32], k: &[E]) -> f32 {
    let (qc, qt) = q.as_chunks::<8>();
    let (kc, kt) = k.as_chunks::<8>();
    let mut acc = [0.0f32; 8];
    for (qv, kv) in qc.iter().zip(kc) {
        for l in 0..8 {
            acc[l] = qv[l].mul_add(kv[l].get(), acc[l]);
        }
    }
    let h: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    let mut sum = (h[0] + h[2]) + (h[1] + h[3]);
    for (&x, &y) in qt.iter().zip(kt) {
        sum = x.mul_add(y.get(), sum);
    }
    sum
}

/// `dst[i] = src[i]` widened to f32 (exactly), eight at a time with `KvElem::load8` in the x86
/// bodies.
#[inline(always)]
pub(crate) fn widen<const ISA: u8, E: KvElem>(src: &[E], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: bad operands");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if ISA != ATTN_PORTABLE {
        let (sc, _) = src.as_chunks::<8>();
        let (dc, _) = dst.as_chunks_mut::<8>();
        for (s, d) in sc.iter().zip(dc) {
            // SAFETY: `ATTN_AVX2` and `ATTN_AVX512` instances run only inside functions built
            // with AVX2, FMA and F16C on a CPU that has them; each chunk holds 8 elements.
            unsafe { std::arch::x86_64::_mm256_storeu_ps(d.as_mut_ptr(), E::load8(s.as_ptr())) };
        }
        done = sc.len() * 8;
    }
    for (d, x) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = x.get();
    }
}

/// The sum of a tile's values by a fixed pairwise tree: halves (`t[j] + t[j + TILE/2]`), then
/// quarters, down to one value. The x86 bodies run the same additions, one vector per level.
#[inline(always)]
pub(crate) fn tile_sum<const ISA: u8>(t: &[f32; TILE]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if ISA != ATTN_PORTABLE {
        // SAFETY: `ATTN_AVX2` and `ATTN_AVX512` instances run only inside functions built with
        // AVX2 (at least) on a CPU that has it; `t` holds the 16 values the body reads.
        return unsafe { x86::tile_sum(t) };
    }
    tree(*t, |lower, upper| lower + upper)
}

/// The largest of a tile's values by the same tree as [`tile_sum`], each step `if t[j + w] >
/// t[j] { t[j + w] } else { t[j] }` (what `maxps` computes with the upper value first). For
/// values without NaN (the callers replace them), where the tree may pick another zero sign
/// than a running maximum would.
#[inline(always)]
pub(crate) fn tile_max<const ISA: u8>(t: &[f32; TILE]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if ISA != ATTN_PORTABLE {
        // SAFETY: as in `tile_sum`.
        return unsafe { x86::tile_max(t) };
    }
    tree(*t, |lower, upper| if upper > lower { upper } else { lower })
}

/// The fixed pairwise tree of [`tile_sum`] and [`tile_max`]: `t[j] = op(t[j], t[j + w])` for
/// `j < w`, with `w` half the tile, then a quarter, down to 1; then `t[0]`.
#[inline(always)]
fn tree(mut t: [f32; TILE], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = TILE;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            t[j] = op(t[j], t[j + width]);
        }
    }
    t[0]
}

/// `acc[m] = alpha[m] · acc[m] + Σ_j p[m][j] · values[j]` for the block's vectors (`acc` holds
/// their rows of `hd`), the sum in key order with fused multiply-adds. The AVX2 kernel takes
/// sixteen head dims of four vectors at a time, the AVX-512 kernel 32 (or 16) of eight (the
/// tail of a head one at a time), with the same operations per element.
#[inline(always)]
pub(crate) fn weighted_values<const ISA: u8, E: KvElem>(
    acc: &mut [f32],
    alpha: &[f32; BLOCK],
    p: &[[f32; TILE]; BLOCK],
    values: &[&[E]],
    hd: usize,
) {
    let n = acc.len() / hd.max(1);
    assert!(
        n <= BLOCK && values.len() <= TILE && values.iter().all(|r| r.len() == hd),
        "weighted_values: bad operands"
    );
    let mut tail = 0;
    #[cfg(target_arch = "x86_64")]
    if ISA != ATTN_PORTABLE {
        let mut vp = [std::ptr::null(); TILE];
        for (p, r) in vp.iter_mut().zip(values) {
            *p = r.as_ptr();
        }
        // SAFETY: `ATTN_AVX2` and `ATTN_AVX512` instances run only inside functions built with
        // their features on a CPU that has them (`crate::attention`'s `attend_keys_avx2` and
        // `attend_keys_avx512`); the assert proves `acc` holds `n ≤ BLOCK` rows of `hd` and
        // each value row `hd` values, and `p` rows hold `TILE ≥ values.len()` weights.
        let vp = &vp[..values.len()];
        unsafe {
            if ISA == ATTN_AVX512 {
                x86::weighted_values512(acc.as_mut_ptr(), n, hd, alpha, p, vp)
            } else {
                x86::weighted_values(acc.as_mut_ptr(), n, hd, alpha, p, vp)
            }
        };
        tail = hd / 16 * 16;
    }
    for ((row, &alpha), p) in acc.chunks_exact_mut(hd.max(1)).zip(alpha).zip(p) {
        for (d, o) in row.iter_mut().enumerate().skip(tail) {
            let mut sum = *o * alpha;
            for (&w, v) in p.iter().zip(values) {
                sum = w.mul_add(v[d].get(), sum);
            }
            *o = sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles whose trees meet every ordering question: mixed signs and magnitudes (so the
    /// association order changes the rounded sum), zeros of both signs in every position, the
    /// infinities, subnormals and ties.
    fn tiles() -> Vec<[f32; TILE]> {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut out = Vec::new();
        for _ in 0..2000 {
            out.push(std::array::from_fn(|_| {
                let r = next();
                let mag = f32::from_bits(((r >> 32) as u32 & 0x007f_ffff) | 0x3f80_0000) - 1.0;
                let scale = [1.0, 1e-3, 1e3, 1e7, 1e-40][(r % 5) as usize];
                if r & 32 == 0 {
                    mag * scale
                } else {
                    -mag * scale
                }
            }));
        }
        let specials = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-45,
            -1e-45,
            1.0,
        ];
        for i in 0..4000usize {
            out.push(std::array::from_fn(|j| {
                specials[(i.wrapping_mul(2_654_435_761) >> (j % 7)).wrapping_add(j) % 7]
            }));
        }
        out
    }

    /// The x86 trees give the portable tree's bits on every tile (the same additions and
    /// comparisons in the same order), sums and maxima alike.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tile_trees_give_the_portable_bits() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        #[target_feature(enable = "avx2")]
        fn vector(t: &[f32; TILE]) -> (f32, f32) {
            (tile_sum::<ATTN_AVX2>(t), tile_max::<ATTN_AVX2>(t))
        }
        for t in tiles() {
            let portable = (tile_sum::<ATTN_PORTABLE>(&t), tile_max::<ATTN_PORTABLE>(&t));
            // SAFETY: the CPU has AVX2 (checked above).
            let x86 = unsafe { vector(&t) };
            assert_eq!(
                (portable.0.to_bits(), portable.1.to_bits()),
                (x86.0.to_bits(), x86.1.to_bits()),
                "{t:?}"
            );
        }
    }

    /// The portable tree is the pairwise one the module promises (halves first), not a
    /// running sum: the two differ on this tile.
    #[test]
    fn tile_sum_adds_halves_first() {
        let mut t = [0.0f32; TILE];
        t[0] = 1e8;
        t[TILE / 2] = -1e8;
        t[1] = 1.0;
        t[2] = 1.0;
        let running = t.iter().fold(0.0f32, |a, &v| a + v);
        assert_eq!(tile_sum::<ATTN_PORTABLE>(&t), 2.0);
        assert_ne!(running, 2.0);
        let mut m = [f32::NEG_INFINITY; TILE];
        m[TILE / 2] = 0.0;
        m[0] = -0.0;
        // `0 > -0` is false, so the lower `-0` stays, as `maxps(upper, lower)` keeps it.
        assert_eq!(tile_max::<ATTN_PORTABLE>(&m).to_bits(), (-0.0f32).to_bits());
    }
}
