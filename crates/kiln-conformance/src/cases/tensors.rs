//! Tensors and caches: making, reading, copying rows, MoE gather/scatter, KV writes.

use kiln_backend::{Backend, BackendError, KvDtype, KvPages};

use crate::data::{host, indices, kv, scaled, shuffled_table, tensor, values};
use crate::Target;
use crate::{check, reference};

/// Shapes of the element-wise and row cases: one element, rows of odd length, 70 rows, and one
/// above the CPU's parallel threshold (32 Ki elements).
pub(crate) const SHAPES: [(usize, usize); 4] = [(1, 1), (3, 7), (70, 33), (100, 500)];

/// `tensor_from_f32`/`to_f32`/`shape`/`zeros`/`rows`/`write_rows`, `run` and `name`.
pub fn tensor_round_trip<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    assert!(!b.name().is_empty(), "a backend has a name");
    assert_eq!(b.run(|| 41 + 1), 42, "run returns the closure's value");
    for (rows, cols) in SHAPES {
        let what = |op: &str| format!("{}: {op} [{rows}, {cols}]", b.name());
        let x = values(rows * cols, 1 + rows as u64);
        let xt = tensor(&b, &x, rows, cols);
        assert_eq!(b.shape(&xt), (rows, cols), "{}", what("shape"));
        check::bits(&what("to_f32"), &host(&b, &xt), &x, cols);
        let z = b.zeros(rows, cols).unwrap();
        assert_eq!(b.shape(&z), (rows, cols));
        check::bits(&what("zeros"), &host(&b, &z), &vec![0.0; rows * cols], cols);

        // rows: the first, the last, a middle range, and all of them.
        for r in [0..1, rows - 1..rows, rows / 3..rows - rows / 3, 0..rows] {
            let part = b.rows(&xt, r.clone()).unwrap();
            assert_eq!(b.shape(&part), (r.len(), cols));
            check::bits(
                &what(&format!("rows {r:?}")),
                &host(&b, &part),
                &x[r.start * cols..r.end * cols],
                cols,
            );
        }

        // write_rows into the middle of a larger tensor leaves the rest alone.
        let mut dst = b.zeros(rows + 3, cols).unwrap();
        b.write_rows(&mut dst, 2, &xt).unwrap();
        let mut want = vec![0.0; (rows + 3) * cols];
        want[2 * cols..(2 + rows) * cols].copy_from_slice(&x);
        check::bits(&what("write_rows"), &host(&b, &dst), &want, cols);

        // An op inside `run` gives what it gives outside.
        let inside = b.run(|| b.add(&xt, &xt).unwrap());
        let outside = b.add(&xt, &xt).unwrap();
        check::bits(&what("run"), &host(&b, &inside), &host(&b, &outside), cols);
    }
}

/// `gather_rows`: the rows of an index, repeated and in any order (the tokens routed to one
/// expert).
pub fn gather_rows<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols, index) in [
        (5, 7, vec![3u32, 0, 3]),
        (1, 4, vec![0, 0, 0, 0, 0]),
        (70, 33, indices(100, 70, 2)),
        (70, 33, vec![69]),
    ] {
        let x = values(rows * cols, 9);
        let xt = tensor(&b, &x, rows, cols);
        let g = b.gather_rows(&xt, &index).unwrap();
        assert_eq!(b.shape(&g), (index.len(), cols));
        let want: Vec<f32> = index
            .iter()
            .flat_map(|&r| x[r as usize * cols..(r as usize + 1) * cols].to_vec())
            .collect();
        check::bits(
            &format!("{}: gather_rows of [{rows}, {cols}]", b.name()),
            &host(&b, &g),
            &want,
            cols,
        );
    }
}

