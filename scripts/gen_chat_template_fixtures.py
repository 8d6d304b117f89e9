#!/usr/bin/env python3
"""Expected chat-template renders for kiln-tokenizer's tests, made with Python jinja2.

Renders a few of llama.cpp's real chat templates (`models/templates/*.jinja`, from the
llama-cpp-python 0.3.36 sdist, the same files the Rust tests extract) with jinja2 set up as Hugging
Face transformers' `apply_chat_template` sets it up (ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, transformers' `tojson`,
`raise_exception` and `strftime_now`, and its `{% generation %}` tag), for a few conversations,
and writes one JSON file per template to crates/kiln-tokenizer/tests/fixtures/chat/: the template
file's sha256, the special tokens, the fixed date, and per case the messages, add_generation_prompt
and the expected text (or the message the template raised).

Differences from transformers, on purpose and mirrored by kiln: `tools` and `documents` are left
undefined (transformers passes None; the templates here treat both alike), and `strftime_now`
uses a fixed UTC time instead of the local clock.

jinja2 is pinned and installed in a venv under $HOME/.cache/kiln/peers/jinja-venv, which this
script creates and then re-executes itself in.

Every other template of the folder is rendered too (with `<BOS>` / `<EOS>`), and only the sha256 of
each render is kept, in crates/kiln-tokenizer/tests/fixtures/chat_digests.json (with what jinja2
says for a template it cannot render), to keep the committed fixtures small.

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
}

PLAIN = [
    {"role": "user", "content": "Hello! What's 2+2? Say \"four\" — s'il vous plaît, café ☕."},
    {"role": "assistant", "content": "  It is 4.\nAnything else?  "},
    {"role": "user", "content": "Now:\n\t<b>tabs</b> & {{ braces }} and \\backslashes\\"},
]
SYSTEM = [{"role": "system", "content": "You are terse. Answer in one line."}] + PLAIN


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
    """The cases of one template: a `raise_exception` is an expected outcome, any other error
    propagates."""
    import jinja2

    cases = []
    for conv_name, messages in (("plain", PLAIN), ("system", SYSTEM)):
        for agp in (False, True):
            case = {
                "name": f"{conv_name}-{'gen' if agp else 'nogen'}",
                "messages": messages,
                "add_generation_prompt": agp,
            }
            try:
                case["expected"] = template.render(messages=messages, add_generation_prompt=agp,
                                                   bos_token=bos, eos_token=eos)
            except jinja2.exceptions.TemplateError as e:
                if type(e) is not jinja2.exceptions.TemplateError:
                    raise
                case["raises"] = str(e)
            cases.append(case)
    return cases


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
            entry["cases"] = {
                c["name"]: ({"raises": c["raises"]} if "raises" in c else
                            {"sha256": hashlib.sha256(c["expected"].encode()).hexdigest()})
                for c in cases
            }
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
        summary = ", ".join(c["name"] + (" (raises)" if "raises" in c else "") for c in cases)
        print(f"{out}: {summary}")
    missing = sorted(set(TEMPLATES) - set(names))
    if missing:
        sys.exit(f"templates missing from {src_dir}: {missing}")
    out = os.path.join(os.path.dirname(OUT), "chat_digests.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({
            "generator": f"scripts/gen_chat_template_fixtures.py, {JINJA2}",
            "note": "the templates without a full fixture in chat/: the sha256 of each render "
                    "(case `<conversation>-gen` / `-nogen`: add_generation_prompt true / false)",
            "bos_token": DIGEST_TOKENS[0],
            "eos_token": DIGEST_TOKENS[1],
            "now_unix": NOW_UNIX,
            "conversations": {"plain": PLAIN, "system": SYSTEM},
            "templates": digests,
        }, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{out}: {len(digests)} templates")
    if not args.templates:
        shutil.rmtree(src_dir)


if __name__ == "__main__":
    main()
