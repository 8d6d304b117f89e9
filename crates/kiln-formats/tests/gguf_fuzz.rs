//! Deterministic mutation fuzz: thousands of corruptions of a small valid file must each parse
//! to `Ok` or `Err`, never panic, and never allocate or loop in proportion to a forged count (a
//! forged count of 2^62 would make this test abort or hang, not fail slowly).

mod common;

use common::{parse, sample_writer};

/// xorshift64*: tiny, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that stress count and length fields: zero, off-by-one around real sizes, huge.
const INTERESTING: [u64; 10] = [
    0,
    1,
    7,
    255,
    1 << 16,
    1 << 31,
    1 << 32,
    1 << 62,
    u64::MAX / 2,
    u64::MAX,
];

fn mutate(bytes: &mut Vec<u8>, rng: &mut Rng) {
    let len = bytes.len();
    match rng.below(7) {
        0 => {
            let i = rng.below(len);
            if let Some(b) = bytes.get_mut(i) {
                *b ^= 1 << rng.below(8);
            }
        }
        1 => {
            let i = rng.below(len);
            if let Some(b) = bytes.get_mut(i) {
                *b = rng.next() as u8;
            }
        }
        2 | 3 => {
            // A u64 (or the low half of one) over what is likely a count or length field.
            let value = if rng.below(2) == 0 {
                INTERESTING[rng.below(INTERESTING.len())]
            } else {
                rng.next() >> rng.below(64)
            };
            let width = if rng.below(2) == 0 { 8 } else { 4 };
            let i = rng.below(len.saturating_sub(width) + 1);
            for (k, b) in value.to_le_bytes().iter().take(width).enumerate() {
                if let Some(slot) = bytes.get_mut(i + k) {
                    *slot = *b;
                }
            }
        }
        4 => bytes.truncate(rng.below(len + 1)),
        5 => {
            let i = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let insert: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            bytes.splice(i..i, insert);
        }
        _ => {
            let i = rng.below(len + 1);
            let end = (i + 1 + rng.below(16)).min(len);
            bytes.drain(i.min(end)..end);
        }
    }
}

/// Parses `bytes`; on success checks the invariants the reader promises and dumps the file.
fn parse_and_check(bytes: Vec<u8>) -> bool {
    let Ok(file) = parse(bytes) else {
        return false;
    };
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes, "{}", t.name);
        assert_eq!(file.tensor(&t.name), Some(t));
        assert_eq!(t.offset % file.alignment(), 0);
    }
    for (k, v) in file.metadata() {
        assert_eq!(file.get(k), Some(v));
    }
    let mut out = Vec::new();
    kiln_formats::write_dump(&file, &mut out, &Default::default()).unwrap();
    true
}

#[test]
fn fuzz_mutations_never_panic() {
    let original = sample_writer().to_bytes();
    assert!(parse_and_check(original.clone()));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let started = std::time::Instant::now();
    let (mut ok, mut total) = (0, 0);

    // Every offset of the header overwritten with every interesting u64.
    let header_end = parse(original.clone()).unwrap().data_offset() as usize;
    for i in 0..header_end {
        for value in INTERESTING {
            let mut bytes = original.clone();
            for (k, b) in value.to_le_bytes().iter().enumerate() {
                if let Some(slot) = bytes.get_mut(i + k) {
                    *slot = *b;
                }
            }
            ok += usize::from(parse_and_check(bytes));
            total += 1;
        }
    }

    // Random stacks of 1 to 4 mutations.
    for iteration in 0..30_000 {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut bytes, &mut rng);
        }
        let result = std::panic::catch_unwind(|| parse_and_check(bytes.clone()));
        match result {
            Ok(parsed) => ok += usize::from(parsed),
            Err(_) => panic!("iteration {iteration} panicked on {bytes:02x?}"),
        }
        total += 1;
    }
    eprintln!(
        "{total} mutated files, {ok} still parsed, {:?}",
        started.elapsed()
    );
    // Mutations in tensor data and metadata values leave a valid file: some must parse, most
    // must not, or the mutations are not reaching the structure.
    assert!(ok > 100 && ok < total / 2, "{ok} of {total} parsed");
}