/// `scatter_add_rows`: `dst[index[i]] += weights[i] · src[i]` in order of `i` (an expert's
/// outputs added back to their tokens), repeated indices accumulating in order. The result must
/// be the bits of that f32 sequence, with each product rounded or fused into its addition.
pub fn scatter_add_rows<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    for (rows, cols, index, weights) in [
        (5, 7, vec![4u32, 1, 4], vec![0.5f32, 2.0, -1.0]),
        (70, 33, indices(100, 70, 3), scaled(100, 4, 2.0)),
        (3, 5, vec![0, 0, 0, 0, 0, 0], scaled(6, 5, 1.0)),
    ] {
        let x = values(rows * cols, 9);
        let src = values(index.len() * cols, 10);
        let mut dst = tensor(&b, &x, rows, cols);
        let s = tensor(&b, &src, index.len(), cols);
        b.scatter_add_rows(&mut dst, &index, &s, &weights).unwrap();
        let got = host(&b, &dst);
        let (mut rounded, mut fused) = (x.clone(), x.clone());
        for (r, (&i, &w)) in index.iter().zip(&weights).enumerate() {
            for c in 0..cols {
                let at = i as usize * cols + c;
                rounded[at] += src[r * cols + c] * w;
                fused[at] = src[r * cols + c].mul_add(w, fused[at]);
            }
        }
        let what = format!("{}: scatter_add_rows into [{rows}, {cols}]", b.name());
        let as_rounded = got
            .iter()
            .zip(&rounded)
            .all(|(g, r)| g.to_bits() == r.to_bits());
        if !as_rounded {
            check::bits(&format!("{what} (fused products)"), &got, &fused, cols);
        }
    }
}

/// `kv_zeros`/`kv_shape`/`kv_dtype`/`write_kv_rows`/`kv_to_f32` in each KV element type: f32
/// stores the values, f16 rounds each once to the nearest (ties to even), and a value too large
/// for f16 is refused as out of range.
pub fn kv_cache_round_trip<B: Backend>(t: &Target<B>) {
    // Values that f16 rounds: thirds, tenths, a tie (1 + 2⁻¹¹ goes to 1, 1 + 3·2⁻¹¹ to
    // 1 + 2⁻⁹), subnormals of f16, its largest finite value.
    let special = [
        1.0f32 / 3.0,
        0.1,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        -2.5e-6,
        6.0e-8,
        65504.0,
        -65504.0,
        0.0,
        -0.0,
    ];
    for (dtype, b) in t.kv_backends() {
        let what = |op: &str| format!("{}: {dtype} KV cache: {op}", b.name());
        let stored = |v: &[f32]| reference::kv_stored(dtype, v);
        // Rows of 5 (the block types: of one block) and, below, 33 (three blocks).
        let blocks = dtype.block() > 1;
        let c5 = if blocks { 32 } else { 5 };
        let fresh = b.kv_zeros(4, c5).unwrap();
        assert_eq!(b.kv_shape(&fresh), (4, c5), "{}", what("kv_shape"));
        check::bits(
            &what("kv_zeros"),
            &b.kv_to_f32(&fresh).unwrap(),
            &vec![reference::kv_zero(dtype); 4 * c5],
            c5,
        );
        if blocks {
            check::shape_error(
                &what("rows of part of a block"),
                b.kv_zeros(2, 48).map(|_| ()),
            );
        }

        for (rows, cols) in [(2, c5), (70, if blocks { 96 } else { 33 })] {
            let mut x = scaled(rows * cols, 20 + rows as u64, 3.0);
            let s = special.len().min(x.len());
            x[..s].copy_from_slice(&special[..s]);
            let mut cache = b.kv_zeros(rows + 3, cols).unwrap();
            b.write_kv_rows(&mut cache, 2, &tensor(&b, &x, rows, cols))
                .unwrap();
            let mut want = vec![reference::kv_zero(dtype); (rows + 3) * cols];
            want[2 * cols..(2 + rows) * cols].copy_from_slice(&stored(&x));
            check::bits(
                &what(&format!("write_kv_rows [{rows}, {cols}] at row 2")),
                &b.kv_to_f32(&cache).unwrap(),
                &want,
                cols,
            );
        }

        // Past the end of the cache.
        let mut cache = b.kv_zeros(4, c5).unwrap();
        let three = tensor(&b, &values(3 * c5, 1), 3, c5);
        check::shape_error(
            &what("rows past the end"),
            b.write_kv_rows(&mut cache, 2, &three),
        );
        let wide = tensor(&b, &values(c5 + 1, 1), 1, c5 + 1);
        check::shape_error(
            &what("a row too wide"),
            b.write_kv_rows(&mut cache, 0, &wide),
        );

        // Beyond f16: refused in an f16 cache (rather than stored as an infinity), kept in f32
        // and in the block types (a scale of 1e6 / 127); a NaN, which no block can encode, is
        // refused there. A backend that records work for later (a GPU) may report the refusal
        // at the next read back instead; the cache then keeps the rows it had.
        let before = b.kv_to_f32(&cache).unwrap();
        let mut row = values(c5, 3);
        row[2] = 1.0e6;
        let big = tensor(&b, &row, 1, c5);
        let r = b
            .write_kv_rows(&mut cache, 1, &big)
            .and_then(|()| b.kv_to_f32(&cache).map(|_| ()));
        match dtype {
            KvDtype::F16 => {
                check::bits(
                    &what("a refused write leaves the cache as it was"),
                    &b.kv_to_f32(&cache).unwrap(),
                    &before,
                    c5,
                );
                assert!(
                    matches!(r, Err(BackendError::Range { .. })),
                    "{}: got {:?}",
                    what("1e6 in f16"),
                    r.err()
                )
            }
            _ => r.unwrap(),
        }
        if blocks {
            let before = b.kv_to_f32(&cache).unwrap();
            row[2] = f32::NAN;
            let r = b
                .write_kv_rows(&mut cache, 2, &tensor(&b, &row, 1, c5))
                .and_then(|()| b.kv_to_f32(&cache).map(|_| ()));
            assert!(
                matches!(r, Err(BackendError::Range { .. })),
                "{}: got {:?}",
                what("NaN in a block cache"),
                r.err()
            );
            check::bits(
                &what("a refused write leaves the cache as it was"),
                &b.kv_to_f32(&cache).unwrap(),
                &before,
                c5,
            );
        }
    }
}

