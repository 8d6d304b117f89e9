//! [`KvElem`]: the element types a KV cache is stored in (f32, f16), as the attention kernels
//! read them: widened to f32 exactly, one at a time (portable code) or eight or sixteen at a time
//! (F16C's and AVX-512's `vcvtph2ps` for f16), so every path sees the same values.

use half::f16;

/// An element type a KV cache is stored in, as attention reads it: widened to f32 exactly, one
/// at a time or eight at a time.
pub(crate) trait KvElem: Copy + Send + Sync + 'static {
    /// Elements per 64-byte cache line.
    const PER_LINE: usize;
    /// The value, exactly, as f32.
    fn get(self) -> f32;
    /// The stored bits (for a read whose value does not matter).
    fn bits(self) -> u32;
    /// Elements `p[0..8]`, widened to f32.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C and `p` addresses eight readable elements. Only called
    /// (inlined) from functions built with those features.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Elements `p[0..16]`, widened to f32.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and `p` addresses sixteen readable elements. Only called (inlined)
    /// from functions built with that feature.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Elements `lo[0..8]` in lanes 0..8 and `hi[0..8]` in lanes 8..16, widened to f32.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and DQ (and AVX2) and both pointers address eight readable elements.
    /// Only called (inlined) from functions built with those features.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8x2(lo: *const Self, hi: *const Self) -> std::arch::x86_64::__m512;
    /// `x` as elements of this type, when it is f32 (rows a block cache was dequantized to).
    fn from_f32s(x: &[f32]) -> Option<&[Self]>;
}

impl KvElem for f32 {
    const PER_LINE: usize = 16;

    #[inline(always)]
    fn get(self) -> f32 {
        self
    }

    #[inline(always)]
    fn bits(self) -> u32 {
        self.to_bits()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2(lo: *const f32, hi: *const f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (32 readable bytes at each, AVX-512 F/DQ).
        unsafe {
            _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm256_loadu_ps(lo)),
                _mm256_loadu_ps(hi),
            )
        }
    }

    #[inline(always)]
    fn from_f32s(x: &[f32]) -> Option<&[f32]> {
        Some(x)
    }
}

impl KvElem for f16 {
    const PER_LINE: usize = 32;

    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }

    #[inline(always)]
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (16 readable bytes, F16C).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (32 readable bytes, AVX-512 F).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2(lo: *const f16, hi: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (16 readable bytes at each, AVX-512 F, AVX2).
        unsafe {
            let lo = _mm256_castsi128_si256(_mm_loadu_si128(lo.cast()));
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(hi.cast())))
        }
    }

    #[inline(always)]
    fn from_f32s(_: &[f32]) -> Option<&[f16]> {
        None
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn the_vector_load_widens_as_the_scalar_one() {
        if !crate::kernels::simd_level().has_avx2() {
            return;
        }
        let vals: Vec<f16> = (0..8)
            .map(|i| f16::from_f32(i as f32 * 0.37 - 1.1))
            .collect();
        // SAFETY: the CPU has AVX2 and F16C (the level check); 8 readable elements.
        let got: [f32; 8] = unsafe { load8_f16c(vals.as_ptr()) };
        let want: Vec<f32> = vals.iter().map(|x| x.get()).collect();
        assert_eq!(got[..], want[..]);
    }

    /// # Safety
    /// As [`KvElem::load8`].
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8_f16c(p: *const f16) -> [f32; 8] {
        // SAFETY: the caller's contract; the transmute is between two 32-byte plain values.
        unsafe { std::mem::transmute(<f16 as KvElem>::load8(p)) }
    }
}
