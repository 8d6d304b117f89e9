//! Sentence embeddings from token states: pooling and L2 normalization, as sentence-transformers'
//! `Pooling` and `Normalize` modules compute them for one (unpadded) sequence.
//!
//! Sums run in f64, so a pooled vector does not depend on how its tokens were batched. Which
//! pooling a folder asks for is read with its other sentence-transformers files (`hf.rs`).

/// How token states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Average of all tokens (specials included, as the attention mask has them).
    Mean,
    /// The first token (`[CLS]` / `<s>`).
    Cls,
    /// The last token (decoder-style embedders).
    LastToken,
    /// Element-wise maximum over tokens.
    Max,
    /// Sum divided by √len.
    MeanSqrtLen,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::LastToken => "last-token",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean-sqrt-len",
        }
    }

    /// Pools `states` (`len` rows of `d`, one sequence, `len ≥ 1`).
    pub fn pool(self, states: &[f32], d: usize) -> Vec<f32> {
        let len = states.len() / d.max(1);
        let rows = || states.chunks_exact(d.max(1));
        let sum = || {
            let mut acc = vec![0.0f64; d];
            for r in rows() {
                for (a, &v) in acc.iter_mut().zip(r) {
                    *a += v as f64;
                }
            }
            acc
        };
        match self {
            Pooling::Cls => rows()
                .next()
                .map(<[f32]>::to_vec)
                .unwrap_or_else(|| vec![0.0; d]),
            Pooling::LastToken => rows()
                .last()
                .map(<[f32]>::to_vec)
                .unwrap_or_else(|| vec![0.0; d]),
            Pooling::Mean => {
                let n = len.max(1) as f64;
                sum().into_iter().map(|s| (s / n) as f32).collect()
            }
            Pooling::MeanSqrtLen => {
                let n = (len.max(1) as f64).sqrt();
                sum().into_iter().map(|s| (s / n) as f32).collect()
            }
            Pooling::Max => {
                let mut m = vec![f32::NEG_INFINITY; d];
                for r in rows() {
                    for (a, &v) in m.iter_mut().zip(r) {
                        *a = a.max(v);
                    }
                }
                m
            }
        }
    }
}

/// `v / max(‖v‖₂, 1e-12)` (PyTorch's `F.normalize`, which sentence-transformers' `Normalize`
/// applies).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt();
    let inv = 1.0 / norm.max(1e-12);
    for x in v.iter_mut() {
        *x = (*x as f64 * inv) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [f32; 6] = [1.0, -2.0, 3.0, 4.0, -5.0, 0.5]; // 3 tokens of d = 2

    #[test]
    fn every_mode_on_a_small_sequence() {
        assert_eq!(Pooling::Mean.pool(&STATES, 2), vec![-1.0 / 3.0, 2.5 / 3.0]);
        assert_eq!(Pooling::Cls.pool(&STATES, 2), vec![1.0, -2.0]);
        assert_eq!(Pooling::LastToken.pool(&STATES, 2), vec![-5.0, 0.5]);
        assert_eq!(Pooling::Max.pool(&STATES, 2), vec![3.0, 4.0]);
        let s3 = 3f64.sqrt();
        assert_eq!(
            Pooling::MeanSqrtLen.pool(&STATES, 2),
            vec![(-1.0 / s3) as f32, (2.5 / s3) as f32]
        );
    }

    #[test]
    fn normalization_gives_unit_norm_and_keeps_zero() {
        let mut v = vec![3.0f32, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, vec![0.0; 3]);
    }
}
