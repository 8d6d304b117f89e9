//! The tile loop of one block of query vectors over a range of keys ([`attend_keys`]): per tile
//! of `TILE` keys, the block's scores, each vector's online-softmax update, and the weighted
//! value rows. One source, compiled with AVX-512, with AVX2+FMA+F16C (where the kernels take
//! their intrinsic bodies) and without: all perform the same operations in the same order.

use std::ops::Range;

use super::job::{Block, Job, State};
use crate::kernels::{self, KvElem, ATTN_AVX2, ATTN_AVX512, ATTN_PORTABLE, BLOCK, TILE};
use crate::math;
use crate::sgemm::Isa;

// The fixed pairwise summation tree of `softmax_update` halves the tile down to one sum.
const _: () = assert!(TILE.is_power_of_two());

/// Fewest vectors in a block for which an f16 cache's tile is widened to f32 once, before the
/// kernels run it. The kernels widen each row they load, once per call of a few vectors (4 in
/// the score kernels, 4 or 8 in the value kernels), so a block of 32 vectors widened
/// each key row 8 times; `vcvtph2ps` shares a port with the multiply-adds. Widening is exact:
/// the kernels compute the same bits from either.
const WIDEN_MIN_VECTORS: usize = 8;

/// Runs block `b` over the positions `keys`, each vector limited to the keys it sees, updating
/// `st`; with the kernels of `isa` (which exists only where the CPU has it). Every caller is a
/// decode (prefills take the row form, `super::rows`), which has read the part's rows of an f32
/// or f16 cache in order just before (`super::decode`): they are in the core's caches, where the
/// kernels' own order (a few key rows at a time, then the value rows chunk by chunk across the
/// tile) finds them. A block cache's rows are read in order by their dequantization here.
pub(super) fn attend_keys<E: KvElem>(
    isa: Isa,
    job: &Job<'_, E>,
    b: &Block<'_>,
    keys: Range<usize>,
    st: &mut State,
) {
    match isa {
        // SAFETY: `Isa::Avx2` exists only where the CPU has AVX2, FMA and F16C (the levels
        // from `SimdLevel::Avx2` up).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { attend_keys_avx2(job, b, keys, st) },
        // SAFETY: `Isa::Avx512` exists only where the CPU has AVX-512 F/BW/VL/DQ as well.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { attend_keys_avx512(job, b, keys, st) },
        Isa::Scalar => attend_keys_impl::<ATTN_PORTABLE, E>(job, b, keys, st),
    }
}

/// [`attend_keys_impl`] built with AVX2+FMA (and F16C, which widens an f16 cache's rows): its
/// kernels use the intrinsics, and the loops of the softmax compile to 8-lane code.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_keys_avx2<E: KvElem>(
    job: &Job<'_, E>,
    b: &Block<'_>,
    keys: Range<usize>,
    st: &mut State,
) {
    attend_keys_impl::<ATTN_AVX2, E>(job, b, keys, st)
}

/// [`attend_keys_impl`] built with AVX-512 F/BW/VL/DQ as well: its kernels take their 512-bit
/// bodies (the same bits), and the loops of the softmax compile to 16-lane code (element-wise:
/// the same bits too).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/DQ, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn attend_keys_avx512<E: KvElem>(
    job: &Job<'_, E>,
    b: &Block<'_>,
    keys: Range<usize>,
    st: &mut State,
) {
    attend_keys_impl::<ATTN_AVX512, E>(job, b, keys, st)
}

