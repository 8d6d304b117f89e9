//! The flash kernel and the row-form prefill against the row-at-a-time reference, on every SIMD
//! level and thread count, over contiguous and paged caches of every element type (the block
//! types where heads hold whole blocks).

use kiln_backend::{AttentionParams, KvDtype, KvPages};

use super::{attention, paged_attention};
use crate::backend::CpuBackend;
use crate::kernels::{simd_level, SimdLevel};
use crate::kv::CpuKv;
use crate::math;
use crate::options::CpuOptions;
use crate::tensor::CpuTensor;

/// The row-at-a-time kernel this module replaced, kept as the reference: scores of one query
/// row and head against all its visible keys, softmax, weighted sum of values.
fn reference(q: &CpuTensor, k: &CpuKv, v: &CpuKv, q_pos: usize, p: &AttentionParams) -> Vec<f32> {
    reference_over(q, &k.to_f32(), &v.to_f32(), q_pos, p)
}

/// [`reference`] over the caches' values as f32.
fn reference_over(
    q: &CpuTensor,
    k: &[f32],
    v: &[f32],
    q_pos: usize,
    p: &AttentionParams,
) -> Vec<f32> {
    let hd = p.head_dim;
    let kv_cols = p.n_kv_heads * hd;
    let group = p.n_heads / p.n_kv_heads;
    let mut out = vec![0.0f32; q.rows * q.cols];
    for (i, out_row) in out.chunks_mut(q.cols).enumerate() {
        let pos = q_pos + i;
        let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let hi = pos + 1;
        let mut scores = vec![0.0f32; hi - lo];
        for h in 0..p.n_heads {
            let kvh = h / group;
            let qh = &q.row(i)[h * hd..(h + 1) * hd];
            let mut max = f32::NEG_INFINITY;
            for (s, j) in scores.iter_mut().zip(lo..hi) {
                let kj = &k[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
                let mut v = math::dot(qh, kj) * p.scale;
                if let Some(cap) = p.softcap {
                    v = cap * (v / cap).tanh();
                }
                *s = v;
                max = max.max(v);
            }
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            let oh = &mut out_row[h * hd..(h + 1) * hd];
            for (s, j) in scores.iter().zip(lo..hi) {
                let vj = &v[j * kv_cols + kvh * hd..j * kv_cols + (kvh + 1) * hd];
                let weight = s * inv;
                for (o, &v) in oh.iter_mut().zip(vj) {
                    *o += weight * v;
                }
            }
        }
    }
    out
}

/// Deterministic values in [-1, 1) (xorshift64).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn tensor(data: Vec<f32>, rows: usize, cols: usize) -> CpuTensor {
    CpuTensor::new(data, rows, cols).unwrap()
}

fn cache(data: &[f32], rows: usize, cols: usize, dtype: KvDtype) -> CpuKv {
    CpuKv::from_f32(data, rows, cols, dtype).unwrap()
}

/// The scalar build on one thread, the AVX2 one where the CPU has more (its kernels then run
/// beside the AVX-512 ones), and the CPU's SIMD level on one and three threads.
fn backends() -> Vec<CpuBackend> {
    let capped = |level| CpuBackend::with_options(&CpuOptions::threads(1).simd_cap(level));
    let mut v = vec![capped(SimdLevel::Scalar).unwrap()];
    if simd_level() > SimdLevel::Avx2 {
        v.push(capped(SimdLevel::Avx2).unwrap());
    }
    if simd_level() != SimdLevel::Scalar {
        v.push(CpuBackend::new(1).unwrap());
        v.push(CpuBackend::new(3).unwrap());
    }
    v
}

/// Runs `rows` query rows at `q_pos` on every backend, over caches of each type, and checks
/// each against the reference over the cache's (rounded) values: the largest error at most
/// 1e-5 of the largest output (softmax weights are within a few ulp of the reference's; the
/// outputs are sums of up to a thousand such products), and all backends bit-identical (the
/// same operations on any thread count and in both builds).
fn check(b: &[CpuBackend], p: &AttentionParams, q_pos: usize, rows: usize, seed: u64) {
    // Block types wherever the heads hold whole blocks.
    for dtype in KvDtype::ALL {
        if p.head_dim.is_multiple_of(dtype.block()) {
            check_one(b, p, q_pos, rows, seed, dtype);
        }
    }
}

