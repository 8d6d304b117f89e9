//! Intel AMX (Advanced Matrix Extensions) tiles, used where the operating system grants them.
//!
//! AMX adds eight tile registers (up to 16 rows of 64 bytes each) and `tdpb*d`, which adds to a
//! tile of i32 sums the products of a tile of 8-bit values with another: `C[m][n] += sum over k
//! of A[m][k] * B[k / 4][4n + k % 4]`. B's layout is exactly a line of the interleaved weight
//! layouts (`kernels::interleaved`): the same 4 quants of 16 rows, 4 bytes a row. One instruction
//! does 16 x 16 x 64 multiply-adds, 16 times the work of a 512-bit `vpdpbusd`.
//!
//! **The grant.** The tile data is 8 KiB of register state that Linux hands a process only on
//! request: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`. Without it the first tile
//! instruction kills the process with SIGILL (a virtual machine may also refuse the request,
//! and llama.cpp built with `-march=native` dies there). [`granted`] makes the request once per
//! process, only when CPUID reports AMX-TILE and AMX-INT8, and says no on any failure, or when
//! `KILN_AMX=0` refuses it; the kernels that use tiles are handed out only after a yes, and the
//! products fall back to the VNNI kernels (same bits) otherwise.
//!
//! **Tile configuration.** [`Config`] names each tile's rows and bytes per row; a thread loads
//! it (`ldtilecfg`) before its first tile instruction and releases the tiles (`tilerelease`)
//! after its last, within one kernel call, so no tile state outlives a call or leaks to a thread
//! that did not load it.
//!
//! The tile instructions have no stable Rust intrinsics (`x86_amx_intrinsics` is unstable in
//! Rust 1.95), so they are written as inline assembly, each naming the tile registers it writes.

use std::arch::asm;
use std::sync::OnceLock;

/// `arch_prctl` codes and the tile data's feature number (Linux `asm/prctl.h`, `xstate`).
#[cfg(target_os = "linux")]
const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
/// The state component of the tile data (XFEATURE_XTILEDATA).
pub(crate) const XFEATURE_XTILEDATA: u64 = 18;

/// Why AMX is not used, when it is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// CPUID does not report AMX-TILE and AMX-INT8.
    NoCpuSupport,
    /// `KILN_AMX` is `0`, `off`, `false` or `no`.
    Disabled,
    /// The operating system refused the tile data (the errno of `arch_prctl`), or the request
    /// cannot be made on this operating system (`None`).
    Os(Option<i64>),
}

/// Whether this process may run tile instructions: CPUID has AMX-TILE and AMX-INT8, `KILN_AMX`
/// does not refuse them and the operating system granted the tile data. Decided once per process.
pub(crate) fn granted() -> bool {
    static GRANT: OnceLock<Result<(), Refusal>> = OnceLock::new();
    GRANT
        .get_or_init(|| {
            let env = std::env::var("KILN_AMX").ok();
            decide(env.as_deref(), cpu_has_amx_int8(), || {
                request_xcomp_perm(XFEATURE_XTILEDATA)
            })
        })
        .is_ok()
}

/// The decision of [`granted`] from the value of `KILN_AMX`, what CPUID says, and the request
/// to the operating system (made only when the first two allow it).
pub(crate) fn decide(
    env: Option<&str>,
    cpu: bool,
    request: impl FnOnce() -> Result<(), Refusal>,
) -> Result<(), Refusal> {
    if super::env_refuses(env) {
        return Err(Refusal::Disabled);
    }
    if !cpu {
        return Err(Refusal::NoCpuSupport);
    }
    request()
}

