//! Attention over KV caches (contiguous and paged, f32 and f16), batched jobs, and packed
//! encoder attention.

use kiln_backend::{AttentionJob, AttentionParams, Backend, KvPages, PackedAttentionParams};

use crate::check;
use crate::data::{host, kv, paged, scaled, shuffled_table, tensor, values};
use crate::reference;
use crate::Target;

/// `(n_heads, n_kv_heads, head_dim)`: grouped-query, multi-head, multi-query with a head size
/// that is not a power of two, and Gemma-like groups of 4.
pub(crate) const HEADS: [(usize, usize, usize); 5] =
    [(4, 2, 8), (3, 3, 16), (4, 1, 40), (8, 2, 16), (4, 2, 64)];

/// `(sliding_window, softcap)`: none, a window of 3 and of 5 with a soft cap of 2 (scores of the
/// inputs below reach past it), a wide window.
pub(crate) const MASKS: [(Option<usize>, Option<f32>); 4] = [
    (None, None),
    (Some(3), None),
    (Some(5), Some(2.0)),
    (Some(100), Some(30.0)),
];

pub(crate) fn params(
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    (sliding_window, softcap): (Option<usize>, Option<f32>),
) -> AttentionParams {
    AttentionParams {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 0.35,
        sliding_window,
        softcap,
    }
}

/// `(q_pos, rows, n_kv, capacity)` of the calls: a prefill of 10 from 0, a decode step at 10, a
/// chunk from the middle, fewer rows filled than the cache holds, and over a cache of 300 rows
/// (past one decode part of 256): a prefill of 70, a decode step, a chunk.
const CALLS: [(usize, usize, usize, usize); 7] = [
    (0, 10, 10, 16),
    (10, 1, 11, 16),
    (4, 6, 10, 16),
    (2, 3, 5, 16),
    (0, 70, 70, 300),
    (299, 1, 300, 300),
    (290, 10, 300, 300),
];

/// `attention` over contiguous caches of each KV element type against its definition on the
/// values the caches hold: every head layout of `HEADS`, mask of `MASKS`, call of `CALLS`.
pub fn attention<B: Backend>(t: &Target<B>) {
    for (dtype, b) in t.kv_backends() {
        // The block types: the heads that hold whole blocks.
        for heads in HEADS
            .into_iter()
            .filter(|h| h.2.is_multiple_of(dtype.block()))
        {
            let (n_heads, n_kv_heads, hd) = heads;
            let kv_cols = n_kv_heads * hd;
            for (c, &(q_pos, n, n_kv, cap)) in CALLS.iter().enumerate() {
                let (kc, ks) = kv(&b, &values(cap * kv_cols, 5 + cap as u64), cap, kv_cols);
                let (vc, vs) = kv(&b, &values(cap * kv_cols, 6 + cap as u64), cap, kv_cols);
                let q = scaled(n * n_heads * hd, 7 + c as u64, 2.0);
                let qt = tensor(&b, &q, n, n_heads * hd);
                for mask in MASKS {
                    let p = params(heads, mask);
                    let y = b.attention(&qt, &kc, &vc, q_pos, n_kv, &p).unwrap();
                    assert_eq!(b.shape(&y), (n, n_heads * hd));
                    check::close(
                        &format!(
                            "{}: {dtype} attention, {n_heads}/{n_kv_heads} heads of {hd}, \
                             window {:?}, softcap {:?}, {n} rows at {q_pos} over {n_kv}",
                            b.name(),
                            mask.0,
                            mask.1
                        ),
                        &host(&b, &y),
                        &reference::attention(&q, &ks, &vs, (n, q_pos, n_kv), &p),
                        n_heads * hd,
                    );
                }
            }
        }
    }
}