fn check_one(
    b: &[CpuBackend],
    p: &AttentionParams,
    q_pos: usize,
    rows: usize,
    seed: u64,
    dtype: KvDtype,
) {
    let hd = p.head_dim;
    let n_kv = q_pos + rows;
    // Queries scaled up so that the softmax is far from uniform.
    let q: Vec<f32> = values(rows * p.n_heads * hd, seed)
        .iter()
        .map(|x| x * 3.0)
        .collect();
    let q = tensor(q, rows, p.n_heads * hd);
    // A cache longer than the filled part, with NaN past it (huge values in a block cache,
    // which cannot hold NaN): never read.
    let cap = n_kv + 3;
    let poison = if dtype.block() > 1 { 3.0e4 } else { f32::NAN };
    let mut k = values(cap * p.n_kv_heads * hd, seed + 1);
    let mut v = values(cap * p.n_kv_heads * hd, seed + 2);
    k[n_kv * p.n_kv_heads * hd..].fill(poison);
    v[n_kv * p.n_kv_heads * hd..].fill(poison);
    let (k, v) = (
        cache(&k, cap, p.n_kv_heads * hd, dtype),
        cache(&v, cap, p.n_kv_heads * hd, dtype),
    );
    let want = reference(&q, &k, &v, q_pos, p);
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let mut first: Option<Vec<f32>> = None;
    for be in b {
        let got = attention(&be.cx, &q, &k, &v, q_pos, n_kv, p).unwrap();
        assert_eq!((got.rows, got.cols), (q.rows, q.cols));
        let err = got
            .data
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-5 * scale,
            "{p:?} q_pos {q_pos} rows {rows} {dtype} on {:?}/{}: error {err:e} of {scale}",
            be.simd(),
            be.threads()
        );
        match &first {
            None => first = Some(got.data.clone()),
            Some(f) => assert!(
                f.iter()
                    .zip(&got.data)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{p:?} q_pos {q_pos} rows {rows} {dtype}: {:?}/{} differs from the first backend",
                be.simd(),
                be.threads()
            ),
        }
    }
}

fn params(
    (n_heads, n_kv_heads): (usize, usize),
    head_dim: usize,
    sliding_window: Option<usize>,
    softcap: Option<f32>,
) -> AttentionParams {
    AttentionParams {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window,
        softcap,
    }
}

#[test]
fn matches_the_reference_on_gqa_windows_and_softcaps() {
    let b = backends();
    let mut seed = 0;
    for heads in [(4, 1), (8, 2), (2, 2)] {
        for hd in [64, 256] {
            for window in [None, Some(5), Some(512)] {
                for softcap in [None, Some(50.0)] {
                    let p = params(heads, hd, window, softcap);
                    for q_pos in [0, 37] {
                        for rows in (1..=13).chain([70]) {
                            seed += 3;
                            check(&b, &p, q_pos, rows, seed);
                        }
                    }
                }
            }
        }
    }
}

/// A paged cache gives the bits of the contiguous one, whatever the block size (tiles
/// crossing blocks included) and the order of the blocks in the pool; rows the table does
/// not map (NaN here) are never read.
#[test]
fn paged_caches_give_the_bits_of_contiguous_ones() {
    use kiln_backend::Backend;
    let b = backends();
    let mut seed = 1000;
    for (heads, hd, window) in [
        ((4, 1), 64, None),
        ((8, 2), 32, Some(40)),
        ((2, 2), 8, None),
    ] {
        let p = params(heads, hd, window, Some(30.0));
        let kv_cols = p.n_kv_heads * hd;
        // (Float types: the unmapped rows are NaN, which blocks cannot hold.)
        let floats = [KvDtype::F32, KvDtype::F16];
        for (block_size, dtype) in [1, 3, 16, 32].into_iter().zip(floats.iter().cycle()) {
            for (q_pos, rows) in [(0, 5), (37, 1), (300, 1), (250, 20)] {
                seed += 7;
                let n_kv = q_pos + rows;
                let q = tensor(values(rows * p.n_heads * hd, seed), rows, p.n_heads * hd);
                let (k, v) = (
                    values(n_kv * kv_cols, seed + 1),
                    values(n_kv * kv_cols, seed + 2),
                );
                let k_cache = cache(&k, n_kv, kv_cols, *dtype);
                let v_cache = cache(&v, n_kv, kv_cols, *dtype);
                let (k, v) = (tensor(k, n_kv, kv_cols), tensor(v, n_kv, kv_cols));
                // The sequence's blocks, scattered through a larger pool in a shuffled order.
                let blocks = n_kv.div_ceil(block_size);
                let pool_blocks = 2 * blocks + 3;
                let mut ids: Vec<u32> = (0..pool_blocks as u32).collect();
                let mut s = seed;
                for i in (1..ids.len()).rev() {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ids.swap(i, (s >> 33) as usize % (i + 1));
                }
                let table = &ids[..blocks];
                let pages = KvPages { table, block_size };
                let nan = vec![f32::NAN; pool_blocks * block_size * kv_cols];
                for be in &b {
                    let mut kp = cache(&nan, pool_blocks * block_size, kv_cols, *dtype);
                    let mut vp = cache(&nan, pool_blocks * block_size, kv_cols, *dtype);
                    // Written in two appends, the second starting inside a block.
                    let cut = n_kv / 2;
                    for (pool, src) in [(&mut kp, &k), (&mut vp, &v)] {
                        be.write_paged_rows(pool, &pages, 0, &be.rows(src, 0..cut).unwrap())
                            .unwrap();
                        be.write_paged_rows(pool, &pages, cut, &be.rows(src, cut..n_kv).unwrap())
                            .unwrap();
                    }
                    let want = attention(&be.cx, &q, &k_cache, &v_cache, q_pos, n_kv, &p).unwrap();
                    let got =
                        paged_attention(&be.cx, &q, &kp, &vp, &pages, q_pos, n_kv, &p).unwrap();
                    assert!(
                        want.data
                            .iter()
                            .zip(&got.data)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{p:?} block {block_size} q_pos {q_pos} rows {rows} {dtype} on {:?}/{}",
                        be.simd(),
                        be.threads()
                    );
                }
            }
        }
    }
}