/// Whether CPUID reports AMX-TILE and AMX-INT8 (leaf 7, EDX bits 24 and 25).
pub(crate) fn cpu_has_amx_int8() -> bool {
    // Leaf 7 exists where leaf 0 says so; it reads as zeros on a CPU without AMX.
    let max = std::arch::x86_64::__cpuid(0).eax;
    if max < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Asks Linux for permission to use the extended state component `feature`
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, feature)`); the errno on refusal.
pub(crate) fn request_xcomp_perm(feature: u64) -> Result<(), Refusal> {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        let ret: i64;
        // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number by value and
        // changes only which state components the process may use; the syscall clobbers rcx and
        // r11, as declared.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") feature,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        if ret == 0 {
            Ok(())
        } else {
            Err(Refusal::Os(Some(-ret)))
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = feature;
        Err(Refusal::Os(None))
    }
}

/// A tile configuration (palette 1): the 64-byte block `ldtilecfg` reads.
#[repr(C, align(64))]
pub(super) struct Config([u8; 64]);

impl Config {
    /// A configuration with every tile unused.
    pub(super) const fn new() -> Config {
        let mut bytes = [0; 64];
        bytes[0] = 1;
        Config(bytes)
    }

    /// Tile `t` of `rows` rows of `bytes` bytes (at most 16 and 64).
    pub(super) const fn tile(mut self, t: usize, rows: u8, bytes: u16) -> Config {
        assert!(t < 8 && rows <= 16 && bytes <= 64);
        let b = bytes.to_le_bytes();
        self.0[16 + 2 * t] = b[0];
        self.0[17 + 2 * t] = b[1];
        self.0[48 + t] = rows;
        self
    }

    /// Loads this configuration into the calling thread's tile state.
    ///
    /// # Safety
    /// [`granted`] returned true.
    #[inline]
    pub(super) unsafe fn load(&self) {
        // SAFETY: the caller vouches for the grant; the block is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Releases the calling thread's tiles (back to the initial state).
///
/// # Safety
/// [`granted`] returned true.
#[inline]
pub(super) unsafe fn release() {
    // SAFETY: the caller vouches for the grant.
    unsafe {
        asm!(
            "tilerelease",
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack, nomem),
        )
    };
}

/// Loads tile `t` (4..8: the operands, A in 4 and 5 and B in 6 and 7; 0..4: sums, for the
/// float products' starting values) from `base`, rows `stride` bytes apart.
///
/// # Safety
/// A configuration is loaded on this thread (tile `t` as the caller expects), and every row of
/// the tile is readable.
#[inline(always)]
pub(super) unsafe fn load(t: usize, base: *const u8, stride: usize) {
    macro_rules! arm {
        ($tmm:tt) => {
            // SAFETY: the caller vouches for the configuration and the memory.
            unsafe {
                asm!(concat!("tileloadd ", $tmm, ", [{base} + {stride}*1]"),
                     base = in(reg) base, stride = in(reg) stride, out($tmm) _,
                     options(nostack, readonly))
            }
        };
    }
    match t {
        0 => arm!("tmm0"),
        1 => arm!("tmm1"),
        2 => arm!("tmm2"),
        3 => arm!("tmm3"),
        4 => arm!("tmm4"),
        5 => arm!("tmm5"),
        6 => arm!("tmm6"),
        _ => arm!("tmm7"),
    }
}

/// Zeroes the pair of sums `set` (tiles 0 and 1, or 2 and 3).
///
/// # Safety
/// A configuration is loaded on this thread.
#[inline(always)]
pub(super) unsafe fn zero_pair(set: usize) {
    // SAFETY: the caller vouches for the configuration.
    unsafe {
        if set == 0 {
            asm!("tilezero tmm0", "tilezero tmm1", out("tmm0") _, out("tmm1") _,
                 options(nostack, nomem))
        } else {
            asm!("tilezero tmm2", "tilezero tmm3", out("tmm2") _, out("tmm3") _,
                 options(nostack, nomem))
        }
    };
}

/// Tile `2 * set + w` (0..4: pair of accumulators `set`) += tile `4 + set` (A, signed bytes) x
/// tile `6 + w` (B): unsigned bytes for `w = 0` (`tdpbsud`), signed bytes for `w = 1`
/// (`tdpbssd`).
///
/// # Safety
/// A configuration is loaded on this thread and the tiles hold their operands.
#[inline(always)]
pub(super) unsafe fn product(set: usize, w: usize) {
    macro_rules! arm {
        ($op:tt, $c:tt, $a:tt, $b:tt) => {
            // SAFETY: the caller vouches for the configuration and the operands.
            unsafe {
                asm!(concat!($op, " ", $c, ", ", $a, ", ", $b),
                     out($c) _, options(nostack, nomem))
            }
        };
    }
    match (set, w) {
        (0, 0) => arm!("tdpbsud", "tmm0", "tmm4", "tmm6"),
        (0, _) => arm!("tdpbssd", "tmm1", "tmm4", "tmm7"),
        (_, 0) => arm!("tdpbsud", "tmm2", "tmm5", "tmm6"),
        _ => arm!("tdpbssd", "tmm3", "tmm5", "tmm7"),
    }
}

/// Stores tile `c` (0..4, the products) to `dst`, rows `stride` bytes apart.
///
/// # Safety
/// A configuration is loaded on this thread, and the tile's rows are writable at `dst`.
#[inline(always)]
pub(super) unsafe fn store(c: usize, dst: *mut u8, stride: usize) {
    macro_rules! arm {
        ($tmm:tt) => {
            // SAFETY: the caller vouches for the configuration and the memory.
            unsafe {
                asm!(concat!("tilestored [{base} + {stride}*1], ", $tmm),
                     base = in(reg) dst, stride = in(reg) stride, options(nostack))
            }
        };
    }
    match c {
        0 => arm!("tmm0"),
        1 => arm!("tmm1"),
        2 => arm!("tmm2"),
        _ => arm!("tmm3"),
    }
}

/// Whether CPUID reports AMX-BF16 (leaf 7, EDX bit 22), which the float products' tiles
/// (`tdpbf16ps`) need beside the grant of [`granted`].
pub(crate) fn cpu_has_amx_bf16() -> bool {
    let max = std::arch::x86_64::__cpuid(0).eax;
    max >= 7 && std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 22) != 0
}

/// The float products' configuration: all eight tiles 16 rows of 64 bytes (sums: 16 × 16 f32;
/// operands: 16 rows of 16 BF16 pairs).
const SPLIT_CONFIG: Config = {
    let mut c = Config::new();
    let mut t = 0;
    while t < 8 {
        c = c.tile(t, 16, 64);
        t += 1;
    }
    c
};

/// Bytes of one operand tile of the float products: 16 rows of 64 bytes.
pub(crate) const SPLIT_TILE_BYTES: usize = 1024;

/// The tiles of the calling thread configured for the float products (`crate::sgemm::amx`),
/// from [`SplitTiles::begin`] until dropped (which releases them). Not `Send`: the tile state
/// belongs to the thread that loaded it.
pub(crate) struct SplitTiles(std::marker::PhantomData<*const ()>);

impl SplitTiles {
    /// Configures the calling thread's tiles.
    ///
    /// # Safety
    /// [`granted`] and [`cpu_has_amx_bf16`] returned true.
    pub(crate) unsafe fn begin() -> SplitTiles {
        // SAFETY: the caller vouches for the grant.
        unsafe { SPLIT_CONFIG.load() };
        SplitTiles(std::marker::PhantomData)
    }

    /// The 32 × 32 sums of two 16-row halves of activations by two 16-column weight panels over
    /// `chunks` chunks of 32 k-steps, each value split in two BF16 parts (`hi`, `lo`), started
    /// from `init` (each row of the block starts as `init[c]`: the bias, or zeros): per chunk
    /// `hi·lo`, `hi·hi`, then `lo·hi` are added to the sums (`tdpbf16ps`: each BF16 product
    /// exact, added into the f32 sum in order of k). Stored at `out`, 32 rows of 32 f32 with
    /// rows `ld` bytes apart (row `r`, column `c`: half `r / 16`, panel `c / 16`).
    ///
    /// Activations: `a[h]` is the hi part of the first row of half `h` at k = 0, rows `stride`
    /// bytes apart, 32 BF16 values (64 bytes) per chunk; each row's lo part starts `lo` bytes
    /// after its hi part. Weights: `b[j]` is panel `j`'s first chunk, chunk `c` its hi tile at
    /// `b[j] + 2c·1024` and its lo tile 1024 bytes after (16 rows of 16 column pairs of k-steps
    /// `2i, 2i + 1`, the layout `tdpbf16ps` multiplies).
    ///
    /// # Safety
    /// Every row of every operand tile named above is readable, and the 32 rows of 128 bytes at
    /// `out` are writable and not accessed by another thread.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn block(
        &self,
        chunks: usize,
        a: [*const u8; 2],
        lo: usize,
        stride: usize,
        b: [*const u8; 2],
        init: &[f32; 32],
        (out, ld): (*mut u8, usize),
    ) {
        // SAFETY: the configuration is loaded (`self` exists on this thread), `init` is 128
        // readable bytes (each tile reads one 64-byte row 16 times: stride 0), and the caller
        // vouches for the operands and `out`.
        unsafe {
            let init = init.as_ptr().cast::<u8>();
            load(0, init, 0);
            load(1, init.add(64), 0);
            load(2, init, 0);
            load(3, init.add(64), 0);
            for c in 0..chunks {
                let (a0, a1) = (a[0].add(64 * c), a[1].add(64 * c));
                let b0 = b[0].add(2 * SPLIT_TILE_BYTES * c);
                let b1 = b[1].add(2 * SPLIT_TILE_BYTES * c);
                split_chunk([a0, a1, a0.add(lo), a1.add(lo)], stride, [b0, b1]);
            }
            store(0, out, ld);
            store(1, out.add(64), ld);
            store(2, out.add(16 * ld), ld);
            store(3, out.add(16 * ld + 64), ld);
        }
    }
}

impl Drop for SplitTiles {
    fn drop(&mut self) {
        // SAFETY: `begin` loaded a configuration on this thread, so the grant was made.
        unsafe { release() };
    }
}

/// One chunk of [`SplitTiles::block`]: `hi·lo`, `hi·hi`, then `lo·hi` into every sum, eight
/// tile loads for twelve products. Each load is placed right after the last product that reads
/// the tile it overwrites, so it can overlap the products that follow.
///
/// # Safety
/// The float products' configuration is loaded on this thread; `a` holds the hi rows of both
/// halves then their lo rows (16 rows `stride` bytes apart, 64 bytes each), `b` each panel's
/// hi tile with its lo tile 1024 bytes after it, all readable.
#[inline(always)]
unsafe fn split_chunk(a: [*const u8; 4], stride: usize, b: [*const u8; 2]) {
    // SAFETY: the caller vouches for the configuration and the memory.
    unsafe {
        asm!(
            "tileloadd tmm4, [{a0} + {sa}*1]",
            "tileloadd tmm6, [{b0} + {sb}*1 + 1024]",
            "tileloadd tmm5, [{a1} + {sa}*1]",
            "tileloadd tmm7, [{b1} + {sb}*1 + 1024]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm6, [{b0} + {sb}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "tileloadd tmm7, [{b1} + {sb}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm4, [{a0l} + {sa}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "tileloadd tmm5, [{a1l} + {sa}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            a0 = in(reg) a[0], a1 = in(reg) a[1], a0l = in(reg) a[2], a1l = in(reg) a[3],
            b0 = in(reg) b[0], b1 = in(reg) b[1], sa = in(reg) stride, sb = in(reg) 64usize,
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack, readonly),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grant_follows_the_environment_the_cpu_and_the_os() {
        let yes = || Ok(());
        let os_no = || Err(Refusal::Os(Some(22)));
        for off in ["0", "off", "OFF", " false ", "no"] {
            assert_eq!(
                decide(Some(off), true, yes),
                Err(Refusal::Disabled),
                "{off:?}"
            );
        }
        // No request is made where the environment or the CPU already says no.
        let never = || -> Result<(), Refusal> { panic!("asked the OS") };
        assert_eq!(decide(Some("0"), true, never), Err(Refusal::Disabled));
        assert_eq!(decide(None, false, never), Err(Refusal::NoCpuSupport));
        assert_eq!(decide(Some("1"), false, never), Err(Refusal::NoCpuSupport));
        assert_eq!(decide(None, true, yes), Ok(()));
        assert_eq!(decide(Some("1"), true, yes), Ok(()));
        // The OS's refusal is a clean no, not a fault.
        assert_eq!(decide(None, true, os_no), Err(Refusal::Os(Some(22))));
    }

    /// A refused request (a state component that does not exist) comes back as an error from
    /// the real system call, on any host: the path a VM that refuses the tile data takes.
    #[test]
    fn a_refused_request_is_an_error() {
        assert!(matches!(request_xcomp_perm(63), Err(Refusal::Os(_))));
    }

    /// Where the CPU reports AMX, the grant follows the OS's answer; elsewhere it is never given.
    #[test]
    fn no_grant_without_the_cpu() {
        if !cpu_has_amx_int8() {
            assert!(!granted());
        }
    }
}
