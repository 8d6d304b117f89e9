#!/usr/bin/env python3
"""Expected chat-template renders for kiln-tokenizer's tests, made with Python jinja2.

Renders a few of llama.cpp's real chat templates (`models/templates/*.jinja`, from the
llama-cpp-python 0.3.36 sdist, the same files the Rust tests extract) with jinja2 set up as Hugging
Face transformers' `apply_chat_template` sets it up (ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, transformers' `tojson`,
`raise_exception` and `strftime_now`, and its `{% generation %}` tag), for a few conversations,
and writes one JSON file per template to crates/kiln-tokenizer/tests/fixtures/chat/: the template
file's sha256, the special tokens, the fixed date, and per case the messages (and the tools),
add_generation_prompt and the expected text (or the message the template raised).

The conversations: `plain` (user, assistant, user), `system` (the same after a system message),
and `tools`, rendered with `tools=TOOLS` (two OpenAI-style function tools): a system message, a
question, an assistant turn that only calls a tool (`content` None, `tool_calls` with `arguments`
as an object, as transformers expects them), the tool's result (`tool_call_id`, `name`), the
assistant's answer and a last question; `tools_empty` is the same with `content` "" instead of
None in the tool-calling turn. In these two conversations only, a template that fails with
another error than its own `raise_exception` (an undefined value, a TypeError on the None
content, ...) is an expected outcome too, recorded as `jinja2_error` ("<exception type>:
<message>").

Differences from transformers, on purpose and mirrored by kiln: without tools (the `plain` and
`system` conversations) `tools` is left undefined, and `documents` always is (transformers passes
None; the templates here treat both alike), and `strftime_now` uses a fixed UTC time instead of
the local clock.

jinja2 is pinned and installed in a venv under $HOME/.cache/kiln/peers/jinja-venv, which this
script creates and then re-executes itself in.

Every other template of the folder is rendered too (with `<BOS>` / `<EOS>`), and only the sha256 of
each render is kept, in crates/kiln-tokenizer/tests/fixtures/chat_digests.json (with what jinja2
says for a template it cannot render, and the conversations and the tools, from which the test
rebuilds the renders' inputs), to keep the committed fixtures small.

Usage: scripts/gen_chat_template_fixtures.py [--templates DIR]
(default: extract the templates from ~/.cache/kiln/peers/dl/llama_cpp_python-0.3.36.tar.gz,
downloading that sdist with pip when it is not there.)
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

JINJA2 = "jinja2==3.1.6"
MARKUPSAFE = "markupsafe==3.0.2"
SDIST = "llama_cpp_python-0.3.36.tar.gz"
HOME = os.path.expanduser("~")
VENV = os.path.join(HOME, ".cache", "kiln", "peers", "jinja-venv")
DL = os.path.join(HOME, ".cache", "kiln", "peers", "dl")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "kiln-tokenizer", "tests", "fixtures", "chat")

# 2025-07-04 13:05:09 UTC, a Friday (day 185 of the year).
NOW_UNIX = 1751634309

# The special tokens of the templates that get digests only.
DIGEST_TOKENS = ("<BOS>", "<EOS>")

# Templates whose renders are written out in full: file stem -> (bos_token, eos_token), as the
# models' tokenizer_config.json give them (an absent token is the empty string).
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    # strftime_now with other formats; the `{% generation %}` tag.
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
    "poolside-Laguna-XS.2": ("<s>", "</s>"),
    # Tool use: tools described as Python signatures, `<tool_call>` with `tojson` arguments.
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
}

PLAIN = [
    {"role": "user", "content": "Hello! What's 2+2? Say \"four\" — s'il vous plaît, café ☕."},
    {"role": "assistant", "content": "  It is 4.\nAnything else?  "},
    {"role": "user", "content": "Now:\n\t<b>tabs</b> & {{ braces }} and \\backslashes\\"},
]
SYSTEM = [{"role": "system", "content": "You are terse. Answer in one line."}] + PLAIN

# The tools of the tools conversations, as an OpenAI client sends them.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city (°C or °F).",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    }},
    {"type": "function", "function": {
        "name": "search_flights",
        "description": "Find flights between two airports.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "IATA code, e.g. \"CDG\""},
                "destinations": {"type": "array", "items": {"type": "string"}},
                "passengers": {"type": "integer", "description": "How many travel",
                               "minimum": 1, "default": 1},
                "max_price": {"type": "number", "description": "In euros", "default": 499.5},
            },
            "required": ["origin", "destinations"],
        },
    }},
]
# Mistral's templates want tool-call ids of exactly 9 letters and digits.
CALL_ID = "abc123xyz"
TOOL_TURNS = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "What's the weather in Paris? Use °C."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": CALL_ID, "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
    ]},
    {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"celsius\"}",
     "tool_call_id": CALL_ID, "name": "get_weather"},
    {"role": "assistant", "content": "It is 21 °C in Paris."},
    {"role": "user", "content": "Thanks! Should I take a coat?"},
]
# The same with an empty text instead of None in the tool-calling turn (as some clients send it;
# several templates fail on None but render this).
TOOL_TURNS_EMPTY = [dict(m, content="") if "tool_calls" in m else m for m in TOOL_TURNS]

# name -> (messages, tools: None leaves the variable undefined)
CONVERSATIONS = {
    "plain": (PLAIN, None),
    "system": (SYSTEM, None),
    "tools": (TOOL_TURNS, TOOLS),
    "tools_empty": (TOOL_TURNS_EMPTY, TOOLS),
}


def ensure_venv():
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    subprocess.check_call([py, "-m", "pip", "install", "-q", JINJA2, MARKUPSAFE])
    os.execv(py, [py] + sys.argv)


def templates_dir(arg):
    if arg:
        return arg
    sdist = os.path.join(DL, SDIST)
    if not os.path.exists(sdist):
        os.makedirs(DL, exist_ok=True)
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--no-binary", "llama-cpp-python", "llama-cpp-python==0.3.36",
                               "-d", DL])
    dest = tempfile.mkdtemp(prefix="kiln-chat-templates-")
    with tarfile.open(sdist) as tar:
        for m in tar:
            parts = m.name.split("/")
            if (m.isfile() and len(parts) == 6
                    and parts[1:5] == ["vendor", "llama.cpp", "models", "templates"]
                    and parts[5].endswith(".jinja")):
                with tar.extractfile(m) as src, open(os.path.join(dest, parts[5]), "wb") as out:
                    out.write(src.read())
    return dest


def environment():
    # As transformers' `_compile_jinja_template` (utils/chat_template_utils.py) builds it.
    from datetime import datetime, timezone

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(NOW_UNIX, tz=timezone.utc).strftime(format)

    class Generation(jinja2.ext.Extension):
        """transformers' AssistantTracker without the tracking: renders the block's body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation_support(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_cases(template, bos, eos):
    """The cases of one template: a `raise_exception` is an expected outcome; any other error
    is one in the tools conversations (`jinja2_error`), and propagates in the others."""
    import jinja2

    cases = []
    for conv_name, (messages, tools) in CONVERSATIONS.items():
        for agp in (False, True):
            case = {
                "name": f"{conv_name}-{'gen' if agp else 'nogen'}",
                "messages": messages,
            }
            variables = {}
            if tools is not None:
                case["tools"] = tools
                variables["tools"] = tools
            case["add_generation_prompt"] = agp
            try:
                case["expected"] = template.render(messages=messages, add_generation_prompt=agp,
                                                   bos_token=bos, eos_token=eos, **variables)
            except jinja2.exceptions.TemplateError as e:
                if type(e) is jinja2.exceptions.TemplateError:
                    case["raises"] = str(e)
                elif tools is not None:
                    case["jinja2_error"] = f"{type(e).__name__}: {e}"
                else:
                    raise
            except Exception as e:  # TypeError, ... on the tool turns
                if tools is None:
                    raise
                case["jinja2_error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    return cases


def outcome(case):
    """A case's outcome in the digest file."""
    if "raises" in case:
        return {"raises": case["raises"]}
    if "jinja2_error" in case:
        return {"jinja2_error": case["jinja2_error"]}
    return {"sha256": hashlib.sha256(case["expected"].encode()).hexdigest()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", help="a directory of llama.cpp's *.jinja templates")
    args = parser.parse_args()
    ensure_venv()
    import jinja2

    src_dir = templates_dir(args.templates)
    env = environment()
    os.makedirs(OUT, exist_ok=True)
    digests = {}
    names = sorted(n[:-len(".jinja")] for n in os.listdir(src_dir) if n.endswith(".jinja"))
    for stem in names:
        with open(os.path.join(src_dir, stem + ".jinja"), "rb") as f:
            raw = f.read()
        template = env.from_string(raw.decode("utf-8"))
        bos, eos = TEMPLATES.get(stem, DIGEST_TOKENS)
        entry = {"sha256": hashlib.sha256(raw).hexdigest()}
        try:
            cases = render_cases(template, bos, eos)
        except jinja2.exceptions.TemplateError as e:
            entry["jinja2_fails"] = f"{type(e).__name__}: {e}"
            digests[stem + ".jinja"] = entry
            print(f"{stem}: jinja2 fails: {entry['jinja2_fails']}")
            continue
        if stem not in TEMPLATES:
            # Only the digests of the renders, with DIGEST_TOKENS.
            entry["cases"] = {c["name"]: outcome(c) for c in cases}
            digests[stem + ".jinja"] = entry
            continue
        fixture = {
            "template": stem + ".jinja",
            "sha256": entry["sha256"],
            "generator": f"scripts/gen_chat_template_fixtures.py, {JINJA2}",
            "bos_token": bos,
            "eos_token": eos,
            "now_unix": NOW_UNIX,
            "cases": cases,
        }
        out = os.path.join(OUT, stem + ".json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
            f.write("\n")
        summary = ", ".join(c["name"] + (" (raises)" if "raises" in c else
                                         " (jinja2 error)" if "jinja2_error" in c else "")
                            for c in cases)
        print(f"{out}: {summary}")
    missing = sorted(set(TEMPLATES) - set(names))
    if missing:
        sys.exit(f"templates missing from {src_dir}: {missing}")
    out = os.path.join(os.path.dirname(OUT), "chat_digests.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({
            "generator": f"scripts/gen_chat_template_fixtures.py, {JINJA2}",
            "note": "the templates without a full fixture in chat/: the sha256 of each render "
                    "(case `<conversation>-gen` / `-nogen`: add_generation_prompt true / false), "
                    "what the template raised, or (tools conversations only) the error jinja2 "
                    "failed with; the `tools` and `tools_empty` conversations are rendered "
                    "with `tools`",
            "bos_token": DIGEST_TOKENS[0],
            "eos_token": DIGEST_TOKENS[1],
            "now_unix": NOW_UNIX,
            "conversations": {name: messages for name, (messages, _) in CONVERSATIONS.items()},
            "tools": TOOLS,
            "templates": digests,
        }, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{out}: {len(digests)} templates")
    if not args.templates:
        shutil.rmtree(src_dir)


if __name__ == "__main__":
    main()