/// `paged_attention`: the same bits as `attention` over a contiguous copy of the rows (the
/// trait's promise), and within bounds of the definition; block tables out of order, blocks of 16
/// and of 5 rows, rows that end mid-block.
pub fn paged_attention<B: Backend>(t: &Target<B>) {
    for (dtype, b) in t.kv_backends() {
        // Heads of 16, or of one block for the block types.
        let heads = (8, 2, 16usize.next_multiple_of(dtype.block()));
        let (n_heads, n_kv_heads, hd) = heads;
        let kv_cols = n_kv_heads * hd;
        let cap = 70;
        let (k, v) = (values(cap * kv_cols, 5), values(cap * kv_cols, 6));
        let (kc, ks) = kv(&b, &k, cap, kv_cols);
        let (vc, vs) = kv(&b, &v, cap, kv_cols);
        for bs in [16, 5] {
            let table = shuffled_table(cap.div_ceil(bs) + 1);
            let pool = |data: &[f32]| {
                let p = paged(data, kv_cols, &table, bs);
                kv(&b, &p, p.len() / kv_cols, kv_cols).0
            };
            let (kp, vp) = (pool(&k), pool(&v));
            let pages = KvPages {
                table: &table,
                block_size: bs,
            };
            for (q_pos, n, n_kv) in [(0, 70, 70), (69, 1, 70), (40, 10, 50), (0, 1, 1)] {
                let q = scaled(n * n_heads * hd, 9 + n as u64, 2.0);
                let qt = tensor(&b, &q, n, n_heads * hd);
                for mask in MASKS {
                    let p = params(heads, mask);
                    let what = format!(
                        "{}: {dtype} paged_attention, blocks of {bs}, window {:?}, softcap {:?}, \
                         {n} rows at {q_pos} over {n_kv}",
                        b.name(),
                        mask.0,
                        mask.1
                    );
                    let got = host(
                        &b,
                        &b.paged_attention(&qt, &kp, &vp, &pages, q_pos, n_kv, &p)
                            .unwrap(),
                    );
                    let contiguous =
                        host(&b, &b.attention(&qt, &kc, &vc, q_pos, n_kv, &p).unwrap());
                    check::bits(
                        &format!("{what} vs contiguous"),
                        &got,
                        &contiguous,
                        n_heads * hd,
                    );
                    check::close(
                        &what,
                        &got,
                        &reference::attention(&q, &ks, &vs, (n, q_pos, n_kv), &p),
                        n_heads * hd,
                    );
                    // A window's table need not map the blocks below it (the engine's window
                    // pool recycles them): unmapped entries there change nothing.
                    let unseen = p.first_key(q_pos) / bs;
                    if unseen > 0 {
                        let mut windowed = table.clone();
                        windowed[..unseen].fill(u32::MAX);
                        let pages = KvPages {
                            table: &windowed,
                            block_size: bs,
                        };
                        let got_windowed = host(
                            &b,
                            &b.paged_attention(&qt, &kp, &vp, &pages, q_pos, n_kv, &p)
                                .unwrap(),
                        );
                        check::bits(
                            &format!("{what}, blocks below the window unmapped"),
                            &got_windowed,
                            &got,
                            n_heads * hd,
                        );
                    }
                }
            }
        }
    }
}

/// `attention_many` (a batched decode step: sequences of different lengths, one or a few query
/// rows each, contiguous caches and pages of a shared pool) gives each job exactly what it gets
/// alone, in job order; the paged job reads the same rows as the contiguous one of its sequence.
pub fn attention_many<B: Backend>(t: &Target<B>) {
    let heads = (4, 1, 32);
    let (n_heads, n_kv_heads, hd) = heads;
    let kv_cols = n_kv_heads * hd;
    let w = n_heads * hd;
    let bs = 16;
    let lens = [1usize, 40, 300, 17, 64, 5];
    for (dtype, b) in t.kv_backends() {
        let caches: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                (
                    kv(&b, &values(len * kv_cols, 20 + i as u64), len, kv_cols).0,
                    kv(&b, &values(len * kv_cols, 40 + i as u64), len, kv_cols).0,
                )
            })
            .collect();
        // One pool holding the third sequence's rows in shuffled blocks.
        let len2 = lens[2];
        let table = shuffled_table(len2.div_ceil(bs));
        let pool = |seed| {
            let p = paged(&values(len2 * kv_cols, seed), kv_cols, &table, bs);
            kv(&b, &p, p.len() / kv_cols, kv_cols).0
        };
        let (kp, vp) = (pool(22), pool(42));
        let pages = KvPages {
            table: &table,
            block_size: bs,
        };
        let queries: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let rows = if i % 2 == 0 { 1 } else { len.min(3) };
                tensor(&b, &values(rows * w, 60 + i as u64), rows, w)
            })
            .collect();
        let mut jobs: Vec<AttentionJob<'_, B::Tensor, B::Kv>> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let rows = b.shape(&queries[i]).0;
                AttentionJob {
                    q: &queries[i],
                    k: &caches[i].0,
                    v: &caches[i].1,
                    pages: None,
                    q_pos: len - rows,
                    n_kv: len,
                }
            })
            .collect();
        jobs.push(AttentionJob {
            q: &queries[2],
            k: &kp,
            v: &vp,
            pages: Some(pages),
            q_pos: len2 - 1,
            n_kv: len2,
        });
        for mask in MASKS {
            let p = params(heads, (mask.0.map(|w| w * 10), mask.1));
            let many = b.attention_many(&jobs, &p).unwrap();
            assert_eq!(many.len(), jobs.len(), "{}: one output per job", b.name());
            for (i, (j, got)) in jobs.iter().zip(&many).enumerate() {
                let alone = j.run(&b, &p).unwrap();
                check::bits(
                    &format!(
                        "{}: {dtype} attention_many job {i}, mask {mask:?}",
                        b.name()
                    ),
                    &host(&b, got),
                    &host(&b, &alone),
                    w,
                );
            }
            check::bits(
                &format!(
                    "{}: {dtype} attention_many, paged job vs contiguous",
                    b.name()
                ),
                &host(&b, &many[lens.len()]),
                &host(&b, &many[2]),
                w,
            );
        }
        assert!(
            b.attention_many(&[], &params(heads, (None, None)))
                .unwrap()
                .is_empty(),
            "no jobs, no outputs"
        );
    }
}

