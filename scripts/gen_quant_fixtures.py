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
int main(int argc, char **argv) {
    if (argc != 8) return 2;
    for (int i = 0; i < (1 << 16); i++) { uint16_t h = i; _Float16 v; memcpy(&v, &h, 2); ggml_table_f32_f16[i] = v; }
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
    exe = workdir / "harness"
    sources = [ggml / "src" / "ggml-quants.c", ggml / "src" / "ggml-cpu" / "quants.c", workdir / "harness.c"]
    subprocess.run(["gcc", *flags, *map(str, sources), "-lm", "-o", str(exe)], check=True)
    return exe


def ggml_dots(rng: np.random.Generator, llama_cpp: pathlib.Path) -> list[str]:
    """Writes <TYPE>.dot.{x,act,out}: random activations, ggml's Q8 encoding and ggml's dot."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        exe = build_harness(llama_cpp, workdir)
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
    parser.add_argument("--llama-cpp", type=pathlib.Path, help="llama.cpp source tree: also write the ggml dot fixtures")
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

    dot_lines = ggml_dots(np.random.default_rng(SEED + 1), args.llama_cpp) if args.llama_cpp else None

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
    if dot_lines is None:
        # Keep the ggml dot section of an earlier run with --llama-cpp.
        previous = (OUT / "README.md").read_text() if (OUT / "README.md").exists() else ""
        marker = "## ggml dot products"
        if marker in previous:
            readme.append(previous[previous.index(marker):].rstrip("\n"))
            readme.append("")
    else:
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
        ]
    (OUT / "README.md").write_text("\n".join(readme))
    print(f"wrote {len(lines)} fixtures to {OUT} (gguf {gguf_version}, numpy {np.__version__})")


if __name__ == "__main__":
    main()
