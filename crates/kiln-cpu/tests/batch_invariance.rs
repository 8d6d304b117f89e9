//! Batch-invariant mode (`CpuOptions::batch_invariant`): a row's results are bit-identical
//! whatever the other rows of the call are — every weight type's product at 1 to 70 rows
//! against each row alone, and attention (causal, GQA, sliding window, soft cap) over a prefill
//! against each query row alone, paged and contiguous. Without the mode these differ in the
//! last bits (the one-row paths are other kernels), which the first test also checks, so that
//! the mode is known to matter.

use std::sync::Arc;

use kiln_backend::{AttentionJob, AttentionParams, Backend, KvPages, Linear};
use kiln_core::GgmlType;
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuKv, CpuOptions};

mod common;
use common::quant::WEIGHT_TYPES;
use common::{upload, values};

fn invariant(threads: usize) -> CpuBackend {
    CpuBackend::with_options(&CpuOptions {
        batch_invariant: true,
        ..CpuOptions::threads(threads)
    })
    .unwrap()
}

fn linear(b: &CpuBackend, ty: GgmlType, n: usize, k: usize, seed: u64) -> Linear<CpuBackend> {
    let w = values(n * k, seed);
    let bytes = if ty == GgmlType::F32 {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    } else {
        let mut out = vec![0u8; kiln_quant::quantized_size(ty, n * k).unwrap()];
        kiln_quant::quantize(ty, &w, &mut out).unwrap();
        out
    };
    Linear {
        weight: Arc::new(upload(b, "w", ty, &[k, n], bytes)),
        bias: None,
        in_features: k,
        out_features: n,
        ty,
    }
}

fn rows_of(b: &CpuBackend, x: &[f32], rows: std::ops::Range<usize>, k: usize) -> Vec<f32> {
    let t = b
        .tensor_from_f32(&x[rows.start * k..rows.end * k], rows.len(), k)
        .unwrap();
    b.to_f32(&t).unwrap()
}

#[test]
fn products_give_each_row_what_it_gets_alone() {
    let mut differs_without = 0;
    for (threads, (n, k)) in [(1, (72, 512)), (2, (72, 512)), (2, (75, 256))] {
        let b = invariant(threads);
        let plain = CpuBackend::new(threads).unwrap();
        for (t, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let lin = linear(&b, ty, n, k, 3 + t as u64);
            let x = values(70 * k, 99 + t as u64);
            let alone: Vec<Vec<f32>> = (0..70)
                .map(|r| {
                    let xr = b
                        .tensor_from_f32(&rows_of(&b, &x, r..r + 1, k), 1, k)
                        .unwrap();
                    b.to_f32(&b.matmul(&xr, &lin).unwrap()).unwrap()
                })
                .collect();
            for m in [1, 2, 3, 5, 8, 13, 64, 70] {
                let xm = b.tensor_from_f32(&x[..m * k], m, k).unwrap();
                let y = b.to_f32(&b.matmul(&xm, &lin).unwrap()).unwrap();
                for r in 0..m {
                    assert_eq!(
                        &y[r * n..(r + 1) * n],
                        &alone[r][..],
                        "{ty}, row {r} of {m}, {threads} threads"
                    );
                }
                let yp = plain.to_f32(&plain.matmul(&xm, &lin).unwrap()).unwrap();
                differs_without += usize::from(yp[..n] != alone[0][..]);
            }
        }
    }
    if simd_level() != SimdLevel::Scalar {
        assert!(differs_without > 0, "the plain paths differ somewhere");
    }
}

#[test]
fn attention_gives_each_query_row_what_it_gets_alone() {
    let (n_heads, n_kv_heads, hd) = (8, 2, 16);
    let cap = 300;
    let kv_cols = n_kv_heads * hd;
    let k = values(cap * kv_cols, 5);
    let v = values(cap * kv_cols, 6);
    // A paged copy: logical block i at physical block `table[i]` (blocks of 16 rows).
    let bs = 16;
    let table: Vec<u32> = (0..cap.div_ceil(bs) as u32).rev().collect();
    let mut kp = vec![0.0f32; table.len() * bs * kv_cols];
    let mut vp = kp.clone();
    for j in 0..cap {
        let at = (table[j / bs] as usize * bs + j % bs) * kv_cols;
        kp[at..at + kv_cols].copy_from_slice(&k[j * kv_cols..(j + 1) * kv_cols]);
        vp[at..at + kv_cols].copy_from_slice(&v[j * kv_cols..(j + 1) * kv_cols]);
    }
    for threads in [1, 2] {
        let b = invariant(threads);
        let kt = CpuKv::from_f32(&k, cap, kv_cols, b.kv_dtype()).unwrap();
        let vt = CpuKv::from_f32(&v, cap, kv_cols, b.kv_dtype()).unwrap();
        let kpt = CpuKv::from_f32(&kp, kp.len() / kv_cols, kv_cols, b.kv_dtype()).unwrap();
        let vpt = CpuKv::from_f32(&vp, vp.len() / kv_cols, kv_cols, b.kv_dtype()).unwrap();
        let pages = KvPages {
            table: &table,
            block_size: bs,
        };
        for (window, softcap) in [(None, None), (Some(37), None), (Some(100), Some(30.0))] {
            let p = AttentionParams {
                n_heads,
                n_kv_heads,
                head_dim: hd,
                scale: 0.25,
                sliding_window: window,
                softcap,
            };
            let (q_pos, rows) = (7, 280);
            let q = values(rows * n_heads * hd, 11);
            let qt = b.tensor_from_f32(&q, rows, n_heads * hd).unwrap();
            let n_kv = q_pos + rows;
            let all = b
                .to_f32(&b.attention(&qt, &kt, &vt, q_pos, n_kv, &p).unwrap())
                .unwrap();
            let paged = b
                .to_f32(
                    &b.paged_attention(&qt, &kpt, &vpt, &pages, q_pos, n_kv, &p)
                        .unwrap(),
                )
                .unwrap();
            assert_eq!(all, paged, "paged and contiguous");
            let w = n_heads * hd;
            for r in [0, 1, 5, 63, 64, 150, 279] {
                let qr = b.tensor_from_f32(&q[r * w..(r + 1) * w], 1, w).unwrap();
                let one = b
                    .to_f32(
                        &b.attention(&qr, &kt, &vt, q_pos + r, q_pos + r + 1, &p)
                            .unwrap(),
                    )
                    .unwrap();
                assert_eq!(
                    &all[r * w..(r + 1) * w],
                    &one[..],
                    "row {r}, window {window:?}"
                );
            }
            // A chunk that starts mid-prompt (chunked prefill) agrees too.
            let qc = b.tensor_from_f32(&q[100 * w..140 * w], 40, w).unwrap();
            let chunk = b
                .to_f32(
                    &b.attention(&qc, &kt, &vt, q_pos + 100, q_pos + 140, &p)
                        .unwrap(),
                )
                .unwrap();
            assert_eq!(&all[100 * w..140 * w], &chunk[..]);
        }
    }
}

