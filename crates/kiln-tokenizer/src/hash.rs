//! Fast lookups for the vocabulary: token text -> id, merge pair -> rank.
//!
//! Tokenizing is dominated by map lookups of short byte strings, for which SipHash costs several
//! times the rest of the work. The keys of these maps are the vocabulary's, fixed at load time, so
//! the flooding attacks SipHash defends against do not apply: a caller's text only chooses which
//! fixed key to look up, and can make no bucket longer.
//!
//! The function is FxHash (the multiply-rotate hash of rustc) over 8-byte words, with a final
//! avalanche step so that the low bits hashbrown indexes by depend on every input byte.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher {
    hash: u64,
}

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i.into());
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i.into());
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // murmur3's fmix64.
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = FastHasher::default();
    h.write(bytes);
    h.finish()
}

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    id: u32,
    /// High hash bits, to skip most text comparisons.
    tag: u32,
}

/// An open-addressing index from token text to id that stores only ids: the texts stay in the
/// vocabulary's `Vec`, so building it allocates one table instead of one key per token (262,144
/// for Gemma).
///
/// Invariants: the table length is a power of two at least twice the number of ids, so probing
/// always reaches an empty slot; it is queried with the same `texts` it was built from; where two
/// ids share a text, the one found is the later id ([`Duplicates::LaterWins`], llama.cpp's
/// `token_to_id[text] = id`) or the earlier one ([`Duplicates::FirstWins`], its `emplace`).
pub(crate) struct TextIndex {
    slots: Vec<Slot>,
    mask: usize,
}

/// Which id a text shared by several ids resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Duplicates {
    FirstWins,
    LaterWins,
}

impl TextIndex {
    pub(crate) fn build<T: AsRef<str>>(texts: &[T], duplicates: Duplicates) -> TextIndex {
        let len = (texts.len() * 2).next_power_of_two().max(16);
        let mut index = TextIndex {
            slots: vec![Slot { id: EMPTY, tag: 0 }; len],
            mask: len - 1,
        };
        for (id, text) in texts.iter().enumerate() {
            let text = text.as_ref().as_bytes();
            let h = hash_bytes(text);
            let tag = (h >> 32) as u32;
            let mut i = h as usize & index.mask;
            loop {
                let slot = &mut index.slots[i];
                let same = slot.id != EMPTY
                    && slot.tag == tag
                    && texts.get(slot.id as usize).map(|t| t.as_ref().as_bytes()) == Some(text);
                if slot.id == EMPTY || (same && duplicates == Duplicates::LaterWins) {
                    *slot = Slot { id: id as u32, tag };
                    break;
                }
                if same {
                    break;
                }
                i = (i + 1) & index.mask;
            }
        }
        index
    }

    /// The id of the token whose text is `bytes`.
    pub(crate) fn get<T: AsRef<str>>(&self, texts: &[T], bytes: &[u8]) -> Option<u32> {
        let h = hash_bytes(bytes);
        let tag = (h >> 32) as u32;
        let mut i = h as usize & self.mask;
        loop {
            let slot = self.slots.get(i)?;
            if slot.id == EMPTY {
                return None;
            }
            if slot.tag == tag
                && texts.get(slot.id as usize).map(|t| t.as_ref().as_bytes()) == Some(bytes)
            {
                return Some(slot.id);
            }
            i = (i + 1) & self.mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_finds_every_text_and_nothing_else() {
        let texts: Vec<String> = (0..5000)
            .map(|i| format!("t{i}"))
            .chain(["t7".into()])
            .collect();
        let index = TextIndex::build(&texts, Duplicates::LaterWins);
        let first = TextIndex::build(&texts, Duplicates::FirstWins);
        for (id, t) in texts.iter().enumerate().take(5000) {
            let want = if t == "t7" { 5000 } else { id as u32 };
            assert_eq!(index.get(&texts, t.as_bytes()), Some(want));
            assert_eq!(first.get(&texts, t.as_bytes()), Some(id as u32));
        }
        assert_eq!(index.get(&texts, b"t5000"), None);
        assert_eq!(index.get(&texts, b""), None);
        let empty: [&str; 0] = [];
        assert_eq!(
            TextIndex::build(&empty, Duplicates::LaterWins).get(&empty, b"x"),
            None
        );
    }
}
