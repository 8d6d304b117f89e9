#!/usr/bin/env python3
"""Generate the tiny random encoder checkpoints of kiln-models, with HF reference outputs.

Two folders in Hugging Face + sentence-transformers layout, so that kiln's whole embedding path
(config.json, safetensors, tokenizer.json, modules.json, pooling, normalization) is tested on
architectures that have no real checkpoint on this machine:

    tests/fixtures/encoders/modernbert-tiny/   ModernBertModel, F16, CLS pooling
    tests/fixtures/encoders/xlm-roberta-tiny/  XLMRobertaModel, BF16, 2+ shards,
                                                                  mean pooling, no Normalize

Run once from the repository root (CPU only, ~15 s), and commit the result:

    python3 -m venv /tmp/venc
    /tmp/venc/bin/pip install torch==2.15.0 transformers==5.23.0 sentence-transformers==6.2.0 \\
        tokenizers==0.23.3 safetensors==0.8.0 sentencepiece==0.2.3 numpy==2.4.6
    /tmp/venc/bin/python scripts/gen_encoder_fixtures.py

Versions used for the committed fixtures: Python 3.11.7, torch 2.15.0 (PyPI CPU run),
transformers 5.23.0, sentence-transformers 6.2.0, tokenizers 0.23.3, safetensors 0.8.0,
sentencepiece 0.2.3 (only for the standard nmt_nfkc normalization table), numpy 2.4.6.

How each folder is made:
  1. A tokenizer is trained with the `tokenizers` library on CORPUS below (a few KB of English,
     accented Latin, CJK, digits and punctuation), with the component structure of the real
     model's tokenizer.json:
       ModernBERT  byte-level BPE: NFC normalizer, ByteLevel pre-tokenizer (no prefix space),
                   template `[CLS] $A [SEP]`, ByteLevel decoder; specials appended after the
                   BPE vocabulary as in the real tokenizer, `[MASK]` with lstrip like the real one.
       XLM-R       Unigram: normalizer Sequence[Precompiled(nmt_nfkc), Replace(" {2,}" -> " ")],
                   Metaspace pre-tokenizer and decoder, template `<s> $A </s>`, `<s>`=0 `<pad>`=1
                   `</s>`=2 `<unk>`=3 and `<mask>` last. The Precompiled charsmap is
                   sentencepiece's nmt_nfkc table (the rule set and binary format that real XLM-R
                   tokenizer.json files embed; the older copy inside xlm-roberta-base may differ in
                   detail), taken from a throw-away sentencepiece model. The trained pieces are
                   rescored deterministically (see canonical_unigram).
  2. The model is built from its config with the model's own init, then EVERY tensor is perturbed
     (norm weights by N(0, 0.2) around 1, matrices by N(0, 1/fan_in), embedding tables by the
     small N(0, 0.03) so that the first norm's eps matters), so that window, position, rope,
     GELU and eps slips all change the output far beyond float32 noise, while activations stay O(1).
  3. The model is cast to the storage dtype (F16 / BF16) and saved; config.json is written with the
     key names that published ModernBERT checkpoints (saved with transformers 4) use:
     global_attn_every_n_layers, global_rope_theta, local_rope_theta; transformers 5 still reads
     them (checked), though it would itself write layer_types / rope_parameters.
  4. The saved folder is loaded back in float32 (so the reference sees exactly the rounded
     weights), eager attention, and for each text of TEXTS:
       input_ids          what sentence-transformers feeds the model (truncation at max_seq_length);
                          checked equal to tokenizer.json via `tokenizers` with truncation set
       last_hidden_state  HF model on that one text (batch 1, no padding), float32
       embedding          SentenceTransformer(dir).encode(text), float32; checked against our own
                          pooling (+ L2 normalization) of last_hidden_state
  5. Checks that fail loudly: an independent float32 re-implementation of each architecture (from
     the state dict, written from the architecture descriptions) agrees with HF; AutoTokenizer and SentenceTransformer
     load the folder; a padded batch of all texts agrees with batch 1 (the max |diff| is recorded);
     deliberate slips (wrong window, rope theta, GELU, position offset, eps) change the output by
     far more than that noise (recorded as `sensitivity`).

The output is deterministic: seeded generators, one torch thread, and training that depends only on
CORPUS.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
from pathlib import Path

# The Hub is unreachable here; fail fast instead of retrying, and keep training single-threaded so
# that the trained vocabularies do not depend on thread scheduling.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import sentencepiece as spm  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentencepiece import sentencepiece_model_pb2  # noqa: E402
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    ModernBertConfig,
    ModernBertModel,
    XLMRobertaConfig,
    XLMRobertaModel,
)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "encoders"
SEED = 20240611

VERSIONS = (
    f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
    f"sentence-transformers {sentence_transformers.__version__}, tokenizers {tokenizers.__version__}, "
    f"sentencepiece {spm.__version__}, numpy {np.__version__}"
)
GENERATOR = f"scripts/gen_encoder_fixtures.py ({VERSIONS})"

# Training text for the tiny tokenizers. Varied on purpose: English prose, accented Latin scripts,
# Chinese and Japanese, numbers, code-ish punctuation. Written for this fixture.
CORPUS = """\
The river town woke slowly; fishermen pulled their boats onto the gravel before sunrise.
A baker on the corner sold warm bread, and the smell drifted across the square.
Children ran to school with their books, shouting about the match they had played yesterday.
The library opened at nine o'clock, and the old clock tower struck the hour twice by mistake.
Engineers measured the bridge again because the numbers did not agree with the drawings.
She wrote the report in plain words: what was tested, what failed, and what should change next.
Rain fell all afternoon, so the market moved under the long stone arches near the station.
He asked whether the train to the coast was late; the answer, as usual, was "a little".
Good tools are simple to start with and hard to outgrow, which is why people keep them for years.
Every model reads tokens, turns them into vectors, mixes them with attention, and pools the result.
The quick brown fox jumps over the lazy dog while the patient cat watches from the window.
Small tests catch big mistakes when they compare every number against a trusted reference.
Le café était fermé, alors nous avons marché jusqu'à la gare sous une pluie très fine.
Déjà vu : une façade naïve, un garçon, une élève et leur professeur à l'école.
Die Straße war nass, und die Bäume vor dem Rathaus verloren schon ihre Blätter.
Über die Brücke fährt jeden Morgen ein grüner Bus mit müden Fahrgästen.
El niño comió una manzana en el jardín mientras su abuela leía el periódico.
¿Dónde está la estación? ¡Está allí, al lado del museo!
A avó contou histórias sobre São Paulo, o coração da cidade e as canções antigas.
Ångström, Dvořák, Łódź, Kraków and Reykjavík are names with letters beyond plain ASCII.
Tiếng Việt có nhiều dấu thanh, ví dụ như những chữ này.
東京は日本の首都です。東京の人口はとても多いです。
私は毎朝コーヒーを飲みます。今日は天気がいいですね。
北京欢迎你！我们明天去图书馆看书，然后一起吃饭。
中文和日文都使用汉字，但是读音不一样。
Order #12345 shipped on 2024-03-15 at 09:30; the total was $67.89 incl. 20% VAT.
Call +1 (555) 010-2030 or write to help@example.org before 5 p.m.
Version 3.14.159 fixed bugs 271, 828 and 1828; pi is about 3.14159 and e about 2.71828.
Temperatures ranged from -12.5 to 37.8 degrees, a spread of 50.3 over 365 days.
x = [1, 2, 3]; y = {"a": 1, "b": 2}; if (x > 0 && y != null) { return x * 2; }
fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }
SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;
Punctuation marks: commas, periods. Semicolons; colons: dashes - and -- em dashes, (parentheses)!
Quotes "double" and 'single', brackets [square] and <angle>, slashes / and \\ backslashes.
Mixed case words like iPhone, eBay, NASA, McDonald and O'Brien test the tokenizer edges.
"""

LONG_TEXT = (
    "Long documents are where an embedding engine is most likely to go wrong: the tokenizer must "
    "cut the text at exactly the configured maximum length, the positions must keep counting past "
    "the small windows of local attention, and the pooling must average only the tokens that "
    "survived the cut. This paragraph is deliberately much longer than the limit of either tiny "
    "model, so that truncation is exercised, and it repeats ordinary words from the training text: "
    "the river, the bridge, the library, the station and the market under the stone arches."
)

# Reference texts: empty, one word, sentences, accents (NFC and NFD), CJK, numbers, whitespace
# oddities, literal special-token strings, compatibility characters that nmt_nfkc rewrites
# (fullwidth, ligature), a character absent from the training text, and one text longer than
# max_seq_length.
TEXTS = [
    "",
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu in São Paulo: a naïve façade, Straße, Ångström and Dvořák.",
    "Cafe\u0301 and cafe\u0301 written with combining accents (NFD).",
    "東京は日本の首都です。北京欢迎你！",
    "Order #12345 costs $67.89 (incl. 20% VAT), due 2024-03-15 at 09:30!",
    "  leading,   multiple   spaces\tand a tab, then a\nnewline  ",
    "Fill in the [MASK] or the <mask>, not [CLS] or </s>.",
    "\U0001f642\U0001f680 emoji, ＦＵＬＬ ｗｉｄｔｈ and a ﬁne ligature",
    (
        "Engineers measured the bridge again because the numbers did not agree with the drawings, "
        "so the report said what was tested and what failed."
    ),
    LONG_TEXT,
]


# ------------------------------------------------------------------------------------ tokenizers


def corpus_lines() -> list[str]:
    return [line for line in CORPUS.splitlines() if line.strip()]


def nmt_nfkc_charsmap() -> bytes:
    """The sentencepiece nmt_nfkc normalization table, as real XLM-R tokenizer.json files embed it.

    sentencepiece compiles the table into every model it trains with that rule; a throw-away model
    on CORPUS is the simplest way to get the bytes.
    """
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()),
        model_writer=buf,
        vocab_size=200,
        model_type="unigram",
        normalization_rule_name="nmt_nfkc",
        hard_vocab_limit=False,
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if len(charsmap) < 1000:
        raise SystemExit("sentencepiece produced no nmt_nfkc charsmap")
    return charsmap


def canonical_unigram(trained: Tokenizer) -> Tokenizer:
    """The trained Unigram pieces with deterministic scores and order.

    The trainer's piece set is reproducible, but its EM scores vary by ~1e-4 from run to run
    (hash-map order in the Rust code), and so does the order of pieces, i.e. their ids. Each piece
    is therefore rescored as the log of its smoothed relative frequency as a substring of the
    normalized, pre-tokenized CORPUS, and ids follow (score desc, piece), after the 4 specials.
    """
    vocab = json.loads(trained.to_str())["model"]["vocab"]
    specials, pieces = [p for p, _ in vocab[:4]], [p for p, _ in vocab[4:]]
    words = [
        w
        for line in corpus_lines()
        for w, _ in trained.pre_tokenizer.pre_tokenize_str(trained.normalizer.normalize_str(line))
    ]

    def occurrences(piece: str) -> int:
        return sum(sum(1 for i in range(len(w) - len(piece) + 1) if w.startswith(piece, i)) for w in words)

    counts = {p: occurrences(p) + 1 for p in pieces}
    total = sum(counts.values())
    scored = sorted(
        ((p, round(math.log(c / total), 6)) for p, c in counts.items()), key=lambda ps: (-ps[1], ps[0])
    )
    tok = Tokenizer(models.Unigram([(p, 0.0) for p in specials] + scored, unk_id=3, byte_fallback=False))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = (
        trained.normalizer,
        trained.pre_tokenizer,
        trained.decoder,
    )
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in specials])
    return tok


def xlmr_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [normalizers.Precompiled(nmt_nfkc_charsmap()), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
        shrinking_factor=0.75,
        max_piece_length=12,
        n_sub_iterations=2,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok = canonical_unigram(tok)
    # `<mask>` goes last, after the trained pieces, as in xlm-roberta-base (id 250001 there).
    tok.add_special_tokens([AddedToken("<mask>", special=True, normalized=False)])
    ids = {t: tok.token_to_id(t) for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")}
    want = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": tok.get_vocab_size() - 1}
    if ids != want:
        raise SystemExit(f"XLM-R special token ids {ids}, want {want}")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok


def modernbert_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    # Specials after the BPE vocabulary, as in the real ModernBERT tokenizer (50280..50284 there);
    # `[MASK]` swallows the space before it (lstrip), like the real one.
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]")]
        + [AddedToken("[MASK]", special=True, normalized=False, lstrip=True)]
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tok


def write_tokenizer_files(out: Path, tok: Tokenizer, specials: dict[str, str], max_len: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    # PreTrainedTokenizerFast loads tokenizer.json as it is. (transformers 5 rebuilds the pipeline
    # of a named class such as XLMRobertaTokenizer from its own code, which would no longer be the
    # file kiln reads.)
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "padding_side": "right",
        "truncation_side": "right",
        "model_input_names": ["input_ids", "attention_mask"],
        **specials,
    }
    dump_json(out / "tokenizer_config.json", cfg)
    dump_json(out / "special_tokens_map.json", specials)


# ---------------------------------------------------------------------------------- checkpoints


def dump_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@torch.no_grad()
def perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Add noise to every parameter, on top of the model's own init.

    Scales: matrices N(0, 1/fan_in) so that q·k/sqrt(d) is O(1) and attention is far from
    uniform; 1-D tensors (norm weights around 1, biases around 0) N(0, 0.2) so that a missing or
    misplaced norm or bias shows up; embedding tables N(0, 0.03), small like trained ones, so that
    the variance entering the embedding LayerNorm is ~1e-3 and its eps visibly matters (the norm
    brings activations back to O(1)).
    """
    for name, p in model.named_parameters():
        if p.ndim == 1:
            std = 0.2
        elif "embeddings" in name:
            std = 0.03
        else:
            std = 1.0 / math.sqrt(p.shape[1])
        p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


