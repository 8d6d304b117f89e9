//! Helpers shared by the decode examples (not an example itself).

/// The index of the largest logit of each of the `batch` rows of `logits` (the last on ties: a
/// plain arg-max, not the engine's sampler).
pub fn argmax_rows(logits: &[f32], batch: usize) -> Vec<u32> {
    logits
        .chunks_exact(logits.len() / batch)
        .map(|row| {
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i as u32)
        })
        .collect()
}
