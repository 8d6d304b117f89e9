#!/usr/bin/env python3
"""Embedding speed of one peer engine on one text file: the peer side of `kiln bench embed`.

    bench_embed_peers.py --backend {ort,st} --model DIR --file F --threads N
                         [--batch-size 32] [--repeats 3] [--max-seq-length 256] [--json]

One backend per process, measured the way tests/golden/all-minilm-l6-v2/README.md ("Peer speed")
describes its figures:
  st   sentence-transformers, fp32 on CPU: SentenceTransformer(DIR).encode(texts, batch_size)
       (its own pipeline: tokenize, BertModel, mean pooling, Normalize).
  ort  ONNX Runtime, CPU execution provider, fp32: the HF model exported once with torch.onnx
       (legacy TorchScript exporter, opset 17, dynamic batch and sequence axes) and cached under
       $KILN_HOME/cache/onnx/<model folder name>-<sha256 of model.safetensors, 12 hex>/model.onnx;
       the HF fast tokenizer (truncation at max_seq_length, padding to the longest text of the
       batch), then mean pooling over the attention mask and L2 normalization in numpy.
Common to both: texts are the non-empty lines of F, sorted by length (characters, longest
first, as sentence-transformers does inside encode) so that both backends batch alike;
tokenization is inside the timed region; one untimed warm-up pass, then the best of --repeats
full passes. Threads are pinned before the libraries load: OMP/MKL/OpenBLAS env, rayon (the
tokenizer's pool) to N, torch.set_num_threads(N) and 1 inter-op thread, ORT
intra_op_num_threads=N, inter_op_num_threads=1, sequential execution.

Prints one line, or with --json one JSON object:
  {"backend", "file", "sentences_per_s", "tokens_per_s", "texts", "tokens", "threads",
   "batch_size", "max_seq_length", "pass_s": [...], "versions": {...}}
tokens = non-pad tokens per text including [CLS]/[SEP], after truncation at max_seq_length,
summed over the file.

Pinned versions (the golden README's): torch 2.15.0 (PyPI wheel, CPU), transformers 5.23.0,
sentence-transformers 6.2.0, tokenizers 0.23.3, onnxruntime 1.32.0, onnx 1.23.2, numpy 2.4.6,
safetensors 0.8.0 (scripts/bench-embed installs them into $KILN_HOME/peers/embed-venv).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

KILN_HOME = Path(os.environ.get("KILN_HOME") or Path.home() / ".cache" / "kiln")
OPSET = 17


class BenchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[bench_embed_peers] {msg}", file=sys.stderr, flush=True)


def pin_threads(n: int) -> None:
    """Must run before numpy, torch, tokenizers or onnxruntime are imported."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[var] = str(n)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def read_texts(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e}") from e
    texts = [t for t in lines if t.strip()]
    if not texts:
        raise BenchError(f"{path} has no non-empty lines")
    return sorted(texts, key=len, reverse=True)


def count_tokens(tokenizer, texts: list[str], max_len: int) -> int:
    enc = tokenizer(texts, truncation=True, max_length=max_len, padding=False)
    return sum(len(ids) for ids in enc["input_ids"])


def timed_passes(run_pass, repeats: int) -> list[float]:
    run_pass()  # warm-up: page cache, allocator, kernel selection
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_pass()
        times.append(time.perf_counter() - t0)
    return times


# ------------------------------------------------------------------------------------------- st


def bench_st(a: argparse.Namespace, texts: list[str]) -> tuple[list[float], int]:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    # transformers 5 / sentence-transformers 6 load in config.json's dtype unless told otherwise.
    model = SentenceTransformer(str(a.model), device="cpu", model_kwargs={"dtype": torch.float32})
    model.max_seq_length = a.max_seq_length
    if {p.dtype for p in model.parameters()} != {torch.float32}:
        raise BenchError("sentence-transformers did not load the model in float32")
    tokens = count_tokens(model.tokenizer, texts, a.max_seq_length)

    def run_pass():
        with torch.inference_mode():
            model.encode(texts, batch_size=a.batch_size, convert_to_numpy=True, show_progress_bar=False)

    return timed_passes(run_pass, a.repeats), tokens


# ------------------------------------------------------------------------------------------ ort


def model_digest(model_dir: Path) -> str:
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise BenchError(f"{weights} not found (the ORT export needs a single-file safetensors model)")
    h = hashlib.sha256()
    with weights.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:12]


