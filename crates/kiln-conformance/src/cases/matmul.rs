//! Weights: `embedding` of every type, `matmul` of every type (GPTQ included) at odd shapes,
//! `matmul_many` and `matmul_activation` against their unfused definitions.
//!
//! Quantized products are compared with the product of the *dequantized* weights and the
//! activations as the backend saw them. A backend may quantize its activations into the weight
//! type's dot format as ggml does (`vec_dot_type`: Q8_0, Q8_1 or Q8_K, by ggml's reference
//! quantizer; the CPU backend does, with SIMD quantizers that give the same bytes) or use them
//! in f32: the result must be within the rounding bound of one of those two exact products
//! ([`candidates`]), and the same one for every product of a given number of input rows (a
//! backend quantizes an input once, whatever the weight; [`check::Joint`]). The bounds are
//! γ_{k/16+8} (quantized activations) or γ_{k+8} (f32) of the terms' magnitude, while
//! quantizing the activations moves each output by about `√k · |w| · d_a / 4` (`d_a` ≈ 1/127
//! of a block's largest activation): over a few dozen outputs one way cannot pass for the other,
//! and an error of 1e-3 in one output is beyond the bound of the way that holds.

use std::sync::Arc;

use half::f16;
use kiln_backend::{Activation, Backend, BackendError, Linear};
use kiln_core::GgmlType;

use super::elementwise::ACTIVATIONS;
use crate::check;
use crate::data::{
    dequantize, encode, gptq, gptq_linear, host, linear, q8_0_by_hand, quantized_activations,
    tensor, upload, values,
};
use crate::reference::{self, Expected};
use crate::tolerance::{self, is_float};
use crate::{Claims, Target, ALL_WEIGHT_TYPES};

/// The exact products a backend may have computed `x · Wᵀ (+ b)` as, for weights of `ty`
/// (`w_bytes` as uploaded, `w` the values they hold), each with its rounding bound: float types
/// on f32 activations; block types on activations quantized to `vec_dot_type(ty)`, or in f32;
/// and, where the backend claims them, on f16 operands ([`Claims::half_products`]) or on
/// activations quantized to int8 in blocks of 32 ([`Claims::int8_activations`]).
pub fn candidates(
    ty: GgmlType,
    x: &[f32],
    (m, k, n): (usize, usize, usize),
    (w_bytes, w): (&[u8], &[f32]),
    bias: Option<&[f32]>,
    claims: &Claims,
) -> Vec<(String, Expected)> {
    let dims = (m, k, n);
    let mut out = if claims.half_products && ty != GgmlType::F32 && ty != GgmlType::BF16 {
        let mag = (!is_float(ty)).then(|| reference::quant_magnitude(ty, w_bytes, w));
        let (xh, wh) = (half_rows(x, k), half_values(w));
        let e = reference::product_expected(
            &xh,
            dims,
            &wh,
            bias,
            mag.as_deref(),
            tolerance::half_product(k),
        );
        vec![("f16 operands".into(), e)]
    } else {
        Vec::new()
    };
    if is_float(ty) {
        let e = reference::product_expected(x, dims, w, bias, None, tolerance::float_product(k));
        out.push(("f32 activations".into(), e));
        if claims.split_products && ty == GgmlType::F32 {
            let e =
                reference::product_expected(x, dims, w, bias, None, tolerance::split_product(k));
            out.push(("split BF16 products".into(), e));
        }
        return out;
    }
    let mag = reference::quant_magnitude(ty, w_bytes, w);
    if claims.int8_activations {
        out.push((
            "int8 activations in blocks of 32".into(),
            int8_product(x, dims, w, &mag, bias),
        ));
    }
    let act_ty = kiln_quant::vec_dot_type(ty).unwrap();
    let (a_bytes, a) = quantized_activations(act_ty, x, k);
    let mut quantized = reference::product_expected(
        &a,
        dims,
        w,
        bias,
        Some(&mag),
        tolerance::quantized_product(k),
    );
    if act_ty == GgmlType::Q8_1 {
        // The `_1` formats' minimum meets the f16 block sum `s` of Q8_1 (see
        // `tolerance::Q8_1_SUM`): both `m` and `s` sit at bytes 2..4 of their blocks.
        let f16_at = |b: &[u8], at: usize| f16::from_le_bytes([b[at + 2], b[at + 3]]).to_f64();
        let (w_row, a_row) = (
            ty.row_bytes(k as u64).unwrap() as usize,
            GgmlType::Q8_1.row_bytes(k as u64).unwrap() as usize,
        );
        let blocks = k / 32;
        for t in 0..m {
            for o in 0..n {
                let extra: f64 = (0..blocks)
                    .map(|blk| {
                        let mw = f16_at(w_bytes, o * w_row + blk * ty.type_size());
                        let sa = f16_at(&a_bytes, t * a_row + blk * GgmlType::Q8_1.type_size());
                        (mw * sa).abs()
                    })
                    .sum();
                quantized.tol[t * n + o] += tolerance::Q8_1_SUM * extra;
            }
        }
    }
    let plain = reference::product_expected(
        x,
        dims,
        w,
        bias,
        Some(&mag),
        tolerance::quantized_product_f32_activations(k),
    );
    out.push((format!("{act_ty} activations"), quantized));
    out.push(("f32 activations".into(), plain));
    out
}

