#!/usr/bin/env python3
"""`kiln serve` against the official `openai` Python client (and raw `httpx` where the client
cannot go: malformed bodies, dropped connections, /metrics).

Run by crates/kiln-cli/tests/serve_openai.rs, which starts the servers:

    test_kiln_serve.py URL PID GOLDEN_DIR [--busy-url URL]

URL serves `gemma3-270m` (with the Gemma 3 chat template), `base` (the same GGUF without a
template) and `minilm`; PID is its process (for VmRSS); GOLDEN_DIR is tests/golden;
--busy-url is a second server started with `--max-running 1 --max-waiting 1` (the 429 check).

Plain asserts, one function per check, no pytest: each check prints its name and PASS or FAIL
(with the traceback), and the script exits 1 when any failed. The soak runs last: it is the
only check that expects the server to have been warmed up by everything before it.
"""

import argparse
import base64
import json
import os
import random
import re
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from suite import run_checks

CHAT = "gemma3-270m"
BASE = "base"
EMBED = "minilm"
# Gemma 3 270M's context (tokens), as the server reports it in its 400.
CONTEXT = 32768

ARGS = None
CLIENT = None  # openai.OpenAI on the main server
HTTP = None  # httpx.Client on the main server


def url(path):
    return ARGS.url.rstrip("/") + path


def client_for(base_url):
    # No retries: a 429 or a 5xx must reach the check, not be retried away.
    return openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=300)


def read_jsonl(rel):
    with open(os.path.join(ARGS.golden, rel), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics():
    """`/metrics` as {(name, labels): value}."""
    r = HTTP.get(url("/metrics"))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    out = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        assert m, f"not a Prometheus sample line: {line!r}"
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def gauge(ms, name, model=CHAT):
    return ms[(name, '{model="%s"}' % model)]


def rss_kib():
    with open(f"/proc/{ARGS.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def concurrently(fn, items, workers=None):
    """fn(item) for every item on its own thread, all released at once; results in order."""
    items = list(items)
    barrier = threading.Barrier(min(len(items), workers or len(items)))

    def run(item):
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        return fn(item)

    with ThreadPoolExecutor(max_workers=workers or len(items)) as pool:
        return list(pool.map(run, items))


def greedy_completion(prompt, max_tokens, **kw):
    return CLIENT.completions.create(model=CHAT, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)


def decode_ids(ids):
    """The server's detokenization of `ids` (a completion that only echoes its prompt)."""
    if not ids:
        return ""
    r = CLIENT.completions.create(model=CHAT, prompt=ids, echo=True, max_tokens=0)
    return r.choices[0].text


def assert_usage(u, prompt=None, completion=None):
    assert u is not None, "no usage"
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert u.prompt_tokens > 0, u
    if prompt is not None:
        assert u.prompt_tokens == prompt, (u, prompt)
    if completion is not None:
        assert u.completion_tokens == completion, (u, completion)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ------------------------------------------------------------------------------------------------
# Models and health

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant. Answer in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And what is the capital of Germany?"},
]


def check_models_and_health():
    ids = {m.id for m in CLIENT.models.list().data}
    assert {CHAT, BASE, EMBED} <= ids, ids
    for m in CLIENT.models.list().data:
        assert m.object == "model", m
    r = HTTP.get(url("/health"))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ok", r.text
    # Unknown routes answer with the error object too.
    r = HTTP.get(url("/v1/nothing-here"))
    assert r.status_code == 404, r.text
    assert "error" in r.json(), r.text


# ------------------------------------------------------------------------------------------------
# Chat completions


def check_chat_multiturn():
    r = CLIENT.chat.completions.create(model=CHAT, messages=CONVERSATION, temperature=0, max_completion_tokens=24)
    assert r.object == "chat.completion", r
    assert r.model == CHAT, r.model
    assert len(r.choices) == 1, r.choices
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant", c.message
    assert isinstance(c.message.content, str) and c.message.content.strip(), c.message
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert_usage(r.usage)
    assert r.usage.completion_tokens <= 24, r.usage
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 24, r.usage
    # The earlier turns are part of the prompt: a one-turn conversation is shorter.
    one = CLIENT.chat.completions.create(model=CHAT, messages=CONVERSATION[-1:], temperature=0, max_completion_tokens=1)
    assert one.usage.prompt_tokens < r.usage.prompt_tokens, (one.usage, r.usage)
    print(f"    multi-turn answer ({c.finish_reason}): {c.message.content!r}")


def stream_chat(**kw):
    """A streamed chat: (text, finish_reason, usage, chunks)."""
    chunks = list(CLIENT.chat.completions.create(model=CHAT, stream=True, stream_options={"include_usage": True}, **kw))
    text, finish, usage = "", None, None
    for i, ch in enumerate(chunks):
        assert ch.object == "chat.completion.chunk", ch
        if ch.usage is not None:
            assert i == len(chunks) - 1, "usage comes in the last chunk only"
            assert ch.choices == [], ch
            usage = ch.usage
            continue
        assert len(ch.choices) == 1, ch
        c = ch.choices[0]
        if i == 0:
            assert c.delta.role == "assistant", ch
        if c.delta.content:
            assert finish is None, "content after the finish_reason"
            text += c.delta.content
        if c.finish_reason is not None:
            assert finish is None, "two finish_reasons"
            finish = c.finish_reason
    assert len({ch.id for ch in chunks}) == 1, "one id per stream"
    return text, finish, usage, chunks


def check_chat_stream_with_usage():
    kw = dict(messages=CONVERSATION, temperature=0, max_completion_tokens=24)
    text, finish, usage, chunks = stream_chat(**kw)
    assert finish in ("stop", "length"), finish
    assert_usage(usage)
    r = CLIENT.chat.completions.create(model=CHAT, **kw)
    # Greedy: the stream says what the non-streamed answer says, with the same counts.
    assert text == r.choices[0].message.content, (text, r.choices[0].message.content)
    assert finish == r.choices[0].finish_reason, (finish, r.choices[0].finish_reason)
    assert usage.prompt_tokens == r.usage.prompt_tokens, (usage, r.usage)
    assert usage.completion_tokens == r.usage.completion_tokens, (usage, r.usage)
    # Without stream_options there is no usage chunk.
    plain = list(CLIENT.chat.completions.create(model=CHAT, stream=True, **kw))
    assert all(ch.usage is None for ch in plain)
    assert "".join(ch.choices[0].delta.content or "" for ch in plain if ch.choices) == text
    print(f"    {len(chunks)} chunks, usage {usage.prompt_tokens}+{usage.completion_tokens}")


def check_chat_max_completion_tokens():
    msgs = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    for kw in ({"max_completion_tokens": 5}, {"max_tokens": 7}):
        limit = next(iter(kw.values()))
        r = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, **kw)
        assert r.choices[0].finish_reason == "length", (kw, r.choices[0])
        assert_usage(r.usage, completion=limit)
        # Both given: max_completion_tokens wins (OpenAI deprecates max_tokens for chat).
    r = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, max_completion_tokens=3, max_tokens=9)
    assert r.usage.completion_tokens == 3, r.usage


