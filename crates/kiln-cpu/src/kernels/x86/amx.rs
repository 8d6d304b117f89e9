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
    if let Some(v) = env {
        if matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        ) {
            return Err(Refusal::Disabled);
        }
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

/// Loads tile `t` (4..8: the operands, A in 4 and 5 and B in 6 and 7) from `base`, rows `stride`
/// bytes apart.
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
