//! How steady the core's matrix units are on this host: a loop of AMX `tdpbssd` (four
//! independent 16 x 16 x 64 tile products, registers only) and a loop of 512-bit `vpdpbusd`
//! (eight independent chains), each timed in slices of about a millisecond for SECONDS seconds,
//! printed as percentiles of the time per instruction. No memory is touched, so what moves is
//! the unit's rate: on a virtual machine whose core is shared (another tenant on the sibling
//! hyperthread), AMX products that take twice their usual time in stretches show up here while
//! the vector loop stays put, and kiln's prefill on tiles swings with them.
//!
//! `cargo run --release -p kiln-cpu --example unit_steadiness [SECONDS] [RUNS]` (2 and 3 by
//! default). AMX runs only where kiln itself would use it (`kiln_cpu::kernels::amx_granted`:
//! CPUID reports AMX-INT8, `KILN_AMX` allows it and Linux grants the tile data); the vector loop
//! only where the CPU has AVX-512 VNNI.

#[cfg(target_arch = "x86_64")]
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let runs: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    // kiln's own grant (CPUID, `KILN_AMX`, then the request to Linux, once per process).
    let amx = kiln_cpu::kernels::amx_granted();
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni");
    if !amx {
        println!(
            "no AMX: the CPU lacks AMX-INT8, KILN_AMX refuses it or the OS refused the tile data"
        );
    }
    if !vnni {
        println!("no AVX-512 VNNI");
    }
    for run in 0..runs {
        if amx {
            // SAFETY: the tile data was granted and the CPU has AMX-INT8.
            let ns = slices(secs, 80_000, || unsafe { amx::products(20_000) });
            report(run, "tdpbssd", &ns);
        }
        if vnni {
            // SAFETY: the CPU has AVX-512 F and VNNI.
            let ns = slices(secs, 160_000, || unsafe { vnni::products(20_000) });
            report(run, "vpdpbusd", &ns);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}

/// Runs `f` (which issues `per_call` instructions) for `secs` seconds; ns per instruction of
/// each call.
#[cfg(target_arch = "x86_64")]
fn slices(secs: f64, per_call: usize, mut f: impl FnMut()) -> Vec<f64> {
    let start = Instant::now();
    let mut ns = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        f();
        ns.push(t.elapsed().as_nanos() as f64 / per_call as f64);
    }
    ns.sort_by(f64::total_cmp);
    ns
}

#[cfg(target_arch = "x86_64")]
fn report(run: usize, what: &str, ns: &[f64]) {
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize];
    println!(
        "run {run}: {what:<9} ns per instruction over {} slices: min {:.3}  p10 {:.3}  p50 {:.3}  p90 {:.3}  max {:.3}  (p90 / min {:.2})",
        ns.len(),
        at(0.0),
        at(0.1),
        at(0.5),
        at(0.9),
        at(1.0),
        at(0.9) / at(0.0)
    );
}

#[cfg(target_arch = "x86_64")]
mod amx {
    use std::arch::asm;

    /// The tile configuration: all eight tiles 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    /// `n` rounds of four independent tile products on zeroed tiles.
    ///
    /// # Safety
    /// `kiln_cpu::kernels::amx_granted()` returned true.
    pub unsafe fn products(n: usize) {
        let mut c = Config([0; 64]);
        c.0[0] = 1;
        for t in 0..8 {
            c.0[16 + 2 * t] = 64;
            c.0[48 + t] = 16;
        }
        // SAFETY: the grant (the caller's contract); the configuration is 64 readable bytes;
        // every tile is configured before it is zeroed and used, and released at the end.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) c.0.as_ptr(), options(nostack, readonly));
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "tilezero tmm4",
                "tilezero tmm5",
                "tilezero tmm6",
                "tilezero tmm7",
                options(nostack, nomem)
            );
            for _ in 0..n {
                asm!(
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    options(nostack, nomem)
                );
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    /// `n` rounds of eight independent `vpdpbusd` chains.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn products(n: usize) {
        let (a, b) = (_mm512_set1_epi8(3), _mm512_set1_epi8(5));
        let mut acc = [_mm512_setzero_si512(); 8];
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, a, b);
            }
        }
        std::hint::black_box(acc);
    }
}