def pick_stop(text):
    """A stop string taken from the middle of `text`: (stop, where it first occurs), the first
    occurrence at least a quarter into the text (a base model repeats itself)."""
    mid = len(text) // 2
    for at in sorted(range(1, len(text) - 6), key=lambda i: abs(i - mid)):
        for width in (6, 5, 4):
            s = text[at : at + width]
            first = text.find(s)
            if s.strip() and first >= len(text) // 4:
                return s, first
    raise AssertionError(f"no stop string fits in {text!r}")


def check_chat_stop_strings():
    msgs = [{"role": "user", "content": "Tell me about the history of Paris in a few sentences."}]
    full = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, max_completion_tokens=48)
    text = full.choices[0].message.content
    assert len(text) >= 12, f"the greedy answer is too short to pick a stop string from: {text!r}"
    stop, at = pick_stop(text)
    assert 0 < at < len(text)
    r = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, max_completion_tokens=48, stop=[stop, "@@never@@"])
    c = r.choices[0]
    assert c.finish_reason == "stop", (stop, c)
    assert c.message.content == text[:at], (stop, c.message.content, text[:at])
    assert r.usage.completion_tokens <= full.usage.completion_tokens, (r.usage, full.usage)
    # The same stop in a stream (it may straddle chunks: nothing of it is sent).
    s_text, s_finish, s_usage, _ = stream_chat(messages=msgs, temperature=0, max_completion_tokens=48, stop=stop)
    assert (s_text, s_finish) == (text[:at], "stop"), (stop, s_text, s_finish)
    assert s_usage.completion_tokens == r.usage.completion_tokens, (s_usage, r.usage)
    print(f"    stop {stop!r} at char {at} of {len(text)}")


