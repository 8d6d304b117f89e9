#!/usr/bin/env python3
"""Structured outputs and tool calls of `kiln serve` through the official `openai` client.

Run by crates/kiln-cli/tests/serve_openai.rs, which starts the server:

    test_structured.py URL GOLDEN_DIR

URL serves `gemma3-270m` (Gemma 3 270M with its own chat template: kiln's generic tool-call
format). The checks:

- 50 strict JSON schemas (nested objects, arrays, enums, nullable fields, $defs/$ref, bounded
  numbers and strings) at temperature 0 and 1, two seeds each: every output that ends with
  `stop` validates against its schema (the `jsonschema` package), and most end that way;
- `json_object` outputs parse as objects; `.parse()` with a pydantic model and the `.stream()`
  helper give parsed objects;
- tools: `required` and a named choice give exactly one valid call (arguments valid against the
  tool's parameters, `finish_reason: "tool_calls"`), `none` gives none, `auto` answers either
  way; a call sent back with its result continues the conversation; streamed calls keep vLLM's
  invariants (the role once, each call's id and name once, one finish_reason) and their
  arguments equal the non-streamed ones;
- `logit_bias` −100 bans the greedy token and +100 forces one;
- 64 concurrent constrained greedy streams each give the text they give alone.

Plain asserts, one function per check; each prints PASS or FAIL; exit 1 when any failed.
"""

import argparse
import importlib.metadata
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pydantic
from suite import run_checks

CHAT = "gemma3-270m"
ARGS = None
CLIENT = None
# Gemma's end tokens never appear as text; a schema's strings are bounded so that outputs end.
MAX_TOKENS = 160


def read_jsonl(rel):
    with open(os.path.join(ARGS.golden, rel), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def strict(properties, defs=None):
    """A strict object schema: every property required, nothing else allowed."""
    s = {"type": "object", "properties": properties, "required": list(properties),
         "additionalProperties": False}
    if defs:
        s["$defs"] = defs
    return s


# The building blocks of the schemas.
FIELDS = [
    ("name", {"type": "string", "maxLength": 12}),
    ("age", {"type": "integer", "minimum": 0, "maximum": 120}),
    ("score", {"type": "number", "minimum": -1, "maximum": 1}),
    ("active", {"type": "boolean"}),
    ("color", {"enum": ["red", "green", "blue"]}),
    ("nickname", {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}),
    ("tags", {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}),
    ("counts", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 1, "maxItems": 4}),
    ("size", {"type": "string", "enum": ["S", "M", "L"]}),
    ("address", strict({"city": {"type": "string", "maxLength": 10},
                        "zip": {"type": "integer", "minimum": 1000, "maximum": 99999}})),
    ("year", {"type": "integer", "minimum": 1900, "maximum": 2100}),
    ("ratio", {"type": "number", "exclusiveMinimum": 0, "maximum": 10}),
]


def schemas():
    """50 strict schemas: 38 objects of 1 to 4 fields, 6 with $defs/$ref, 6 nested."""
    rng = random.Random(7)
    out = []
    for i in range(38):
        fields = rng.sample(FIELDS, rng.randint(1, 4))
        out.append(strict(dict(fields)))
    for i in range(6):
        item = strict(dict(rng.sample(FIELDS[:5], 2)))
        out.append(strict({"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2},
                           "label": {"type": "string", "maxLength": 10}},
                          defs={"item": item}))
    for i in range(6):
        inner = strict(dict(rng.sample(FIELDS, 2)))
        out.append(strict({"outer": strict({"inner": inner, "flag": {"type": "boolean"}}),
                           "kind": {"enum": ["a", "b", None]}}))
    assert len(out) == 50
    return out


def chat(messages, **kw):
    return CLIENT.chat.completions.create(model=CHAT, messages=messages, **kw)