#[test]
fn fused_decode_products_match_the_single_ones() {
    let k = 256;
    let b = invariant(2);
    for types in [
        [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_0],
        [GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K],
    ] {
        let lins: Vec<Linear<CpuBackend>> = types
            .iter()
            .enumerate()
            .map(|(i, &ty)| linear(&b, ty, 40 + 9 * i, k, 70 + i as u64))
            .collect();
        let refs: Vec<&Linear<CpuBackend>> = lins.iter().collect();
        let x = b.tensor_from_f32(&values(k, 5), 1, k).unwrap();
        let fused = b.matmul_many(&x, &refs).unwrap();
        for (y, l) in fused.iter().zip(&lins) {
            let single = b.matmul(&x, l).unwrap();
            assert_eq!(b.to_f32(y).unwrap(), b.to_f32(&single).unwrap(), "{}", l.ty);
        }
    }
}

#[test]
fn attention_many_gives_each_job_what_it_gets_alone() {
    // A batched decode step: sequences of different lengths, one query row or a few each, over
    // contiguous caches and over pages of a shared pool; run as team tasks on 2 and 3 threads,
    // every job must equal its lone call bit for bit, in job order.
    let (n_heads, n_kv_heads, hd) = (4, 1, 32);
    let kv_cols = n_kv_heads * hd;
    let w = n_heads * hd;
    let bs = 16;
    let lens = [1usize, 40, 300, 17, 64, 5];
    for threads in [1, 2, 3] {
        let b = CpuBackend::new(threads).unwrap();
        let p = AttentionParams {
            n_heads,
            n_kv_heads,
            head_dim: hd,
            scale: 0.2,
            sliding_window: Some(48),
            softcap: None,
        };
        let caches: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let k = values(len * kv_cols, 20 + i as u64);
                let v = values(len * kv_cols, 40 + i as u64);
                (
                    CpuKv::from_f32(&k, len, kv_cols, b.kv_dtype()).unwrap(),
                    CpuKv::from_f32(&v, len, kv_cols, b.kv_dtype()).unwrap(),
                )
            })
            .collect();
        // One pool holding the first cache's rows in reversed blocks.
        let len0 = lens[2];
        let table: Vec<u32> = (0..len0.div_ceil(bs) as u32).rev().collect();
        let (k0, v0) = (values(len0 * kv_cols, 22), values(len0 * kv_cols, 42));
        let mut kp = vec![0.0f32; table.len() * bs * kv_cols];
        let mut vp = kp.clone();
        for j in 0..len0 {
            let at = (table[j / bs] as usize * bs + j % bs) * kv_cols;
            kp[at..at + kv_cols].copy_from_slice(&k0[j * kv_cols..(j + 1) * kv_cols]);
            vp[at..at + kv_cols].copy_from_slice(&v0[j * kv_cols..(j + 1) * kv_cols]);
        }
        let kpt = CpuKv::from_f32(&kp, kp.len() / kv_cols, kv_cols, b.kv_dtype()).unwrap();
        let vpt = CpuKv::from_f32(&vp, vp.len() / kv_cols, kv_cols, b.kv_dtype()).unwrap();
        let pages = KvPages {
            table: &table,
            block_size: bs,
        };
        let queries: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let rows = if i % 2 == 0 { 1 } else { len.min(3) };
                b.tensor_from_f32(&values(rows * w, 60 + i as u64), rows, w)
                    .unwrap()
            })
            .collect();
        let mut jobs: Vec<AttentionJob<'_, _, _>> = lens
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
            k: &kpt,
            v: &vpt,
            pages: Some(pages),
            q_pos: len0 - 1,
            n_kv: len0,
        });
        let many = b.attention_many(&jobs, &p).unwrap();
        assert_eq!(many.len(), jobs.len());
        for (i, (j, got)) in jobs.iter().zip(&many).enumerate() {
            let alone = j.run(&b, &p).unwrap();
            assert_eq!(
                b.to_f32(got).unwrap(),
                b.to_f32(&alone).unwrap(),
                "job {i}, {threads} threads"
            );
        }
        // The paged job reads the same rows as the contiguous one of that sequence.
        assert_eq!(
            b.to_f32(&many[2]).unwrap(),
            b.to_f32(&many[lens.len()]).unwrap()
        );
    }
}