def check_chat_seed_reproducible():
    msgs = [{"role": "user", "content": "Invent a name for a new color."}]

    def sample(seed):
        return CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=1.0, seed=seed, max_completion_tokens=16).choices[0].message.content

    a, b = sample(1234), sample(1234)
    assert a == b, (a, b)
    others = {sample(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds all gave the same sample"


def tokens_of(choice):
    """Tokens a chat choice generated: its log-probability entries, plus the end-of-turn token
    (which has no text and no entry) when it stopped on its own."""
    return len(choice.logprobs.content) + (1 if choice.finish_reason == "stop" else 0)


def check_chat_n2():
    msgs = [{"role": "user", "content": "Say something about cats."}]
    r = CLIENT.chat.completions.create(model=CHAT, messages=msgs, n=2, temperature=1.0, seed=7, max_completion_tokens=12, logprobs=True)
    assert [c.index for c in r.choices] == [0, 1], r.choices
    for c in r.choices:
        assert c.finish_reason in ("stop", "length"), c
        assert c.message.role == "assistant"
    assert_usage(r.usage, completion=sum(tokens_of(c) for c in r.choices))
    again = CLIENT.chat.completions.create(model=CHAT, messages=msgs, n=2, temperature=1.0, seed=7, max_completion_tokens=12, logprobs=True)
    assert [c.message.content for c in r.choices] == [c.message.content for c in again.choices]
    # n=2 streamed: every chunk names its choice; each choice ends once.
    finishes = {}
    for ch in CLIENT.chat.completions.create(model=CHAT, messages=msgs, n=2, temperature=1.0, seed=7, max_completion_tokens=12, stream=True):
        for c in ch.choices:
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert sorted(finishes) == [0, 1], finishes


def check_chat_penalties_and_extra_fields():
    msgs = [{"role": "user", "content": "List five animals."}]
    greedy = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, max_completion_tokens=16).choices[0].message.content
    r = CLIENT.chat.completions.create(
        model=CHAT, messages=msgs, max_completion_tokens=16, temperature=0.7, seed=3,
        presence_penalty=0.5, frequency_penalty=0.5,
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    assert r.choices[0].finish_reason in ("stop", "length"), r
    # The extra fields are applied, not just accepted: top_k 1 and min_p 1 leave only the arg-max.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        t = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=1.0, seed=11, max_completion_tokens=16, extra_body=extra).choices[0].message.content
        assert t == greedy, (extra, t, greedy)
    # Penalties change a repetitive greedy continuation (llama.cpp's golden output of this prompt
    # repeats itself).
    prompt = "The capital of France is"
    plain = greedy_completion(prompt, 32).choices[0].text
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"extra_body": {"repetition_penalty": 1.5}}):
        t = greedy_completion(prompt, 32, **kw).choices[0].text
        assert t != plain, (kw, t)
    # Out-of-range values are refused by name.
    for kw, param in (({"presence_penalty": 2.5}, "presence_penalty"), ({"extra_body": {"top_k": -5}}, "top_k"), ({"extra_body": {"min_p": 2}}, "min_p")):
        try:
            CLIENT.chat.completions.create(model=CHAT, messages=msgs, max_completion_tokens=2, **kw)
            raise AssertionError(f"{kw} accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (kw, e.body)


def check_chat_logprobs():
    msgs = [{"role": "user", "content": "Name the largest planet in the Solar System."}]
    r = CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, max_completion_tokens=10, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert content, c.logprobs
    assert len(content) + (1 if c.finish_reason == "stop" else 0) == r.usage.completion_tokens, (len(content), r.usage)
    for e in content:
        assert len(e.top_logprobs) == 3, e
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True), lps
        assert all(lp <= 0 for lp in lps), lps
        # Greedy: the chosen token is the most likely one.
        assert abs(e.logprob - lps[0]) < 1e-6, (e.logprob, lps)
        assert e.token == e.top_logprobs[0].token, e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or not e.token.isascii(), e
    assert "".join(e.token for e in content) == c.message.content, ([e.token for e in content], c.message.content)
    # Streamed log-probabilities are the same entries.
    streamed = []
    for ch in CLIENT.chat.completions.create(model=CHAT, messages=msgs, temperature=0, max_completion_tokens=10, logprobs=True, top_logprobs=3, stream=True):
        for ci in ch.choices:
            if ci.logprobs and ci.logprobs.content:
                streamed.extend(ci.logprobs.content)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def check_chat_on_base_model_is_refused():
    try:
        CLIENT.chat.completions.create(model=BASE, messages=CONVERSATION, max_completion_tokens=4)
        raise AssertionError("chat on a model without a template was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert "chat template" in e.body["message"], e.body
    # The same model completes text.
    r = CLIENT.completions.create(model=BASE, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text == greedy_completion("The capital of France is", 4).choices[0].text


# ------------------------------------------------------------------------------------------------
# Completions


def check_completion_prompt_shapes():
    p1, p2 = "The capital of France is", "Water boils at a temperature of"
    g = {c["prompt"]: c for c in read_jsonl("gemma3-270m/public/greedy.jsonl")}
    one = greedy_completion(p1, 8)
    assert one.object == "text_completion", one
    assert len(one.choices) == 1 and one.choices[0].index == 0
    assert one.choices[0].finish_reason == "length", one.choices[0]
    # Prompts are tokenized as llama.cpp does (BOS added).
    assert_usage(one.usage, prompt=len(g[p1]["prompt_ids"]), completion=8)
    two = greedy_completion([p1, p2], 8)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == one.choices[0].text, (two.choices[0].text, one.choices[0].text)
    assert two.choices[1].text == greedy_completion(p2, 8).choices[0].text
    assert_usage(two.usage, prompt=len(g[p1]["prompt_ids"]) + len(g[p2]["prompt_ids"]), completion=16)
    ids = greedy_completion(g[p1]["prompt_ids"], 8)
    assert ids.choices[0].text == one.choices[0].text, (ids.choices[0].text, one.choices[0].text)
    assert_usage(ids.usage, prompt=len(g[p1]["prompt_ids"]))
    lists = greedy_completion([g[p1]["prompt_ids"], g[p2]["prompt_ids"]], 8)
    assert [c.text for c in lists.choices] == [c.text for c in two.choices]
    # Streamed: the same text.
    streamed = "".join(ch.choices[0].text for ch in CLIENT.completions.create(model=CHAT, prompt=p1, max_tokens=8, temperature=0, stream=True) if ch.choices)
    assert streamed == one.choices[0].text, (streamed, one.choices[0].text)


# Steps compared with llama.cpp's greedy output: those before the first step whose top-2 gap
# (llama.cpp's logit of its first choice minus its second) is below this many nats, and how many
# prompts in 20 may diverge before it: golden_gemma3.rs's rule for `kiln run`, which the golden
# README derives from the distance between independent references (llama.cpp and HF disagree at
# gaps up to 0.12 themselves; Q8 activations against f32 move logits by a few tenths of a nat).
GREEDY_GAP = 0.6
EARLY_PER_20 = 1


def check_completion_greedy_matches_llama_cpp():
    """Greedy completions of the golden prompts equal llama.cpp's up to the first step where
    llama.cpp's top-2 gap is under GREEDY_GAP nats, but for at most EARLY_PER_20 prompts in 20
    (as golden_gemma3.rs holds `kiln run`). The server's batch-invariant kernels sum in another
    order than `kiln run`'s, so the two may part at small gaps; both are held to this rule."""
    cases = read_jsonl("gemma3-270m/public/greedy.jsonl")
    end_ids = {1, 106}  # <eos>, <end_of_turn>: llama.cpp's text leaves them out

    def prefix(ids, k):
        # A cut may split a UTF-8 sequence: its replacement character is not compared.
        return decode_ids([t for t in ids[:k] if t not in end_ids]).rstrip("\ufffd")

    r = greedy_completion([c["prompt"] for c in cases], 32, logprobs=0)
    assert len(r.choices) == len(cases)
    assert_usage(r.usage, prompt=sum(len(c["prompt_ids"]) for c in cases))
    bad, full, compared = [], 0, 0
    for case, choice in zip(cases, r.choices):
        # The server detokenizes llama.cpp's ids as llama.cpp does.
        assert prefix(case["ids"], 32) == case["text"].rstrip("\ufffd"), (case["prompt"], prefix(case["ids"], 32), case["text"])
        gaps = case["top2_gap"]
        k = next((i for i, g in enumerate(gaps) if g < GREEDY_GAP), len(gaps))
        compared += k
        full += choice.text == case["text"]
        if choice.text == case["text"]:
            continue
        # The first step where our token differs (pieces: the server's text of each token).
        ours = choice.logprobs.tokens
        theirs = [decode_ids([t]) if t not in end_ids else "" for t in case["ids"]]
        step = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        if not choice.text.startswith(prefix(case["ids"], k)):
            bad.append(f"{case['prompt'][:40]!r}: differs at step {step} (llama.cpp's gap there {gaps[min(step, 31)]:.3f}; compared up to "
                       f"step {k}): want {prefix(case['ids'], k)!r}, got {choice.text!r}")
    print(f"    {full}/{len(cases)} completions identical to llama.cpp's; {compared} steps compared; "
          f"{len(bad)} diverge before a gap < {GREEDY_GAP}")
    assert len(bad) * 20 <= EARLY_PER_20 * len(cases), f"{len(bad)} of {len(cases)} prompts diverge early:\n" + "\n".join(bad)


def check_completion_echo_logprobs():
    prompt = "The capital of France is"
    r = CLIENT.completions.create(model=CHAT, prompt=prompt, echo=True, max_tokens=0, logprobs=1)
    c = r.choices[0]
    assert c.text == prompt, c.text
    lp = c.logprobs
    assert lp.token_logprobs[0] is None, lp.token_logprobs
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:]), lp.token_logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert_usage(r.usage, completion=0)
    assert len(lp.tokens) == r.usage.prompt_tokens, (lp.tokens, r.usage)
    assert lp.top_logprobs[0] is None
    assert all(len(t) >= 1 for t in lp.top_logprobs[1:]), lp.top_logprobs
    # Echo with generation: the prompt, then the greedy continuation, log-probabilities for all.
    g = CLIENT.completions.create(model=CHAT, prompt=prompt, echo=True, max_tokens=4, logprobs=1, temperature=0)
    assert g.choices[0].text == prompt + greedy_completion(prompt, 4).choices[0].text, g.choices[0].text
    assert len(g.choices[0].logprobs.tokens) == r.usage.prompt_tokens + 4


