//! The GEMM kernels against the loop of kiln-quant's reference row dot.
//!
//! The scalar level must be that loop bit for bit. The AVX2 kernels (tile kernels and loops over
//! the AVX2 row dots) must match it within the standard of `tests/kernels.rs`: the integer part
//! of every block dot is exact in both, so they differ only in the rounding and order of the f32
//! per-block terms, at most about `(k / 8 + 8) * eps * S` each, `S` the sum of the absolute values
//! of the terms (bounded by `sum |w_i| * |x_i|` over the weights split into their scale and minimum
//! parts, so that cancellation inside a weight cannot hide a term). The test allows twice that,
//! once per implementation; a wrong quant, scale or lane moves a result by a sizeable fraction of
//! `S / sqrt(k)`, orders of magnitude more.
//!
//! Weights are both quantized by kiln-quant from random floats and raw random bytes (every scale
//! field a finite half), activations come from `quantize_fn`; outputs are written with a stride
//! `ldo > rows` into a buffer of sentinels, which must survive everywhere but at the outputs.

use std::panic::{catch_unwind, AssertUnwindSafe};

use half::f16;
use kiln_core::GgmlType;

use kiln_cpu::kernels::{
    activation_terms, amx_granted, gemm_fn, gemm_fn_invariant, gemv_fn, has_interleaved_layout,
    interleave, interleaved_gemm_fn, interleaved_gemm_fn_gfni, interleaved_row, panel_key,
    quantize_fn, rows_exact_fn, simd_level, strided_gemm_fn, SimdLevel, INTERLEAVE_ROWS,
};

mod common;
use common::quant::{avx2_available, scale_fields, vnni_available, Field, Rng, WEIGHT_TYPES};

/// The types with an AVX2 tile kernel (the others loop over the AVX2 row dot).
const TILED: [GgmlType; 8] = [
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_K,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
];

/// A value no kernel writes: outputs left alone must keep it bit for bit.
const SENTINEL: f32 = -1.234_567e-29;

fn width(field: Field) -> usize {
    if field == Field::ScaleF32 {
        4
    } else {
        2
    }
}

/// `rows` rows of `k` elements of `ty` as raw random bytes, every scale field (or float element)
/// finite. `fill`, when given, replaces every byte outside the scale fields.
fn raw_weights(ty: GgmlType, rows: usize, k: usize, fill: Option<u8>, rng: &mut Rng) -> Vec<u8> {
    let bytes = rows * ty.row_bytes(k as u64).unwrap() as usize;
    let mut w: Vec<u8> = (0..bytes)
        .map(|_| fill.unwrap_or(rng.next_u64() as u8))
        .collect();
    match ty {
        GgmlType::F32 => w
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&rng.finite(2.0).to_le_bytes())),
        GgmlType::F16 => w
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&f16::from_f32(rng.finite(2.0)).to_le_bytes())),
        GgmlType::BF16 => w.chunks_exact_mut(2).for_each(|c| {
            let bits = (rng.finite(2.0).to_bits() >> 16) as u16;
            c.copy_from_slice(&bits.to_le_bytes())
        }),
        _ => {
            for block in w.chunks_exact_mut(ty.type_size()) {
                for (at, field) in scale_fields(ty) {
                    let v = rng.finite(0.05);
                    if field == Field::ScaleF32 {
                        block[at..at + 4].copy_from_slice(&v.to_le_bytes());
                    } else {
                        block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                    }
                }
            }
        }
    }
    w
}

/// `rows` rows of random floats (a random order of magnitude per row) quantized by kiln-quant.
fn quantized_weights(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..rows)
        .flat_map(|_| {
            let magnitude = 10f32.powf(2.0 * rng.signed());
            (0..k).map(|_| rng.signed() * magnitude).collect::<Vec<_>>()
        })
        .collect();
    let mut w = vec![0u8; rows * ty.row_bytes(k as u64).unwrap() as usize];
    kiln_quant::quantize(ty, &x, &mut w).unwrap();
    w
}

/// `cols` activation rows for weights of `ty`: random floats of a random order of magnitude, some
/// exact zeros, quantized by the AVX2 (or scalar) quantizer.
fn activations(ty: GgmlType, cols: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
    let quantize = quantize_fn(act_ty, simd_level()).unwrap();
    let row = kiln_quant::activation_bytes(act_ty, k).unwrap();
    let mut a = vec![0u8; cols * row];
    for out in a.chunks_exact_mut(row) {
        let magnitude = 10f32.powf(4.0 * (rng.signed() + 1.0) / 2.0 - 2.0);
        let x: Vec<f32> = (0..k)
            .map(|i| {
                if i % 37 == 5 {
                    0.0
                } else {
                    rng.signed() * magnitude
                }
            })
            .collect();
        quantize(&x, out);
    }
    a
}

/// `w` (whole rows) with every field of kind `zero` set to 0, dequantized.
fn dequantized_without(ty: GgmlType, w: &[u8], zero: Field) -> Vec<f32> {
    let mut w = w.to_vec();
    let fields = scale_fields(ty);
    if !fields.is_empty() {
        for block in w.chunks_exact_mut(ty.type_size()) {
            for &(at, field) in &fields {
                if field == zero {
                    block[at..at + width(field)].fill(0);
                }
            }
        }
    }
    let elements = w.len() / ty.type_size() * ty.block_size();
    let mut out = vec![0f32; elements];
    kiln_quant::dequantize(ty, &w, &mut out).unwrap();
    out
}

