//! [`CpuWeight`], a weight as the CPU backend holds it (a zero-copy view of the file's bytes,
//! and what is derived from it once: f32 values of vectors, the dense GEMM's packing, an
//! interleaved layout), and the [`Arena`] the interleaved layouts live in.
//!
//! Invariant: an [`Interleaved`] region lies inside its chunk, is written once (in
//! [`Interleaved::new`]) before any reader holds it, and is only read afterwards.

use std::sync::{Arc, OnceLock};

use kiln_backend::{shape_err, GptqMatrix, Result, WeightData};
use kiln_core::{GgmlType, SharedBytes};

use crate::kernels;
use crate::sgemm::{Isa, PackedWeight};
use crate::team::Team;

/// A weight on the CPU: a zero-copy view of the file's bytes (quantized blocks stay quantized).
/// One-dimensional f32 weights (norms, biases) are also decoded once into `values`.
#[derive(Clone, Debug)]
pub struct CpuWeight {
    pub(crate) ty: GgmlType,
    pub(crate) row_len: usize,
    pub(crate) n_rows: usize,
    pub(crate) row_bytes: usize,
    pub(crate) bytes: SharedBytes,
    pub(crate) values: Option<Vec<f32>>,
    /// A float matrix packed for the dense GEMM (`sgemm`), made on first dense use (F16 and
    /// BF16 kept in 16 bits, widened in registers); the error is kept so every later call
    /// reports it.
    pub(crate) packed: OnceLock<std::result::Result<PackedWeight, String>>,
    /// An F32 matrix split into BF16 parts for the AMX tiles (`sgemm::amx`), made on first use
    /// by a backend with [`CpuOptions::amx_float`](crate::CpuOptions::amx_float) (kept apart
    /// from `packed`, so that backends of both settings can share a weight).
    pub(crate) split: OnceLock<std::result::Result<PackedWeight, String>>,
    /// A GPTQ 4-bit matrix (then `ty` is I32, the checkpoint's word type, and `bytes` empty).
    pub(crate) gptq: Option<Arc<GptqMatrix>>,
    /// The matrix in an interleaved layout (`kernels::interleave`), which every product and
    /// embedding lookup then reads instead of `bytes`, whose pages were handed back (see
    /// [`CpuOptions::interleave`](crate::CpuOptions::interleave)).
    pub(crate) interleaved: Option<Arc<Interleaved>>,
}

/// A matrix in an interleaved layout (`kernels::interleave`), in memory of the backend's own
/// (see [`Arena`]).
#[derive(Debug)]
pub(crate) struct Interleaved {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
    /// The SIMD level whose products the layout is made for (`kernels::interleave`).
    pub(crate) level: kernels::SimdLevel,
    /// The layout's product (`kernels::interleaved_gemm_fn` of the weight's type and `level`,
    /// which the backend checked before interleaving).
    pub(crate) gemm: kernels::InterleavedGemmFn,
}

