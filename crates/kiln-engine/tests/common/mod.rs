//! Helpers of the scheduler tests.

/// `n` prompts over tokens `1..=400` (every fixture vocabulary holds them) from a xorshift
/// stream seeded with `seed`: the first `shared` tokens common to all, then `tail(i)` more for
/// prompt `i`.
pub fn prompts(n: usize, shared: usize, seed: u64, tail: fn(usize) -> usize) -> Vec<Vec<u32>> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 400) as u32 + 1
    };
    let prefix: Vec<u32> = (0..shared).map(|_| next()).collect();
    (0..n)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend((0..tail(i)).map(|_| next()));
            p
        })
        .collect()
}