def write_st_files(out: Path, dim: int, pooling: str, normalize: bool, max_seq_length: int) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    dump_json(out / "modules.json", modules)
    (out / "1_Pooling").mkdir()
    modes = (
        "cls_token",
        "mean_tokens",
        "max_tokens",
        "mean_sqrt_len_tokens",
        "weightedmean_tokens",
        "lasttoken",
    )
    pool = {"word_embedding_dimension": dim}
    pool.update({f"pooling_mode_{m}": m == pooling for m in modes})
    pool["include_prompt"] = True
    dump_json(out / "1_Pooling" / "config.json", pool)
    dump_json(out / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    dump_json(
        out / "config_sentence_transformers.json",
        {
            "__version__": {
                "sentence_transformers": sentence_transformers.__version__,
                "transformers": transformers.__version__,
                "pytorch": torch.__version__,
            },
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )


def make_modernbert(out: Path, gen: torch.Generator) -> dict:
    tok = modernbert_tokenizer()
    n_tok = tok.get_vocab_size()
    # Like the real config (50368 rows for 50285 tokens): more embedding rows than tokens.
    vocab_size = (n_tok + 63) // 64 * 64
    ids = {t: tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
    legacy = {"global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0}
    config = ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        local_attention=8,
        norm_eps=1e-5,
        hidden_activation="gelu",
        max_position_embeddings=512,
        pad_token_id=ids["[PAD]"],
        bos_token_id=ids["[CLS]"],
        cls_token_id=ids["[CLS]"],
        eos_token_id=ids["[SEP]"],
        sep_token_id=ids["[SEP]"],
        **legacy,
    )
    if config.layer_types != ["full_attention", "sliding_attention", "sliding_attention"]:
        raise SystemExit(f"unexpected ModernBERT layer types {config.layer_types}")
    model = ModernBertModel(config).eval()
    perturb(model, gen)
    model.to(torch.float16).save_pretrained(out)
    # transformers 5 writes layer_types/rope_parameters; published ModernBERT checkpoints (saved with
    # transformers 4) carry the three legacy keys instead, and transformers 5 still reads them.
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("layer_types", None)
    cfg.pop("rope_parameters", None)
    cfg.update(legacy)
    dump_json(out / "config.json", dict(sorted(cfg.items())))
    back = ModernBertConfig.from_pretrained(out)
    if back.layer_types != config.layer_types or back.rope_parameters != config.rope_parameters:
        raise SystemExit("legacy ModernBERT config keys do not round-trip through transformers")

    specials = {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    }
    write_tokenizer_files(out, tok, specials, config.max_position_embeddings)
    write_st_files(out, config.hidden_size, pooling="cls_token", normalize=True, max_seq_length=48)
    return {"pooling": "cls", "normalize": True, "max_seq_length": 48}


def make_xlmr(out: Path, gen: torch.Generator) -> dict:
    tok = xlmr_tokenizer()
    config = XLMRobertaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        max_position_embeddings=130,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    perturb(model, gen)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size=40_000)
    shards = sorted(out.glob("model-*.safetensors"))
    if len(shards) < 2 or not (out / "model.safetensors.index.json").exists():
        raise SystemExit(f"expected a sharded checkpoint, got {[p.name for p in out.iterdir()]}")
    specials = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
    }
    write_tokenizer_files(out, tok, specials, config.max_position_embeddings - 2)
    write_st_files(out, config.hidden_size, pooling="mean_tokens", normalize=False, max_seq_length=40)
    return {"pooling": "mean", "normalize": False, "max_seq_length": 40}


# ------------------------------------------------------------------ independent float32 forwards


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * w
    return y if b is None else y + b


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def attention(q, k, v, allowed: torch.Tensor | None) -> torch.Tensor:
    """q, k, v: (heads, len, head_dim); allowed: (len, len) bool or None (all)."""
    s = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def rope_neox(t: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on halves: dims i and i + d/2 rotate together (HF rotate_half)."""
    half = t.shape[-1] // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
    return t * angles.cos() + rotated * angles.sin()


def modernbert_manual(sd: dict, c: dict, ids: list[int]) -> torch.Tensor:
    """ModernBERT from its paper: pre-norm, no biases, GeGLU, neox rope with per-layer theta,
    layer i global iff i % global_attn_every_n_layers == 0, local layers see |i - j| <= window/2,
    no attention norm in layer 0, final norm."""
    n, h = len(ids), c["num_attention_heads"]
    d = c["hidden_size"] // h
    eps = c["norm_eps"]
    x = layer_norm(sd["embeddings.tok_embeddings.weight"][ids], sd["embeddings.norm.weight"], None, eps)
    pos = torch.arange(n, dtype=torch.float32)
    near = (pos[:, None] - pos[None, :]).abs() <= c["local_attention"] // 2
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        is_global = i % c["global_attn_every_n_layers"] == 0
        theta = c["global_rope_theta"] if is_global else c["local_rope_theta"]
        a = x if i == 0 else layer_norm(x, sd[p + "attn_norm.weight"], None, eps)
        qkv = (a @ sd[p + "attn.Wqkv.weight"].T).view(n, 3, h, d).permute(1, 2, 0, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], dim=-1)
        o = attention(rope_neox(q, ang), rope_neox(k, ang), v, None if is_global else near)
        x = x + o.permute(1, 0, 2).reshape(n, h * d) @ sd[p + "attn.Wo.weight"].T
        m = layer_norm(x, sd[p + "mlp_norm.weight"], None, eps) @ sd[p + "mlp.Wi.weight"].T
        up, gate = m.chunk(2, dim=-1)
        x = x + (gelu_erf(up) * gate) @ sd[p + "mlp.Wo.weight"].T
    return layer_norm(x, sd["final_norm.weight"], None, eps)


def xlmr_manual(sd: dict, c: dict, ids: list[int]) -> torch.Tensor:
    """RoBERTa from its paper: post-norm BERT layers with biases, erf GELU, learned absolute
    positions that start at pad_token_id + 1 (= 2), token type 0."""
    n, h = len(ids), c["num_attention_heads"]
    d = c["hidden_size"] // h
    eps = c["layer_norm_eps"]
    e = "embeddings."
    positions = torch.arange(n) + c["pad_token_id"] + 1
    x = sd[e + "word_embeddings.weight"][ids] + sd[e + "position_embeddings.weight"][positions]
    x = layer_norm(
        x + sd[e + "token_type_embeddings.weight"][0],
        sd[e + "LayerNorm.weight"],
        sd[e + "LayerNorm.bias"],
        eps,
    )

    def lin(t, name):
        return t @ sd[name + ".weight"].T + sd[name + ".bias"]

    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (
            lin(x, p + "attention.self." + w).view(n, h, d).transpose(0, 1) for w in ("query", "key", "value")
        )
        o = attention(q, k, v, None).transpose(0, 1).reshape(n, h * d)
        x = layer_norm(
            x + lin(o, p + "attention.output.dense"),
            sd[p + "attention.output.LayerNorm.weight"],
            sd[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        f = lin(gelu_erf(lin(x, p + "intermediate.dense")), p + "output.dense")
        x = layer_norm(x + f, sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"], eps)
    return x


# ------------------------------------------------------------------------------------ reference


def f32_list(a: np.ndarray):
    """Nested lists of floats that print as the shortest decimal that round-trips to the float32."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1:
        return [float(str(v)) for v in a]
    return [f32_list(row) for row in a]


def max_abs(a, b) -> float:
    return (
        float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))
        if np.size(a)
        else 0.0
    )


