#!/usr/bin/env python3
"""One line that says which CPU a benchmark row comes from, for the bench-* scripts.

    cpu: AMD EPYC, 2 logical CPUs; flags: avx2 fma f16c avx512f avx512bw ... ; no AMX; KILN_SIMD unset

The flags listed are the ones kiln's kernels (or its peers') choose between: the AVX2 and
AVX-512 families, VNNI, BF16 and AMX. Where the CPU lists AMX, the line says whether this process
may use it: Linux hands out the AMX tile state only after `arch_prctl(ARCH_REQ_XCOMP_PERM)`, and
a VM may refuse it (a peer built with -march=native then dies with SIGILL in its AMX path).
Run as a script it prints the line; the Python scripts import `describe()`.
"""

from __future__ import annotations

import ctypes
import os

# The flags, in /proc/cpuinfo's spelling, that decide which kernels run.
RELEVANT = [
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
]

ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86-64


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def amx_granted() -> bool:
    """Whether the kernel grants this process the AMX tile data state (x86-64 Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def describe() -> str:
    model, flags = _cpuinfo()
    have = [f for f in RELEVANT if f in flags]
    if "amx_tile" in flags:
        amx = "AMX granted" if amx_granted() else "AMX refused by the OS (arch_prctl)"
    else:
        amx = "no AMX"
    simd = os.environ.get("KILN_SIMD")
    cap = f"KILN_SIMD={simd} (kiln's SIMD level capped)" if simd else "KILN_SIMD unset"
    return (f"cpu: {model}, {os.cpu_count()} logical CPUs; flags: {' '.join(have) or 'none'}; "
            f"{amx}; {cap}")


if __name__ == "__main__":
    print(describe())