def export_onnx(model_dir: Path, dest: Path, tokenizer) -> None:
    """torch.onnx export of the HF encoder (last_hidden_state), checked against torch once."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    log(f"exporting {model_dir} to ONNX (once; cached at {dest})")
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    sample = tokenizer(
        ["a short text", "a somewhat longer text, so that the batch has padding in it"],
        padding=True,
        return_tensors="pt",
    )
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]
    if "token_type_ids" not in names:
        sample["token_type_ids"] = torch.zeros_like(sample["input_ids"])
        names.append("token_type_ids")
    args = tuple(sample[n] for n in names)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic["last_hidden_state"] = {0: "batch", 1: "sequence"}

    class Encoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    # The wrapper must be in eval mode itself: export restores the wrapper's own mode afterwards,
    # recursively, which would switch dropout on in the inner model if the wrapper were training.
    encoder = Encoder(model).eval()
    try:
        with torch.no_grad():
            want = encoder(*args).numpy()
            torch.onnx.export(
                encoder,
                args,
                str(tmp),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes=dynamic,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        got = sess.run(["last_hidden_state"], {i.name: sample[i.name].numpy() for i in sess.get_inputs()})[0]
        mask = sample["attention_mask"].numpy().astype(bool)
        diff = float(np.max(np.abs(got[mask] - want[mask])))
        if not diff < 1e-4:
            raise BenchError(f"ONNX export disagrees with torch: max |diff| {diff:.2e}")
        log(f"ONNX export matches torch (max |diff| {diff:.1e}); opset {OPSET}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def bench_ort(a: argparse.Namespace, texts: list[str]) -> tuple[list[float], int]:
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    onnx_path = KILN_HOME / "cache" / "onnx" / f"{a.model.name}-{model_digest(a.model)}" / "model.onnx"
    if not onnx_path.is_file():
        export_onnx(a.model, onnx_path, tokenizer)
    tokens = count_tokens(tokenizer, texts, a.max_seq_length)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in sess.get_inputs()]
    batches = [texts[i : i + a.batch_size] for i in range(0, len(texts), a.batch_size)]

    def run_pass():
        for batch in batches:
            enc = tokenizer(
                batch, padding="longest", truncation=True, max_length=a.max_seq_length, return_tensors="np"
            )
            ids = enc["input_ids"].astype(np.int64)
            mask = enc["attention_mask"].astype(np.int64)
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = sess.run(["last_hidden_state"], {k: feed[k] for k in inputs})[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    return timed_passes(run_pass, a.repeats), tokens


# ----------------------------------------------------------------------------------------- main


def versions(backend: str) -> dict:
    import numpy
    import tokenizers
    import torch
    import transformers

    v = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": numpy.__version__,
    }
    if backend == "st":
        import sentence_transformers

        v["sentence-transformers"] = sentence_transformers.__version__
    else:
        import onnxruntime

        v["onnxruntime"] = onnxruntime.__version__
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", required=True, choices=["ort", "st"])
    ap.add_argument("--model", required=True, type=Path, help="HF / sentence-transformers model folder")
    ap.add_argument("--file", required=True, type=Path, help="texts, one per line")
    ap.add_argument("--threads", required=True, type=int)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported")
    ap.add_argument("--max-seq-length", type=int, default=256)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    for name in ("threads", "batch_size", "repeats", "max_seq_length"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not a.model.is_dir():
        ap.error(f"model folder not found: {a.model}")
    a.model = a.model.resolve()
    pin_threads(a.threads)

    texts = read_texts(a.file)
    passes, tokens = (bench_st if a.backend == "st" else bench_ort)(a, texts)
    best = min(passes)
    result = {
        "backend": a.backend,
        "file": str(a.file),
        "sentences_per_s": len(texts) / best,
        "tokens_per_s": tokens / best,
        "texts": len(texts),
        "tokens": tokens,
        "threads": a.threads,
        "batch_size": a.batch_size,
        "max_seq_length": a.max_seq_length,
        "pass_s": [round(t, 4) for t in passes],
        "versions": versions(a.backend),
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(
            f"{a.backend} {a.file}: {result['sentences_per_s']:.1f} sentences/s, "
            f"{result['tokens_per_s']:.0f} tokens/s ({len(texts)} texts, {tokens} tokens, "
            f"{a.threads} threads, passes {', '.join(f'{t:.2f}s' for t in passes)})"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench_embed_peers: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