/// See [`attend_keys`]. `ISA` selects the kernels' bodies (`kernels::ATTN_*`): the intrinsic
/// ones only when called from [`attend_keys_avx2`] or [`attend_keys_avx512`].
#[inline(always)]
fn attend_keys_impl<const ISA: u8, E: KvElem>(
    job: &Job<'_, E>,
    b: &Block<'_>,
    Range {
        start: from,
        end: to,
    }: Range<usize>,
    st: &mut State,
) {
    let (hd, kvh) = (job.hd, b.kvh);
    let n = b.queries.len();
    let mut qs: [&[f32]; BLOCK] = [&[]; BLOCK];
    for (d, x) in qs.iter_mut().zip(&b.queries) {
        *d = x.q;
    }
    let mut scores = Scores([[0.0f32; TILE]; BLOCK]);
    let s = &mut scores.0;
    // A block cache's tile, dequantized: TILE rows of keys, then TILE of values.
    let mut scratch = match job.blocks {
        Some(_) => vec![0.0f32; 2 * TILE * hd],
        None => Vec::new(),
    };
    // An f16 cache's tile, widened once for the whole block (see `WIDEN_MIN_VECTORS`).
    let widen = job.blocks.is_none() && size_of::<E>() < 4 && n >= WIDEN_MIN_VECTORS;
    let mut wide = if widen {
        vec![0.0f32; 2 * TILE * hd]
    } else {
        Vec::new()
    };
    let mut t0 = from;
    while t0 < to {
        let t1 = (t0 + TILE).min(to);
        let nk = t1 - t0;
        let mut keys: [&[E]; TILE] = [&[]; TILE];
        let mut values: [&[E]; TILE] = [&[]; TILE];
        if let Some(b) = &job.blocks {
            let (ks, vs) = scratch.split_at_mut(TILE * hd);
            for j in 0..nk {
                job.dequantize_head(b, false, kvh, t0 + j, &mut ks[j * hd..(j + 1) * hd]);
                job.dequantize_head(b, true, kvh, t0 + j, &mut vs[j * hd..(j + 1) * hd]);
            }
            let (ks, vs) = scratch.split_at(TILE * hd);
            for j in 0..nk {
                // `run` builds block jobs over f32 only; another type reads nothing.
                keys[j] = E::from_f32s(&ks[j * hd..(j + 1) * hd]).unwrap_or(&[]);
                values[j] = E::from_f32s(&vs[j * hd..(j + 1) * hd]).unwrap_or(&[]);
            }
        } else {
            for j in 0..nk {
                keys[j] = job.head_row(job.k, kvh, t0 + j);
                values[j] = job.head_row(job.v, kvh, t0 + j);
            }
        }
        let mut wide_keys: [&[f32]; TILE] = [&[]; TILE];
        let mut wide_values: [&[f32]; TILE] = [&[]; TILE];
        if widen {
            let (ks, vs) = wide.split_at_mut(TILE * hd);
            for j in 0..nk {
                kernels::widen::<ISA, E>(keys[j], &mut ks[j * hd..(j + 1) * hd]);
                kernels::widen::<ISA, E>(values[j], &mut vs[j * hd..(j + 1) * hd]);
            }
            let (ks, vs) = wide.split_at(TILE * hd);
            for j in 0..nk {
                wide_keys[j] = &ks[j * hd..(j + 1) * hd];
                wide_values[j] = &vs[j * hd..(j + 1) * hd];
            }
            kernels::scores::<ISA, f32>(&qs[..n], &wide_keys[..nk], s);
        } else {
            kernels::scores::<ISA, E>(&qs[..n], &keys[..nk], s);
        }
        // The online-softmax update in three passes (see `softmax_max`): each vector's new
        // maximum, then every vector's rescaling factor at once, then each one's weights.
        let mut seen = [false; BLOCK];
        let mut new_max = st.max;
        for (m, x) in b.queries.iter().enumerate() {
            let (a, z) = (x.lo.max(t0), x.hi.min(t1));
            if a >= z {
                s[m] = [0.0; TILE];
            } else {
                seen[m] = true;
                new_max[m] = softmax_max::<ISA, E>(job, &mut s[m], a - t0, z - t0, st.max[m]);
            }
        }
        let alpha = rescale_factors(&seen, &st.max, &new_max);
        for (m, x) in b.queries.iter().enumerate() {
            if seen[m] {
                let (a, z) = (x.lo.max(t0) - t0, x.hi.min(t1) - t0);
                let tile_sum = softmax_weights::<ISA>(&mut s[m], a, z, new_max[m]);
                st.max[m] = new_max[m];
                st.sum[m] = st.sum[m].mul_add(alpha[m], tile_sum);
            }
        }
        let acc = &mut st.acc[..n * hd];
        if widen {
            kernels::weighted_values::<ISA, f32>(acc, &alpha, s, &wide_values[..nk], hd);
        } else {
            kernels::weighted_values::<ISA, E>(acc, &alpha, s, &values[..nk], hd);
        }
        t0 = t1;
    }
}

/// A block's scores of one tile, each vector's row one 64-byte line. As a plain array on the
/// stack its rows sat wherever the stack's random start put them: in three processes out of
/// four each 16-lane row straddled two lines, and llama-3.2-1b's 512-row prefill attention took
/// 13.1-13.7 ms instead of 9.7-10.5 (`examples/attn_bench 1 3 32 8 64`, one speed or the other
/// for a process's life; with address randomization off, always the slow one).
#[repr(C, align(64))]
struct Scores([[f32; TILE]; BLOCK]);