def load_hf(out: Path, edit=None) -> torch.nn.Module:
    """The saved folder in float32 with eager attention; `edit(config)` may change the config."""
    config = AutoConfig.from_pretrained(out)
    if edit is not None:
        edit(config)
    return AutoModel.from_pretrained(
        out, config=config, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@torch.no_grad()
def hidden_batch1(model, ids_list: list[list[int]], position_offset: int | None = None) -> list[np.ndarray]:
    res = []
    for ids in ids_list:
        t = torch.tensor([ids])
        kw = {}
        if position_offset is not None:
            kw["position_ids"] = torch.arange(len(ids))[None] + position_offset
        res.append(model(input_ids=t, attention_mask=torch.ones_like(t), **kw).last_hidden_state[0].numpy())
    return res


def write_reference(out: Path, info: dict, manual, slips: dict) -> dict:
    cfg = json.loads((out / "config.json").read_text())
    tok_file = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok_file.enable_truncation(max_length=info["max_seq_length"])
    auto = AutoTokenizer.from_pretrained(out)
    st = SentenceTransformer(str(out), device="cpu", model_kwargs={"dtype": torch.float32})
    if {p.dtype for p in st.parameters()} != {torch.float32}:
        raise SystemExit("sentence-transformers did not load the model in float32")
    if st.max_seq_length != info["max_seq_length"]:
        raise SystemExit(f"sentence-transformers max_seq_length {st.max_seq_length}")

    model = load_hf(out)
    if {p.dtype for p in model.parameters()} != {torch.float32}:
        raise SystemExit("transformers did not load the model in float32")
    sd = {k: v.float() for k, v in model.state_dict().items()}
    pad_id = cfg["pad_token_id"]

    ids_list = []
    for text in TEXTS:
        ids = st.preprocess([text])["input_ids"][0].tolist()
        if ids != tok_file.encode(text).ids:
            raise SystemExit(f"tokenizer.json and sentence-transformers disagree on {text!r}")
        if (
            ids[: info["max_seq_length"]]
            != auto(text, truncation=True, max_length=info["max_seq_length"])["input_ids"]
        ):
            raise SystemExit(f"AutoTokenizer and sentence-transformers disagree on {text!r}")
        ids_list.append(ids)
    if max(map(len, ids_list)) != info["max_seq_length"]:
        raise SystemExit("no reference text reaches max_seq_length")
    unk_id = tok_file.token_to_id(cfg.get("unk_token", "<unk>"))
    if unk_id is not None and not any(unk_id in ids for ids in ids_list):
        raise SystemExit("no reference text exercises the unknown token")

    hidden = hidden_batch1(model, ids_list)
    cases, pool_diff, manual_diff = [], 0.0, 0.0
    for text, ids, hs in zip(TEXTS, ids_list, hidden):
        emb = st.encode(text, convert_to_numpy=True)
        if emb.dtype != np.float32:
            raise SystemExit(f"embedding dtype {emb.dtype}")
        h64 = hs.astype(np.float64)
        own = h64[0] if info["pooling"] == "cls" else h64.mean(axis=0)
        if info["normalize"]:
            own = own / np.linalg.norm(own)
        pool_diff = max(pool_diff, max_abs(emb, own))
        manual_diff = max(manual_diff, max_abs(manual(sd, cfg, ids).numpy(), hs))
        cases.append(
            {"text": text, "input_ids": ids, "last_hidden_state": f32_list(hs), "embedding": f32_list(emb)}
        )
    if pool_diff > 2e-6:
        raise SystemExit(f"sentence-transformers embedding differs from own pooling by {pool_diff:.2e}")
    if manual_diff > 1e-4:
        raise SystemExit(f"independent re-implementation differs from transformers by {manual_diff:.2e}")

    # Padded batch of all texts (right padding, attention mask) against batch 1.
    width = max(map(len, ids_list))
    batch = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids in ids_list])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in ids_list])
    with torch.no_grad():
        hb = model(input_ids=batch, attention_mask=mask).last_hidden_state.numpy()
    batch_diff = max(max_abs(hb[i, : len(ids)], hidden[i]) for i, ids in enumerate(ids_list))
    st_batch = st.encode(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS))
    st_batch_diff = max(max_abs(st_batch[i], c["embedding"]) for i, c in enumerate(cases))

    # What deliberate slips do to last_hidden_state (all texts, batch 1).
    sensitivity = {}
    for name, make in slips.items():
        other, offset = make(out)
        got = hidden_batch1(other, ids_list, offset)
        sensitivity[name] = float(f"{max(max_abs(a, b) for a, b in zip(got, hidden)):.3g}")
    # Each slip must stand well clear of the reference's own noise and of the 1e-4 tolerance that
    # the README recommends (a tanh GELU is the smallest, ~1e-3).
    noise = max(batch_diff, manual_diff)
    for name, v in sensitivity.items():
        if v < max(100 * noise, 5e-4):
            raise SystemExit(f"slip {name!r} changes the output by only {v:.2e} (noise {noise:.2e})")

    ref = {
        "generator": GENERATOR,
        "max_seq_length": info["max_seq_length"],
        "pooling": info["pooling"],
        "normalize": info["normalize"],
        "batch_vs_single_max_abs_diff": {
            "last_hidden_state": float(f"{batch_diff:.3g}"),
            "embedding_sentence_transformers": float(f"{st_batch_diff:.3g}"),
        },
        "independent_reimplementation_max_abs_diff": float(f"{manual_diff:.3g}"),
        "sentence_transformers_vs_own_pooling_max_abs_diff": float(f"{pool_diff:.3g}"),
        "sensitivity_max_abs_diff_last_hidden_state": sensitivity,
        "cases": cases,
    }
    (out / "reference.json").write_text(json.dumps(ref, ensure_ascii=False) + "\n", encoding="utf-8")
    return ref