/// `x · Wᵀ (+ b)` as a backend that quantizes each block of 32 activations to int8 codes with
/// one scale `d ≈ max|x| / 127` computes it, whatever its rounding: each activation moves by at
/// most `d/2` (the bound allows `d` a part in a thousand more), the integer sums are exact, and
/// the per-chunk scale products and the sum over chunks of 16 round as
/// [`tolerance::quantized_product`] allows, on terms of at most `|w|·(|x| + d)`.
fn int8_product(
    x: &[f32],
    (m, k, n): (usize, usize, usize),
    w: &[f32],
    mag: &[f32],
    bias: Option<&[f32]>,
) -> Expected {
    let mut e = reference::product_expected(x, (m, k, n), w, bias, Some(mag), 0.0);
    for t in 0..m {
        let row = &x[t * k..(t + 1) * k];
        let d: Vec<f64> = row
            .chunks(32)
            .map(|b| b.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64)) / 127.0)
            .collect();
        for o in 0..n {
            let wr = &mag[o * k..(o + 1) * k];
            let (mut moved, mut terms) = (0.0f64, 0.0f64);
            for (i, (&wv, &xv)) in wr.iter().zip(row).enumerate() {
                let di = d[i / 32];
                moved += wv.abs() as f64 * di * 0.5 * 1.001;
                terms += wv.abs() as f64 * (xv.abs() as f64 + di);
            }
            e.tol[t * n + o] = moved + tolerance::quantized_product(k) * terms + f64::MIN_POSITIVE;
        }
    }
    e
}

/// Values rounded to f16 (to nearest, ties to even).
fn half_values(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}