# ------------------------------------------------------------------------------------------------
# Embeddings


def embed(inp, **kw):
    return CLIENT.embeddings.create(model=EMBED, input=inp, encoding_format="float", **kw)


def check_embedding_shapes_and_base64():
    texts = ["A cat sits on the mat.", "Quantum computers use qubits.", "café"]
    one = embed(texts[0])
    assert one.object == "list" and len(one.data) == 1, one
    v = one.data[0].embedding
    assert len(v) == 384 and all(isinstance(x, float) for x in v)
    assert abs(sum(x * x for x in v) - 1) < 1e-5, "unit norm"
    assert one.usage.prompt_tokens > 0 and one.usage.total_tokens == one.usage.prompt_tokens
    many = embed(texts)
    assert [d.index for d in many.data] == [0, 1, 2]
    alone = [embed(t).data[0].embedding for t in texts]
    # The inputs of one request are packed into one forward pass, whose kernels pick their path
    # by the packed row count: the server promises exact vectors per request (see
    # check_batch_invariance_embeddings), not per input, so here the last bits may move.
    packed = max(abs(a - b) for d, v in zip(many.data, alone) for a, b in zip(d.embedding, v))
    assert packed <= 1e-6, packed
    # Token ids (with [CLS] and [SEP], as the model sees them) give the text's vector.
    golden = {c["text"]: c for c in read_jsonl("all-minilm-l6-v2/public/embeddings.jsonl")}
    ids = golden["café"]["input_ids"]
    by_ids = embed(ids)
    assert by_ids.usage.prompt_tokens == len(ids) == embed("café").usage.prompt_tokens
    assert by_ids.data[0].embedding == alone[2], "ids and text give one vector"
    assert max(abs(a - b) for a, b in zip(embed([ids, ids]).data[1].embedding, alone[2])) <= 1e-6
    # base64: little-endian float32, the same numbers.
    b = CLIENT.embeddings.create(model=EMBED, input=texts, encoding_format="base64")
    for d, f in zip(b.data, many.data):
        raw = base64.b64decode(d.embedding)
        assert len(raw) == 4 * 384, len(raw)
        assert list(struct.unpack("<384f", raw)) == [f32(x) for x in f.embedding]
    # The client's default asks for base64 and decodes it.
    dflt = CLIENT.embeddings.create(model=EMBED, input=texts)
    assert [[f32(x) for x in d.embedding] for d in dflt.data] == [[f32(x) for x in d.embedding] for d in many.data]