# ------------------------------------------------------------------------------------------ main


def modernbert_slips() -> dict:
    def window16(c):
        c.local_attention = 16

    def all_global(c):
        c.layer_types = ["full_attention"] * c.num_hidden_layers

    def local_theta(c):
        c.rope_parameters["sliding_attention"]["rope_theta"] = 160000.0

    def tanh_gelu(c):
        c.hidden_activation = "gelu_pytorch_tanh"

    def eps(c):
        c.norm_eps = 1e-12

    return {
        "local window 16 instead of 8": lambda d: (load_hf(d, window16), None),
        "all layers global": lambda d: (load_hf(d, all_global), None),
        "local rope theta 160000 instead of 10000": lambda d: (load_hf(d, local_theta), None),
        "tanh GELU instead of erf GELU": lambda d: (load_hf(d, tanh_gelu), None),
        "norm eps 1e-12 instead of 1e-5": lambda d: (load_hf(d, eps), None),
    }


def xlmr_slips() -> dict:
    def tanh_gelu(c):
        c.hidden_act = "gelu_pytorch_tanh"

    def eps(c):
        c.layer_norm_eps = 1e-12

    return {
        "positions from 0 instead of 2": lambda d: (load_hf(d), 0),
        "tanh GELU instead of erf GELU": lambda d: (load_hf(d, tanh_gelu), None),
        "layer norm eps 1e-12 instead of 1e-5": lambda d: (load_hf(d, eps), None),
    }