/// The allowed difference between two implementations of each dot of `w` x `a`, indexed
/// `[c * rows + r]` (see the module docs).
fn tolerances(ty: GgmlType, k: usize, w: &[u8], rows: usize, a: &[u8], cols: usize) -> Vec<f32> {
    let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
    let mut x = vec![0f32; cols * k];
    kiln_quant::dequantize(act_ty, a, &mut x).unwrap();
    // The scale part (minimums zeroed) plus the minimum part (scales zeroed), in absolute value.
    let scaled = dequantized_without(ty, w, Field::MinF16);
    let has_mins = scale_fields(ty).iter().any(|&(_, f)| f == Field::MinF16);
    let mins = if has_mins {
        dequantized_without(ty, w, Field::ScaleF16)
    } else {
        vec![0.0; rows * k]
    };
    let mut tol = Vec::with_capacity(rows * cols);
    for xc in x.chunks_exact(k) {
        for r in 0..rows {
            let magnitude: f64 = (0..k)
                .map(|i| {
                    let wi = f64::from(scaled[r * k + i].abs()) + f64::from(mins[r * k + i].abs());
                    wi * f64::from(xc[i].abs())
                })
                .sum();
            let per_implementation = (k / 8 + 8) as f64 * f64::from(f32::EPSILON) * magnitude;
            tol.push((2.0 * per_implementation) as f32 + f32::MIN_POSITIVE);
        }
    }
    tol
}

/// `gemm` of `w` (`rows`) x `a` (`cols`) at stride `ldo`, into a buffer of sentinels with
/// `ldo - rows` spare elements after each output row and a spare row at the end; checks the
/// sentinels and returns the outputs as `[c * rows + r]`.
#[allow(clippy::too_many_arguments)]
fn run(
    level: SimdLevel,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    cols: usize,
    ldo: usize,
) -> Vec<f32> {
    let gemm = gemm_fn(ty, level).unwrap();
    let mut out = vec![SENTINEL; cols * ldo + ldo];
    gemm(k, w, rows, a, cols, &mut out, ldo);
    let mut got = Vec::with_capacity(rows * cols);
    for (i, &v) in out.iter().enumerate() {
        let (c, r) = (i / ldo, i % ldo);
        if c < cols && r < rows {
            got.push(v);
        } else {
            assert_eq!(
                v.to_bits(),
                SENTINEL.to_bits(),
                "{ty} {level:?} rows {rows} cols {cols} ldo {ldo}: wrote element {i}"
            );
        }
    }
    got
}

/// Row lengths to test for `ty`.
fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_size() {
        1 => vec![1, 40, 256],
        32 => vec![32, 64, 256, 2048],
        _ => vec![256, 2048],
    }
}

/// The bytes of the first `rows` rows of `bytes` (rows of `row` bytes).
fn first(bytes: &[u8], rows: usize, row: usize) -> &[u8] {
    &bytes[..rows * row]
}

#[test]
fn scalar_gemm_is_the_vec_dot_loop() {
    let mut rng = Rng::new(1);
    for ty in WEIGHT_TYPES {
        for k in lengths(ty) {
            let (rows, cols, ldo) = (5, 3, 7);
            let w = raw_weights(ty, rows, k, None, &mut rng);
            let a = activations(ty, cols, k, &mut rng);
            let got = run(SimdLevel::Scalar, ty, k, &w, rows, &a, cols, ldo);
            let (w_row, a_row) = (w.len() / rows, a.len() / cols);
            for c in 0..cols {
                for r in 0..rows {
                    let wr = &w[r * w_row..(r + 1) * w_row];
                    let ac = &a[c * a_row..(c + 1) * a_row];
                    let expected = kiln_quant::vec_dot(ty, k, wr, ac).unwrap();
                    assert_eq!(
                        got[c * rows + r].to_bits(),
                        expected.to_bits(),
                        "{ty} k={k} row {r} col {c}"
                    );
                }
            }
        }
    }
}

/// Checks the GEMM at `level` of every `rows x cols` prefix (1..=9 each) of `w` x `a` (9 rows and
/// 9 columns), and of the whole of `big_w` x `big_a` (37 x 23), against the scalar GEMM.
fn check_against_scalar(
    level: SimdLevel,
    ty: GgmlType,
    k: usize,
    weights: &dyn Fn(usize) -> Vec<u8>,
    rng: &mut Rng,
) {
    let (w, a) = (weights(9), activations(ty, 9, k, rng));
    let (w_row, a_row) = (w.len() / 9, a.len() / 9);
    let expected = run(SimdLevel::Scalar, ty, k, &w, 9, &a, 9, 9);
    let tol = tolerances(ty, k, &w, 9, &a, 9);
    for rows in 1..=9 {
        for cols in 1..=9 {
            let ldo = rows + 1 + (rows + cols) % 3;
            let got = run(
                level,
                ty,
                k,
                first(&w, rows, w_row),
                rows,
                first(&a, cols, a_row),
                cols,
                ldo,
            );
            for c in 0..cols {
                for r in 0..rows {
                    let (g, e, t) = (got[c * rows + r], expected[c * 9 + r], tol[c * 9 + r]);
                    assert!(
                        (g - e).abs() <= t,
                        "{ty} k={k} {rows}x{cols}, row {r} col {c}: {level:?} {g} vs scalar {e} \
                         (tolerance {t})"
                    );
                }
            }
        }
    }
    let (rows, cols) = (37, 23);
    let (w, a) = (weights(rows), activations(ty, cols, k, rng));
    let expected = run(SimdLevel::Scalar, ty, k, &w, rows, &a, cols, rows);
    let got = run(level, ty, k, &w, rows, &a, cols, rows + 5);
    let tol = tolerances(ty, k, &w, rows, &a, cols);
    for i in 0..rows * cols {
        assert!(
            (got[i] - expected[i]).abs() <= tol[i],
            "{ty} k={k} {rows}x{cols}, row {} col {}: {level:?} {} vs scalar {} (tolerance {})",
            i % rows,
            i / rows,
            got[i],
            expected[i],
            tol[i]
        );
    }
}

#[test]
fn avx2_gemm_of_quantized_weights_matches_the_scalar_loop() {
    if !avx2_available("avx2_gemm_of_quantized_weights_matches_the_scalar_loop") {
        return;
    }
    vnni_available("avx2_gemm_of_quantized_weights_matches_the_scalar_loop");
    let mut rng = Rng::new(2);
    for ty in WEIGHT_TYPES {
        for k in lengths(ty) {
            let seed = rng.next_u64();
            let weights = |rows| quantized_weights(ty, rows, k, &mut Rng::new(seed));
            for level in simd_levels() {
                check_against_scalar(level, ty, k, &weights, &mut rng);
            }
        }
    }
}

