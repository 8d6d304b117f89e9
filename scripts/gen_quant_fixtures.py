#!/usr/bin/env python3
"""Generate the dequantization fixtures of kiln-quant from an independent reference.

The reference is the PyPI `gguf` package (llama.cpp's own Python library, a numpy
re-implementation of ggml's dequantizers that shares no code with kiln). Run once, from the
repository root, and commit the result:

    pip install gguf numpy
    python scripts/gen_quant_fixtures.py

For every type it writes, under crates/kiln-quant/tests/fixtures/:

    <TYPE>.bin   raw blocks, exactly as they would sit in a GGUF file
    <TYPE>.f32   the expected dequantized values, little-endian f32

and README.md naming the gguf and numpy versions used. The blocks are random bytes whose scale
fields are overwritten with finite, moderate values (|d| in [1e-3, 1], random sign), so that no
NaN or Inf enters the expected output. Block 0 has every quant byte 0x00 and block 1 every quant
byte 0xFF, so the extreme codes of each format are always covered.

With `--llama-cpp DIR` (a llama.cpp checkout, e.g. the vendor/llama.cpp of the llama-cpp-python
sdist: `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`) it also compiles
ggml's own scalar code with gcc (`ggml-quants.c` and `ggml-cpu/quants.c`, built with
GGML_CPU_GENERIC and -ffp-contract=off, so no SIMD path and no FMA contraction) and records, for
each quantized weight type, random activations and what ggml makes of them:

    <TYPE>.dot.x     activations, little-endian f32 (rows of the fixture's length)
    <TYPE>.dot.act   ggml's quantize_row_q8_0_ref / q8_1_ref / q8_K_ref of each row
    <TYPE>.dot.out   ggml's ggml_vec_dot_<type>_<q8> of the <TYPE>.bin row with each, f32

and, for every type kiln quantizes weights to (F16, BF16, the legacy and k-quant formats, and
Q8_K), f32 inputs and what ggml's reference quantizer makes of them:

    <TYPE>.quant.x     inputs, little-endian f32, a whole number of blocks
    <TYPE>.quant.bin   ggml's quantize_row_<type>_ref of them (F16: ggml_fp32_to_fp16_row,
                       BF16: ggml_fp32_to_bf16_row_ref), the bytes a GGUF file would hold

The inputs are one block per case: typical weights (normal, sigma 0.02), an all-zero block, a
block with one huge outlier, tiny values (1e-6, and 1e-18, below ggml's GROUP_MAX_EPS), a
negative-only, a positive-only and a constant negative block, uniform and heavy-tailed values,
a block that is half zeros, and a few more normal blocks. F16/BF16 get rounding ties, subnormals,
overflow, signed zeros, infinities and NaNs with payloads instead.

Without the flag those files are left as they are.

gguf has no Q8_K dequantizer (Q8_K is an activation format that never appears in model files).
Its expected values are computed here in numpy straight from the definition in ggml-quants.c
(`dequantize_row_q8_K`: x = d * q with an f32 d and signed 8-bit q), marked as such in the README.
The output is deterministic: the random generator has a fixed seed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import subprocess
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 20250114
OUT = pathlib.Path(__file__).resolve().parent.parent / "crates" / "kiln-quant" / "tests" / "fixtures"
QK_K = 256

# type -> (elements per block, bytes per block, [(offset, kind)] scale fields, number of blocks)
# kind "f16" / "f32" fields get finite, moderate values; everything else stays random.
LAYOUTS: dict[str, tuple[int, int, list[tuple[int, str]], int]] = {
    "Q4_0": (32, 18, [(0, "f16")], 16),
    "Q4_1": (32, 20, [(0, "f16"), (2, "f16")], 16),
    "Q5_0": (32, 22, [(0, "f16")], 16),
    "Q5_1": (32, 24, [(0, "f16"), (2, "f16")], 16),
    "Q8_0": (32, 34, [(0, "f16")], 16),
    "Q2_K": (QK_K, 84, [(80, "f16"), (82, "f16")], 8),
    "Q3_K": (QK_K, 110, [(108, "f16")], 8),
    "Q4_K": (QK_K, 144, [(0, "f16"), (2, "f16")], 8),
    "Q5_K": (QK_K, 176, [(0, "f16"), (2, "f16")], 8),
    "Q6_K": (QK_K, 210, [(208, "f16")], 8),
    "Q8_K": (QK_K, 292, [(0, "f32")], 8),
}
FLOAT_ELEMENTS = 512
# Rows of activations per weight block size (the legacy rows are short, so a few more of them).
DOT_ROUNDS = {32: 4, QK_K: 2}
# weight type -> (activation format, ggml's scalar dot for the pair)
GGML_DOTS = {
    "Q4_0": ("Q8_0", "ggml_vec_dot_q4_0_q8_0"),
    "Q4_1": ("Q8_1", "ggml_vec_dot_q4_1_q8_1"),
    "Q5_0": ("Q8_0", "ggml_vec_dot_q5_0_q8_0"),
    "Q5_1": ("Q8_1", "ggml_vec_dot_q5_1_q8_1"),
    "Q8_0": ("Q8_0", "ggml_vec_dot_q8_0_q8_0"),
    "Q2_K": ("Q8_K", "ggml_vec_dot_q2_K_q8_K"),
    "Q3_K": ("Q8_K", "ggml_vec_dot_q3_K_q8_K"),
    "Q4_K": ("Q8_K", "ggml_vec_dot_q4_K_q8_K"),
    "Q5_K": ("Q8_K", "ggml_vec_dot_q5_K_q8_K"),
    "Q6_K": ("Q8_K", "ggml_vec_dot_q6_K_q8_K"),
}
ACT_BLOCK = {"Q8_0": (32, 34), "Q8_1": (32, 36), "Q8_K": (QK_K, 292)}
# Types whose reference quantizer is recorded, with ggml's function for it.
GGML_QUANTIZERS = {
    "F16": "ggml_fp32_to_fp16_row",
    "BF16": "ggml_fp32_to_bf16_row_ref",
    **{name: f"quantize_row_{name.lower().replace('_k', '_K')}_ref"
       for name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]},
}
# Extra normal blocks after the special cases (legacy blocks are short, so more of them).
QUANT_EXTRA_BLOCKS = {32: 20, QK_K: 1}

# A tiny driver around ggml's C: argv = dot name, activation format, n, weights, x, act out, dot out.
HARNESS_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*quant_fn)(const float *, void *, int64_t);
#define DOT(name) void name(int, float *, size_t, const void *, size_t, const void *, size_t, int);
DOT(ggml_vec_dot_q4_0_q8_0) DOT(ggml_vec_dot_q4_1_q8_1) DOT(ggml_vec_dot_q5_0_q8_0)
DOT(ggml_vec_dot_q5_1_q8_1) DOT(ggml_vec_dot_q8_0_q8_0) DOT(ggml_vec_dot_q2_K_q8_K)
DOT(ggml_vec_dot_q3_K_q8_K) DOT(ggml_vec_dot_q4_K_q8_K) DOT(ggml_vec_dot_q5_K_q8_K)
DOT(ggml_vec_dot_q6_K_q8_K)
void quantize_row_q8_0_ref(const float *, void *, int64_t);
void quantize_row_q8_1_ref(const float *, void *, int64_t);
void quantize_row_q8_K_ref(const float *, void *, int64_t);
#define QUANT(name) void name(const float *, void *, int64_t);
QUANT(quantize_row_q4_0_ref) QUANT(quantize_row_q4_1_ref) QUANT(quantize_row_q5_0_ref)
QUANT(quantize_row_q5_1_ref) QUANT(quantize_row_q2_K_ref) QUANT(quantize_row_q3_K_ref)
QUANT(quantize_row_q4_K_ref) QUANT(quantize_row_q5_K_ref) QUANT(quantize_row_q6_K_ref)
/* GGML_FP32_TO_FP16 / _BF16 of ggml-impl.h, in their own file (see F16_C). */
void kiln_fp32_to_fp16_row(const float *, void *, int64_t);
void kiln_fp32_to_bf16_row(const float *, void *, int64_t);
/* What the rest of ggml would provide: the f16 table of the CPU backend and error hooks. */
float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char *file, int line, const char *fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(int type, int64_t n) { abort(); }
size_t ggml_type_size(int type) { abort(); }
const char *ggml_type_name(int type) { return "?"; }
static void *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END); *len = ftell(f); fseek(f, 0, SEEK_SET);
    void *buf = malloc(*len + 64);
    if (fread(buf, 1, *len, f) != (size_t)*len) exit(1);
    fclose(f);
    return buf;
}
/* argv = quant, ggml function, x file, bytes per element block, elements per block, out file. */
static int quant_main(char **argv) {
    struct { const char *name; quant_fn fn; } fns[] = {
        {"ggml_fp32_to_fp16_row", kiln_fp32_to_fp16_row}, {"ggml_fp32_to_bf16_row_ref", kiln_fp32_to_bf16_row},
        {"quantize_row_q4_0_ref", quantize_row_q4_0_ref}, {"quantize_row_q4_1_ref", quantize_row_q4_1_ref},
        {"quantize_row_q5_0_ref", quantize_row_q5_0_ref}, {"quantize_row_q5_1_ref", quantize_row_q5_1_ref},
        {"quantize_row_q8_0_ref", quantize_row_q8_0_ref}, {"quantize_row_q2_K_ref", quantize_row_q2_K_ref},
        {"quantize_row_q3_K_ref", quantize_row_q3_K_ref}, {"quantize_row_q4_K_ref", quantize_row_q4_K_ref},
        {"quantize_row_q5_K_ref", quantize_row_q5_K_ref}, {"quantize_row_q6_K_ref", quantize_row_q6_K_ref},
        {"quantize_row_q8_K_ref", quantize_row_q8_K_ref}};
    quant_fn fn = NULL;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) if (!strcmp(argv[2], fns[i].name)) fn = fns[i].fn;
    if (!fn) return 3;
    long xl;
    float *x = slurp(argv[3], &xl);
    size_t type_size = atoi(argv[4]), block = atoi(argv[5]), n = xl / 4;
    size_t out_len = n / block * type_size;
    unsigned char *out = calloc(out_len + 64, 1);
    fn(x, out, n);
    FILE *fo = fopen(argv[6], "wb"); fwrite(out, 1, out_len, fo); fclose(fo);
    return 0;
}
int main(int argc, char **argv) {
    for (int i = 0; i < (1 << 16); i++) { uint16_t h = i; _Float16 v; memcpy(&v, &h, 2); ggml_table_f32_f16[i] = v; }
    if (argc == 7 && !strcmp(argv[1], "quant")) return quant_main(argv);
    if (argc != 8) return 2;
    struct { const char *name; dot_fn fn; } dots[] = {
        {"ggml_vec_dot_q4_0_q8_0", ggml_vec_dot_q4_0_q8_0}, {"ggml_vec_dot_q4_1_q8_1", ggml_vec_dot_q4_1_q8_1},
        {"ggml_vec_dot_q5_0_q8_0", ggml_vec_dot_q5_0_q8_0}, {"ggml_vec_dot_q5_1_q8_1", ggml_vec_dot_q5_1_q8_1},
        {"ggml_vec_dot_q8_0_q8_0", ggml_vec_dot_q8_0_q8_0}, {"ggml_vec_dot_q2_K_q8_K", ggml_vec_dot_q2_K_q8_K},
        {"ggml_vec_dot_q3_K_q8_K", ggml_vec_dot_q3_K_q8_K}, {"ggml_vec_dot_q4_K_q8_K", ggml_vec_dot_q4_K_q8_K},
        {"ggml_vec_dot_q5_K_q8_K", ggml_vec_dot_q5_K_q8_K}, {"ggml_vec_dot_q6_K_q8_K", ggml_vec_dot_q6_K_q8_K}};
    dot_fn dot = NULL;
    for (size_t i = 0; i < sizeof dots / sizeof dots[0]; i++) if (!strcmp(argv[1], dots[i].name)) dot = dots[i].fn;
    if (!dot) return 3;
    quant_fn quant = !strcmp(argv[2], "Q8_0") ? quantize_row_q8_0_ref
                   : !strcmp(argv[2], "Q8_1") ? quantize_row_q8_1_ref : quantize_row_q8_K_ref;
    size_t act_bytes = !strcmp(argv[2], "Q8_0") ? 34 : !strcmp(argv[2], "Q8_1") ? 36 : 292;
    size_t act_block = !strcmp(argv[2], "Q8_K") ? 256 : 32;
    int n = atoi(argv[3]);
    long wl, xl;
    void *w = slurp(argv[4], &wl);
    float *x = slurp(argv[5], &xl);
    int rows = xl / (4 * n);
    size_t row_act = n / act_block * act_bytes;
    unsigned char *act = calloc(rows, row_act + 64);
    float *out = calloc(rows, sizeof(float));
    for (int r = 0; r < rows; r++) {
        quant(x + (size_t)r * n, act + r * row_act, n);
        dot(n, &out[r], 0, w, 0, act + r * row_act, 0, 1);
    }
    FILE *fa = fopen(argv[6], "wb"); fwrite(act, 1, rows * row_act, fa); fclose(fa);
    FILE *fo = fopen(argv[7], "wb"); fwrite(out, sizeof(float), rows, fo); fclose(fo);
    return 0;
}
"""