README = """\
# Tiny random encoder checkpoints (ModernBERT, XLM-RoBERTa) with HF reference outputs

Generated by `scripts/gen_encoder_fixtures.py` (its docstring has the full recipe); regenerate with

    python3 -m venv /tmp/venc
    /tmp/venc/bin/pip install torch==2.15.0 transformers==5.23.0 sentence-transformers==6.2.0 \\
        tokenizers==0.23.3 safetensors==0.8.0 sentencepiece==0.2.3 numpy==2.4.6
    /tmp/venc/bin/python scripts/gen_encoder_fixtures.py

Generator and versions: {generator}.
Deterministic (seeded, one torch thread): rerunning gives byte-identical files.

Weights are random (the model's own init plus noise on every tensor, sized so attention is sharp
and activations stay O(1)); the tokenizers are trained on a few KB of text embedded in the script.
Both folders are in Hugging Face + sentence-transformers layout and load with
`AutoTokenizer.from_pretrained(dir)`, `AutoModel.from_pretrained(dir)` and
`SentenceTransformer(dir, device="cpu", model_kwargs={{"dtype": torch.float32}})` (transformers 5
and sentence-transformers 6 otherwise load in the dtype of config.json, i.e. f16/bf16).

## `modernbert-tiny/` ({mb_size})
- `ModernBertModel` (bare encoder, no MLM head): hidden 64, 4 heads (head_dim 16), FFN 96 (GeGLU,
  `Wi` is 64 -> 192), 3 layers, erf GELU, norm eps 1e-5, no biases anywhere, vocab rows {mb_vocab}
  (more than the {mb_tokens} tokens, as in the real model).
- Attention pattern: layer 0 global (rope theta 160000), layers 1-2 local (rope theta 10000) with
  `local_attention` 8, i.e. a token sees keys with |i - j| <= 4. Texts of up to 48 tokens, so the
  window matters. Layer 0 has no `attn_norm` tensor (identity), as in the real model.
- config.json uses the key names of the published checkpoints: `global_attn_every_n_layers`,
  `global_rope_theta`, `local_rope_theta`, `local_attention` (not transformers 5's `layer_types` /
  `rope_parameters`).
- `model.safetensors` in **F16**; the reference ran in float32 on exactly those rounded weights.
- tokenizer.json: byte-level BPE (NFC, ByteLevel without prefix space, `[CLS] $A [SEP]`); the
  specials `[UNK] [CLS] [SEP] [PAD] [MASK]` come after the BPE vocabulary (ids {mb_specials}) and
  are not in the BPE model's vocab, only in `added_tokens`; `[MASK]` has `lstrip` (eats the space
  before it).
- sentence-transformers: Transformer -> Pooling (**CLS**) -> Normalize, `max_seq_length` 48.

## `xlm-roberta-tiny/` ({xr_size})
- `XLMRobertaModel` without pooler: hidden 32, 4 heads, FFN 64, 2 layers, erf GELU, LayerNorm eps
  1e-5, `max_position_embeddings` 130, `pad_token_id` 1 so positions start at **2**,
  `type_vocab_size` 1 (token type 0 everywhere), vocab {xr_vocab}.
- Weights in **BF16**, **sharded** into {xr_shards} files with `model.safetensors.index.json`;
  the reference ran in float32 on the bf16-rounded weights.
- tokenizer.json: Unigram with the structure of xlm-roberta-base: normalizer
  `Sequence[Precompiled(nmt_nfkc charsmap), Replace(" {{2,}}" -> " ")]` (sentencepiece 0.2.3's
  nmt_nfkc table, in the binary format real XLM-R files embed: fullwidth -> ASCII, ligature `ﬁ` ->
  `fi`, tab -> space, ...), Metaspace pre-tokenizer (`▁`, prepend always, split), `<s> $A </s>`,
  `<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3, `<mask>` last ({xr_mask}). Piece scores are log relative
  substring frequencies in the training text (the trainer's own EM scores are not reproducible
  run to run). Characters unseen in training (the emoji) become `<unk>`.
- sentence-transformers: Transformer -> Pooling (**mean** over the unpadded tokens incl. `<s>` and
  `</s>`), no Normalize, `max_seq_length` 40.

## `reference.json` (one per folder)
`{{"generator", "max_seq_length", "pooling", "normalize", "batch_vs_single_max_abs_diff",
"independent_reimplementation_max_abs_diff", "sentence_transformers_vs_own_pooling_max_abs_diff",
"sensitivity_max_abs_diff_last_hidden_state", "cases": [{{"text", "input_ids",
"last_hidden_state", "embedding"}}]}}` for {n_texts} texts: empty string, one word, sentences,
accents (NFC and NFD), CJK, numbers, tabs/newlines/multiple spaces, literal special-token strings,
fullwidth + ligature + emoji, and one text longer than `max_seq_length` (truncated).
- `input_ids`: what sentence-transformers feeds the model, i.e. tokenizer.json with truncation at
  `max_seq_length` (checked equal), no padding.
- `last_hidden_state`: HF transformers float32, eager attention, one text at a time (no padding).
- `embedding`: `SentenceTransformer(dir).encode(text)` float32 (equals our own pooling of
  `last_hidden_state` to {{mb: {mb_pool}, xr: {xr_pool}}}).
- Floats are the shortest decimals that round-trip to the float32.

Noise of the reference itself (max |diff| of last_hidden_state): padded batch of all texts vs batch 1
ModernBERT {mb_batch}, XLM-R {xr_batch}; an independent float32 re-implementation in the script vs
transformers ModernBERT {mb_manual}, XLM-R {xr_manual}. (transformers 5's ModernBERT no longer unpads;
the batch runs padded with an attention mask.) Deliberate slips move last_hidden_state by:
{sensitivity}
so a float32 engine should match `last_hidden_state` and `embedding` to ~1e-4 max |diff| (weights
read from f16/bf16 and widened to f32 exactly), far below every slip above.
"""


