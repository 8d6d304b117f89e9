//! Malformed operands are reported, never computed on (so a malformed model file cannot crash a
//! server): shape mismatches as `BackendError::Shape`, malformed weights as
//! `BackendError::Weight`.

use std::sync::Arc;

use kiln_backend::{Backend, BackendError, KvPages, Linear, PackedAttentionParams, RopeParams};
use kiln_core::GgmlType;

use super::attention::params;
use crate::check::{error, shape_error};
use crate::data::{encode, tensor, upload, values, vector, weight_data};
use crate::Target;

/// Every op's refusal of operands that do not fit.
pub fn shape_errors<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    let name = b.name();
    let e = |op: &str| format!("{name}: {op}");
    let t23 = tensor(&b, &values(6, 1), 2, 3);
    let t32 = tensor(&b, &values(6, 2), 3, 2);

    // Tensors.
    error(
        &e("tensor_from_f32 of 5 values as [2, 3]"),
        b.tensor_from_f32(&values(5, 1), 2, 3),
    );
    shape_error(&e("rows 1..3 of 2"), b.rows(&t23, 1..3));
    let mut dst = b.zeros(4, 2).unwrap();
    shape_error(
        &e("write_rows of 3 at row 2 of 4"),
        b.write_rows(&mut dst, 2, &t32),
    );
    shape_error(
        &e("write_rows at usize::MAX"),
        b.write_rows(&mut dst, usize::MAX, &t32),
    );
    shape_error(
        &e("write_rows of 3 columns into 2"),
        b.write_rows(&mut dst, 0, &t23),
    );
    shape_error(
        &e("gather_rows of row 2 of 2"),
        b.gather_rows(&t23, &[0, 2]),
    );
    let mut dst = tensor(&b, &values(15, 3), 5, 3);
    let one = b.rows(&t23, 0..1).unwrap();
    shape_error(
        &e("scatter_add_rows to row 5 of 5"),
        b.scatter_add_rows(&mut dst, &[5], &one, &[1.0]),
    );
    shape_error(
        &e("scatter_add_rows with 2 indices for 1 row"),
        b.scatter_add_rows(&mut dst, &[0, 1], &one, &[1.0, 1.0]),
    );
    shape_error(
        &e("scatter_add_rows with 2 weights for 1 row"),
        b.scatter_add_rows(&mut dst, &[0], &one, &[1.0, 1.0]),
    );
    shape_error(
        &e("scatter_add_rows of 2 columns into 3"),
        b.scatter_add_rows(&mut dst, &[0], &b.rows(&t32, 0..1).unwrap(), &[1.0]),
    );

    // Element-wise.
    shape_error(&e("add [2, 3] + [3, 2]"), b.add(&t23, &t32));
    shape_error(&e("mul [2, 3] * [3, 2]"), b.mul(&t23, &t32));
    shape_error(
        &e("gated_activation [2, 3] by [3, 2]"),
        b.gated_activation(&t23, &t32, kiln_backend::Activation::Silu),
    );

    // Weights.
    for (what, ty, dims, bytes) in [
        ("Q8_0 [64, 2] in 67 bytes", GgmlType::Q8_0, vec![64, 2], 67),
        (
            "Q8_0 rows of 48 (not whole blocks)",
            GgmlType::Q8_0,
            vec![48, 2],
            68,
        ),
        ("F32 [4, 4] in 60 bytes", GgmlType::F32, vec![4, 4], 60),
    ] {
        match b.upload_weight(&weight_data("bad", ty, &dims, vec![0; bytes])) {
            Err(BackendError::Weight { name, .. }) => assert_eq!(name, "bad", "{}", e(what)),
            Err(other) => panic!("{}: not a weight error: {other}", e(what)),
            Ok(_) => panic!("{}: accepted", e(what)),
        }
    }
    let table = upload(
        &b,
        "embd",
        GgmlType::F32,
        &[2, 3],
        encode(GgmlType::F32, &values(6, 4)).0,
    );
    error(&e("embedding of row 3 of 3"), b.embedding(&table, &[0, 3]));

    // Products.
    let (n, k) = (16, 8);
    let lin = |bias_len: Option<usize>| Linear::<B> {
        weight: Arc::new(upload(
            &b,
            "w",
            GgmlType::F32,
            &[k, n],
            encode(GgmlType::F32, &values(n * k, 1)).0,
        )),
        bias: bias_len.map(|l| vector(&b, "b", &values(l, 2))),
        in_features: k,
        out_features: n,
        ty: GgmlType::F32,
    };
    let x9 = tensor(&b, &values(9 * k, 2), 9, k);
    shape_error(
        &e("matmul with a bias of 15 for 16 outputs"),
        b.matmul(&x9, &lin(Some(n - 1))),
    );
    let x1 = tensor(&b, &values(k, 2), 1, k);
    shape_error(
        &e("matmul of one row, bias of 15"),
        b.matmul(&x1, &lin(Some(n - 1))),
    );
    let wide = tensor(&b, &values(9 * (k + 1), 2), 9, k + 1);
    shape_error(&e("matmul of 9 inputs by 8"), b.matmul(&wide, &lin(None)));
    shape_error(
        &e("matmul_many of 9 inputs by 8"),
        b.matmul_many(&wide, &[&lin(None)]),
    );

    // Norms.
    let x = tensor(&b, &values(5 * 64, 3), 5, 64);
    shape_error(
        &e("rms_norm of 64 in groups of 48"),
        b.rms_norm(&x, &vector(&b, "w", &values(48, 1)), 1e-6),
    );
    let w63 = vector(&b, "w", &values(63, 1));
    shape_error(
        &e("layer_norm of 64 by 63 weights"),
        b.layer_norm(&x, &w63, None, 1e-5),
    );
    let w64 = vector(&b, "w", &values(64, 1));
    shape_error(
        &e("layer_norm of 64, bias of 63"),
        b.layer_norm(&x, &w64, Some(&w63), 1e-5),
    );
    let fewer = tensor(&b, &values(4 * 64, 3), 4, 64);
    shape_error(
        &e("add_layer_norm of 4 rows and 5"),
        b.add_layer_norm(&fewer, &x, &w64, None, 1e-5),
    );
    shape_error(
        &e("add_rms_norm of 4 rows and 5"),
        b.add_rms_norm(&fewer, &x, &w64, 1e-6),
    );

    // Rope.
    let p = RopeParams {
        n_heads: 4,
        head_dim: 16,
        rope_dim: 16,
        base: 10_000.0,
        freq_scale: 1.0,
        freq_factors: None,
        mscale: 1.0,
        style: kiln_backend::RopeStyle::Neox,
    };
    shape_error(
        &e("rope of 5 rows at 4 positions"),
        b.rope(&x, &[0, 1, 2, 3], &p),
    );
    let p_wide = RopeParams {
        rope_dim: 32,
        ..p.clone()
    };
    shape_error(
        &e("rope of 32 dims in heads of 16"),
        b.rope(&x, &[0, 1, 2, 3, 4], &p_wide),
    );
    let p_heads = RopeParams { n_heads: 3, ..p };
    shape_error(
        &e("rope of 3 heads of 16 over 64 columns"),
        b.rope(&x, &[0, 1, 2, 3, 4], &p_heads),
    );

    // Attention.
    let q = b.zeros(1, 32).unwrap();
    let kv24 = b.kv_zeros(4, 24).unwrap();
    shape_error(
        &e("attention of 4 heads over 3 KV heads"),
        b.attention(&q, &kv24, &kv24, 0, 1, &params((4, 3, 8), (None, None))),
    );
    let kv16 = b.kv_zeros(4, 16).unwrap();
    let p = params((4, 2, 8), (None, None));
    shape_error(
        &e("attention over 5 rows of a cache of 4"),
        b.attention(&q, &kv16, &kv16, 4, 5, &p),
    );
    shape_error(
        &e("attention of a row at 3 over 3 rows"),
        b.attention(&q, &kv16, &kv16, 3, 3, &p),
    );
    shape_error(
        &e("attention of 32 columns over 24"),
        b.attention(&q, &kv24, &kv24, 0, 1, &p),
    );
    let pool = b.kv_zeros(8, 16).unwrap();
    let short = KvPages {
        table: &[1],
        block_size: 4,
    };
    shape_error(
        &e("paged_attention over 6 rows of a table of one block of 4"),
        b.paged_attention(&q, &pool, &pool, &short, 5, 6, &p),
    );
    let outside = KvPages {
        table: &[0, 2],
        block_size: 4,
    };
    shape_error(
        &e("paged_attention through block 2 of a pool of 2"),
        b.paged_attention(&q, &pool, &pool, &outside, 5, 6, &p),
    );

    // Packed attention.
    let pp = PackedAttentionParams {
        n_heads: 2,
        head_dim: 16,
        scale: 0.25,
        radius: None,
    };
    let rows9 = tensor(&b, &values(9 * 32, 5), 9, 32);
    shape_error(
        &e("packed_attention of sequences of 3 and 4 over 9 rows"),
        b.packed_attention(&rows9, &rows9, &rows9, &[3, 4], &pp),
    );
    let pp_wide = PackedAttentionParams { n_heads: 3, ..pp };
    shape_error(
        &e("packed_attention of 3 heads of 16 over 32 columns"),
        b.packed_attention(&rows9, &rows9, &rows9, &[9], &pp_wide),
    );
}