#[test]
fn avx2_gemm_of_raw_weights_matches_the_scalar_loop() {
    if !avx2_available("avx2_gemm_of_raw_weights_matches_the_scalar_loop") {
        return;
    }
    vnni_available("avx2_gemm_of_raw_weights_matches_the_scalar_loop");
    let mut rng = Rng::new(3);
    for ty in WEIGHT_TYPES {
        for k in lengths(ty) {
            let seed = rng.next_u64();
            let weights = |rows| raw_weights(ty, rows, k, None, &mut Rng::new(seed));
            for level in simd_levels() {
                check_against_scalar(level, ty, k, &weights, &mut rng);
            }
        }
    }
}

#[test]
fn avx2_gemm_handles_extreme_quants() {
    // Weight bytes all 0x00, 0xff, 0x80 or 0x7f put every quant and sub-block scale at an end of
    // its range (Q8_0's -128, every high bit set, Q6_K scales -128 and 127), against activations
    // at +-127: the largest i16 sums the tile kernels form.
    if !avx2_available("avx2_gemm_handles_extreme_quants") {
        return;
    }
    let mut rng = Rng::new(4);
    for ty in TILED {
        let k = 2 * ty.block_size();
        for fill in [0x00u8, 0xff, 0x80, 0x7f] {
            let (rows, cols) = (9, 5);
            let w = raw_weights(ty, rows, k, Some(fill), &mut rng);
            let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
            let row = kiln_quant::activation_bytes(act_ty, k).unwrap();
            let mut a = vec![0u8; cols * row];
            for (c, out) in a.chunks_exact_mut(row).enumerate() {
                // All +127, all -127 (the largest sums of one sign), or mixed.
                let x: Vec<f32> = (0..k)
                    .map(|i| match c % 3 {
                        0 => 1.0,
                        1 => -1.0,
                        _ if (i + c) % 3 == 0 => -1.0,
                        _ => 1.0,
                    })
                    .collect();
                quantize_fn(act_ty, simd_level()).unwrap()(&x, out);
            }
            let expected = run(SimdLevel::Scalar, ty, k, &w, rows, &a, cols, rows);
            let tol = tolerances(ty, k, &w, rows, &a, cols);
            for level in simd_levels() {
                let got = run(level, ty, k, &w, rows, &a, cols, rows);
                for i in 0..rows * cols {
                    assert!(
                        (got[i] - expected[i]).abs() <= tol[i],
                        "{ty} fill {fill:#x} output {i}: {level:?} {} vs scalar {} \
                         (tolerance {})",
                        got[i],
                        expected[i],
                        tol[i]
                    );
                }
            }
        }
    }
}

#[test]
fn avx2_tile_kernels_exist_for_the_listed_types() {
    if !avx2_available("avx2_tile_kernels_exist_for_the_listed_types") {
        return;
    }
    for ty in WEIGHT_TYPES {
        let simd = gemm_fn(ty, SimdLevel::Avx2).unwrap() as usize;
        let scalar = gemm_fn(ty, SimdLevel::Scalar).unwrap() as usize;
        assert_ne!(simd, scalar, "{ty}: the AVX2 GEMM is the scalar loop");
    }
    for ty in [GgmlType::IQ2_XXS, GgmlType::I32, GgmlType::Q8_1] {
        assert!(gemm_fn(ty, SimdLevel::Avx2).is_err(), "{ty}");
        assert!(gemm_fn(ty, SimdLevel::Scalar).is_err(), "{ty}");
    }
}

#[test]
fn gemm_reads_misaligned_slices() {
    let mut levels = vec![SimdLevel::Scalar];
    if avx2_available("gemm_reads_misaligned_slices") {
        levels.push(SimdLevel::Avx2);
    }
    if simd_level() == SimdLevel::Avx512Vnni {
        levels.push(SimdLevel::Avx512Vnni);
    }
    let mut rng = Rng::new(5);
    for &level in &levels {
        for ty in WEIGHT_TYPES {
            let k = ty.block_size().max(32) * 3;
            let (rows, cols) = (9, 5);
            let w = raw_weights(ty, rows, k, None, &mut rng);
            let a = activations(ty, cols, k, &mut rng);
            let aligned = run(level, ty, k, &w, rows, &a, cols, rows);
            for offset in [1, 3] {
                let shift = |bytes: &[u8]| {
                    let mut v = vec![0u8; offset];
                    v.extend_from_slice(bytes);
                    v
                };
                let (ws, as_) = (shift(&w), shift(&a));
                let got = run(
                    level,
                    ty,
                    k,
                    &ws[offset..],
                    rows,
                    &as_[offset..],
                    cols,
                    rows,
                );
                let same = got
                    .iter()
                    .zip(&aligned)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{ty} {level:?} offset {offset}");
            }
        }
    }
}

#[test]
fn gemm_of_nothing_writes_nothing_or_zeros() {
    let mut levels = vec![SimdLevel::Scalar];
    if avx2_available("gemm_of_nothing_writes_nothing_or_zeros") {
        levels.push(SimdLevel::Avx2);
    }
    if simd_level() == SimdLevel::Avx512Vnni {
        levels.push(SimdLevel::Avx512Vnni);
    }
    for &level in &levels {
        for ty in WEIGHT_TYPES {
            let gemm = gemm_fn(ty, level).unwrap();
            let mut out = vec![SENTINEL; 8];
            gemm(0, &[], 3, &[], 2, &mut out, 4);
            let zeros = [0, 1, 2, 4, 5, 6];
            for (i, v) in out.iter().enumerate() {
                let expected = if zeros.contains(&i) { 0.0 } else { SENTINEL };
                assert_eq!(
                    v.to_bits(),
                    expected.to_bits(),
                    "{ty} {level:?} k=0 element {i}"
                );
            }
            let k = ty.block_size();
            let w = raw_weights(ty, 2, k, None, &mut Rng::new(6));
            let mut out = vec![SENTINEL; 4];
            gemm(k, &w, 2, &[], 0, &mut out, 2);
            gemm(k, &[], 0, &[], 0, &mut out, 0);
            assert!(
                out.iter().all(|v| v.to_bits() == SENTINEL.to_bits()),
                "{ty}"
            );
        }
    }
}