def folder_size(path: Path) -> str:
    n = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return f"{n / 1024:.0f} KiB"


def main() -> int:
    # The load reports (e.g. the XLM-R pooler that is deliberately absent) are expected noise.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    mb_dir, xr_dir = OUT / "modernbert-tiny", OUT / "xlm-roberta-tiny"
    for d in (mb_dir, xr_dir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()

    gen = torch.Generator().manual_seed(SEED)
    mb_info = make_modernbert(mb_dir, gen)
    xr_info = make_xlmr(xr_dir, gen)
    mb = write_reference(mb_dir, mb_info, modernbert_manual, modernbert_slips())
    xr = write_reference(xr_dir, xr_info, xlmr_manual, xlmr_slips())

    mb_tok = Tokenizer.from_file(str(mb_dir / "tokenizer.json"))
    xr_tok = Tokenizer.from_file(str(xr_dir / "tokenizer.json"))
    mb_cfg = json.loads((mb_dir / "config.json").read_text())
    sens = "\n".join(
        [f"- ModernBERT, {k}: {v:g}" for k, v in mb["sensitivity_max_abs_diff_last_hidden_state"].items()]
        + [f"- XLM-R, {k}: {v:g}" for k, v in xr["sensitivity_max_abs_diff_last_hidden_state"].items()]
    )
    readme = README.format(
        generator=GENERATOR,
        mb_size=folder_size(mb_dir),
        xr_size=folder_size(xr_dir),
        mb_vocab=mb_cfg["vocab_size"],
        mb_tokens=mb_tok.get_vocab_size(),
        mb_specials=", ".join(
            f"{t}={mb_tok.token_to_id(t)}" for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
        ),
        xr_vocab=xr_tok.get_vocab_size(),
        xr_shards=len(list(xr_dir.glob("model-*.safetensors"))),
        xr_mask=f"`<mask>`={xr_tok.token_to_id('<mask>')}",
        n_texts=len(TEXTS),
        mb_pool=mb["sentence_transformers_vs_own_pooling_max_abs_diff"],
        xr_pool=xr["sentence_transformers_vs_own_pooling_max_abs_diff"],
        mb_batch=mb["batch_vs_single_max_abs_diff"]["last_hidden_state"],
        xr_batch=xr["batch_vs_single_max_abs_diff"]["last_hidden_state"],
        mb_manual=mb["independent_reimplementation_max_abs_diff"],
        xr_manual=xr["independent_reimplementation_max_abs_diff"],
        sensitivity=sens,
    )
    (OUT / "README.md").write_text(readme, encoding="utf-8")
    for d, r in ((mb_dir, mb), (xr_dir, xr)):
        summary = {k: v for k, v in r.items() if k != "cases"}
        print(
            f"{d.relative_to(REPO)}: {folder_size(d)}, {len(r['cases'])} cases, {json.dumps(summary, indent=1)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