/// Rows of `k` activations as a kernel on f16 operands sees them: each row scaled by `2^-e`,
/// `e = max(0, E − 14)` with `E` the binary exponent of the row's largest |x| (so that the row
/// stays below 2^15), rounded to f16 and scaled back (both scalings exact).
fn half_rows(x: &[f32], k: usize) -> Vec<f32> {
    x.chunks(k.max(1))
        .flat_map(|row| {
            let max = row.iter().map(|v| v.abs().to_bits()).max().unwrap_or(0);
            let e = (((max >> 23) & 0xff) as i32 - 127 - 14).max(0);
            let s = 2f32.powi(e);
            row.iter()
                .map(move |&v| f16::from_f32(v / s).to_f32() * s)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `matmul` of `lin` on `x` (`m` rows), and the [`candidates`] it must match.
fn run_matmul<B: Backend>(
    b: &B,
    lin: &Linear<B>,
    x: &[f32],
    m: usize,
    (w_bytes, w): (&[u8], &[f32]),
    bias: Option<&[f32]>,
    claims: &Claims,
) -> (Vec<f32>, Vec<(String, Expected)>) {
    let (k, n) = (lin.in_features, lin.out_features);
    let y = b.matmul(&tensor(b, x, m, k), lin).unwrap();
    assert_eq!(b.shape(&y), (m, n), "{}: matmul shape", b.name());
    (
        host(b, &y),
        candidates(lin.ty, x, (m, k, n), (w_bytes, w), bias, claims),
    )
}

/// [`run_matmul`] of the rows in `x`, checked.
fn check_matmul<B: Backend>(
    b: &B,
    what: &str,
    lin: &Linear<B>,
    x: &[f32],
    weights: (&[u8], &[f32]),
    bias: Option<&[f32]>,
    claims: &Claims,
) {
    let m = x.len() / lin.in_features.max(1);
    let (y, c) = run_matmul(b, lin, x, m, weights, bias, claims);
    check::close_any(what, &y, &c, lin.out_features);
}

/// Float weights at every edge of a blocked GEMM: `k` of 1, 7, 255 to 257 and 1000, `n` of 1
/// and 15 to 17 and 100, every `m` from 1 to 13 and 64 and 257, with and without a bias; and an
/// encoder-sized layer.
fn matmul_float<B: Backend>(t: &Target<B>, ty: GgmlType) {
    if !t.computes(ty, "matmul") {
        return;
    }
    let b = t.backend();
    for k in [1, 7, 255, 256, 257, 1000] {
        for n in [1, 15, 16, 17, 100] {
            let (bytes, w) = encode(ty, &values(n * k, (n * 31 + k) as u64));
            let bias = values(n, 7);
            let lin = linear(&b, ty, (n, k), bytes.clone(), Some(&bias));
            let plain = linear(&b, ty, (n, k), bytes.clone(), None);
            for m in (1..=13).chain([64, 257]) {
                let x = values(m * k, (m * 7 + k) as u64);
                let what = format!("{}: {ty} matmul [{m}, {k}] x [{n}, {k}]ᵀ + b", b.name());
                check_matmul(&b, &what, &lin, &x, (&bytes, &w), Some(&bias), &t.claims);
                if m == 13 {
                    let what = format!("{}: {ty} matmul [{m}, {k}] x [{n}, {k}]ᵀ", b.name());
                    check_matmul(&b, &what, &plain, &x, (&bytes, &w), None, &t.claims);
                }
            }
        }
    }
    let (n, k) = (45, 72);
    let (bytes, w) = encode(ty, &values(n * k, 7));
    let bias = values(n, 8);
    let lin = linear(&b, ty, (n, k), bytes.clone(), Some(&bias));
    for m in [1, 7, 8, 33] {
        let x = values(m * k, 10 + m as u64);
        let what = format!("{}: {ty} matmul [{m}, {k}] x [{n}, {k}]ᵀ + b", b.name());
        check_matmul(&b, &what, &lin, &x, (&bytes, &w), Some(&bias), &t.claims);
    }
}

/// `(n, k)` of a block type's cases: one output row, 37 and 70 (not whole groups of 16), 48
/// (whole groups, which a backend may store interleaved); `k` of 1 to 9 blocks of 32 (none a
/// multiple of 256) or of one and two k-quant super-blocks.
fn quantized_shapes(ty: GgmlType) -> [(usize, usize); 4] {
    if ty.block_size() == 32 {
        [(1, 32), (37, 96), (48, 160), (70, 288)]
    } else {
        [(1, 256), (37, 512), (48, 256), (70, 512)]
    }
}

/// Rows of activations of the product cases: one (decode), a few, one past a tile of 16, and
/// 70 (past a tile of 64).
const PRODUCT_ROWS: [usize; 6] = [1, 2, 3, 8, 17, 70];

/// A block type's products at [`quantized_shapes`] × [`PRODUCT_ROWS`], with a bias on one shape,
/// an all-zero weight row, an all-zero activation row (zero scales) and one of values past f16's
/// range; Q8_0 also with a matrix
/// quantized by hand, independently of kiln-quant.
fn matmul_quantized<B: Backend>(t: &Target<B>, ty: GgmlType) {
    if !t.computes(ty, "matmul") {
        return;
    }
    let b = t.backend();
    let mut lins = Vec::new();
    for (s, (n, k)) in quantized_shapes(ty).into_iter().enumerate() {
        let mut wv = values(n * k, 40 + s as u64);
        if n == 70 {
            wv[..k].fill(0.0);
        }
        let (bytes, w) = encode(ty, &wv);
        let bias = (n == 37).then(|| values(n, 5));
        let lin = linear(&b, ty, (n, k), bytes.clone(), bias.as_deref());
        lins.push((lin, bytes, w, bias));
    }
    // The products of one input row count must all match the same way of computing them.
    for m in PRODUCT_ROWS {
        let mut joint = check::Joint::new(&format!("{}: {ty} matmul of {m} rows", b.name()));
        for (lin, bytes, w, bias) in &lins {
            let (n, k) = (lin.out_features, lin.in_features);
            let mut x = values(m * k, 50 + m as u64);
            if m >= 3 {
                x[k..2 * k].fill(0.0);
            }
            if m >= 17 {
                // A row past f16's range (65,504), as activations of some models reach, in
                // pairs of opposite values: Q8_1's block sums are f16 (ggml's format), which
                // a row of large sums would overflow on any backend that uses them.
                for (i, v) in x[2 * k..3 * k].iter_mut().enumerate() {
                    let a = 3.0e5 * (1.0 + (i / 2 % 7) as f32 / 7.0);
                    *v = if i % 2 == 0 { a } else { -a };
                }
            }
            let (y, c) = run_matmul(&b, lin, &x, m, (bytes, w), bias.as_deref(), &t.claims);
            let call = format!(
                "[{m}, {k}] x [{n}, {k}]ᵀ{}",
                if bias.is_some() { " + b" } else { "" }
            );
            joint.add(&call, &y, &c, n);
        }
        joint.finish();
    }
    if ty == GgmlType::Q8_0 {
        let (n, k) = (37, 128);
        let (bytes, w) = q8_0_by_hand(&values(n * k, 8));
        let lin = linear(&b, ty, (n, k), bytes.clone(), None);
        for m in [1, 3, 17] {
            let x = values(m * k, 9);
            let what = format!(
                "{}: Q8_0 (by hand) matmul [{m}, {k}] x [{n}, {k}]ᵀ",
                b.name()
            );
            check_matmul(&b, &what, &lin, &x, (&bytes, &w), None, &t.claims);
        }
    }
}

macro_rules! type_cases {
    ($($name:ident => $ty:ident, $f:ident;)*) => {
        $(
            #[doc = concat!("`matmul` with ", stringify!($ty), " weights (see the module docs).")]
            pub fn $name<B: Backend>(t: &Target<B>) {
                $f(t, GgmlType::$ty)
            }
        )*
    };
}

type_cases! {
    matmul_f32 => F32, matmul_float;
    matmul_f16 => F16, matmul_float;
    matmul_bf16 => BF16, matmul_float;
    matmul_q4_0 => Q4_0, matmul_quantized;
    matmul_q4_1 => Q4_1, matmul_quantized;
    matmul_q5_0 => Q5_0, matmul_quantized;
    matmul_q5_1 => Q5_1, matmul_quantized;
    matmul_q8_0 => Q8_0, matmul_quantized;
    matmul_q2_k => Q2_K, matmul_quantized;
    matmul_q3_k => Q3_K, matmul_quantized;
    matmul_q4_k => Q4_K, matmul_quantized;
    matmul_q5_k => Q5_K, matmul_quantized;
    matmul_q6_k => Q6_K, matmul_quantized;
    matmul_q8_k => Q8_K, matmul_quantized;
}

/// GPTQ 4-bit matrices (`upload_gptq`): group sizes 32, 64 and 128, inputs in order and permuted
/// by act-order's `g_idx`, v1 and v2 zero points, with a bias, against the product of
/// `GptqMatrix::dequantize` (the reference dequantizer) with f32 activations. A backend that does
/// not claim GPTQ must refuse it as a weight error naming the matrix.
pub fn matmul_gptq<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    if !t.claims.gptq {
        match b.upload_gptq("layer.0.q", Arc::new(gptq(64, 8, 32, false, false, 1))) {
            Err(BackendError::Weight { name, .. }) => assert_eq!(name, "layer.0.q"),
            Err(e) => panic!("{}: GPTQ refused with {e}, not as a weight error", b.name()),
            Ok(_) => panic!("{}: accepts GPTQ without claiming it", b.name()),
        }
        return;
    }
    for (s, (inputs, out, group, act_order, v1)) in [
        (96, 24, 32, false, true),
        (128, 40, 64, true, false),
        (256, 8, 128, true, true),
        (512, 72, 128, false, false),
    ]
    .into_iter()
    .enumerate()
    {
        let g = Arc::new(gptq(inputs, out, group, act_order, v1, 60 + s as u64));
        let w = g.dequantize();
        let bias = (s % 2 == 1).then(|| values(out, 3));
        let lin = gptq_linear(&b, &g, bias.as_deref());
        for m in [1, 3, 8, 17] {
            let x = values(m * inputs, 70 + m as u64);
            let y = host(&b, &b.matmul(&tensor(&b, &x, m, inputs), &lin).unwrap());
            let want = reference::product_expected(
                &x,
                (m, inputs, out),
                &w,
                bias.as_deref(),
                None,
                tolerance::gptq_product(inputs, inputs / group),
            );
            check::close(
                &format!(
                    "{}: GPTQ matmul [{m}, {inputs}] x [{out}, {inputs}]ᵀ, groups of {group}, \
                     act-order {act_order}, v1 {v1}",
                    b.name()
                ),
                &y,
                &want,
                out,
            );
        }
    }
}

/// `embedding` of a table of every type: each row as the type's dequantizer gives it (bit for
/// bit for the float types, which widen exactly; within [`tolerance::dequantized`] for the block
/// types), rows repeated and in any order, 37 and 48 rows (whole groups of 16, which a backend
/// may store interleaved); a table quantized by hand gives its values exactly; a row past the
/// table is an error.
pub fn embedding<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for ty in ALL_WEIGHT_TYPES {
        if !t.computes(ty, "embedding") {
            continue;
        }
        let d = match ty.block_size() {
            1 => 70,
            32 => 96,
            _ => 512,
        };
        for rows in [37, 48] {
            let (bytes, w) = encode(ty, &values(rows * d, 80 + rows as u64));
            let table = upload(&b, "embd", ty, &[d, rows], bytes);
            let ids = [0u32, rows as u32 - 1, 5, 5, 17, 0];
            let got = host(&b, &b.embedding(&table, &ids).unwrap());
            let mut want = Expected::with_capacity(ids.len() * d);
            for &id in &ids {
                let row = &w[id as usize * d..(id as usize + 1) * d];
                for blk in row.chunks(ty.block_size().max(1)) {
                    let max = blk.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
                    for &v in blk {
                        let tol = if is_float(ty) {
                            0.0
                        } else {
                            tolerance::dequantized(max)
                        };
                        want.push(v as f64, tol);
                    }
                }
            }
            let what = format!("{}: {ty} embedding of a [{rows}, {d}] table", b.name());
            check::close(&what, &got, &want, d);
            check::error(
                &format!("{what}: row {rows}"),
                b.embedding(&table, &[rows as u32]),
            );
        }
    }
    if t.claims.weight_types.contains(&GgmlType::Q8_0) {
        let (rows, d) = (48, 64);
        let (bytes, w) = q8_0_by_hand(&values(rows * d, 8));
        assert_eq!(dequantize(GgmlType::Q8_0, &bytes, rows * d), w);
        let table = upload(&b, "embd", GgmlType::Q8_0, &[d, rows], bytes);
        let got = host(&b, &b.embedding(&table, &[47, 0, 3]).unwrap());
        let want: Vec<f32> = [47, 0, 3]
            .iter()
            .flat_map(|&r| w[r * d..(r + 1) * d].to_vec())
            .collect();
        check::bits(
            &format!("{}: Q8_0 (by hand) embedding", b.name()),
            &got,
            &want,
            d,
        );
    }
}

/// A weight of `rows` outputs and `k` inputs of `ty` on `b`, when claimed.
fn claimed_linear<B: Backend>(
    t: &Target<B>,
    b: &B,
    ty: GgmlType,
    rows: usize,
    k: usize,
    seed: u64,
) -> Option<Linear<B>> {
    t.computes(ty, "matmul_many").then(|| {
        let (bytes, _) = encode(ty, &values(rows * k, seed));
        linear(b, ty, (rows, k), bytes, None)
    })
}

/// `matmul_many` (several weights sharing an input: Q/K/V, gate/up, experts) gives exactly what
/// one `matmul` per weight gives, in order, at every row count from a decode step to a batch:
/// block types of one activation format, of several, and lists with float and GPTQ weights.
pub fn matmul_many<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    let k = 256;
    use GgmlType::*;
    let lists: [&[(GgmlType, usize)]; 4] = [
        // Q8_0 and Q4_K activation formats; 300, 37 rows and whole groups of 16.
        &[(Q8_0, 300), (Q4_K, 64), (Q8_0, 37), (Q8_0, 64), (Q5_0, 64)],
        &[(Q5_0, 40), (Q8_0, 49), (Q4_0, 58)],
        &[(Q5_0, 40), (Q4_K, 49), (Q6_K, 58)],
        // Every other type, and float weights.
        &[
            (Q4_1, 24),
            (Q5_1, 16),
            (Q2_K, 33),
            (Q3_K, 16),
            (Q5_K, 20),
            (Q8_K, 17),
            (F32, 24),
            (F16, 33),
            (BF16, 8),
        ],
    ];
    let mut sets: Vec<Vec<Linear<B>>> = lists
        .iter()
        .map(|list| {
            list.iter()
                .enumerate()
                .filter_map(|(i, &(ty, rows))| claimed_linear(t, &b, ty, rows, k, 11 + i as u64))
                .collect()
        })
        .collect();
    if t.claims.gptq {
        let g = Arc::new(gptq(k, 16, 64, true, false, 5));
        let mut with_gptq: Vec<Linear<B>> = Vec::new();
        with_gptq.push(gptq_linear(&b, &g, None));
        with_gptq.extend(claimed_linear(t, &b, Q8_0, 37, k, 3));
        sets.push(with_gptq);
    }
    for (s, set) in sets.iter().enumerate() {
        let lins: Vec<&Linear<B>> = set.iter().collect();
        for m in [1, 2, 3, 5, 8, 9, 16, 17] {
            let x = tensor(&b, &values(m * k, 14), m, k);
            let fused = b.matmul_many(&x, &lins).unwrap();
            assert_eq!(fused.len(), lins.len(), "{}: list {s}: outputs", b.name());
            for (y, lin) in fused.iter().zip(&lins) {
                let what = format!(
                    "{}: matmul_many list {s}, m={m}: {} of {} outputs vs its matmul",
                    b.name(),
                    lin.ty,
                    lin.out_features
                );
                assert_eq!(b.shape(y), (m, lin.out_features), "{what}: shape");
                let alone = b.matmul(&x, lin).unwrap();
                check::bits(&what, &host(&b, y), &host(&b, &alone), lin.out_features);
            }
        }
    }
    let x = tensor(&b, &values(k, 14), 1, k);
    assert!(
        b.matmul_many(&x, &[]).unwrap().is_empty(),
        "no weights, no outputs"
    );
}