# ggml's own fp32 -> fp16/bf16 conversions (static inline in ggml-impl.h, which the harness cannot
# include next to its stand-ins for ggml.c), exported for the harness.
F16_C = r"""
#include "ggml-impl.h"
void kiln_fp32_to_fp16_row(const float *x, void *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((ggml_fp16_t *)y)[i] = GGML_FP32_TO_FP16(x[i]);
}
void kiln_fp32_to_bf16_row(const float *x, void *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((ggml_bf16_t *)y)[i] = GGML_FP32_TO_BF16(x[i]);
}
"""


def moderate(rng: np.random.Generator, count: int) -> np.ndarray:
    """Random magnitudes in [1e-3, 1] (log-uniform) with random signs."""
    mag = 10.0 ** rng.uniform(-3.0, 0.0, size=count)
    sign = np.where(rng.random(count) < 0.5, -1.0, 1.0)
    return mag * sign


def quantized_blocks(rng: np.random.Generator, name: str) -> np.ndarray:
    _, type_size, fields, n_blocks = LAYOUTS[name]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scale_bytes = np.zeros(type_size, dtype=bool)
    for offset, kind in fields:
        width = 2 if kind == "f16" else 4
        scale_bytes[offset : offset + width] = True
    # Extreme quant codes in the first two blocks (scales stay random and valid below).
    blocks[0, ~scale_bytes] = 0x00
    blocks[1, ~scale_bytes] = 0xFF
    for offset, kind in fields:
        values = moderate(rng, n_blocks)
        dtype = np.float16 if kind == "f16" else np.float32
        raw = values.astype(dtype).view(np.uint8).reshape(n_blocks, -1)
        blocks[:, offset : offset + raw.shape[1]] = raw
    if name == "Q8_K":
        # bsums (16 x i16 at byte 260) are the sums of each 16 quants, as quantize_row_q8_K_ref
        # writes them; dequantization ignores them but a consistent block is the honest fixture.
        qs = blocks[:, 4 : 4 + QK_K].view(np.int8).astype(np.int16)
        bsums = qs.reshape(n_blocks, 16, 16).sum(axis=2).astype("<i2")
        blocks[:, 4 + QK_K :] = bsums.view(np.uint8).reshape(n_blocks, 32)
    return blocks


