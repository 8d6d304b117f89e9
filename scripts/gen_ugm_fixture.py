#!/usr/bin/env python3
"""Reference ids for kiln's Unigram (`t5`) GGUF tokenizer, made by SentencePiece itself.

llama.cpp ships `models/ggml-vocab-nomic-bert-moe.gguf` (XLM-RoBERTa's 250,048-piece Unigram
vocabulary with its precompiled normalization charsmap) but no `.inp`/`.out` test cases for it.
This script rebuilds the SentencePiece model the GGUF was converted from, out of the GGUF's own
fields (pieces, scores, token types, `precompiled_charsmap`, `add_space_prefix`,
`remove_extra_whitespaces`), loads it into the `sentencepiece` library, and encodes every test
string of llama.cpp's tokenizer suite (all `models/ggml-vocab-*.gguf.inp` files, deduplicated)
plus strings that exercise the normalization (NFKC forms, full-width and compatibility
characters, white space runs, unknown characters). The ids are what `SentencePieceProcessor
.encode` returns (no BOS/EOS: llama.cpp's test-tokenizer-0 runs without specials). llama.cpp's
own `llama-tokenize --ids --no-bos` on the same GGUF (the scripts/build-llamacpp peer) gave the
same ids for every case, once the EOS it appends is dropped (checked when the file was made).

Run from the repository root (CPU, offline, seconds), and commit the output:

    python3 -m venv /tmp/vugm
    /tmp/vugm/bin/pip install sentencepiece==0.2.3 protobuf numpy==2.4.6
    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /tmp/lcp
    tar -xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    /tmp/vugm/bin/python scripts/gen_ugm_fixture.py \\
        --llama-cpp /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp

Output: tests/fixtures/tokenizers/nomic-bert-moe-ugm.json: {"vocab_file", "versions",
"cases": [{"text", "ids"}]}. Used by crates/kiln-tokenizer/tests/llama_vocabs.rs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "tokenizers" / "nomic-bert-moe-ugm.json"
VOCAB = "ggml-vocab-nomic-bert-moe.gguf"

# Strings for the normalizer (NFKC by charsmap) and the white space rules, written for this file.
EXTRA = [
    "ｆｕｌｌ－ｗｉｄｔｈ　ＡＢＣ　１２３",
    "ﬁne ﬂour, Ⅻ, ①②③, ㎏, ™",
    "Cafe\u0301 vs Café, Å vs Å",
    "  leading and   inner   runs and trailing   ",
    "tabs\tand\nnewlines\r\nmixed",
    "\u200b zero width \ufeff bom",
    "日本語のテキストと한국어",
    "emoji 🦙🔥 and ⚙︎ variation",
    "\x01 control \x7f chars",
    "ÀÉÎÕÜ àéîõü ñ ç ß ẞ",
    "x" * 40,
    "▁ a literal lower one eighth block",
    "",
    " ",
]


def read_inputs(models: Path) -> list[str]:
    seen: dict[str, None] = {}
    for inp in sorted(models.glob("ggml-vocab-*.gguf.inp")):
        for text in inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n"):
            seen.setdefault(text, None)
    for text in EXTRA:
        seen.setdefault(text, None)
    return list(seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    args = parser.parse_args()
    root = args.llama_cpp.resolve()
    sys.path.insert(0, str(root / "gguf-py"))
    import gguf  # noqa: E402

    reader = gguf.GGUFReader(root / "models" / VOCAB)

    def field(name: str):
        f = reader.fields[name]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            if f.types[1] == gguf.GGUFValueType.UINT8:
                return bytes(f.parts[f.data[0]]) if len(f.data) == 1 else bytes(
                    int(f.parts[i][0]) for i in f.data
                )
            return [f.parts[i][0].item() for i in f.data]
        return f.parts[f.data[0]][0].item()

    tokens = field("tokenizer.ggml.tokens")
    scores = field("tokenizer.ggml.scores")
    types = field("tokenizer.ggml.token_type")
    charsmap = field("tokenizer.ggml.precompiled_charsmap")
    m = model_pb2.ModelProto()
    m.trainer_spec.model_type = model_pb2.TrainerSpec.UNIGRAM
    m.trainer_spec.unk_id = field("tokenizer.ggml.unknown_token_id")
    m.trainer_spec.bos_id = field("tokenizer.ggml.bos_token_id")
    m.trainer_spec.eos_id = field("tokenizer.ggml.eos_token_id")
    m.trainer_spec.pad_id = field("tokenizer.ggml.padding_token_id")
    m.normalizer_spec.name = "nmt_nfkc"
    m.normalizer_spec.precompiled_charsmap = charsmap
    m.normalizer_spec.add_dummy_prefix = bool(field("tokenizer.ggml.add_space_prefix"))
    m.normalizer_spec.remove_extra_whitespaces = bool(field("tokenizer.ggml.remove_extra_whitespaces"))
    m.normalizer_spec.escape_whitespaces = True
    # GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
    kinds = {
        1: model_pb2.ModelProto.SentencePiece.NORMAL,
        2: model_pb2.ModelProto.SentencePiece.UNKNOWN,
        3: model_pb2.ModelProto.SentencePiece.CONTROL,
        4: model_pb2.ModelProto.SentencePiece.USER_DEFINED,
        5: model_pb2.ModelProto.SentencePiece.UNUSED,
        6: model_pb2.ModelProto.SentencePiece.BYTE,
    }
    for piece, score, kind in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece = piece
        p.score = score
        p.type = kinds[kind]
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    if sp.get_piece_size() != len(tokens):
        raise SystemExit(f"sentencepiece has {sp.get_piece_size()} pieces, the GGUF {len(tokens)}")
    cases = [{"text": t, "ids": sp.encode(t)} for t in read_inputs(root / "models")]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "vocab_file": VOCAB,
                "versions": {
                    "sentencepiece": spm.__version__,
                    "llama.cpp": "as vendored in llama-cpp-python 0.3.36",
                },
                "cases": cases,
            },
            ensure_ascii=False,
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"{OUT.relative_to(REPO)}: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