#[test]
fn a_table_that_does_not_cover_the_rows_is_an_error() {
    use kiln_backend::Backend;
    let be = CpuBackend::new(1).unwrap();
    let p = params((2, 1), 4, None, None);
    let q = tensor(values(8, 1), 1, 8);
    let pool = cache(&values(16, 2), 4, 4, KvDtype::F16); // 2 blocks of 2 rows
    let short = KvPages {
        table: &[1],
        block_size: 2,
    };
    let err = paged_attention(&be.cx, &q, &pool, &pool, &short, 2, 3, &p).unwrap_err();
    assert!(err.to_string().contains("need 2 blocks"), "{err}");
    let outside = KvPages {
        table: &[0, 2],
        block_size: 2,
    };
    let err = paged_attention(&be.cx, &q, &pool, &pool, &outside, 2, 3, &p).unwrap_err();
    assert!(err.to_string().contains("block 2"), "{err}");
    let zero = KvPages {
        table: &[0, 1],
        block_size: 0,
    };
    assert!(paged_attention(&be.cx, &q, &pool, &pool, &zero, 0, 1, &p).is_err());
    let mut dst = cache(&values(16, 2), 4, 4, KvDtype::F16);
    let err = be
        .write_paged_rows(&mut dst, &outside, 1, &tensor(values(8, 3), 2, 4))
        .unwrap_err();
    assert!(err.to_string().contains("block 2"), "{err}");
    assert_eq!(
        dst.to_f32(),
        pool.to_f32(),
        "a failed write changes nothing"
    );
    let f32_pool = cache(&values(16, 2), 4, 4, KvDtype::F32);
    let err = attention(&be.cx, &q, &pool, &f32_pool, 2, 3, &p).unwrap_err();
    assert!(
        err.to_string()
            .contains("keys stored as f16, values as f32"),
        "{err}"
    );
}

/// Long caches: decode splits the keys into parts (and prefill tasks walk many tiles).
#[test]
fn long_caches_split_into_parts_match_the_reference() {
    let b = backends();
    for heads in [(4, 1), (8, 2), (2, 2)] {
        for window in [None, Some(5), Some(300)] {
            for softcap in [None, Some(50.0)] {
                let p = params(heads, 64, window, softcap);
                // (4090, 20): a prefill whose keys cross the row form's chunk of 4096.
                for (q_pos, rows) in [
                    (255, 1),
                    (256, 1),
                    (700, 1),
                    (1000, 2),
                    (600, 9),
                    (4090, 20),
                ] {
                    check(&b, &p, q_pos, rows, (q_pos + rows) as u64);
                }
            }
        }
    }
}

/// Head sizes that are not a multiple of the lanes take the tail paths; groups of 3 and 16
/// heads per KV head make partial and multiple blocks.
#[test]
fn odd_head_sizes_and_groups_match_the_reference() {
    let b = backends();
    for (heads, hd) in [
        ((4, 1), 8),
        ((6, 2), 20),
        ((3, 1), 72),
        ((16, 1), 32),
        ((1, 1), 1),
    ] {
        let p = params(heads, hd, None, None);
        for (q_pos, rows) in [(0, 1), (0, 5), (11, 17), (300, 1)] {
            check(&b, &p, q_pos, rows, 9);
        }
    }
}