impl Interleaved {
    /// `data`'s matrix (`n_rows` rows of `row_bytes`, a whole number of groups of
    /// `kernels::INTERLEAVE_ROWS`) in the interleaved layout of its type for the products of
    /// `level`, in a fresh region of `arena`, copied on `team`; `gemm` is the layout's product.
    pub(crate) fn new(
        arena: &Arena,
        team: &Team,
        data: &WeightData,
        n_rows: usize,
        row_bytes: usize,
        level: kernels::SimdLevel,
        gemm: kernels::InterleavedGemmFn,
    ) -> std::io::Result<Interleaved> {
        let rows = kernels::INTERLEAVE_ROWS;
        let len = n_rows * row_bytes;
        let (chunk, offset) = arena.alloc(len)?;
        // SAFETY: the region is this call's alone (fresh from the arena) and inside the chunk;
        // nothing reads it before it is filled below.
        let dst = unsafe { std::slice::from_raw_parts_mut(chunk.base.add(offset), len) };
        // Pieces of whole groups, at most about 2 MiB and at least one per thread, in parallel;
        // each piece's source pages are released once it is copied (so that a large matrix is
        // never resident twice), and the whole matrix's at the end (the pages that straddle
        // two pieces).
        let group = rows * row_bytes;
        let piece = (len / team.threads()).clamp(group, (2 << 20).max(group)) / group * group;
        let k = data.row_len();
        team.for_each_chunk(dst, piece, |i, dst| {
            let src = &data.bytes[i * piece..i * piece + dst.len()];
            kernels::interleave(data.ty, level, k, src, dst);
            if let Some(done) = data.bytes.slice(i * piece..i * piece + dst.len()) {
                done.release_pages();
            }
        });
        data.bytes.release_pages();
        Ok(Interleaved {
            chunk,
            offset,
            len,
            level,
            gemm,
        })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the region lies inside the chunk (`Arena::alloc`), was written before this
        // value existed, and is never written again.
        unsafe { std::slice::from_raw_parts(self.chunk.base.add(self.offset), self.len) }
    }
}

/// One anonymous map of the [`Arena`], advised to transparent huge pages.
#[derive(Debug)]
struct Chunk {
    /// The map's first byte: regions are written through it, each once, before any reader
    /// holds them.
    base: *mut u8,
    _map: memmap2::MmapMut,
}

// SAFETY: `base` points into `_map`, owned here; every region is written once by its allocator
// before it is shared, and only read after (see `Arena::alloc`).
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

/// Memory for the interleaved weights: matrices smaller than a chunk are cut (64-byte aligned)
/// from anonymous maps of [`Arena::CHUNK`] bytes advised to huge pages, so that small matrices
/// also sit on 2 MiB pages (a map of its own per matrix of a few hundred KB gets 4 KiB pages,
/// and products that stream a matrix through 4 KiB pages miss the TLB far more than on the
/// GGUF loader's huge-page copy); larger matrices get a map of their own.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    /// The chunk being filled and its first free byte.
    current: std::sync::Mutex<Option<(Arc<Chunk>, usize)>>,
}

impl Arena {
    const CHUNK: usize = 32 << 20;

