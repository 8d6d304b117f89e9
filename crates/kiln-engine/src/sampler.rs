//! Token sampling: penalties, then the filters (top-k, top-p, min-p) on the untempered
//! distribution, then temperature, then a draw — llama.cpp's default order. Temperature 0 is
//! greedy (arg-max, lowest id on ties) and ignores the filters and the seed.

use crate::{EngineError, Rng};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p ×` the most likely one (0 = off).
    pub min_p: f32,
    /// CTRL-style: a positive logit of a recent token is divided by it, a negative one multiplied
    /// (1.0 = off).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every recent token (0 = off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a recent token (0 = off).
    pub frequency_penalty: f32,
    /// How many of the latest tokens the penalties look at (0 = all).
    pub penalty_last_n: usize,
    pub seed: u64,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`: −100 bans a
    /// token, +100 all but forces it); ids past the logits are ignored.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding, no penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: &str| Err(EngineError::Sampling(m.to_string()));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty must be > 0");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("presence/frequency penalties must be finite");
        }
        if self
            .logit_bias
            .iter()
            .any(|&(_, b)| !(-100.0..=100.0).contains(&b))
        {
            return bad("logit biases must be between -100 and 100");
        }
        Ok(())
    }
}

/// A sampler with its own random stream.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, EngineError> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Sampler { params, rng })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Pick the next token from `logits` (modified in place by the penalties); `history` is the
    /// sequence so far (prompt and generated tokens).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.adjust(logits, history);
        self.pick(logits)
    }

    /// The part of sampling that does not depend on which tokens are allowed: the logit biases
    /// added, then the penalties. A constraint's mask may be applied after it as well as
    /// before (a penalty moves one finite logit; −∞ stays −∞).
    pub fn adjust(&self, logits: &mut [f32], history: &[u32]) {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.apply_penalties(logits, history);
    }

    /// Whether drawing from the adjusted logits without a constraint's mask, and keeping the
    /// draw when the constraint allows it, draws from the masked distribution exactly (the
    /// caller masks and draws again otherwise): so for greedy decoding (the arg-max over all
    /// tokens is the arg-max over the allowed ones when allowed) and for a draw without top-k,
    /// top-p or min-p (rejection sampling: a draw kept when in the allowed set A, else one from
    /// the masked distribution, has probability p(a) + (1 − p(A)) p(a)/p(A) = p(a)/p(A)). The
    /// filters are decided on the masked distribution, so with them the mask comes first.
    pub fn draws_exactly_unmasked(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0 || (p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0)
    }

    /// Picks a token from logits already [`Sampler::adjust`]ed (and masked, if constrained):
    /// the arg-max when greedy, else the filters, the temperature and a draw.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature == 0.0 {
            return argmax(logits);
        }
        let p = &self.params;
        let finite = logits.iter().filter(|l| l.is_finite()).count();
        if finite == 0 {
            return argmax(logits);
        }
        if p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0 {
            // No filter (OpenAI's defaults): one pass over the vocabulary, no sort.
            return self.draw_all(logits);
        }
        // The candidates, most likely first (ties: lower id first): with top-k its k; without,
        // a growing prefix of the sorted vocabulary, as long as the filters need (the
        // 262k-token vocabularies make a full sort per token the sampler's main cost).
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        // Probabilities on the untempered distribution: over the top-k set, or the vocabulary.
        let mut k = if p.top_k > 0 {
            p.top_k.min(finite)
        } else {
            64.min(finite)
        };
        let (cand, probs) = loop {
            if k < all.len() {
                all.select_nth_unstable_by(k - 1, by_logit_desc);
            }
            let mut cand = all[..k].to_vec();
            cand.sort_unstable_by(by_logit_desc);
            let probs = if p.top_k > 0 {
                softmax(&cand, 1.0)
            } else {
                // Normalized over the whole vocabulary (the tail is not in `cand`).
                let max = cand[0].1 as f64;
                let z: f64 = all.iter().map(|c| (c.1 as f64 - max).exp()).sum();
                cand.iter()
                    .map(|c| (c.1 as f64 - max).exp() / z)
                    .collect::<Vec<f64>>()
            };
            // The filters are decided within `cand` unless they may keep tokens beyond it.
            let decided = k == all.len() || p.top_k > 0 || {
                let reaches_p = p.top_p < 1.0 && probs.iter().sum::<f64>() >= p.top_p as f64;
                let floor = probs[0] * p.min_p as f64;
                let min_p_cut = p.min_p > 0.0 && probs[k - 1] < floor;
                reaches_p || min_p_cut
            };
            if decided {
                break (cand, probs);
            }
            k = (k * 8).min(all.len());
        };
        let mut cand = cand;
        cand.truncate(kept(&probs, p));
        draw(&cand, p.temperature, self.rng.next_f64())
    }

    /// A draw from the tempered distribution over every finite logit, in vocabulary order.
    fn draw_all(&mut self, logits: &[f32]) -> u32 {
        let t = self.params.temperature as f64;
        let max = logits
            .iter()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, |m, &l| m.max(l)) as f64;
        let weight = |l: f32| {
            if l.is_finite() {
                ((l as f64 - max) / t).exp()
            } else {
                0.0
            }
        };
        let z: f64 = logits.iter().map(|&l| weight(l)).sum();
        let target = self.rng.next_f64() * z;
        let mut acc = 0.0;
        let mut last = 0;
        for (i, &l) in logits.iter().enumerate() {
            let w = weight(l);
            if w > 0.0 {
                acc += w;
                last = i;
                if target < acc {
                    return i as u32;
                }
            }
        }
        last as u32
    }

    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let window = if p.penalty_last_n == 0 {
            history.len()
        } else {
            p.penalty_last_n.min(history.len())
        };
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for &t in &history[history.len() - window..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &c) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repetition_penalty;
            } else {
                *l *= p.repetition_penalty;
            }
            *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