/// `(lens, n_heads, head_dim)` of the packed cases: lengths that are not whole tiles, a single
/// token and an empty sequence; head sizes of 16 and 40.
pub(crate) const PACKED: [(&[usize], usize, usize); 4] = [
    (&[5, 1, 0, 70, 130, 64], 3, 16),
    (&[17, 40], 2, 32),
    (&[5, 1, 0, 70, 130, 64], 2, 40),
    (&[1], 4, 8),
];

/// `packed_attention` against its definition: each row attends to its own sequence only, all of
/// it or within a radius.
pub fn packed_attention<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (lens, heads, hd) in PACKED {
        let cols = heads * hd;
        let total: usize = lens.iter().sum();
        let q = scaled(total * cols, 4, 2.0);
        let (k, v) = (values(total * cols, 5), values(total * cols, 6));
        let tt = |x: &[f32]| tensor(&b, x, total, cols);
        for radius in [None, Some(0), Some(4), Some(40)] {
            let p = PackedAttentionParams {
                n_heads: heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                radius,
            };
            let y = host(
                &b,
                &b.packed_attention(&tt(&q), &tt(&k), &tt(&v), lens, &p)
                    .unwrap(),
            );
            check::close(
                &format!(
                    "{}: packed_attention {lens:?}, {heads} heads of {hd}, radius {radius:?}",
                    b.name()
                ),
                &y,
                &reference::packed_attention(&q, &k, &v, lens, &p),
                cols,
            );
        }
    }
}

/// Attention over a long context (16,000 keys, Gemma 3's heads of 256 in groups of 4): a decode
/// step and a chunk of 4 rows at the end, with a window of 4,096 and a soft cap and
/// without; paged (blocks of 256, out of order) gives the contiguous bits. Short-context cases
/// cannot catch a kernel that splits long rows wrongly, or a device that stops long loops
/// (lavapipe ends a shader invocation's loops after 65,535 iterations in all).
pub fn long_attention<B: Backend>(t: &Target<B>) {
    let heads = (4, 1, 256);
    let (n_heads, n_kv_heads, hd) = heads;
    let kv_cols = n_kv_heads * hd;
    let (n_kv, bs) = (16_000, 256);
    let (k, v) = (values(n_kv * kv_cols, 71), values(n_kv * kv_cols, 72));
    let table = shuffled_table(n_kv.div_ceil(bs));
    let pages = KvPages {
        table: &table,
        block_size: bs,
    };
    for (dtype, b) in t.kv_backends() {
        let (kc, ks) = kv(&b, &k, n_kv, kv_cols);
        let (vc, vs) = kv(&b, &v, n_kv, kv_cols);
        let pool = |data: &[f32]| {
            let p = paged(data, kv_cols, &table, bs);
            kv(&b, &p, p.len() / kv_cols, kv_cols).0
        };
        let (kp, vp) = (pool(&k), pool(&v));
        for n in [1, 4] {
            let q_pos = n_kv - n;
            let q = scaled(n * n_heads * hd, 73 + n as u64, 0.5);
            let qt = tensor(&b, &q, n, n_heads * hd);
            for mask in [(None, None), (Some(4096), Some(5.0))] {
                let p = AttentionParams {
                    scale: 1.0 / (hd as f32).sqrt(),
                    ..params(heads, mask)
                };
                let what = format!(
                    "{}: {dtype} attention over {n_kv} keys, {n} rows, window {:?}, softcap {:?}",
                    b.name(),
                    mask.0,
                    mask.1
                );
                let got = host(&b, &b.attention(&qt, &kc, &vc, q_pos, n_kv, &p).unwrap());
                check::close(
                    &what,
                    &got,
                    &reference::attention(&q, &ks, &vs, (n, q_pos, n_kv), &p),
                    n_heads * hd,
                );
                let paged = b
                    .paged_attention(&qt, &kp, &vp, &pages, q_pos, n_kv, &p)
                    .unwrap();
                check::bits(
                    &format!("{what}: paged vs contiguous"),
                    &host(&b, &paged),
                    &got,
                    n_heads * hd,
                );
            }
        }
    }
}
