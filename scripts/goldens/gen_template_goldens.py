#!/usr/bin/env python3
"""Generates tests/tokenizer/goldens/templates.json: the real chat templates of ../shared/testdata
rendered over conversations.json by Jinja2, set up as transformers' apply_chat_template does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson,
raise_exception and strftime_now). Tool-call arguments given as JSON strings are parsed to objects
first, as roofline does. Usage: python3 gen_template_goldens.py [SHARED_DIR] (Debian: python3-jinja2)."""
import json
import lzma
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "shared")
TD = os.path.join(SHARED, "testdata", "tokenizer")
OUT = os.path.join(HERE, "..", "..", "tests", "tokenizer", "goldens", "templates.json")
NOW = datetime(2025, 3, 14, 15, 9, 26)  # strftime_now's fixed clock; the tests use the same


def load_json(path):
    if path.endswith(".xz"):
        with lzma.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def tok(cfg, key):
    v = cfg.get(key)
    return v.get("content") if isinstance(v, dict) else v


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def normalize(messages):
    out = json.loads(json.dumps(messages))
    for m in out:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
    return out


def main():
    qwen3 = load_json(os.path.join(TD, "qwen3", "tokenizer_config.json"))
    llama = load_json(os.path.join(TD, "llama3_1", "tokenizer_config.json"))
    gemma = load_json(os.path.join(TD, "gemma3", "tokenizer_config.json.xz"))
    with open(os.path.join(TD, "chat_templates", "meta-llama-Llama-3.1-8B-Instruct.jinja"), encoding="utf-8") as f:
        llama31 = f.read()
    with open(os.path.join(TD, "chat_templates", "Qwen-Qwen2.5-7B-Instruct.jinja"), encoding="utf-8") as f:
        qwen25 = f.read()
    templates = [
        ("qwen3", "tokenizer/qwen3/tokenizer_config.json", qwen3["chat_template"], qwen3),
        ("qwen2.5", "tokenizer/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", qwen25, qwen3),
        ("llama3.1", "tokenizer/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja", llama31, llama),
        ("llama3_1-config", "tokenizer/llama3_1/tokenizer_config.json", llama["chat_template"], llama),
        ("gemma3", "tokenizer/gemma3/tokenizer_config.json.xz", gemma["chat_template"], gemma),
    ]
    convs = load_json(os.path.join(HERE, "conversations.json"))
    env = make_env()
    cases = []
    for tname, tsource, tmpl_src, cfg in templates:
        tmpl = env.from_string(tmpl_src)
        specials = {k: tok(cfg, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token") if tok(cfg, k)}
        for c in convs:
            ctx = dict(specials)
            ctx.update(messages=normalize(c["messages"]), tools=c.get("tools"), documents=None,
                       add_generation_prompt=c["add_generation_prompt"])
            ctx.update(c.get("kwargs", {}))
            case = {"template": tname, "conversation": c["name"], "add_generation_prompt": c["add_generation_prompt"]}
            try:
                case["output"] = tmpl.render(**ctx)
            except Exception as e:  # raise_exception, or a Python error the template runs into
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    out = {"generator": "scripts/goldens/gen_template_goldens.py", "jinja2": jinja2.__version__,
           "now": NOW.isoformat(), "templates": {t[0]: t[1] for t in templates}, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases, {sum('error' in c for c in cases)} raising")

    # Small templates, one feature each (jinja_cases.py).
    sys.path.insert(0, HERE)
    import jinja_cases
    small = []
    for src in jinja_cases.CASES:
        case = {"template": src}
        try:
            case["output"] = env.from_string(src).render(**jinja_cases.CTX)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        small.append(case)
    out2 = os.path.join(os.path.dirname(OUT), "jinja_cases.json")
    with open(out2, "w", encoding="utf-8") as f:
        json.dump({"generator": "scripts/goldens/gen_template_goldens.py", "jinja2": jinja2.__version__,
                   "now": NOW.isoformat(), "context": jinja_cases.CTX, "cases": small}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{out2}: {len(small)} cases, {sum('error' in c for c in small)} raising")


if __name__ == "__main__":
    main()