/// `matmul_activation` (`act(x · Wᵀ + b)`, an encoder FFN's first half) for each activation, on
/// float and block weights, against its definition (the product's bound carried through the
/// activation's slope) and against the unfused `activation(matmul(x))`.
pub fn matmul_activation<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    let (n, k) = (40, 256);
    for ty in [
        GgmlType::F32,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
    ] {
        if !t.computes(ty, "matmul_activation") {
            continue;
        }
        let (bytes, w) = encode(ty, &values(n * k, 21));
        let bias = values(n, 22);
        let lin = linear(&b, ty, (n, k), bytes.clone(), Some(&bias));
        for m in [1, 8, 17] {
            // Inputs of 1/8 so that the products spread over the activations' curved range.
            let x: Vec<f32> = values(m * k, 23).iter().map(|v| v / 8.0).collect();
            let xt = tensor(&b, &x, m, k);
            for act in ACTIVATIONS {
                let what = format!(
                    "{}: {ty} matmul_activation {act:?} [{m}, {k}] x [{n}, {k}]ᵀ + b",
                    b.name()
                );
                let fused = host(&b, &b.matmul_activation(&xt, &lin, act).unwrap());
                let unfused = host(
                    &b,
                    &b.activation(&b.matmul(&xt, &lin).unwrap(), act).unwrap(),
                );
                let products = candidates(ty, &x, (m, k, n), (&bytes, &w), Some(&bias), &t.claims);
                let through = |e: &Expected| activated(act, e);
                let want: Vec<(String, Expected)> = products
                    .iter()
                    .map(|(name, e)| (name.clone(), through(e)))
                    .collect();
                check::close_any(&what, &fused, &want, n);
                let against_unfused: Vec<(String, Expected)> = want
                    .iter()
                    .map(|(name, e)| {
                        let near = Expected {
                            value: unfused.iter().map(|&v| v as f64).collect(),
                            tol: e.tol.iter().map(|t| 2.0 * t).collect(),
                        };
                        (format!("unfused, {name}"), near)
                    })
                    .collect();
                check::close_any(&format!("{what} vs unfused"), &fused, &against_unfused, n);
            }
        }
    }
}

/// `act` of each expected value, the bound carried through the activation's slope.
fn activated(act: Activation, e: &Expected) -> Expected {
    let mut out = Expected::with_capacity(e.len());
    for (&z, &dz) in e.value.iter().zip(&e.tol) {
        let y = reference::activation(act, z);
        out.push(y, tolerance::activation_of_inexact(z, y, dz));
    }
    out
}