/// No query rows, or no query heads: empty outputs of the right shape, no work.
#[test]
fn empty_shapes_give_empty_outputs() {
    let be = CpuBackend::new(2).unwrap();
    let kv = cache(&values(4 * 16, 1), 4, 16, KvDtype::F16);
    let q = tensor(Vec::new(), 0, 64);
    let got = attention(&be.cx, &q, &kv, &kv, 2, 2, &params((4, 1), 16, None, None)).unwrap();
    assert_eq!((got.rows, got.cols), (0, 64));
    let q = tensor(Vec::new(), 3, 0);
    let got = attention(&be.cx, &q, &kv, &kv, 0, 3, &params((0, 1), 16, None, None)).unwrap();
    assert_eq!((got.rows, got.cols), (3, 0));
}

/// A window of 0 leaves every query without keys: zeros, as the reference gives.
#[test]
fn an_empty_window_gives_zeros() {
    let be = CpuBackend::new(2).unwrap();
    let p = params((4, 1), 16, Some(0), None);
    for (q_pos, rows) in [(0, 1), (0, 6), (400, 1)] {
        let n_kv = q_pos + rows;
        let q = tensor(values(rows * 64, 1), rows, 64);
        let kv = cache(&values(n_kv * 16, 2), n_kv, 16, KvDtype::F16);
        let got = attention(&be.cx, &q, &kv, &kv, q_pos, n_kv, &p).unwrap();
        assert!(got.data.iter().all(|&x| x == 0.0));
    }
}

/// A prefill over an f16 or block cache reads the rows its queries see widened to f32 once
/// (`widened`): the bits of a prefill over an f32 cache of the same values, at every SIMD level.
#[test]
fn prefills_over_converted_rows_give_the_bits_of_an_f32_cache() {
    let mut levels = vec![SimdLevel::Scalar];
    if simd_level() != SimdLevel::Scalar {
        levels.extend([SimdLevel::Avx2, simd_level()]);
    }
    for level in levels {
        let be = CpuBackend::with_options(&CpuOptions::threads(2).simd_cap(level)).unwrap();
        for (window, q_pos, n) in [(None, 0, 70), (Some(9), 5, 41), (None, 33, 20)] {
            let p = params((8, 2), 64, window, None);
            let n_kv = q_pos + n;
            let q = tensor(values(n * 8 * 64, 7), n, 8 * 64);
            for dtype in KvDtype::ALL {
                let kv = |seed| cache(&values(n_kv * 2 * 64, seed), n_kv, 2 * 64, dtype);
                let (k, v) = (kv(8), kv(9));
                let f32_cache = |c: &CpuKv| cache(&c.to_f32(), n_kv, 2 * 64, KvDtype::F32);
                let (k32, v32) = (f32_cache(&k), f32_cache(&v));
                let a = attention(&be.cx, &q, &k, &v, q_pos, n_kv, &p).unwrap();
                let b = attention(&be.cx, &q, &k32, &v32, q_pos, n_kv, &p).unwrap();
                assert!(
                    a.data
                        .iter()
                        .zip(&b.data)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{dtype} {level:?} window {window:?} at {q_pos}: differs from the f32 cache"
                );
            }
        }
    }
}

/// A prefill's rows do not depend on the other rows of the call (the row form, `rows`): a prompt
/// prefilled in two chunks gives the bits of the whole, on every backend.
#[test]
fn a_prefill_in_chunks_gives_the_bits_of_a_whole_one() {
    for be in backends() {
        for (heads, window, softcap) in [((4, 1), None, None), ((2, 2), Some(30), Some(40.0))] {
            let p = params(heads, 64, window, softcap);
            // Rows `[q0, n)` whole and split at `split` (the second case's keys cross the row
            // form's chunk of 4096 positions).
            for (q0, n, split) in [(0, 110, 45), (4030, 4140, 4080)] {
                let q = tensor(values((n - q0) * p.n_heads * 64, 3), n - q0, p.n_heads * 64);
                let kv_cols = p.n_kv_heads * 64;
                let k = cache(&values(n * kv_cols, 4), n, kv_cols, KvDtype::F32);
                let v = cache(&values(n * kv_cols, 5), n, kv_cols, KvDtype::F32);
                let whole = attention(&be.cx, &q, &k, &v, q0, n, &p).unwrap();
                let part = |r0: usize, r1: usize| {
                    let rows = q.data[(r0 - q0) * q.cols..(r1 - q0) * q.cols].to_vec();
                    let q = tensor(rows, r1 - r0, q.cols);
                    attention(&be.cx, &q, &k, &v, r0, r1, &p)
                        .unwrap()
                        .data
                        .clone()
                };
                let chunks = [part(q0, split), part(split, n)].concat();
                assert!(
                    whole
                        .data
                        .iter()
                        .zip(&chunks)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{p:?} from {q0} on {:?}/{}: the chunks differ from the whole",
                    be.simd(),
                    be.threads()
                );
            }
        }
    }
}