/// How many of the candidates (most likely first, `probs` their untempered probabilities) the
/// top-p and min-p filters keep: top-p the smallest prefix reaching p, min-p those at least
/// `min_p ×` the most likely; at least one.
fn kept(probs: &[f64], p: &SamplingParams) -> usize {
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, &pr) in probs.iter().enumerate() {
            acc += pr;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p as f64;
        keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count());
    }
    keep.max(1)
}

/// The candidate where the cumulative tempered probability (in candidate order) passes `r`.
fn draw(cand: &[(u32, f32)], temperature: f32, r: f64) -> u32 {
    let probs = softmax(cand, temperature);
    let mut acc = 0.0;
    for (&(id, _), pr) in cand.iter().zip(&probs) {
        acc += pr;
        if r < acc {
            return id;
        }
    }
    cand[cand.len() - 1].0
}

fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Softmax of `logits / temperature` in f64.
fn softmax(cand: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let t = temperature as f64;
    let max = cand
        .iter()
        .map(|c| c.1 as f64 / t)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = cand.iter().map(|c| (c.1 as f64 / t - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// Index of the largest logit; the lowest index wins ties; NaNs never win (0 when no logit
/// exceeds -inf).
///
/// Two passes that vectorize, instead of one loop whose every step depends on the last
/// comparison: the maximum in 16 independent lanes (`if x > m { x } else { m }` is one packed
/// max), then the first index holding it. About 4x faster on Gemma's 262k logits, which
/// matters when a batched decode step takes the arg-max of several rows on one thread.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(tail) {
        max = if x > max { x } else { max };
    }
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&x| x == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass definition `argmax` must equal.
    fn argmax_reference(logits: &[f32]) -> u32 {
        let mut best = 0usize;
        let mut best_v = f32::NEG_INFINITY;
        for (i, &v) in logits.iter().enumerate() {
            if v > best_v {
                best = i;
                best_v = v;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_equals_the_one_pass_definition() {
        let mut rng = Rng::new(7);
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        let ninf = f32::NEG_INFINITY;
        let fixed: [&[f32]; 9] = [
            &[],
            &[nan, nan],
            &[nan, ninf, ninf],
            &[ninf, ninf],
            &[1.0, nan, 1.0, 2.0, 2.0],
            &[nan, 3.0, inf, 5.0, inf],
            &[-0.0, 0.0],
            &[0.0, -0.0],
            &[-5.0; 40],
        ];
        for row in fixed {
            assert_eq!(argmax(row), argmax_reference(row), "{row:?}");
        }
        for len in [1, 15, 16, 17, 33, 1000, 4099] {
            for _ in 0..20 {
                // Few distinct values, so that ties are common; a NaN now and then.
                let row: Vec<f32> = (0..len)
                    .map(|_| match rng.next_u64() % 50 {
                        0 => nan,
                        k => (k % 7) as f32 - 3.0,
                    })
                    .collect();
                assert_eq!(argmax(&row), argmax_reference(&row), "len {len}");
            }
        }
    }

    fn sampler(f: impl FnOnce(&mut SamplingParams)) -> Sampler {
        let mut p = SamplingParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..Default::default()
        };
        f(&mut p);
        Sampler::new(p).unwrap()
    }

    #[test]
    fn logit_bias_bans_forces_and_is_bounded() {
        let greedy = |bias: Vec<(u32, f32)>| {
            let mut s = Sampler::new(SamplingParams {
                logit_bias: bias,
                ..SamplingParams::greedy()
            })
            .unwrap();
            s.sample(&mut [1.0, 3.0, 2.5, 0.0], &[])
        };
        assert_eq!(greedy(vec![]), 1);
        assert_eq!(greedy(vec![(1, -100.0)]), 2, "the maximum banned");
        assert_eq!(greedy(vec![(3, 100.0)]), 3, "a token forced");
        assert_eq!(
            greedy(vec![(99, 100.0)]),
            1,
            "ids past the logits are ignored"
        );
        // Sampling at temperature 1 never draws a banned token.
        let mut s = sampler(|p| p.logit_bias = vec![(0, -100.0), (1, -100.0), (3, -100.0)]);
        for _ in 0..200 {
            assert_eq!(s.sample(&mut [1.0, 3.0, 2.5, 0.0], &[]), 2);
        }
        for bad in [100.5f32, -101.0, f32::NAN] {
            let p = SamplingParams {
                logit_bias: vec![(0, bad)],
                ..SamplingParams::greedy()
            };
            assert!(p.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, f32::NAN], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_distribution_follows_probabilities() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let draw = |seed| {
            let mut s = sampler(|p| p.seed = seed);
            (0..4000)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
        assert!(!a.contains(&2));
    }

    #[test]
    fn filters_restrict_the_candidates() {
        let logits = [5.0f32, 4.0, 3.0, 2.0, 1.0];
        let seen = |s: &mut Sampler| {
            let mut v: Vec<u32> = (0..2000)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect();
            v.sort();
            v.dedup();
            v
        };
        assert_eq!(seen(&mut sampler(|p| p.top_k = 2)), vec![0, 1]);
        // p(0)=0.636, p(1)=0.234: top-p 0.8 keeps two.
        assert_eq!(seen(&mut sampler(|p| p.top_p = 0.8)), vec![0, 1]);
        // min-p 0.3: keep tokens with p >= 0.3·p(0) → 0 and 1 (0.368 ratio), not 2 (0.135).
        assert_eq!(seen(&mut sampler(|p| p.min_p = 0.3)), vec![0, 1]);
        assert_eq!(seen(&mut sampler(|p| p.temperature = 1e-3)), vec![0]);
    }

    /// The sampler as a full sort of the vocabulary computes it, drawing with `r`.
    fn reference(logits: &[f32], p: &SamplingParams, r: f64) -> u32 {
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        cand.sort_unstable_by(by_logit_desc);
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        // The filters' definition on the fully sorted vocabulary.
        cand.truncate(kept(&softmax(&cand, 1.0), p));
        draw(&cand, p.temperature, r)
    }

    #[test]
    fn filters_over_a_large_vocabulary_match_a_full_sort() {
        let mut rng = Rng::new(3);
        for case in 0..60 {
            // Peaked and flat distributions over 5000 tokens, a few of them -inf.
            let spread = [0.5f32, 2.0, 6.0][case % 3];
            let mut logits: Vec<f32> = (0..5000)
                .map(|_| (rng.next_f64() as f32 - 0.5) * 2.0 * spread)
                .collect();
            logits[case * 7] = f32::NEG_INFINITY;
            logits[case * 11 + 1] += 4.0;
            let params = [
                (0, 0.9, 0.0),
                (0, 0.5, 0.0),
                (0, 1.0, 0.05),
                (0, 0.95, 0.05),
                (0, 0.999, 0.0),
                (40, 0.95, 0.05),
            ];
            for &(top_k, top_p, min_p) in &params {
                let p = SamplingParams {
                    temperature: 0.8,
                    top_k,
                    top_p,
                    min_p,
                    seed: case as u64,
                    ..SamplingParams::default()
                };
                let mut s = Sampler::new(p.clone()).unwrap();
                let mut draws = Rng::new(case as u64);
                for _ in 0..5 {
                    let r = draws.next_f64();
                    let got = s.sample(&mut logits.clone(), &[]);
                    assert_eq!(
                        got,
                        reference(&logits, &p, r),
                        "case {case}, {top_k} {top_p} {min_p}"
                    );
                }
            }
        }
    }

    #[test]
    fn penalties_push_repeated_tokens_down() {
        let mut s = sampler(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 2.0;
        });
        let mut l = [2.0f32, 1.5, -1.0];
        assert_eq!(s.sample(&mut l, &[0, 2]), 1);
        assert_eq!(l, [1.0, 1.5, -2.0]);
        let mut s = sampler(|p| {
            p.temperature = 0.0;
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.25;
        });
        let mut l = [2.0f32, 1.5];
        s.sample(&mut l, &[0, 0, 1]);
        assert_eq!(l, [2.0 - 1.0 - 0.25, 1.5 - 0.5 - 0.25]);
    }

    #[test]
    fn bad_parameters_are_rejected() {
        for f in [
            (|p: &mut SamplingParams| p.temperature = -1.0) as fn(&mut SamplingParams),
            |p| p.top_p = 0.0,
            |p| p.min_p = 2.0,
            |p| p.repetition_penalty = 0.0,
        ] {
            let mut p = SamplingParams::default();
            f(&mut p);
            assert!(Sampler::new(p).is_err());
        }
    }
}
