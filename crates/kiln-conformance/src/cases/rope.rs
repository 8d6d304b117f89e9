//! Rotary position embedding.

use kiln_backend::{Backend, RopeParams, RopeStyle};

use crate::check;
use crate::data::{host, tensor, values};
use crate::reference;
use crate::Target;

fn params(
    (n_heads, head_dim, rope_dim): (usize, usize, usize),
    style: RopeStyle,
    freq_scale: f32,
    scaled: bool,
) -> RopeParams {
    RopeParams {
        n_heads,
        head_dim,
        rope_dim,
        base: 10_000.0,
        freq_scale,
        // Scaled: per-pair frequency divisors (Llama 3.1, Phi-3) and a cos/sin factor.
        freq_factors: scaled.then(|| (0..rope_dim / 2).map(|i| 1.0 + i as f32 * 0.75).collect()),
        mscale: if scaled { 1.19 } else { 1.0 },
        style,
    }
}

/// `rope` against its definition: both pair layouts, full and partial rotation, linear position
/// scaling, frequency factors and `mscale`, positions from 0 to 9 900, 70 rows, and a tensor
/// above the CPU's parallel threshold.
pub fn rope<B: Backend>(t: &Target<B>) {
    let b = t.backend();
    let few = [0u32, 1, 7, 1000];
    let seventy: Vec<u32> = (0..70).map(|i| i * 3 + 5).collect();
    let long: Vec<u32> = (0..100).map(|i| i * 100).collect();
    for (heads, positions) in [
        ((3, 16, 16), &few[..]),
        ((3, 16, 8), &few[..]),
        ((2, 64, 64), &seventy[..]),
        ((8, 64, 32), &long[..]),
    ] {
        for (style, freq_scale, scaled) in [
            (RopeStyle::Neox, 1.0, false),
            (RopeStyle::Neox, 0.5, false),
            (RopeStyle::Normal, 0.5, false),
            (RopeStyle::Neox, 0.5, true),
            (RopeStyle::Normal, 0.5, true),
        ] {
            let p = params(heads, style, freq_scale, scaled);
            let (rows, cols) = (positions.len(), p.n_heads * p.head_dim);
            let x = values(rows * cols, 4 + rows as u64);
            let y = host(
                &b,
                &b.rope(&tensor(&b, &x, rows, cols), positions, &p).unwrap(),
            );
            check::close(
                &format!(
                    "{}: rope {style:?} of {} heads of {} (rotary {}), freq_scale {freq_scale}, \
                     scaled {scaled}, {rows} positions",
                    b.name(),
                    p.n_heads,
                    p.head_dim,
                    p.rope_dim
                ),
                &y,
                &reference::rope(&x, positions, &p),
                cols,
            );
        }
    }
}

/// A backend may keep the angles of recent calls: calls that interleave more settings than it
/// could keep, and repeat them, must each give the bits a fresh backend gives.
pub fn rope_is_history_independent<B: Backend>(t: &Target<B>) {
    let (n_heads, head_dim) = (2, 8);
    let settings: Vec<(f32, f32, Vec<u32>)> = vec![
        (10_000.0, 1.0, vec![5, 6]),
        (1_000_000.0, 1.0, vec![5, 6]),
        (10_000.0, 1.0, vec![6, 5]),
        (10_000.0, 0.25, vec![5, 6]),
        (10_000.0, 1.0, vec![5, 6, 7]),
        (500.0, 1.0, vec![5, 6]),
    ];
    let b = t.backend();
    for round in 0..3 {
        for (k, (base, freq_scale, positions)) in settings.iter().enumerate() {
            let p = RopeParams {
                base: *base,
                ..params(
                    (n_heads, head_dim, head_dim),
                    RopeStyle::Neox,
                    *freq_scale,
                    false,
                )
            };
            let x = values(positions.len() * n_heads * head_dim, 10 + k as u64);
            let rope = |b: &B| {
                let xt = tensor(b, &x, positions.len(), n_heads * head_dim);
                host(b, &b.rope(&xt, positions, &p).unwrap())
            };
            check::bits(
                &format!(
                    "{}: rope, round {round}, setting {k}, vs a fresh backend",
                    b.name()
                ),
                &rope(&b),
                &rope(&t.backend()),
                n_heads * head_dim,
            );
        }
    }
}
