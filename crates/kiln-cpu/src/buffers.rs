//! Recycled storage for large tensors.
//!
//! An encoder batch of 32 × 256 tokens makes FFN activations of 50 MB, and every layer makes
//! the same dozen tensors again. The system allocator hands allocations that large out as fresh
//! memory maps and unmaps them on free (glibc does so above 32 MiB, and on worker threads its
//! arenas cannot keep them), so each one costs a page fault and a kernel page-zeroing per 4 KiB
//! on first write: measured at about 20 % of MiniLM's throughput on 256-token texts at 2 threads.
//! Like ONNX Runtime's arena, kiln keeps such buffers for reuse instead: a [`CpuTensor`] of at
//! least [`MIN_POOLED`] values gives its vector back here when dropped, and ops that overwrite
//! every element of their output take it from here ([`take`]).
//!
//! The pool is bounded in bytes as well as in count, so that it cannot turn into a second copy of
//! the activations: it keeps at most [`cap_bytes`] — 32 MiB, or six times the largest vector it
//! has seen when that is more. Gemma 3 270M's 512-token prefill stays within 32 MiB (a count
//! bound alone let it hold 100 MB, which put kiln's peak RSS 25 % above llama.cpp's). Six times
//! is what one layer of a larger decoder makes: llama-3.2-1b's 512-token prefill makes three
//! 16 MiB FFN tensors and about ten of 1-4 MiB, 82 MiB a layer. At three times (48 MiB) the
//! pool dropped the small ones every layer and the allocator mapped them again: 0.26-0.59 million
//! page faults per `kiln bench -p 512 -r 3` instead of 0.05 million, twice the system time, and
//! a higher peak RSS (1020 against 964-987 MiB); llama-3.1-8b's, 0.66 against 0.19 million.
//!
//! A new vector large enough to be kept is allocated with a little slack ([`size_class`]), so
//! that the next batch, a few percent longer, still finds it long enough.
//!
//! A kept vector keeps the length its last tensor gave it. [`take`] serves a request from the
//! smallest *capacity* that holds it (among equal capacities, the vector that needs the fewest
//! new zeros) and resizes it within that capacity: zeros over the gap only, no new pages.
//! Restoring every vector to its capacity when it came back, as this pool first did, zeroed the
//! whole unused tail each time: a 16 MB FFN buffer lent to a 4 MB tensor cost a 12 MB `memset`
//! on its return, 2.4 % of the samples of a 1B decoder's 512-token prefill.
//!
//! Invariants: the pool holds at most [`MAX_KEPT`] vectors and [`cap_bytes`] bytes of capacity;
//! [`take`] returns exactly `len` values whose contents are unspecified (stale values of an
//! earlier tensor, or zeros), so it is only for outputs that are written in full. Only safe
//! `Vec` operations are used: a value past a vector's length is never read.
//!
//! [`CpuTensor`]: crate::CpuTensor

use std::mem::size_of;
use std::sync::Mutex;

/// Smallest vector worth keeping (1 MiB of f32): smaller ones are cheap for the allocator.
pub(crate) const MIN_POOLED: usize = 256 * 1024;
/// Most vectors kept: an encoder layer has about a dozen large tensors alive or just dropped.
pub(crate) const MAX_KEPT: usize = 24;

/// Bytes the pool keeps at least the right to hold.
const MIN_CAP_BYTES: usize = 32 << 20;

struct Pool {
    free: Vec<Vec<f32>>,
    /// Largest vector capacity ever given back.
    largest: usize,
}

static FREE: Mutex<Pool> = Mutex::new(Pool {
    free: Vec::new(),
    largest: 0,
});

/// Most bytes kept: 32 MiB, or six of the largest vector seen (see the module docs).
fn cap_bytes(largest: usize) -> usize {
    MIN_CAP_BYTES.max(6 * largest * size_of::<f32>())
}

/// A vector of `len` values with unspecified contents: a kept vector of enough capacity
/// ([`pick`], resized to `len`), or a new zeroed one (of capacity [`size_class`] when it is
/// large enough to be kept).
pub(crate) fn take(len: usize) -> Vec<f32> {
    if len >= MIN_POOLED {
        let mut pool = FREE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pick(&pool.free, len) {
            let mut v = pool.free.swap_remove(i);
            drop(pool);
            v.resize(len, 0.0);
            return v;
        }
        let mut v = vec![0.0; size_class(len)];
        v.truncate(len);
        return v;
    }
    vec![0.0; len]
}

/// The capacity a new pooled vector gets for `len` values: `len` rounded up to a multiple of a
/// sixteenth of the largest power of two not above it (less than 6.25 % more). Batches of texts
/// differ in length by a few percent, and with exact sizes each batch's tensors were a little
/// too long for the vectors the previous one gave back: on 256-token texts nearly every tensor
/// was a fresh allocation, 1.3 to 1.8 million page faults per `bench embed` run (two
/// measurements) instead of 58 thousand.
fn size_class(len: usize) -> usize {
    let floor_pow2 = 1usize << len.max(1).ilog2();
    let step = (floor_pow2 / 16).max(1);
    len.next_multiple_of(step)
}

/// Which kept vector serves a request for `len` values: the smallest capacity that holds it
/// (so that the large vectors stay for the large requests: a new one costs page faults), and
/// among equal capacities the one that needs the fewest zeros written past its length.
fn pick(free: &[Vec<f32>], len: usize) -> Option<usize> {
    free.iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= len)
        .min_by_key(|(_, v)| (v.capacity(), len.saturating_sub(v.len())))
        .map(|(i, _)| i)
}