/// `0, 1, …, TILE − 1`: the keys' indices in a tile, as a vector the masks compare against.
const TILE_INDICES: [u32; TILE] = {
    let mut v = [0u32; TILE];
    let mut j = 0;
    while j < TILE {
        v[j] = j as u32;
        j += 1;
    }
    v
};

/// The first pass of one vector's online-softmax update over a tile, where it sees tile keys
/// `[a, z)` (non-empty): scales and soft-caps its raw scores `s` in place and returns its new
/// running maximum, the larger of `max` and the largest score inside `[a, z)` (NaN skipped).
///
/// The update is split in passes so that the work of one vector is vector code: this one, then
/// [`rescale_factors`] for the whole block (one `e^x` per vector, in vector lanes instead of one
/// scalar chain each), then [`softmax_weights`]. Each vector's values go through the same
/// operations in the same order as in one pass.
#[inline(always)]
fn softmax_max<const ISA: u8, E>(
    job: &Job<'_, E>,
    s: &mut [f32; TILE],
    a: usize,
    z: usize,
    max: f32,
) -> f32 {
    for v in s.iter_mut() {
        *v *= job.scale;
    }
    if let Some(cap) = job.softcap {
        for v in s.iter_mut() {
            *v = cap * math::tanh(*v / cap);
        }
    }
    let inside = inside(a, z);
    // The largest score inside `[a, z)` (NaN skipped; −inf where there is none) by a fixed
    // pairwise tree (`kernels::tile_max`). Among equal values it may pick another zero sign
    // than a running maximum would: `e^(v − max)` is the same for both.
    let mut tops = [f32::NEG_INFINITY; TILE];
    for ((t, &v), &j) in tops.iter_mut().zip(s.iter()).zip(&TILE_INDICES) {
        if inside(j) && !v.is_nan() {
            *t = v;
        }
    }
    let tile_max = kernels::tile_max::<ISA>(&tops);
    if tile_max > max {
        tile_max
    } else {
        max
    }
}

/// Whether key `j` of the tile is inside `[a, z)`: one unsigned compare against a constant
/// vector of indices (vectorizes; `j >= a && j < z` over an enumeration did not).
#[inline(always)]
fn inside(a: usize, z: usize) -> impl Fn(u32) -> bool {
    let (from, len) = (a as u32, (z - a) as u32);
    move |j: u32| j.wrapping_sub(from) < len
}

/// The factor `e^(old max − new max)` by which each vector's sum and accumulator are rescaled,
/// 1 for the vectors that saw no key of the tile. `new ≥ old` (or both infinite), so the
/// exponent is ≤ 0 or NaN, where `exp_nonpositive` has `exp`'s bits; without `exp`'s overflow
/// branch the loop is vector code over the block.
#[inline(always)]
fn rescale_factors(seen: &[bool; BLOCK], old: &[f32; BLOCK], new: &[f32; BLOCK]) -> [f32; BLOCK] {
    let mut alpha = [1.0f32; BLOCK];
    for (((f, &seen), &old), &new) in alpha.iter_mut().zip(seen).zip(old).zip(new) {
        let e = math::exp_nonpositive(old - new);
        if seen {
            *f = e;
        }
    }
    alpha
}

/// The last pass of one vector's update (see [`softmax_max`]): `s = e^(s − max)` inside
/// `[a, z)` and 0 outside, where `max` is its new running maximum; returns the tile's sum of
/// them by a fixed pairwise tree (`kernels::tile_sum`).
#[inline(always)]
fn softmax_weights<const ISA: u8>(s: &mut [f32; TILE], a: usize, z: usize, max: f32) -> f32 {
    let inside = inside(a, z);
    // Inside `[a, z)`, `v − max ≤ 0` (or NaN), where `exp_nonpositive` has `exp`'s bits;
    // outside, its value is discarded. Without `exp`'s overflow branch the loop vectorizes.
    for (v, &j) in s.iter_mut().zip(&TILE_INDICES) {
        let e = math::exp_nonpositive(*v - max);
        *v = if inside(j) { e } else { 0.0 };
    }
    kernels::tile_sum::<ISA>(s)
}