/// (k, w, rows, a, cols, out length, ldo)
type Case<'a> = (usize, &'a [u8], usize, &'a [u8], usize, usize, usize);

#[test]
fn wrong_lengths_panic_instead_of_reading_or_writing_out_of_bounds() {
    let mut levels = vec![SimdLevel::Scalar];
    if avx2_available("wrong_lengths_panic_instead_of_reading_or_writing_out_of_bounds") {
        levels.push(SimdLevel::Avx2);
    }
    if simd_level() == SimdLevel::Avx512Vnni {
        levels.push(SimdLevel::Avx512Vnni);
    }
    let mut rng = Rng::new(7);
    for &level in &levels {
        for ty in WEIGHT_TYPES {
            let gemm = gemm_fn(ty, level).unwrap();
            let k = 2 * ty.block_size().max(16);
            let (rows, cols) = (3, 2);
            let w = raw_weights(ty, rows, k, None, &mut rng);
            let a = activations(ty, cols, k, &mut rng);
            let out_len = (cols - 1) * 4 + rows;
            let cases: [Case; 8] = [
                (k, &w[..w.len() - 1], rows, &a, cols, out_len, 4),
                (k, &w, rows, &a[..a.len() - 1], cols, out_len, 4),
                (k, &w, rows + 1, &a, cols, out_len, 4),
                (k, &w, rows, &a, cols + 1, out_len, 4),
                (k + ty.block_size(), &w, rows, &a, cols, out_len, 4),
                (usize::MAX - 7, &w, rows, &a, cols, out_len, 4),
                (k, &w, rows, &a, cols, out_len - 1, 4),
                (k, &w, rows, &a, cols, out_len, rows - 1),
            ];
            for (i, (k, w, rows, a, cols, len, ldo)) in cases.into_iter().enumerate() {
                let mut out = vec![0f32; len];
                let result = catch_unwind(AssertUnwindSafe(|| {
                    gemm(k, w, rows, a, cols, &mut out, ldo)
                }));
                assert!(result.is_err(), "{ty} {level:?} case {i} did not panic");
            }
        }
    }
}

#[test]
fn gemm_gives_the_same_results_on_every_thread() {
    // The tile kernels keep a per-thread scratch: results must not depend on which thread (and
    // which earlier call) sized it.
    if !avx2_available("gemm_gives_the_same_results_on_every_thread") {
        return;
    }
    let mut rng = Rng::new(8);
    for ty in TILED {
        let k = 512;
        let (rows, cols) = (19, 7);
        let w = raw_weights(ty, rows, k, None, &mut rng);
        let a = activations(ty, cols, k, &mut rng);
        for level in simd_levels() {
            let here = run(level, ty, k, &w, rows, &a, cols, rows);
            let there = std::thread::scope(|s| {
                s.spawn(|| {
                    // A larger call first, so that the scratch holds stale data of another shape.
                    let big = raw_weights(ty, 40, 2 * k, None, &mut Rng::new(9));
                    let big_a = activations(ty, 11, 2 * k, &mut Rng::new(10));
                    run(level, ty, 2 * k, &big, 40, &big_a, 11, 40);
                    run(level, ty, k, &w, rows, &a, cols, rows)
                })
                .join()
                .unwrap()
            });
            let same = here
                .iter()
                .zip(&there)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{ty} {level:?}");
        }
    }
}

/// The SIMD levels above scalar that this CPU runs: AVX2, and AVX-512 VNNI where it has it.
fn simd_levels() -> Vec<SimdLevel> {
    let mut levels = vec![SimdLevel::Avx2];
    if simd_level() == SimdLevel::Avx512Vnni {
        levels.push(SimdLevel::Avx512Vnni);
    }
    levels
}