def check_strict_json_schemas():
    jobs = []
    for i, schema in enumerate(schemas()):
        for temperature in (0, 1):
            for seed in (1, 2):
                jobs.append((i, schema, temperature, seed))

    def run(job):
        i, schema, temperature, seed = job
        r = chat([{"role": "user", "content": "Write an example record as JSON."}],
                 response_format={"type": "json_schema",
                                  "json_schema": {"name": f"record_{i}", "schema": schema, "strict": True}},
                 temperature=temperature, seed=seed, max_tokens=MAX_TOKENS)
        return job, r.choices[0]

    stopped, bad = 0, []
    with ThreadPoolExecutor(16) as pool:
        for (i, schema, t, seed), c in pool.map(run, jobs):
            if c.finish_reason != "stop":
                assert c.finish_reason == "length", c
                continue
            stopped += 1
            try:
                jsonschema.validate(json.loads(c.message.content), schema)
            except Exception as e:
                bad.append(f"schema {i} (t={t}, seed {seed}): {e}: {c.message.content!r}")
    print(f"    {stopped} of {len(jobs)} outputs ended by their grammar; all validate" if not bad else "")
    assert not bad, "\n".join(bad)
    assert stopped * 10 >= len(jobs) * 8, f"only {stopped} of {len(jobs)} outputs ended with stop"


def check_json_object():
    for seed in range(6):
        c = chat([{"role": "user", "content": "Describe a cat in JSON."}],
                 response_format={"type": "json_object"}, temperature=1, seed=seed,
                 max_tokens=MAX_TOKENS).choices[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict), c.message.content


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    population: int = pydantic.Field(ge=0, le=100_000_000)
    capital: bool


