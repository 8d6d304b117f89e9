/*
 * cpuid-cap: makes a peer engine see an AVX2-only x86-64 CPU, for side-by-side benchmarks that
 * set kiln under KILN_SIMD=avx2 beside a peer on the same instructions.
 *
 * Loaded with LD_PRELOAD (scripts/bench-embed --peer-isa avx2 builds and uses it). Its
 * constructor asks Linux to make the CPUID instruction fault in this process
 * (arch_prctl(ARCH_SET_CPUID, 0); kept across fork and clone, reset by execve, so every thread
 * the peer starts inherits it and every program it execs loads this again). A SIGSEGV handler
 * then runs each CPUID for the program, with CPUID enabled for that one instruction, and clears
 * the feature bits of what an AVX2-only host (AMD Zen 2/3, Intel before Ice Lake) lacks:
 * every AVX-512 subset, AVX-VNNI, AVX512-BF16/FP16 and AMX. AVX2, FMA, F16C, BMI1/2 stay.
 *
 * Libraries that pick kernels from CPUID at run time (ONNX Runtime's MLAS, PyTorch's ATen and
 * oneDNN, MKL, NumPy) then choose their AVX2 kernels; `torch.backends.cpu.get_cpu_capability()`
 * reads "AVX2" under it. What it cannot hide: instructions compiled in unconditionally, and
 * glibc's own string functions (the dynamic loader reads CPUID before any preload runs).
 *
 * A program that later installs its own SIGSEGV handler and then runs CPUID dies of the fault
 * (Python's faulthandler, when enabled, is one); ONNX Runtime and PyTorch do not.
 *
 * Needs a CPU (or hypervisor) with CPUID faulting: the "cpuid_fault" flag in /proc/cpuinfo.
 * Without it the constructor says so on stderr and the process exits with status 97, rather
 * than measure an uncapped peer by mistake.
 *
 * Build: cc -O2 -shared -fPIC -o cpuid-cap.so scripts/cpuid-cap.c
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* Leaf 7, sub-leaf 0. EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31. */
#define L7_EBX_MASK ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | \
                     (1u << 28) | (1u << 30) | (1u << 31))
/* ECX: AVX512_VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14. */
#define L7_ECX_MASK ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
/* EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX_BF16 22, AVX512_FP16 23, AMX_TILE 24,
 * AMX_INT8 25. */
#define L7_EDX_MASK ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | \
                     (1u << 24) | (1u << 25))
/* Leaf 7, sub-leaf 1. EAX: AVX_VNNI 4, AVX512_BF16 5. */
#define L7S1_EAX_MASK ((1u << 4) | (1u << 5))

static void say(const char *msg) {
    ssize_t ignored = write(2, msg, strlen(msg));
    (void)ignored;
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)info;
    greg_t *r = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    if (ip[0] != 0x0f || ip[1] != 0xa2) {
        /* A real fault: let it take its default course when the instruction runs again. */
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX], a, b, c, d;
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __cpuid_count(leaf, sub, a, b, c, d);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    if (leaf == 7 && sub == 0) {
        b &= ~L7_EBX_MASK;
        c &= ~L7_ECX_MASK;
        d &= ~L7_EDX_MASK;
    } else if (leaf == 7 && sub == 1) {
        a &= ~L7S1_EAX_MASK;
    }
    r[REG_RAX] = a;
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
}

__attribute__((constructor)) static void cpuid_cap_init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGSEGV, &sa, 0) != 0 || syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        say("cpuid-cap: this CPU or kernel cannot make CPUID fault (no cpuid_fault in "
            "/proc/cpuinfo?); refusing to run the peer uncapped\n");
        _exit(97);
    }
}