#[test]
fn vnni_tile_kernels_are_bit_identical_to_the_avx2_ones() {
    // The VNNI kernels form the same exact integer sums as the AVX2 ones and share their f32
    // steps, so every output must have the same bits: on quantized weights, raw bytes and the
    // extreme fills, for every tile shape and remainder (rows 1..=18 cover one and two panels
    // and a partial panel; cols 1..=9 the 4-row tiles and their 3, 2 and 1-row ends).
    if !vnni_available("vnni_tile_kernels_are_bit_identical_to_the_avx2_ones") {
        return;
    }
    let mut rng = Rng::new(11);
    for ty in TILED {
        let avx2 = gemm_fn_invariant(ty, SimdLevel::Avx2).unwrap();
        let vnni = gemm_fn_invariant(ty, SimdLevel::Avx512Vnni).unwrap();
        assert_ne!(avx2 as usize, vnni as usize, "{ty}: no VNNI kernel");
        // The plain VNNI GEMM too wherever it runs a bit-identical VNNI kernel: the tiles (one
        // row, or more than 8, for the 32-element formats) and the k-quants' narrow kernels
        // (from the tile crossover, 3 rows, Q6_K 4, to 8). The 32-element formats' narrow
        // kernels (2 to 8 rows) add the blocks' f32 terms in another order (even and odd blocks
        // apart): they are held to the scalar loop by the tolerance tests above instead.
        let plain = gemm_fn(ty, SimdLevel::Avx512Vnni).unwrap();
        let plain_runs_exact = |cols: usize| match ty {
            GgmlType::Q6_K => cols >= 4,
            GgmlType::Q4_K | GgmlType::Q5_K => cols >= 3,
            _ => !(2..=8).contains(&cols),
        };
        for k in lengths(ty) {
            let sets: Vec<Vec<u8>> = vec![
                quantized_weights(ty, 18, k, &mut rng),
                raw_weights(ty, 18, k, None, &mut rng),
                raw_weights(ty, 18, k, Some(0xff), &mut rng),
                raw_weights(ty, 18, k, Some(0x80), &mut rng),
            ];
            let a = activations(ty, 9, k, &mut rng);
            let a_row = a.len() / 9;
            for w in &sets {
                let w_row = w.len() / 18;
                for rows in 1..=18 {
                    for cols in 1..=9 {
                        let w = first(w, rows, w_row);
                        let a = first(&a, cols, a_row);
                        let mut x = vec![SENTINEL; rows * cols];
                        let mut y = vec![SENTINEL; rows * cols];
                        avx2(k, w, rows, a, cols, &mut x, rows);
                        vnni(k, w, rows, a, cols, &mut y, rows);
                        let mut z = x.clone();
                        if plain_runs_exact(cols) {
                            plain(k, w, rows, a, cols, &mut z, rows);
                        }
                        for i in 0..rows * cols {
                            assert!(
                                x[i].to_bits() == y[i].to_bits()
                                    && x[i].to_bits() == z[i].to_bits(),
                                "{ty} k={k} {rows}x{cols} output {i}: avx2 {} vs vnni {} \
                                 (invariant), {} (plain)",
                                x[i],
                                y[i],
                                z[i]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn one_row_exact_products_are_bit_identical_to_the_invariant_tiles() {
    // `rows_exact_fn` (batch-invariant decode) reads the weight rows where they lie and must
    // give every output the bits of the invariant tile GEMM, whatever the number of activation
    // rows beside it (1 and 5 here): the 8 tile formats, every partial panel (rows 1..=18),
    // block counts that leave a partial group of 8 (blocks32) and several super-blocks, and
    // rows long enough that the tiles take their blocks in several passes with a shorter last
    // one (45 blocks of 32, 5 super-blocks: past `SLICE_BYTES` of panels), on quantized
    // weights, raw bytes and the extreme fills.
    if !avx2_available("one_row_exact_products_are_bit_identical_to_the_invariant_tiles") {
        return;
    }
    let mut rng = Rng::new(13);
    for ty in WEIGHT_TYPES {
        assert_eq!(
            rows_exact_fn(ty, SimdLevel::Avx2).is_some(),
            TILED.contains(&ty),
            "{ty}: a tile format has a one-row exact product, and only those"
        );
    }
    for level in simd_levels() {
        for ty in TILED {
            let exact = rows_exact_fn(ty, level).unwrap();
            let tiles = gemm_fn_invariant(ty, level).unwrap();
            let extra = if ty.block_size() == 32 {
                [11 * 32, 45 * 32]
            } else {
                [3 * 256, 5 * 256]
            };
            for k in lengths(ty).into_iter().chain(extra) {
                let sets: Vec<Vec<u8>> = vec![
                    quantized_weights(ty, 18, k, &mut rng),
                    raw_weights(ty, 18, k, None, &mut rng),
                    raw_weights(ty, 18, k, Some(0xff), &mut rng),
                    raw_weights(ty, 18, k, Some(0x80), &mut rng),
                ];
                let a = activations(ty, 5, k, &mut rng);
                let a_row = a.len() / 5;
                for w in &sets {
                    let w_row = w.len() / 18;
                    for rows in 1..=18 {
                        let w = first(w, rows, w_row);
                        // One sentinel past the outputs: it must survive.
                        let mut got = vec![SENTINEL; rows + 1];
                        exact(k, w, rows, first(&a, 1, a_row), &mut got[..rows]);
                        assert_eq!(got[rows].to_bits(), SENTINEL.to_bits(), "{ty} k={k}");
                        for cols in [1, 5] {
                            let mut want = vec![SENTINEL; rows * cols];
                            tiles(k, w, rows, first(&a, cols, a_row), cols, &mut want, rows);
                            for r in 0..rows {
                                assert_eq!(
                                    got[r].to_bits(),
                                    want[r].to_bits(),
                                    "{ty} {level:?} k={k} {rows} rows, row {r} ({cols} \
                                     activation rows): exact {} vs tiles {}",
                                    got[r],
                                    want[r]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn vnni_one_row_products_match_the_scalar_loop() {
    // `gemv_fn`: none at the scalar level; at the AVX2 level, the tile-exact product (held to
    // the tiles' bits by `one_row_exact_products_are_bit_identical_to_the_invariant_tiles`);
    // at the VNNI level, its own kernel for the formats it names (checked here).
    for ty in WEIGHT_TYPES {
        assert!(gemv_fn(ty, SimdLevel::Scalar).is_none(), "{ty}");
        assert_eq!(
            gemv_fn(ty, SimdLevel::Avx2).map(|f| f as usize),
            rows_exact_fn(ty, SimdLevel::Avx2).map(|f| f as usize),
            "{ty}"
        );
    }
    if !vnni_available("vnni_one_row_products_match_the_scalar_loop") {
        return;
    }
    let mut rng = Rng::new(12);
    for ty in WEIGHT_TYPES {
        let listed = matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0);
        let Some(gemv) = gemv_fn(ty, SimdLevel::Avx512Vnni) else {
            assert!(!listed, "{ty}: no VNNI one-row product");
            continue;
        };
        assert!(listed, "{ty}: an unexpected one-row product");
        // 70 blocks: longer than the 64 blocks the kernel prepares at once; 7: two blocks past
        // a group of four, and an odd one (the kernel takes blocks in pairs, pairs in twos).
        for k in lengths(ty).into_iter().chain([7 * 32, 70 * 32]) {
            let rows = 37;
            let sets = weight_sets(ty, rows, k, &[0xff, 0x80, 0x00], &mut rng);
            for w in &sets {
                let a = activations(ty, 1, k, &mut rng);
                let expected = run(SimdLevel::Scalar, ty, k, w, rows, &a, 1, rows);
                let tol = tolerances(ty, k, w, rows, &a, 1);
                let w_row = w.len() / rows;
                for n in [1, 2, 5, 8, 9, rows] {
                    // One sentinel past the outputs: it must survive.
                    let mut out = vec![SENTINEL; n + 1];
                    gemv(k, first(w, n, w_row), n, &a, &mut out[..n]);
                    assert_eq!(out[n].to_bits(), SENTINEL.to_bits(), "{ty} k={k}");
                    for r in 0..n {
                        assert!(
                            (out[r] - expected[r]).abs() <= tol[r],
                            "{ty} k={k} {n} rows, row {r}: vnni {} vs scalar {} (tolerance {})",
                            out[r],
                            expected[r],
                            tol[r]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn strided_gemms_write_what_the_gemm_writes_into_a_shared_output() {
    // Two "tasks" write the two halves of a weight block's columns into one output of stride
    // `ldo`: every value must be the plain GEMM's bits, every other element untouched; a shape
    // the strided kernel does not take writes nothing and says so.
    for ty in WEIGHT_TYPES {
        assert!(strided_gemm_fn(ty, SimdLevel::Avx2).is_none(), "{ty}");
    }
    if !vnni_available("strided_gemms_write_what_the_gemm_writes_into_a_shared_output") {
        return;
    }
    let mut rng = Rng::new(13);
    for ty in TILED {
        let strided = strided_gemm_fn(ty, SimdLevel::Avx512Vnni).expect("a strided kernel");
        let plain = gemm_fn(ty, SimdLevel::Avx512Vnni).unwrap();
        let k = 2 * ty.block_size();
        let rows = 13;
        let w = raw_weights(ty, rows, k, None, &mut rng);
        let w_row = w.len() / rows;
        for cols in 1..=9 {
            let a = activations(ty, cols, k, &mut rng);
            let ldo = rows + 3;
            let mut want = vec![SENTINEL; cols * ldo];
            plain(k, &w, rows, &a, cols, &mut want, ldo);
            let mut got = vec![SENTINEL; cols * ldo];
            let split = 6;
            let (first, second) = (&w[..split * w_row], &w[split * w_row..]);
            // The two halves share a panel key, as one product's tasks do: the second reuses
            // the activations the first packed (a fresh key per activation matrix, so a stale
            // panel of the previous `cols` would show as wrong values).
            let panel = panel_key();
            // SAFETY: each call writes only its own rows' columns of `got`, all inside it; both
            // pass this matrix's fresh key with the same `k`, `a` and `cols`.
            let taken = unsafe {
                [
                    strided(panel, k, first, split, &a, cols, got.as_mut_ptr(), ldo),
                    strided(
                        panel,
                        k,
                        second,
                        rows - split,
                        &a,
                        cols,
                        got.as_mut_ptr().add(split),
                        ldo,
                    ),
                ]
            };
            assert_eq!(taken[0], taken[1], "{ty} cols {cols}");
            if !taken[0] {
                assert!(
                    cols == 1 || cols == 9 || ty.block_size() == 256,
                    "{ty} cols {cols}"
                );
                assert!(
                    got.iter().all(|v| v.to_bits() == SENTINEL.to_bits()),
                    "{ty} cols {cols}"
                );
                continue;
            }
            assert!((2..=8).contains(&cols), "{ty} cols {cols}: taken");
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{ty} cols {cols} element {i}: {g} vs {e}"
                );
            }
        }
    }
}

/// The formats with an interleaved layout.
const INTERLEAVED: [GgmlType; 4] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Row lengths to try for an interleaved format: odd block counts (a lone last block, or lines
/// off a 64-byte boundary) and Gemma 3 270M's widths where the format allows them.
fn interleaved_widths(ty: GgmlType) -> &'static [usize] {
    if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
        &[256, 3 * 256, 1024, 2048]
    } else {
        &[32, 7 * 32, 640, 21 * 32, 2048]
    }
}

/// Weights of `rows` rows of `k` for a product test: quantized from floats, random bytes, then
/// every byte `fill` for each of `fills` (the edges of the quant and scale fields), in that order.
fn weight_sets(ty: GgmlType, rows: usize, k: usize, fills: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut sets = vec![
        quantized_weights(ty, rows, k, rng),
        raw_weights(ty, rows, k, None, rng),
    ];
    sets.extend(
        fills
            .iter()
            .map(|&f| raw_weights(ty, rows, k, Some(f), rng)),
    );
    sets
}

/// The activation format of `ty`'s products.
fn act_type(ty: GgmlType) -> GgmlType {
    kiln_quant::vec_dot_type(ty).unwrap()
}

#[test]
fn interleaved_rows_round_trip() {
    for ty in WEIGHT_TYPES {
        assert_eq!(
            has_interleaved_layout(ty),
            INTERLEAVED.contains(&ty),
            "{ty}"
        );
    }
    let mut rng = Rng::new(21);
    // The layouts of the AVX2 and the VNNI products (the same but for Q5_0's masks; on a host
    // without VNNI both levels give the AVX2 form: the kernels module tests both forms).
    let levels = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni];
    for ty in INTERLEAVED {
        for &k in interleaved_widths(ty) {
            let rows = 2 * INTERLEAVE_ROWS;
            let w = raw_weights(ty, rows, k, None, &mut rng);
            for level in levels {
                let mut il = vec![0u8; w.len()];
                interleave(ty, level, k, &w, &mut il);
                assert_ne!(il, w, "{ty} k={k}: the layout moved nothing");
                let row = w.len() / rows;
                let mut back = vec![0u8; row];
                for r in 0..rows {
                    interleaved_row(ty, level, k, &il, r, &mut back);
                    assert_eq!(
                        back,
                        w[r * row..(r + 1) * row],
                        "{ty} {level:?} k={k} row {r}"
                    );
                }
            }
        }
        // Not whole groups, or a row outside the matrix: a panic, not a wrong read.
        let k = interleaved_widths(ty)[0];
        let row = ty.row_bytes(k as u64).unwrap() as usize;
        let w = vec![0u8; 15 * row];
        let level = SimdLevel::Avx2;
        let caught = catch_unwind(|| interleave(ty, level, k, &w, &mut vec![0u8; w.len()]));
        assert!(caught.is_err());
        let il = vec![0u8; 16 * row];
        let caught = catch_unwind(|| interleaved_row(ty, level, k, &il, 16, &mut vec![0u8; row]));
        assert!(caught.is_err());
        let caught =
            catch_unwind(|| interleaved_row(ty, level, k, &il, 3, &mut vec![0u8; row + 1]));
        assert!(caught.is_err());
    }
    let caught = catch_unwind(|| interleave(GgmlType::Q5_K, SimdLevel::Avx2, 256, &[], &mut []));
    assert!(caught.is_err(), "Q5_K has no interleaved layout");
}

/// The formats with an AVX2 product over their interleaved layout.
const INTERLEAVED_AVX2: [GgmlType; 2] = [GgmlType::Q4_K, GgmlType::Q5_0];

#[test]
fn avx2_interleaved_products_are_the_tile_kernels_bits() {
    // None at the scalar level; at AVX2 only where the layout's product beats the file's.
    for ty in WEIGHT_TYPES {
        assert!(interleaved_gemm_fn(ty, SimdLevel::Scalar).is_none());
        let avx2 = interleaved_gemm_fn(ty, SimdLevel::Avx2);
        if avx2_available("avx2_interleaved_products_are_the_tile_kernels_bits") {
            assert_eq!(avx2.is_some(), INTERLEAVED_AVX2.contains(&ty), "{ty}");
        }
    }
    if !avx2_available("avx2_interleaved_products_are_the_tile_kernels_bits") {
        return;
    }
    let mut rng = Rng::new(23);
    for ty in INTERLEAVED_AVX2 {
        let gemm = interleaved_gemm_fn(ty, SimdLevel::Avx2).unwrap();
        let tile = gemm_fn_invariant(ty, SimdLevel::Avx2).unwrap();
        for &k in interleaved_widths(ty) {
            let rows = 3 * INTERLEAVE_ROWS;
            let sets = weight_sets(ty, rows, k, &[0xff, 0x80, 0x00], &mut rng);
            for w in &sets {
                let mut il = vec![0u8; w.len()];
                interleave(ty, SimdLevel::Avx2, k, w, &mut il);
                // The direct kernel (1, 2 rows), the packed tiles (3 up), and past the tiles'
                // pass of 128 activation rows.
                for cols in [1, 2, 3, 5, 130] {
                    let a = activations(ty, cols, k, &mut rng);
                    let ldo = rows + 3;
                    let expected = {
                        let mut out = vec![SENTINEL; cols * ldo + ldo];
                        tile(k, w, rows, &a, cols, &mut out, ldo);
                        out
                    };
                    let mut out = vec![SENTINEL; cols * ldo + ldo];
                    let terms = activation_terms(act_type(ty), &a, cols);
                    // SAFETY: `out` holds `cols` rows of stride `ldo >= rows`, used by nothing
                    // else.
                    unsafe { gemm(k, &il, rows, &a, &terms, cols, out.as_mut_ptr(), ldo) };
                    for (i, (v, e)) in out.iter().zip(&expected).enumerate() {
                        assert_eq!(
                            v.to_bits(),
                            e.to_bits(),
                            "{ty} k={k} cols {cols}: element {i} (row {}, col {}): interleaved \
                             {v} vs tile {e}",
                            i % ldo,
                            i / ldo
                        );
                    }
                }
            }
        }
    }
}

/// The AMX products (16 activation rows at a time, from 32 rows, where the operating system
/// grants the tiles) give every output the bits of the same row alone (the VNNI kernel), over
/// quantized and raw weights (every byte 0xff, 0x80, ...), with rows left over for the VNNI
/// kernel after the tiles, and past one slice of tiles (`AMX_SLICE`, 16 tiles).
#[test]
fn amx_products_have_the_vnni_bits() {
    if !vnni_available("amx_products_have_the_vnni_bits") {
        return;
    }
    if !amx_granted() {
        println!("amx_products_have_the_vnni_bits: no AMX here (CPU, KILN_AMX or the OS)");
    }
    let mut rng = Rng::new(31);
    for ty in WEIGHT_TYPES {
        let Some(gemm) = interleaved_gemm_fn(ty, SimdLevel::Avx512Vnni) else {
            continue;
        };
        for &k in interleaved_widths(ty) {
            let rows = 2 * INTERLEAVE_ROWS;
            let sets = weight_sets(ty, rows, k, &[0xff, 0x80, 0x7f], &mut rng);
            for w in &sets {
                let mut il = vec![0u8; w.len()];
                interleave(ty, SimdLevel::Avx512Vnni, k, w, &mut il);
                for cols in [32, 37, 55, 277] {
                    let a = activations(ty, cols, k, &mut rng);
                    let per = a.len() / cols;
                    let ldo = rows + 3;
                    let mut out = vec![SENTINEL; cols * ldo + ldo];
                    let terms = activation_terms(act_type(ty), &a, cols);
                    // SAFETY: `out` holds `cols` rows of stride `ldo >= rows`, used by nothing
                    // else.
                    unsafe { gemm(k, &il, rows, &a, &terms, cols, out.as_mut_ptr(), ldo) };
                    for c in 0..cols {
                        let one = &a[c * per..(c + 1) * per];
                        let mut single = vec![0f32; rows];
                        let t = activation_terms(act_type(ty), one, 1);
                        // SAFETY: `single` holds the `rows` outputs.
                        unsafe { gemm(k, &il, rows, one, &t, 1, single.as_mut_ptr(), rows) };
                        for r in 0..rows {
                            let v = out[c * ldo + r];
                            assert_eq!(
                                v.to_bits(),
                                single[r].to_bits(),
                                "{ty} k={k} cols {cols} row {r} col {c}: {v} vs alone {}",
                                single[r]
                            );
                        }
                        for r in rows..ldo {
                            assert_eq!(out[c * ldo + r].to_bits(), SENTINEL.to_bits());
                        }
                    }
                }
            }
        }
    }
}

/// The Q6_K product that makes its codes with GFNI gives the bits of the one with shifts and
/// masks, at every number of activation rows (one, a chunk of 8 and past it, and the 32 and more
/// that AMX tiles take where granted), on weights whose codes use every bit pattern.
#[test]
fn q6_k_products_through_gfni_give_the_bits_of_the_shifts() {
    if !vnni_available("q6_k_products_through_gfni_give_the_bits_of_the_shifts") {
        return;
    }
    if !std::arch::is_x86_feature_detected!("gfni") {
        println!("q6_k_products_through_gfni_give_the_bits_of_the_shifts: skipped, no GFNI");
        return;
    }
    let ty = GgmlType::Q6_K;
    let level = SimdLevel::Avx512Vnni;
    let with = interleaved_gemm_fn_gfni(ty, level, true).unwrap();
    let without = interleaved_gemm_fn_gfni(ty, level, false).unwrap();
    let mut rng = Rng::new(61);
    for &k in interleaved_widths(ty) {
        let rows = 2 * INTERLEAVE_ROWS;
        for w in &weight_sets(ty, rows, k, &[0xff, 0x80, 0x7f, 0x00], &mut rng) {
            let mut il = vec![0u8; w.len()];
            interleave(ty, level, k, w, &mut il);
            for cols in [1, 3, 8, 9, 33] {
                let a = activations(ty, cols, k, &mut rng);
                let terms = activation_terms(act_type(ty), &a, cols);
                let run = |gemm: kiln_cpu::kernels::InterleavedGemmFn| {
                    let mut out = vec![0f32; cols * rows];
                    // SAFETY: `out` holds `cols` rows of `rows` outputs; `il` whole groups.
                    unsafe { gemm(k, &il, rows, &a, &terms, cols, out.as_mut_ptr(), rows) };
                    out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                };
                assert_eq!(run(with), run(without), "k={k} cols {cols}");
            }
        }
    }
}

#[test]
fn interleaved_products_match_the_scalar_loop() {
    if !vnni_available("interleaved_products_match_the_scalar_loop") {
        return;
    }
    let mut rng = Rng::new(22);
    for ty in WEIGHT_TYPES {
        let Some(gemm) = interleaved_gemm_fn(ty, SimdLevel::Avx512Vnni) else {
            assert!(!INTERLEAVED.contains(&ty), "{ty}: no interleaved product");
            continue;
        };
        for &k in interleaved_widths(ty) {
            let rows = 3 * INTERLEAVE_ROWS;
            let sets = weight_sets(ty, rows, k, &[0xff, 0x80, 0x7f, 0x00], &mut rng);
            for w in &sets {
                let mut il = vec![0u8; w.len()];
                interleave(ty, SimdLevel::Avx512Vnni, k, w, &mut il);
                // 1 (decode), 2..8 (batched decode), and past a chunk of 8 activation rows.
                for cols in [1, 2, 5, 8, 9, 19] {
                    let a = activations(ty, cols, k, &mut rng);
                    let expected = run(SimdLevel::Scalar, ty, k, w, rows, &a, cols, rows);
                    let tol = tolerances(ty, k, w, rows, &a, cols);
                    let ldo = rows + 3;
                    let mut out = vec![SENTINEL; cols * ldo + ldo];
                    // SAFETY: `out` holds `cols` rows of stride `ldo >= rows`, used by nothing
                    // else.
                    let terms = activation_terms(act_type(ty), &a, cols);
                    unsafe { gemm(k, &il, rows, &a, &terms, cols, out.as_mut_ptr(), ldo) };
                    for (i, &v) in out.iter().enumerate() {
                        let (c, r) = (i / ldo, i % ldo);
                        if c < cols && r < rows {
                            let e = expected[c * rows + r];
                            let t = tol[c * rows + r];
                            assert!(
                                (v - e).abs() <= t,
                                "{ty} k={k} cols {cols} row {r} col {c}: interleaved {v} vs \
                                 scalar {e} (tolerance {t})"
                            );
                            // Batch-invariant: the same bits as the row alone.
                            if cols == 9 && c == 8 {
                                let one = &a[c * a.len() / cols..(c + 1) * a.len() / cols];
                                let mut single = vec![0f32; rows];
                                // SAFETY: `single` holds the `rows` outputs.
                                let t = activation_terms(act_type(ty), one, 1);
                                unsafe {
                                    gemm(k, &il, rows, one, &t, 1, single.as_mut_ptr(), rows)
                                };
                                assert_eq!(v.to_bits(), single[r].to_bits(), "{ty} k={k} row {r}");
                            }
                        } else {
                            assert_eq!(
                                v.to_bits(),
                                SENTINEL.to_bits(),
                                "{ty} k={k} cols {cols}: wrote {i}"
                            );
                        }
                    }
                }
            }
        }
        // Rows that are not whole groups: a panic before anything is read or written.
        let k = interleaved_widths(ty)[0];
        let row = ty.row_bytes(k as u64).unwrap() as usize;
        let w = vec![0u8; 8 * row];
        let act = act_type(ty);
        let a = vec![0u8; kiln_quant::activation_bytes(act, k).unwrap()];
        let mut out = vec![0f32; 8];
        let terms = activation_terms(act, &a, 1);
        let caught = catch_unwind(AssertUnwindSafe(|| unsafe {
            gemm(k, &w, 8, &a, &terms, 1, out.as_mut_ptr(), 8)
        }));
        assert!(caught.is_err(), "{ty}");
        // Terms of other activations than the call's: a panic too.
        let w = vec![0u8; 16 * row];
        let mut out = vec![0f32; 16];
        let caught = catch_unwind(AssertUnwindSafe(|| unsafe {
            gemm(
                k,
                &w,
                16,
                &a,
                &activation_terms(act, &[], 1),
                1,
                out.as_mut_ptr(),
                16,
            )
        }));
        assert!(caught.is_err(), "{ty}");
    }
}