def check_embeddings_match_sentence_transformers():
    cases = read_jsonl("all-minilm-l6-v2/public/embeddings.jsonl")
    # Texts go in as text where sentence-transformers did not truncate them (kiln refuses longer
    # input, as OpenAI does; the empty string too); every case goes in as its ids.
    texts = [c for c in cases if c["text"] and len(c["input_ids"]) < 256]
    got_text = embed([c["text"] for c in texts]).data
    got_ids = embed([c["input_ids"] for c in cases]).data
    long = next(c for c in cases if len(c["input_ids"]) == 256 and len(c["text"]) > 4000)
    try:
        embed(long["text"])
        raise AssertionError("a text longer than max_seq_length was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "input" and "256" in e.body["message"], e.body
    # Packing a request's inputs moves last bits only (see check_embedding_shapes_and_base64).
    alone = [embed(c["text"]).data[0].embedding for c in texts[:20]]
    packed = max(abs(a - b) for d, v in zip(got_text, alone) for a, b in zip(d.embedding, v))
    assert packed <= 1e-6, packed
    worst, bad = 0.0, []
    for c, d in list(zip(texts, got_text)) + list(zip(cases, got_ids)):
        diff = max(abs(a - b) for a, b in zip(c["embedding"], d.embedding))
        worst = max(worst, diff)
        if diff > 1e-4:
            bad.append(f"{c['text'][:40]!r}: max |diff| {diff:.2e}")
    print(f"    {len(texts)} texts and {len(cases)} id lists, worst max |diff| {worst:.2e}; "
          f"within-request packing moved vectors by up to {packed:.1e}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------------------------
# Errors


def assert_error(resp, status, param="any"):
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if param != "any":
        assert err["param"] == param, err
    return err


def check_unknown_model_is_not_found():
    for call in (
        lambda: CLIENT.chat.completions.create(model="no-such-model", messages=CONVERSATION),
        lambda: CLIENT.completions.create(model="no-such-model", prompt="x"),
        lambda: CLIENT.embeddings.create(model="no-such-model", input="x"),
    ):
        try:
            call()
            raise AssertionError("an unknown model was accepted")
        except openai.NotFoundError as e:
            assert e.status_code == 404
            assert e.body["param"] == "model", e.body
            assert CHAT in e.body["message"], "the message lists the served models"


def check_malformed_requests_are_400s():
    post = lambda path, content: HTTP.post(url(path), content=content, headers={"content-type": "application/json"})
    err = assert_error(post("/v1/completions", b'{"model": "gemma3-270m", "prompt": '), 400)
    assert "JSON" in err["message"], err
    err = assert_error(post("/v1/chat/completions", b'{"model": "gemma3-270m", "messages": [{"role": "user", "content": "\xff\xfe"}]}'), 400)
    assert "UTF-8" in err["message"], err
    assert_error(post("/v1/completions", b'{"model": "gemma3-270m", "prompt": "x", "max_tokens": "ten"}'), 400)
    assert_error(post("/v1/chat/completions", b'{"model": "gemma3-270m", "messages": "hello"}'), 400)
    assert_error(post("/v1/embeddings", b'{"model": "minilm", "input": {"text": "x"}}'), 400)
    assert_error(post("/v1/completions", b'[1, 2, 3]'), 400)
    assert_error(post("/v1/completions", b'{"model": "gemma3-270m", "prompt": "x", "max_tokens": -5}'), 400)
    assert_error(post("/v1/chat/completions", json.dumps({"model": CHAT, "messages": CONVERSATION, "temperature": 5}).encode()), 400, param="temperature")
    # The client sees the same as exceptions.
    for kw, param in (({"max_tokens": -5}, None), ({"temperature": 5}, "temperature")):
        try:
            CLIENT.completions.create(model=CHAT, prompt="x", **kw)
            raise AssertionError(f"{kw} accepted")
        except openai.BadRequestError as e:
            if param:
                assert e.body["param"] == param, e.body


def check_prompt_longer_than_context():
    # ~40000 tokens (about 5.9 per repetition).
    text = " ".join(f"item {i % 1000}," for i in range(6800))
    for path, body, param in (
        ("/v1/completions", {"model": CHAT, "prompt": text, "max_tokens": 4}, "prompt"),
        ("/v1/chat/completions", {"model": CHAT, "messages": [{"role": "user", "content": text}], "max_tokens": 4}, "messages"),
    ):
        err = assert_error(HTTP.post(url(path), json=body), 400, param=param)
        n = [int(x) for x in re.findall(r"\d+", err["message"])]
        assert CONTEXT in n, err
        assert any(x > CONTEXT for x in n), ("the prompt's length is named", err)
        assert err["code"] == "context_length_exceeded", err
    try:
        CLIENT.completions.create(model=CHAT, prompt=text, max_tokens=4)
        raise AssertionError("an over-long prompt was accepted")
    except openai.BadRequestError as e:
        assert str(CONTEXT) in e.body["message"], e.body
        print(f"    {e.body['message']}")


# ------------------------------------------------------------------------------------------------
# Batch invariance

SUBJECTS = ["the moon", "a river", "coffee", "the violin", "glaciers", "honeybees", "the printing press", "volcanoes",
            "chess", "the Roman empire", "photosynthesis", "jazz", "the desert", "a lighthouse", "bread", "electricity",
            "the octopus", "mountains", "libraries", "the wind", "tea", "trains", "the ocean floor", "salt",
            "clocks", "the Amazon", "bicycles", "comets", "paper", "owls", "the piano", "rain"]


def check_batch_invariance_completions():
    prompts = [f"Here is one surprising fact about {s}:" for s in SUBJECTS]
    assert len(set(prompts)) == 32

    def one(p):
        r = greedy_completion(p, 24, logprobs=1)
        c = r.choices[0]
        return c.text, c.logprobs.tokens, c.logprobs.token_logprobs

    t0 = time.monotonic()
    together = concurrently(one, prompts)
    t1 = time.monotonic()
    alone = [one(p) for p in prompts]
    t2 = time.monotonic()
    text_diff = [i for i in range(32) if together[i][:2] != alone[i][:2]]
    assert not text_diff, "outputs differ when batched: " + "; ".join(f"{prompts[i]!r}: {together[i][0]!r} vs {alone[i][0]!r}" for i in text_diff)
    lp_diff = [i for i in range(32) if together[i][2] != alone[i][2]]
    assert not lp_diff, f"log-probabilities differ when batched for {len(lp_diff)} prompts, e.g. {together[lp_diff[0]][2]} vs {alone[lp_diff[0]][2]}"
    print(f"    32 concurrent: {t1 - t0:.1f} s; one at a time: {t2 - t1:.1f} s")


def check_batch_invariance_embeddings():
    texts = [f"A sentence about {s}, number {i}." for i, s in enumerate(SUBJECTS)]
    together = concurrently(lambda t: embed(t).data[0].embedding, texts)
    alone = [embed(t).data[0].embedding for t in texts]
    diff = [i for i in range(32) if together[i] != alone[i]]
    assert not diff, f"{len(diff)} vectors differ when requests run concurrently"


# ------------------------------------------------------------------------------------------------
# Prefix caching


def time_to_first_token(prompt):
    t0 = time.monotonic()
    first, usage = None, None
    for ch in CLIENT.completions.create(model=CHAT, prompt=prompt, max_tokens=2, temperature=0, stream=True, stream_options={"include_usage": True}):
        if first is None and ch.choices:
            first = time.monotonic() - t0
        if ch.usage:
            usage = ch.usage
    return first, usage


def check_prefix_cache():
    nonce = uuid.uuid4().hex
    sentences = [f"Paragraph {i}: the committee reviewed the {s} report and approved the budget for next year." for i, s in enumerate(SUBJECTS)]
    prefix = f"Meeting notes {nonce}.\n" + "\n".join(sentences) + "\n\n"
    before = metrics()
    t1, u1 = time_to_first_token(prefix + "Question: what did the committee approve?")
    mid = metrics()
    t2, u2 = time_to_first_token(prefix + "Summary in one word:")
    after = metrics()
    hits1 = gauge(mid, "kiln_prefix_cache_hit_blocks_total") - gauge(before, "kiln_prefix_cache_hit_blocks_total")
    hits2 = gauge(after, "kiln_prefix_cache_hit_blocks_total") - gauge(mid, "kiln_prefix_cache_hit_blocks_total")
    print(f"    prompts of {u1.prompt_tokens} and {u2.prompt_tokens} tokens; cache hits {hits1:.0f} then {hits2:.0f} blocks; "
          f"time to first token {t1 * 1000:.0f} ms then {t2 * 1000:.0f} ms")
    assert u1.prompt_tokens >= 550, ("the shared prefix is ~600 tokens", u1)
    assert hits1 == 0, "the first request's prefix is new"
    # Every full block of the shared prefix but the last (which the tokenizer may merge with the
    # suffix) is found.
    shared_blocks = (u1.prompt_tokens - 16) // 16 - 1
    assert hits2 >= shared_blocks, (hits2, shared_blocks)
    assert t2 < t1, (t1, t2)


# ------------------------------------------------------------------------------------------------
# Admission (429)


def check_queue_full_is_429():
    if not ARGS.busy_url:
        raise AssertionError("no --busy-url: the 429 check needs the second server")
    busy = client_for(ARGS.busy_url)

    def one(i):
        try:
            r = busy.completions.with_raw_response.create(model=CHAT, prompt=f"Count from {i} upwards:", max_tokens=64, temperature=0)
            c = r.parse()
            return 200, None, (c.choices[0].finish_reason, c.usage.completion_tokens)
        except openai.RateLimitError as e:
            return e.status_code, e.response.headers.get("retry-after"), e.body
        except openai.APIStatusError as e:
            return e.status_code, None, e.body

    out = concurrently(one, range(16))
    codes = [o[0] for o in out]
    n429 = codes.count(429)
    print(f"    16 concurrent requests: {codes.count(200)} × 200, {n429} × 429")
    assert n429 >= 1, codes
    assert set(codes) <= {200, 429}, out
    for code, retry, body in out:
        if code == 429:
            assert retry is not None and int(retry) >= 1, "429 without Retry-After"
            assert body["type"] == "rate_limit_error", body
        else:
            finish, tokens = body
            assert finish in ("stop", "length") and 1 <= tokens <= 64, ("an admitted request runs to its end", body)


# ------------------------------------------------------------------------------------------------
# Soak (last)

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "iris", "juniper", "kelp",
         "lagoon", "meadow", "nebula", "orchid", "prairie", "quartz", "reef", "sequoia", "tundra", "umber",
         "valley", "willow", "xenon", "yarrow", "zephyr"]


def soak_round(n, concurrency, abort_every, seed):
    """n streamed completions (max_tokens 16, varied prompts) at `concurrency`; every
    `abort_every`-th client closes its connection after the first chunk. Returns counts.

    Half the requests are greedy, half sample with top_k 40: sampling from the whole vocabulary
    (OpenAI's default, top_k off) sorts all 262144 logits per token on the model thread and
    halves the throughput (measured: 27 vs 59 tokens/s at 16 concurrent requests), which would
    double the soak's time without loading anything else."""
    rng = random.Random(seed)
    prompts = [f"{rng.choice(WORDS)} {rng.choice(WORDS)} {seed}.{i}: the {rng.choice(WORDS)} and the {rng.choice(WORDS)}"
               for i in range(n)]
    lock = threading.Lock()
    counts = {"ok": 0, "aborted": 0, "5xx": 0, "other": 0, "tokens": 0}
    failures = []

    def one(i):
        abort = abort_every and i % abort_every == 0
        try:
            sampling = {"temperature": 0} if i % 2 else {"temperature": 0.8, "seed": i, "extra_body": {"top_k": 40}}
            stream = CLIENT.completions.create(model=CHAT, prompt=prompts[i], max_tokens=16, stream=True,
                                               stream_options={"include_usage": True}, **sampling)
            finish, usage = None, None
            for ch in stream:
                if abort:
                    stream.close()  # drops the connection mid-stream
                    break
                for c in ch.choices:
                    finish = c.finish_reason or finish
                usage = ch.usage or usage
            with lock:
                if abort:
                    counts["aborted"] += 1
                elif finish in ("stop", "length") and usage is not None:
                    counts["ok"] += 1
                    counts["tokens"] += usage.completion_tokens
                else:
                    counts["other"] += 1
                    failures.append(f"#{i}: finish {finish}, usage {usage}")
        except openai.APIStatusError as e:
            with lock:
                counts["5xx" if e.status_code >= 500 else "other"] += 1
                failures.append(f"#{i}: {e.status_code} {e.body}")
        except Exception as e:  # an error event mid-stream, a broken connection
            with lock:
                counts["other"] += 1
                failures.append(f"#{i}: {type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(n)))
    return counts, failures


def wait_idle(timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        ms = metrics()
        state = {k: gauge(ms, k) for k in ("kiln_kv_blocks_used", "kiln_running_sequences", "kiln_waiting_sequences")}
        if all(v == 0 for v in state.values()):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle {timeout} s after the load: {state}")
        time.sleep(0.5)


def check_soak():
    """The KV cache is allocated zeroed (calloc): its pages become resident as blocks are first
    used, and every full block stays cached for prefix reuse, so resident memory grows until the
    prefix cache has filled the whole pool once (with the default 1 GiB pool the soak grew VmRSS
    by 43 % that way). The driver starts the server with a small pool (--kv-memory 128) and the
    baseline is taken once the cache holds nearly every block, so that growth after it is the
    server's own."""
    t0 = time.monotonic()
    for rnd in range(1, 6):
        warm, warm_fail = soak_round(64, 64, 5, seed=rnd)
        assert warm["5xx"] == 0 and warm["other"] == 0, (warm, warm_fail[:5])
        wait_idle()
        ms = metrics()
        total, cached = gauge(ms, "kiln_kv_blocks_free"), gauge(ms, "kiln_kv_blocks_cached")
        if cached >= total - 128:
            break
    assert cached >= total - 128, f"the prefix cache holds {cached} of {total} blocks after {rnd} warm-up rounds"
    rss_warm = rss_kib()
    t1 = time.monotonic()
    counts, failures = soak_round(500, 64, 5, seed=100)
    t2 = time.monotonic()
    idle = wait_idle()
    rss_after = rss_kib()
    ms = metrics()
    print(f"    warm-up: {rnd} × 64 requests in {t1 - t0:.1f} s (then {cached:.0f} of {total:.0f} KV blocks cached); soak: 500 requests in {t2 - t1:.1f} s: {counts['ok']} complete "
          f"({counts['tokens']} tokens, {counts['tokens'] / (t2 - t1):.0f} tokens/s), {counts['aborted']} closed after the first chunk, "
          f"{counts['5xx']} × 5xx, {counts['other']} other failures")
    print(f"    after: {idle}; VmRSS {rss_warm / 1024:.0f} MiB after the warm-up, {rss_after / 1024:.0f} MiB after the soak "
          f"({(rss_after / rss_warm - 1) * 100:+.1f}%); KV blocks cached {gauge(ms, 'kiln_kv_blocks_cached'):.0f}, "
          f"free {gauge(ms, 'kiln_kv_blocks_free'):.0f}; preemptions {gauge(ms, 'kiln_preemptions_total'):.0f}")
    assert counts["5xx"] == 0, failures[:10]
    assert counts["other"] == 0, failures[:10]
    assert counts["ok"] == 400 and counts["aborted"] == 100, counts
    assert rss_after <= rss_warm * 1.15, f"VmRSS grew from {rss_warm} to {rss_after} KiB"
    r = HTTP.get(url("/health"))
    assert r.status_code == 200, r.text


CHECKS = [
    check_models_and_health,
    check_chat_multiturn,
    check_chat_stream_with_usage,
    check_chat_max_completion_tokens,
    check_chat_stop_strings,
    check_chat_seed_reproducible,
    check_chat_n2,
    check_chat_penalties_and_extra_fields,
    check_chat_logprobs,
    check_chat_on_base_model_is_refused,
    check_completion_prompt_shapes,
    check_completion_greedy_matches_llama_cpp,
    check_completion_echo_logprobs,
    check_embedding_shapes_and_base64,
    check_embeddings_match_sentence_transformers,
    check_unknown_model_is_not_found,
    check_malformed_requests_are_400s,
    check_prompt_longer_than_context,
    check_batch_invariance_completions,
    check_batch_invariance_embeddings,
    check_prefix_cache,
    check_queue_full_is_429,
    check_soak,  # last: it measures memory after everything else ran
]


def main():
    global ARGS, CLIENT, HTTP
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("pid", type=int, help="the server's process id (for VmRSS)")
    ap.add_argument("golden", help="the golden data folder (tests/golden)")
    ap.add_argument("--busy-url", help="a server started with --max-running 1 --max-waiting 1")
    ap.add_argument("-k", dest="only", help="run the checks whose name contains this")
    ARGS = ap.parse_args()
    CLIENT = client_for(ARGS.url)
    HTTP = httpx.Client(timeout=300)
    print(f"openai {openai.__version__}, httpx {httpx.__version__}, server {ARGS.url} (pid {ARGS.pid})", flush=True)
    run_checks(CHECKS, ARGS.only, "openai suite")


if __name__ == "__main__":
    main()
