//! Batch-invariant mode (`CpuOptions::batch_invariant`) changes which kernels run: the
//! conformance suite (crates/kiln-conformance) checks that in the mode every row of a product
//! and of attention is the same bits alone or batched; here, that without the mode the one-row
//! paths are other kernels whose results differ in the last bits, so that the mode is known to
//! matter.

use std::sync::Arc;

use kiln_backend::{Backend, Linear};
use kiln_core::GgmlType;
use kiln_cpu::kernels::{simd_level, SimdLevel};
use kiln_cpu::{CpuBackend, CpuOptions};

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

#[test]
fn without_the_mode_one_row_products_take_other_kernels() {
    if simd_level() == SimdLevel::Scalar {
        eprintln!("skipped: the scalar level has one kernel per type");
        return;
    }
    let mut differs_without = 0;
    for (threads, (n, k)) in [(1, (72, 512)), (2, (72, 512)), (2, (75, 256))] {
        let b = invariant(threads);
        let plain = CpuBackend::new(threads).unwrap();
        for (t, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let lin = linear(&b, ty, n, k, 3 + t as u64);
            let x = values(70 * k, 99 + t as u64);
            let first = b.tensor_from_f32(&x[..k], 1, k).unwrap();
            let alone = b.to_f32(&b.matmul(&first, &lin).unwrap()).unwrap();
            for m in [1, 2, 3, 5, 8, 13, 64, 70] {
                let xm = b.tensor_from_f32(&x[..m * k], m, k).unwrap();
                let yp = plain.to_f32(&plain.matmul(&xm, &lin).unwrap()).unwrap();
                differs_without += usize::from(yp[..n] != alone[..]);
            }
        }
    }
    assert!(differs_without > 0, "the plain paths differ somewhere");
}