/// Keeps `v` (at its length) for a later [`take`] when it is large enough, dropping the
/// smallest kept vectors while the pool is over its count or byte bound.
pub(crate) fn give(v: Vec<f32>) {
    if v.capacity() < MIN_POOLED {
        return;
    }
    let mut pool = FREE.lock().unwrap_or_else(|e| e.into_inner());
    let dropped = keep(&mut pool, v);
    drop(pool);
    drop(dropped); // freed outside the lock
}

/// Adds `v` to `pool`, then takes the smallest kept vectors out while the pool is over its
/// count or byte bound; returns them (for the caller to free).
fn keep(pool: &mut Pool, v: Vec<f32>) -> Vec<Vec<f32>> {
    pool.largest = pool.largest.max(v.capacity());
    let cap = cap_bytes(pool.largest);
    let free = &mut pool.free;
    free.push(v);
    let mut dropped = Vec::new();
    // Over either bound: let the smallest go first (the large ones cost the most to fault in).
    while free.len() > MAX_KEPT
        || free
            .iter()
            .map(|v| v.capacity() * size_of::<f32>())
            .sum::<usize>()
            > cap
    {
        let Some(i) = free
            .iter()
            .enumerate()
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)
        else {
            break;
        };
        dropped.push(free.swap_remove(i));
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool is process-wide and tests run in parallel, so this test only relies on what no
    /// other test can change: lengths, and that a kept vector comes back.
    #[test]
    fn buffers_come_back_with_the_requested_length() {
        let len = MIN_POOLED + 12_345;
        let mut v = take(len);
        assert_eq!(v.len(), len);
        v.fill(7.0);
        let ptr = v.as_ptr();
        give(v);
        // Somewhat shorter requests may reuse it; every element is initialized either way.
        let w = take(len - 100);
        assert_eq!(w.len(), len - 100);
        assert!(w.iter().all(|x| *x == 7.0 || *x == 0.0));
        let reused = w.as_ptr() == ptr;
        give(w);
        let x = take(len);
        assert_eq!(x.len(), len);
        if reused {
            // The shortened vector grew back within its capacity, zeros past its old end.
            assert!(x[len - 100..].iter().all(|v| *v == 0.0 || *v == 7.0));
        }
        // Small requests never touch the pool.
        assert_eq!(take(10), vec![0.0; 10]);
    }

    /// A vector comes back at its tensor's length; a request goes to the smallest capacity that
    /// holds it, and among equal capacities to the vector that needs the fewest new zeros.
    #[test]
    fn requests_go_to_the_smallest_capacity_then_the_fewest_new_zeros() {
        let kept = |len: usize, cap: usize| {
            let mut v = Vec::with_capacity(cap);
            v.resize(len, 1.0f32);
            assert_eq!(v.capacity(), cap);
            v
        };
        let m = 1 << 20;
        let free = vec![kept(4 * m, 16 * m), kept(8 * m, 8 * m), kept(m, 4 * m)];
        assert_eq!(pick(&free, 2 * m), Some(2));
        assert_eq!(pick(&free, 4 * m), Some(2));
        assert_eq!(pick(&free, 6 * m), Some(1));
        assert_eq!(pick(&free, 12 * m), Some(0));
        assert_eq!(pick(&free, 17 * m), None);
        let same = vec![kept(m, 4 * m), kept(3 * m, 4 * m), kept(2 * m, 4 * m)];
        assert_eq!(pick(&same, 4 * m), Some(1));
        assert_eq!(pick(&same, m), Some(0));
        // What `take` then does with it: zeros over the gap only, inside the capacity.
        let mut v = kept(m, 4 * m);
        let ptr = v.as_ptr();
        v.resize(3 * m, 0.0);
        assert!(v.as_ptr() == ptr && v[..m].iter().all(|x| *x == 1.0));
        assert!(v[m..].iter().all(|x| *x == 0.0));
    }

    /// Every tensor one layer of a llama-3.2-1b-shaped 512-token prefill gives back is kept
    /// (none is dropped to be mapped again by the next layer), and the byte bound still holds.
    #[test]
    fn a_decoder_layers_tensors_are_all_kept() {
        let (hidden, kv, ffn) = (512 * 2048, 512 * 512, 512 * 8192);
        let layer = [
            hidden, hidden, kv, kv, hidden, hidden, hidden, hidden, ffn, ffn, ffn, hidden, hidden,
        ];
        let mut pool = Pool {
            free: Vec::new(),
            largest: 0,
        };
        for len in layer {
            assert!(keep(&mut pool, Vec::with_capacity(len)).is_empty(), "{len}");
        }
        assert_eq!(pool.free.len(), layer.len());
        // A second layer's worth no longer fits: the smallest go first.
        let mut dropped = Vec::new();
        for len in layer {
            dropped.extend(keep(&mut pool, Vec::with_capacity(len)));
        }
        let bytes: usize = pool.free.iter().map(|v| v.capacity() * 4).sum();
        assert!(bytes <= cap_bytes(ffn) && !dropped.is_empty());
        assert!(dropped.iter().all(|v| v.capacity() <= hidden));
    }

    #[test]
    fn size_classes_round_up_by_at_most_a_sixteenth() {
        for len in [MIN_POOLED, MIN_POOLED + 1, 2_333_333, 8192 * 384, 6_000_001] {
            let c = size_class(len);
            assert!(c >= len && c - len <= len / 16, "{len} -> {c}");
        }
        // Lengths a few percent apart share a class, so one's vector serves the other.
        assert_eq!(size_class(2_300_000), size_class(2_350_000));
        let v = take(MIN_POOLED + 1);
        assert!(v.len() == MIN_POOLED + 1 && v.capacity() >= size_class(MIN_POOLED + 1));
    }
}