def dequantize_q8_k(blocks: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_q8_K, independently in numpy: x = d * q, d an f32 at byte 0."""
    d = blocks[:, 0:4].copy().view("<f4").astype(np.float32)
    qs = blocks[:, 4 : 4 + QK_K].view(np.int8).astype(np.float32)
    return (d * qs).astype(np.float32)


def float_bits(rng: np.random.Generator, name: str) -> np.ndarray:
    """Random finite values covering the whole format (subnormals included, no NaN or Inf)."""
    if name == "F32":
        return rng.standard_normal(FLOAT_ELEMENTS).astype("<f4").view(np.uint8)
    exp_mask, exp_all_ones = (0x7C00, 0x7C00) if name == "F16" else (0x7F80, 0x7F80)
    bits = rng.integers(0, 1 << 16, size=2 * FLOAT_ELEMENTS, dtype=np.uint16)
    bits = bits[(bits & exp_mask) != exp_all_ones][:FLOAT_ELEMENTS]
    return bits.astype("<u2").view(np.uint8)


def build_harness(llama_cpp: pathlib.Path, workdir: pathlib.Path) -> pathlib.Path:
    """Compiles ggml's scalar quantizers and dot products with the driver above."""
    ggml = llama_cpp / "ggml"
    flags = ["-O2", "-std=gnu11", "-ffp-contract=off", "-DGGML_CPU_GENERIC", "-w",
             f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}"]
    (workdir / "harness.c").write_text(HARNESS_C)
    (workdir / "f16.c").write_text(F16_C)
    exe = workdir / "harness"
    sources = [ggml / "src" / "ggml-quants.c", ggml / "src" / "ggml-cpu" / "quants.c", workdir / "harness.c",
               workdir / "f16.c"]
    subprocess.run(["gcc", *flags, *map(str, sources), "-lm", "-o", str(exe)], check=True)
    return exe


def quant_blocks(rng: np.random.Generator, block: int) -> np.ndarray:
    """The quantizer inputs of one block type: one block per case of the module doc."""
    normal = lambda: rng.normal(0.0, 0.02, block)  # noqa: E731
    outlier = normal()
    outlier[rng.integers(block)] = 40.0 * rng.choice([-1.0, 1.0])
    half_zero = normal()
    # Every other group of 16 is zero (for a legacy block of 32: its first half).
    half_zero.reshape(-1, 16)[::2] = 0.0
    cases = [
        normal(),
        np.zeros(block),
        outlier,
        normal() * 5e-5,
        normal() * 5e-17,
        -np.abs(normal()),
        np.abs(normal()),
        np.full(block, -0.0371),
        rng.uniform(-1.0, 1.0, block),
        rng.standard_t(3, block) * 0.05,
        half_zero,
        *[normal() for _ in range(QUANT_EXTRA_BLOCKS[block])],
    ]
    return np.concatenate(cases).astype(np.float32)


def float_cases(rng: np.random.Generator, name: str) -> np.ndarray:
    """F16/BF16 inputs: rounding ties and their neighbours, subnormals, overflow, ±0, ±inf, NaNs."""
    if name == "F16":
        lo = rng.integers(0, 0x7BFF, 96).astype(np.uint16).view(np.float16).astype(np.float32)
        hi = (lo.astype(np.float16).view(np.uint16) + 1).view(np.float16).astype(np.float32)
        ties = lo + (hi - lo) / 2  # exact in f32: f16 has 11 significant bits
        special = [65504.0, 65519.0, 65519.996, 65520.0, 1e5, 6.1e-5, 6e-8, 2.9e-8, 3e-8, 1e-10]
    else:
        bits = rng.integers(0, 0x7F7F, 96).astype(np.uint32) << 16
        lo = bits.view(np.float32)
        ties = (bits | 0x8000).view(np.float32)
        special = [3.3895314e38, 3.4e38, 1e-40, 1e-45, 9.2e-41]
    near = np.concatenate([ties.view(np.uint32) - 1, ties.view(np.uint32) + 1]).view(np.float32)
    # NaNs built from bits and every piece kept in float32: a trip through float64 would quiet
    # the signalling ones.
    nans = np.array([0x7FC00000, 0x7F800001, 0xFFC00123, 0x7FA5A5A5, 0x7F80FFFF], dtype=np.uint32).view(np.float32)
    pieces = [lo, ties, near, special, [0.0, -0.0, np.inf, -np.inf], rng.normal(0.0, 1.0, 64)]
    values = np.concatenate([np.asarray(p, dtype=np.float32) for p in pieces])
    # Random signs by flipping the sign bit (no arithmetic on the values).
    flip = (rng.random(values.size) < 0.5).astype(np.uint32) << 31
    return np.concatenate([(values.view(np.uint32) ^ flip).view(np.float32), nans])


def ggml_quants(rng: np.random.Generator, exe: pathlib.Path) -> list[str]:
    """Writes <TYPE>.quant.{x,bin}: inputs and ggml's reference quantization of them."""
    lines = []
    for name, fn in GGML_QUANTIZERS.items():
        if name in ("F16", "BF16"):
            x, block, type_size = float_cases(rng, name), 1, 2
        else:
            block, type_size = LAYOUTS[name][:2]
            x = quant_blocks(rng, block)
        (OUT / f"{name}.quant.x").write_bytes(x.astype("<f4").tobytes())
        subprocess.run(
            [str(exe), "quant", fn, str(OUT / f"{name}.quant.x"), str(type_size), str(block),
             str(OUT / f"{name}.quant.bin")],
            check=True,
        )
        assert (OUT / f"{name}.quant.bin").stat().st_size == x.size // block * type_size
        lines.append(f"| {name} | {x.size} | {fn} |")
    return lines


def ggml_fixtures(llama_cpp: pathlib.Path) -> tuple[list[str], list[str]]:
    """Builds the harness once and writes the dot (seed SEED + 1) and quantizer (SEED + 2) fixtures."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_harness(llama_cpp, pathlib.Path(tmp))
        dots = ggml_dots(np.random.default_rng(SEED + 1), exe)
        quants = ggml_quants(np.random.default_rng(SEED + 2), exe)
    return dots, quants


def ggml_dots(rng: np.random.Generator, exe: pathlib.Path) -> list[str]:
    """Writes <TYPE>.dot.{x,act,out}: random activations, ggml's Q8 encoding and ggml's dot."""
    lines = []
    for name, (act_ty, dot) in GGML_DOTS.items():
        block_size, type_size, _, n_blocks = LAYOUTS[name]
        n = n_blocks * block_size
        rows = DOT_ROUNDS[block_size]
        x = rng.uniform(-1.0, 1.0, size=(rows, n)).astype(np.float32)
        outliers = rng.random(size=x.shape) < 1 / 64
        x[outliers] *= 30.0
        (OUT / f"{name}.dot.x").write_bytes(x.astype("<f4").tobytes())
        subprocess.run(
            [str(exe), dot, act_ty, str(n), str(OUT / f"{name}.bin"), str(OUT / f"{name}.dot.x"),
             str(OUT / f"{name}.dot.act"), str(OUT / f"{name}.dot.out")],
            check=True,
        )
        act_block, act_bytes = ACT_BLOCK[act_ty]
        assert (OUT / f"{name}.dot.act").stat().st_size == rows * n // act_block * act_bytes
        lines.append(f"| {name} | {rows} x {n} | {act_ty} | {dot} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", type=pathlib.Path, help="llama.cpp source tree: also write the ggml dot and quantizer fixtures")
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in ["F32", "F16", "BF16"]:
        raw = float_bits(rng, name)
        expected = np.asarray(dequantize(raw, T[name]), dtype=np.float32).reshape(-1)
        (OUT / f"{name}.bin").write_bytes(raw.tobytes())
        (OUT / f"{name}.f32").write_bytes(expected.astype("<f4").tobytes())
        lines.append(f"| {name} | {expected.size} | gguf.quants.dequantize |")
    for name in LAYOUTS:
        blocks = quantized_blocks(rng, name)
        if name == "Q8_K":
            expected = dequantize_q8_k(blocks)
            source = "numpy, from ggml's dequantize_row_q8_K (gguf has no Q8_K)"
        else:
            expected = dequantize(blocks.reshape(-1), T[name])
            source = "gguf.quants.dequantize"
        expected = np.asarray(expected, dtype=np.float32).reshape(-1)
        assert np.all(np.isfinite(expected)), name
        (OUT / f"{name}.bin").write_bytes(blocks.tobytes())
        (OUT / f"{name}.f32").write_bytes(expected.astype("<f4").tobytes())
        lines.append(f"| {name} | {expected.size} | {source} |")

    ggml_lines = ggml_fixtures(args.llama_cpp) if args.llama_cpp else None

    gguf_version = importlib.metadata.version("gguf")
    readme = [
        "# kiln-quant dequantization fixtures",
        "",
        "Generated by `python scripts/gen_quant_fixtures.py` (seed "
        f"{SEED}) with gguf {gguf_version} and numpy {np.__version__}; do not edit by hand.",
        "",
        "`<TYPE>.bin` holds raw blocks (random quants, finite scales; block 0 all-zero quant bytes,",
        "block 1 all-0xFF), `<TYPE>.f32` the expected values as little-endian f32.",
        "",
        "| type | elements | expected values from |",
        "|---|---|---|",
        *lines,
        "",
    ]
    if ggml_lines is None:
        # Keep the ggml sections of an earlier run with --llama-cpp.
        previous = (OUT / "README.md").read_text() if (OUT / "README.md").exists() else ""
        marker = "## ggml dot products"
        if marker in previous:
            readme.append(previous[previous.index(marker):].rstrip("\n"))
            readme.append("")
    else:
        dot_lines, quant_lines = ggml_lines
        readme += [
            "## ggml dot products",
            "",
            f"Written with `--llama-cpp` (seed {SEED + 1}) by compiling {args.llama_cpp.name}'s",
            "`ggml-quants.c` and `ggml-cpu/quants.c` (GGML_CPU_GENERIC, -ffp-contract=off):",
            "`<TYPE>.dot.x` activations (f32 rows), `<TYPE>.dot.act` ggml's `quantize_row_q8_*_ref` of",
            "each row, `<TYPE>.dot.out` ggml's scalar dot of `<TYPE>.bin` with each row (f32).",
            "",
            "| weights | activations (rows x elements) | format | ggml function |",
            "|---|---|---|---|",
            *dot_lines,
            "",
            "## ggml reference quantizers",
            "",
            f"Written with `--llama-cpp` (seed {SEED + 2}) by the same build: `<TYPE>.quant.x` inputs",
            "(f32, one block per case: normal weights, all zero, one huge outlier, tiny values above",
            "and below GROUP_MAX_EPS, negative-only, positive-only, constant, uniform, heavy-tailed,",
            "half zero, more normal blocks; F16/BF16: ties, subnormals, overflow, ±0, ±inf, NaNs) and",
            "`<TYPE>.quant.bin` the bytes ggml's reference quantizer writes for them.",
            "",
            "| type | elements | ggml function |",
            "|---|---|---|",
            *quant_lines,
            "",
        ]
    (OUT / "README.md").write_text("\n".join(readme))
    print(f"wrote {len(lines)} fixtures to {OUT} (gguf {gguf_version}, numpy {np.__version__})")


if __name__ == "__main__":
    main()
