//! Batch invariance (where claimed: a row's result is the same bits alone or inside any batch)
//! and determinism (the same call twice gives the same bits).

use std::sync::Arc;

use kiln_backend::{Backend, KvPages, Linear, PackedAttentionParams};
use kiln_core::GgmlType;

use super::attention::{params, MASKS, PACKED};
use crate::check;
use crate::data::{encode, gptq, gptq_linear, host, kv, linear, paged, tensor, values, vector};
use crate::{Target, ALL_WEIGHT_TYPES};

fn claimed<B: Backend>(t: &Target<B>, case: &str) -> bool {
    if !t.claims.batch_invariant {
        eprintln!(
            "{}: {case} skipped: the backend does not claim batch invariance",
            t.name()
        );
    }
    t.claims.batch_invariant
}

/// Every weight type's product (GPTQ included) at 1 to 70 rows: each row the bits it gets alone.
pub fn batch_invariant_matmul<B: Backend>(t: &Target<B>) {
    if !claimed(t, "batch_invariant_matmul") {
        return;
    }
    let b = t.backend();
    for (n, k) in [(72, 512), (75, 256)] {
        let mut lins: Vec<Linear<B>> = ALL_WEIGHT_TYPES
            .iter()
            .enumerate()
            .filter(|(_, &ty)| t.computes(ty, "batch_invariant_matmul"))
            .map(|(i, &ty)| {
                let (bytes, _) = encode(ty, &values(n * k, 3 + i as u64));
                linear(&b, ty, (n, k), bytes, None)
            })
            .collect();
        if t.claims.gptq {
            lins.push(gptq_linear(
                &b,
                &Arc::new(gptq(k, 72, 128, true, true, 9)),
                None,
            ));
        }
        for (i, lin) in lins.iter().enumerate() {
            let n = lin.out_features;
            let x = values(70 * k, 99 + i as u64);
            let alone: Vec<Vec<f32>> = x
                .chunks(k)
                .map(|row| host(&b, &b.matmul(&tensor(&b, row, 1, k), lin).unwrap()))
                .collect();
            for m in [1, 2, 3, 5, 8, 13, 64, 70] {
                let y = host(&b, &b.matmul(&tensor(&b, &x[..m * k], m, k), lin).unwrap());
                for (r, single) in alone.iter().take(m).enumerate() {
                    check::bits(
                        &format!(
                            "{}: batch-invariant {} matmul [{m}, {k}] x [{n}, {k}]ᵀ, row {r} vs \
                             alone",
                            b.name(),
                            lin.ty
                        ),
                        &y[r * n..(r + 1) * n],
                        single,
                        n,
                    );
                }
            }
        }
    }
}

/// Attention (causal, GQA, windows, soft cap) over a prefill of 280 rows: each query row alone
/// (a decode step), and a chunk from the middle of the prompt (chunked prefill), give the
/// prefill's bits, over contiguous and paged caches of each KV element type.
pub fn batch_invariant_attention<B: Backend>(t: &Target<B>) {
    if !claimed(t, "batch_invariant_attention") {
        return;
    }
    let cap = 300usize;
    let bs = 16;
    let table: Vec<u32> = (0..cap.div_ceil(bs) as u32).rev().collect();
    let pages = KvPages {
        table: &table,
        block_size: bs,
    };
    for (dtype, b) in t.kv_backends() {
        // Heads of 16, or of one block for the block types.
        let heads = (8, 2, 16usize.next_multiple_of(dtype.block()));
        let (n_heads, n_kv_heads, hd) = heads;
        let kv_cols = n_kv_heads * hd;
        let (k, v) = (values(cap * kv_cols, 5), values(cap * kv_cols, 6));
        let (kc, _) = kv(&b, &k, cap, kv_cols);
        let (vc, _) = kv(&b, &v, cap, kv_cols);
        let pool = |data: &[f32]| {
            let p = paged(data, kv_cols, &table, bs);
            kv(&b, &p, p.len() / kv_cols, kv_cols).0
        };
        let (kp, vp) = (pool(&k), pool(&v));
        let w = n_heads * hd;
        let (q_pos, rows) = (7, 280);
        let q = values(rows * w, 11);
        let qt = tensor(&b, &q, rows, w);
        let n_kv = q_pos + rows;
        for mask in [MASKS[0], (Some(37), None), (Some(100), Some(30.0))] {
            let p = params(heads, mask);
            let what = |s: &str| {
                format!(
                    "{}: {dtype} batch-invariant attention, {mask:?}: {s}",
                    b.name()
                )
            };
            let all = host(&b, &b.attention(&qt, &kc, &vc, q_pos, n_kv, &p).unwrap());
            let paged_all = host(
                &b,
                &b.paged_attention(&qt, &kp, &vp, &pages, q_pos, n_kv, &p)
                    .unwrap(),
            );
            check::bits(&what("paged vs contiguous"), &paged_all, &all, w);
            for r in [0, 1, 5, 63, 64, 150, 279] {
                let qr = tensor(&b, &q[r * w..(r + 1) * w], 1, w);
                let one = host(
                    &b,
                    &b.attention(&qr, &kc, &vc, q_pos + r, q_pos + r + 1, &p)
                        .unwrap(),
                );
                check::bits(
                    &what(&format!("row {r} alone")),
                    &one,
                    &all[r * w..(r + 1) * w],
                    w,
                );
            }
            let qc = tensor(&b, &q[100 * w..140 * w], 40, w);
            let chunk = host(
                &b,
                &b.attention(&qc, &kc, &vc, q_pos + 100, q_pos + 140, &p)
                    .unwrap(),
            );
            check::bits(
                &what("rows 100..140 as a chunk"),
                &chunk,
                &all[100 * w..140 * w],
                w,
            );
        }
    }
}