    /// A fresh region of `len` bytes, 64-byte aligned, and where to write it (once, before
    /// the region is read).
    fn alloc(&self, len: usize) -> std::io::Result<(Arc<Chunk>, usize)> {
        let new_chunk = |size: usize| -> std::io::Result<Arc<Chunk>> {
            let mut map = memmap2::MmapOptions::new().len(size.max(1)).map_anon()?;
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            Ok(Arc::new(Chunk {
                base: map.as_mut_ptr(),
                _map: map,
            }))
        };
        if len > Self::CHUNK / 2 {
            return Ok((new_chunk(len)?, 0));
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |(_, used): &(Arc<Chunk>, usize)| used.next_multiple_of(64) + len <= Self::CHUNK;
        if !current.as_ref().is_some_and(fits) {
            *current = Some((new_chunk(Self::CHUNK)?, 0));
        }
        let (chunk, used) = current.as_mut().expect("a chunk with room");
        let offset = used.next_multiple_of(64);
        *used = offset + len;
        Ok((chunk.clone(), offset))
    }
}

impl CpuWeight {
    pub(crate) fn row_bytes_of(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
    /// The weight packed for the dense GEMM, for float types: packed on first use (on `team`),
    /// then shared by every call. With `release_rows` (every product of this backend reads the
    /// panels), the pages of the file's rows are handed back once packed: they are read again
    /// only by an embedding lookup, which faults in just the rows it takes. With `split`, an F32
    /// weight split for the AMX tiles where `isa` has them (`PackedWeight::pack_for`).
    pub(crate) fn dense_packed(
        &self,
        team: &Team,
        release_rows: bool,
        split: Option<Isa>,
    ) -> Result<&PackedWeight> {
        let lock = if split.is_some() {
            &self.split
        } else {
            &self.packed
        };
        lock.get_or_init(|| {
            let packed = PackedWeight::pack_for(
                split,
                team,
                self.ty,
                &self.bytes,
                self.n_rows,
                self.row_len,
                self.row_bytes,
            );
            if release_rows && packed.is_ok() {
                self.bytes.release_pages();
            }
            packed
        })
        .as_ref()
        .map_err(|e| shape_err("dense matmul", e.clone()))
    }

    /// Whether this weight is held in an interleaved layout (see
    /// [`CpuOptions::interleave`](crate::CpuOptions::interleave)).
    pub fn is_interleaved(&self) -> bool {
        self.interleaved.is_some()
    }

    /// f32 values of a small vector weight.
    pub(crate) fn vector(&self, op: &'static str) -> Result<&[f32]> {
        self.values
            .as_deref()
            .ok_or_else(|| shape_err(op, "expected a one-dimensional weight"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_for_panels_only_hands_the_rows_pages_back_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let team = Team::new(1, "weight-test").unwrap();
        for release_rows in [false, true] {
            let released = Arc::new(AtomicUsize::new(0));
            let seen = released.clone();
            let data: Vec<u8> = (0..16 * 8).flat_map(|i| (i as f32).to_le_bytes()).collect();
            let bytes = SharedBytes::with_release(
                Arc::new(data),
                Arc::new(move |range: std::ops::Range<usize>| {
                    assert_eq!(range, 0..16 * 8 * 4);
                    seen.fetch_add(1, Ordering::SeqCst);
                }),
            );
            let w = CpuWeight {
                ty: GgmlType::F32,
                row_len: 8,
                n_rows: 16,
                row_bytes: 32,
                bytes,
                values: None,
                packed: OnceLock::new(),
                split: OnceLock::new(),
                gptq: None,
                interleaved: None,
            };
            w.dense_packed(&team, release_rows, None).unwrap();
            w.dense_packed(&team, release_rows, None).unwrap();
            assert_eq!(released.load(Ordering::SeqCst), usize::from(release_rows));
            // The rows read the same after the release (a lookup faults them in again).
            assert_eq!(w.row_bytes_of(3)[..4], 24f32.to_le_bytes());
        }
    }

    #[test]
    fn arena_regions_are_aligned_disjoint_and_large_ones_stand_alone() {
        let arena = Arena::default();
        let mut regions: Vec<(Arc<Chunk>, usize, usize)> = Vec::new();
        for len in [
            100,
            64,
            1,
            5000,
            Arena::CHUNK / 3,
            Arena::CHUNK / 3,
            Arena::CHUNK / 3,
            77,
        ] {
            let (chunk, offset) = arena.alloc(len).unwrap();
            assert_eq!(offset % 64, 0, "{len}");
            assert!(offset + len <= Arena::CHUNK);
            for (other, o, l) in &regions {
                if Arc::ptr_eq(other, &chunk) {
                    assert!(offset >= o + l || offset + len <= *o, "{len} overlaps");
                }
            }
            regions.push((chunk, offset, len));
        }
        // Three thirds of a chunk and what came before do not all fit in one chunk; the small
        // region after the third comes from the same (new) chunk.
        assert!(Arc::ptr_eq(&regions[0].0, &regions[5].0));
        assert!(!Arc::ptr_eq(&regions[0].0, &regions[6].0));
        assert!(Arc::ptr_eq(&regions[6].0, &regions[7].0));
        let (big, offset) = arena.alloc(Arena::CHUNK).unwrap();
        assert_eq!(offset, 0);
        assert!(regions.iter().all(|(c, _, _)| !Arc::ptr_eq(c, &big)));
        // The next small region still comes from the current shared chunk.
        let (next, _) = arena.alloc(10).unwrap();
        assert!(Arc::ptr_eq(&next, &regions[7].0));
    }
}
