//! Helpers shared by the kiln-quant integration tests: the committed fixtures, a seeded random
//! source, and buffers that place bytes at a chosen address alignment.

#![allow(dead_code)] // each test binary uses a different subset

use kiln_core::GgmlType;

/// Every type `dequantize` and `vec_dot` support as weights.
pub const WEIGHT_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

/// The raw blocks and the expected dequantized values of `ty`, written by
/// `scripts/gen_quant_fixtures.py` from the `gguf` package.
pub fn fixture(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let raw = std::fs::read(dir.join(format!("{ty}.bin"))).unwrap();
    let expected = f32s(&std::fs::read(dir.join(format!("{ty}.f32"))).unwrap());
    (raw, expected)
}

/// Little-endian f32 values.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// splitmix64: a small, seeded generator so every run sees the same data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Activation-like values: mostly uniform, a few large outliers (as real hidden states have).
    pub fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = self.uniform();
                if self.next_u64().is_multiple_of(64) {
                    v * 40.0
                } else {
                    v
                }
            })
            .collect()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// A copy of some bytes starting at an address that is `misalign` past a multiple of 8, so tests
/// can hand the library both aligned and misaligned rows.
pub struct Placed {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Placed {
    pub fn new(bytes: &[u8], misalign: usize) -> Self {
        let mut buf = vec![0u8; bytes.len() + 16];
        let base = buf.as_ptr() as usize;
        let start = (misalign + 8 - base % 8) % 8;
        buf[start..start + bytes.len()].copy_from_slice(bytes);
        Placed {
            buf,
            start,
            len: bytes.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}