/// Packed attention: each sequence alone gives the bits it gets inside the packed batch.
pub fn batch_invariant_packed_attention<B: Backend>(t: &Target<B>) {
    if !claimed(t, "batch_invariant_packed_attention") {
        return;
    }
    let b = t.backend();
    for (lens, heads, hd) in PACKED {
        let cols = heads * hd;
        let total: usize = lens.iter().sum();
        let (q, k, v) = (
            values(total * cols, 4),
            values(total * cols, 5),
            values(total * cols, 6),
        );
        for radius in [None, Some(4)] {
            let p = PackedAttentionParams {
                n_heads: heads,
                head_dim: hd,
                scale: 0.25,
                radius,
            };
            let tt = |x: &[f32], rows| tensor(&b, x, rows, cols);
            let all = host(
                &b,
                &b.packed_attention(&tt(&q, total), &tt(&k, total), &tt(&v, total), lens, &p)
                    .unwrap(),
            );
            let mut start = 0;
            for &len in lens.iter() {
                if len > 0 {
                    let s = start * cols..(start + len) * cols;
                    let one = host(
                        &b,
                        &b.packed_attention(
                            &tt(&q[s.clone()], len),
                            &tt(&k[s.clone()], len),
                            &tt(&v[s.clone()], len),
                            &[len],
                            &p,
                        )
                        .unwrap(),
                    );
                    check::bits(
                        &format!(
                            "{}: batch-invariant packed_attention {lens:?}, radius {radius:?}: \
                             the sequence of {len} at row {start} alone",
                            b.name()
                        ),
                        &one,
                        &all[s],
                        cols,
                    );
                }
                start += len;
            }
        }
    }
}

/// The same call twice on one backend gives the same bits (the trait's determinism for a given
/// configuration): block and float products at one and several rows, a norm, attention prefill
/// and decode, packed attention.
pub fn deterministic<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    let twice = |what: &str, f: &dyn Fn() -> Vec<f32>| {
        let first = f();
        check::bits(&format!("{}: {what} run twice", b.name()), &f(), &first, 1);
    };
    let k = 256;
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F32] {
        if !t.claims.weight_types.contains(&ty) {
            continue;
        }
        let (bytes, _) = encode(ty, &values(48 * k, 1));
        let lin = linear(&b, ty, (48, k), bytes, None);
        for m in [1, 5, 9] {
            let x = tensor(&b, &values(m * k, 2), m, k);
            twice(&format!("{ty} matmul at {m} rows"), &|| {
                host(&b, &b.matmul(&x, &lin).unwrap())
            });
        }
    }
    let x = tensor(&b, &values(70 * 96, 3), 70, 96);
    let w = vector(&b, "w", &values(96, 4));
    twice("rms_norm", &|| host(&b, &b.rms_norm(&x, &w, 1e-6).unwrap()));
    let heads = (8, 2, 16);
    let kv_cols = 32;
    let (kc, _) = kv(&b, &values(300 * kv_cols, 5), 300, kv_cols);
    let (vc, _) = kv(&b, &values(300 * kv_cols, 6), 300, kv_cols);
    let p = params(heads, (Some(100), Some(30.0)));
    for (q_pos, n) in [(0, 280), (299, 1)] {
        let q = tensor(&b, &values(n * 128, 7), n, 128);
        twice(&format!("attention of {n} rows at {q_pos}"), &|| {
            host(
                &b,
                &b.attention(&q, &kc, &vc, q_pos, q_pos + n, &p).unwrap(),
            )
        });
    }
    let (lens, heads, hd) = PACKED[0];
    let total: usize = lens.iter().sum();
    let cols = heads * hd;
    let qkv = tensor(&b, &values(total * cols, 8), total, cols);
    let pp = PackedAttentionParams {
        n_heads: heads,
        head_dim: hd,
        scale: 0.25,
        radius: None,
    };
    twice("packed_attention", &|| {
        host(
            &b,
            &b.packed_attention(&qkv, &qkv, &qkv, lens, &pp).unwrap(),
        )
    });
}