/// The default `write_paged_rows`: row `i` of `src` at logical row `first + i` through a block
/// table, runs that cross blocks included; an unmapped row is an error.
pub fn write_paged_rows<B: Backend>(t: &Target<B>) {
    for (dtype, b) in t.kv_backends() {
        // Rows of 6, or of two blocks for the block types.
        let cols = if dtype.block() > 1 {
            2 * dtype.block()
        } else {
            6
        };
        for (bs, first, n) in [(4usize, 3usize, 11usize), (5, 0, 1), (16, 7, 40)] {
            let blocks = (first + n).div_ceil(bs) + 1;
            let table = shuffled_table(blocks);
            let pages = KvPages {
                table: &table,
                block_size: bs,
            };
            let mut pool = b.kv_zeros(blocks * bs, cols).unwrap();
            let x = values(n * cols, 30 + n as u64);
            b.write_paged_rows(&mut pool, &pages, first, &tensor(&b, &x, n, cols))
                .unwrap();
            let (_, written) = kv(&b, &x, n, cols);
            let mut want = vec![reference::kv_zero(dtype); blocks * bs * cols];
            for i in 0..n {
                let j = first + i;
                let at = (table[j / bs] as usize * bs + j % bs) * cols;
                want[at..at + cols].copy_from_slice(&written[i * cols..(i + 1) * cols]);
            }
            check::bits(
                &format!(
                    "{}: {dtype} write_paged_rows of {n} rows at {first}, blocks of {bs}",
                    b.name()
                ),
                &b.kv_to_f32(&pool).unwrap(),
                &want,
                cols,
            );
        }
        // A table too short for the rows.
        let mut pool = b.kv_zeros(8, cols).unwrap();
        let pages = KvPages {
            table: &[1],
            block_size: 4,
        };
        let src = tensor(&b, &values(3 * cols, 1), 3, cols);
        check::shape_error(
            "write_paged_rows past the table",
            b.write_paged_rows(&mut pool, &pages, 2, &src),
        );
    }
}
