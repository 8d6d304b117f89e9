//! YaRN rope scaling ("YaRN: Efficient Context Window Extension", Peng et al., 2023) as kiln's
//! rope applies it: one divisor per rotary pair and a factor on cos and sin.
//!
//! Pair `i` of a `d`-dimensional rotary part turns at `θᵢ = base^(-2i/d)` unscaled
//! ("extrapolated") and `θᵢ / factor` interpolated. YaRN mixes the two by a ramp over the pairs:
//! pairs that turn more than `beta_fast` times within the original context keep their frequency,
//! pairs that turn fewer than `beta_slow` times are interpolated, and those between are blended
//! linearly. The pair where a frequency makes `r` turns in `L` positions is
//! `d · ln(L / (2π r)) / (2 ln base)`; with `truncate` (the default in transformers, and what
//! llama.cpp always does) the fast bound is floored and the slow one ceiled, then both are
//! clamped to `[0, d − 1]`. With `e = 1 − clamp((i − low) / (high − low), 0, 1)` the pair's
//! frequency is `θᵢ · ((1 − e) / factor + e)`, which kiln applies as the divisor
//! `1 / ((1 − e) / factor + e)`.
//!
//! The attention factor multiplies cos and sin (so the scores by its square): the config's
//! `attention_factor` where given, else `0.1 ln(factor) + 1` (1 for `factor ≤ 1`), or, with
//! DeepSeek's `mscale` and `mscale_all_dim`, the ratio of the two such terms. These are
//! transformers' `_compute_yarn_parameters` and llama.cpp's `rope_yarn` / `llama_context` rules
//! (upstream 0c1e570), which agree.

use std::f64::consts::PI;

/// The YaRN settings of one model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Yarn {
    /// Context extension factor (`> 0`).
    pub factor: f64,
    /// The context length the model was trained at.
    pub original_context: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Floor/ceil the ramp's bounds (transformers' `truncate`, default true).
    pub truncate: bool,
}

impl Yarn {
    /// The defaults of both transformers and llama.cpp: `beta_fast` 32, `beta_slow` 1, truncated.
    pub(crate) fn new(factor: f64, original_context: f64) -> Yarn {
        Yarn {
            factor,
            original_context,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
        }
    }

    /// Why these settings cannot be used, if they cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("YaRN {name} must be a positive number, got {v}"))
            }
        };
        positive("factor", self.factor)?;
        positive("original context length", self.original_context)?;
        positive("beta_fast", self.beta_fast)?;
        positive("beta_slow", self.beta_slow)
    }

    /// The `rope_dim / 2` frequency divisors for a rotary part of `rope_dim` dims with base
    /// `base` (see the module docs).
    pub(crate) fn divisors(&self, rope_dim: usize, base: f64) -> Vec<f32> {
        let d = rope_dim as f64;
        let pair_of =
            |turns: f64| d * (self.original_context / (turns * 2.0 * PI)).ln() / (2.0 * base.ln());
        let (mut low, mut high) = (pair_of(self.beta_fast), pair_of(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, high) = (low.max(0.0), high.min(d - 1.0));
        // transformers' ramp runs in f32, with a minimum width against a zero division.
        let (low, high) = (low as f32, high as f32);
        let width = if low == high { 0.001 } else { high - low };
        let factor = self.factor as f32;
        (0..rope_dim / 2)
            .map(|i| {
                let extrapolated = 1.0 - ((i as f32 - low) / width).clamp(0.0, 1.0);
                1.0 / ((1.0 - extrapolated) / factor + extrapolated)
            })
            .collect()
    }
}

/// `0.1 · mscale · ln(scale) + 1`, or 1 where `scale ≤ 1` (YaRN's attention temperature).
pub(crate) fn mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ramp of a small case worked by hand: 16 rotary dims, base 10⁴, trained at 256
    /// positions: pair bounds 0.21 → 0 and 3.22 → 4, so pairs 0..4 blend 1, ¾, ½, ¼ of the
    /// original frequency and the rest are fully interpolated.
    #[test]
    fn divisors_follow_the_ramp() {
        let y = Yarn::new(4.0, 256.0);
        let got = y.divisors(16, 10_000.0);
        let blend = |e: f32| 1.0 / ((1.0 - e) / 4.0 + e);
        let want = [
            1.0,
            blend(0.75),
            blend(0.5),
            blend(0.25),
            4.0,
            4.0,
            4.0,
            4.0,
        ];
        assert_eq!(got.len(), 8);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
        // Without truncation the bounds stay fractional (0.21, 3.22): pair 1 keeps
        // 1 - 0.79 / 3.01 of its unscaled frequency instead of 3/4.
        let loose = Yarn {
            truncate: false,
            ..y
        };
        let e = 1.0 - (1.0 - 0.20982) / (3.22012 - 0.20982);
        assert!((loose.divisors(16, 10_000.0)[1] - blend(e)).abs() < 1e-4);
    }

    #[test]
    fn attention_factor_is_one_without_extension() {
        assert_eq!(mscale(1.0, 1.0), 1.0);
        assert!((mscale(4.0, 1.0) - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-12);
        assert!(Yarn::new(0.0, 10.0).check().is_err());
        assert!(Yarn::new(2.0, f64::NAN).check().is_err());
        assert!(Yarn::new(2.0, 4096.0).check().is_ok());
    }
}