def check_parse_and_stream_helpers():
    msgs = [{"role": "user", "content": "Tell me about Paris."}]
    r = CLIENT.chat.completions.parse(model=CHAT, messages=msgs, response_format=City,
                                      temperature=0, max_tokens=MAX_TOKENS)
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert isinstance(c.message.parsed, City), c.message
    with CLIENT.chat.completions.stream(model=CHAT, messages=msgs, response_format=City,
                                        temperature=0, max_tokens=MAX_TOKENS) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    assert final.choices[0].message.parsed == c.message.parsed, (final, c)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a time zone.",
        "parameters": {"type": "object", "properties": {
            "utc_offset": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["utc_offset"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def assert_valid_calls(message, only=None):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and len(call.id) >= 9, call
        assert call.function.name in PARAMS, call
        if only:
            assert call.function.name == only, call
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def check_tool_choice_required_named_none():
    for choice, only in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
        for t, seed in ((0, 1), (1, 1), (1, 2)):
            c = chat(ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                     temperature=t, seed=seed, max_tokens=MAX_TOKENS).choices[0]
            assert c.finish_reason == "tool_calls", c
            assert len(c.message.tool_calls) == 1, c.message
            assert_valid_calls(c.message, only)
    c = chat(ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24).choices[0]
    assert not c.message.tool_calls and c.finish_reason in ("stop", "length"), c
    assert c.message.content, c
    # auto: either a valid call or text.
    for seed in (1, 2, 3):
        c = chat(ASK, tools=TOOLS, temperature=1, seed=seed, max_tokens=MAX_TOKENS).choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls", c
            assert_valid_calls(c.message)
        else:
            assert c.finish_reason in ("stop", "length"), c


def check_tool_results_continue_the_conversation():
    first = chat(ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=MAX_TOKENS).choices[0]
    call = first.message.tool_calls[0]
    msgs = ASK + [first.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    r = chat(msgs, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24)
    assert r.choices[0].message.content, r
    assert r.usage.prompt_tokens > first.usage.prompt_tokens if hasattr(first, "usage") else True


def stream_calls(**kw):
    """A streamed chat answer reassembled: content, [(id, name, arguments)], finish_reason."""
    content, calls, finishes, roles = "", [], [], 0
    for chunk in CLIENT.chat.completions.create(model=CHAT, stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            roles += d.role is not None
            content += d.content or ""
            for t in d.tool_calls or []:
                if t.id is not None:
                    assert t.index == len(calls), "a call opens once, in order"
                    assert len(t.id) >= 9 and t.type == "function" and t.function.name, t
                    calls.append([t.id, t.function.name, ""])
                else:
                    assert t.function.name is None, "a call's name once"
                calls[t.index][2] += t.function.arguments or ""
            if c.finish_reason is not None:
                finishes.append(c.finish_reason)
    assert roles == 1, f"the role {roles} times"
    assert len(finishes) == 1, finishes
    return content, calls, finishes[0]


def check_streamed_tool_calls_equal_whole():
    # One call (it ends the turn), and parallel calls (Gemma 270M repeats them up to max_tokens:
    # the streamed calls still equal the whole answer's, the last one cut off alike).
    for choice, parallel in (("required", False), ({"type": "function", "function": {"name": "get_weather"}}, False),
                             ("required", True)):
        kw = dict(messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                  temperature=0, max_tokens=MAX_TOKENS)
        whole = chat(**kw).choices[0]
        content, calls, finish = stream_calls(**kw)
        assert finish == whole.finish_reason, (finish, whole)
        if not parallel:
            assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
        assert [(n, a) for _, n, a in calls] == [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
        assert content == (whole.message.content or "")


def check_logit_bias_bans_and_forces():
    cases = read_jsonl("gemma3-270m/public/greedy.jsonl")
    prompt, first = cases[0]["prompt"], cases[0]["ids"][0]

    def greedy(p, bias):
        return CLIENT.completions.create(model=CHAT, prompt=p, max_tokens=4, temperature=0,
                                         logprobs=0, logit_bias=bias).choices[0]
    plain = greedy(prompt, {})
    banned = greedy(prompt, {str(first): -100})
    assert banned.logprobs.tokens[0] != plain.logprobs.tokens[0], (plain.logprobs.tokens, banned.logprobs.tokens)
    forced = greedy(cases[1]["prompt"], {str(first): 100})
    assert forced.logprobs.tokens == [plain.logprobs.tokens[0]] * 4, forced.logprobs.tokens


def check_concurrent_constrained_streams_match_alone():
    all_schemas = schemas()
    jobs = [(all_schemas[i % 50], f"Record number {i} as JSON.") for i in range(64)]

    def kw(job):
        schema, text = job
        return dict(model=CHAT, messages=[{"role": "user", "content": text}], temperature=0, max_tokens=48,
                    response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}})

    alone = [CLIENT.chat.completions.create(**kw(j)).choices[0].message.content for j in jobs]

    def streamed(job):
        text = ""
        for chunk in CLIENT.chat.completions.create(stream=True, **kw(job)):
            for c in chunk.choices:
                text += c.delta.content or ""
        return text

    with ThreadPoolExecutor(64) as pool:
        together = list(pool.map(streamed, jobs))
    diff = [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]
    assert not diff, f"{len(diff)} of 64 differ, e.g. {alone[diff[0]]!r} vs {together[diff[0]]!r}"


def check_bad_schemas_are_400s():
    for fmt, param in (
        ({"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                 "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}},
         "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "response_format"),
    ):
        try:
            chat(ASK, response_format=fmt, max_tokens=4)
            raise AssertionError(f"{fmt} accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, e.body


CHECKS = [
    check_strict_json_schemas,
    check_json_object,
    check_parse_and_stream_helpers,
    check_tool_choice_required_named_none,
    check_tool_results_continue_the_conversation,
    check_streamed_tool_calls_equal_whole,
    check_logit_bias_bans_and_forces,
    check_bad_schemas_are_400s,
    check_concurrent_constrained_streams_match_alone,
]


def main():
    global ARGS, CLIENT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("golden")
    ap.add_argument("-k", dest="only", help="run the checks whose name contains this")
    ARGS = ap.parse_args()
    CLIENT = openai.OpenAI(base_url=ARGS.url.rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=600)
    print(f"openai {openai.__version__}, jsonschema {importlib.metadata.version('jsonschema')}, pydantic {pydantic.VERSION}", flush=True)
    run_checks(CHECKS, ARGS.only, "structured suite")


if __name__ == "__main__":
    main()
