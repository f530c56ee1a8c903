#!/usr/bin/env python3
"""Seed inputs for the libFuzzer targets (scripts/fuzz.sh): DIR/seeds-<target>/<n>, written fresh each run.
The real chat templates come from ../shared when it is there (read, not copied into the repository)."""
import json
import lzma
import os
import struct
import sys

out = sys.argv[1]
shared = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "testdata", "tokenizer")


def write(target, items):
    d = os.path.join(out, "seeds-" + target)
    os.makedirs(d, exist_ok=True)
    for i, data in enumerate(items):
        with open(os.path.join(d, str(i)), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())


gbnf = [
    'root ::= "yes" | "no"',
    'root ::= [a-z]+ ("," [a-z]+)*',
    'root ::= obj\nobj ::= "{" ws (pair ("," ws pair)*)? "}"\npair ::= str ":" ws val\nstr ::= "\\"" [^"\\\\]* "\\""\n'
    'val ::= str | [0-9]+ | obj\nws ::= [ \\t\\n]*',
    'root ::= x{2,5} y?\nx ::= [\\u00e9-\\u00ff]\ny ::= [^\\x00-\\x7F]',
    'root ::= "a" root | "b"',
    'root ::= ( "ab" | [0-9] )* "." # comment\n',
]
write("fuzz_gbnf", [g + "\0" + '{"a": 12}ab,cd\xc3\xa9' for g in gbnf])

schemas = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
                                      "age": {"type": "integer"}}, "required": ["name"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    {"enum": ["a", 1, None, True, {"x": [1]}]},
    {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"}]},
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    {"type": ["string", "null"], "const": "x"},
    {"prefixItems": [{"type": "boolean"}, {"type": "integer"}], "items": False},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"allOf": [{"type": "string"}]},
    True,
]
write("fuzz_json_schema", [json.dumps(s) + "\0" + '{"name": "ab", "age": 3}' for s in schemas])

templates = [
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}"
    "{{ loop.index }}:{{ m['content'] | trim | upper }}{% endfor %}{{ ns.n }}{{ tools | tojson(indent=2) }}",
    "{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{{ f(3) }}{{ range(3) | list }}{{ 'a,b' .split(',') | join('-') }}"
    "{{ messages[0].content[:3] }}{% if messages|length > 2 %}{{ raise_exception('no') }}{% endif %}",
    "{%- for m in messages -%}{%- if m.tool_calls is defined -%}{%- for c in m.tool_calls -%}{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{%- endfor -%}{%- endif -%}{%- endfor -%}{{ strftime_now('%Y-%m-%d') }}",
]
for path, key in [("chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", None),
                  ("chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja", None),
                  ("qwen3/tokenizer_config.json", "chat_template"),
                  ("gemma3/tokenizer_config.json.xz", "chat_template")]:
    p = os.path.join(shared, path)
    if not os.path.exists(p):
        continue
    data = lzma.open(p).read() if p.endswith(".xz") else open(p, "rb").read()
    text = data.decode()
    if key:
        text = json.loads(text)[key]
    templates.append(text)
write("fuzz_jinja", templates)

outputs = [
    'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "nope", "arguments": {}}</tool_call> tail',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "f", "parameters": {}}',
    '```json\n{"tool_calls": [{"name": "f", "arguments": {"a": [1, 2]}}]}\n```',
    '{"response": "just text"}',
    'plain answer with <tool_ and a partial tag',
]
write("fuzz_tool_calls", [bytes([i * 7 % 256]) + o.encode() for i, o in enumerate(outputs)])


def safetensors(tensors, meta=None):
    header, data = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


write("fuzz_safetensors", [
    safetensors([("a.weight", "F32", [2, 3], struct.pack("<6f", *range(6)))], {"format": "pt"}),
    safetensors([("b", "F16", [4], b"\x00\x3c" * 4), ("c", "BF16", [1, 2], b"\x80\x3f" * 2)]),
    safetensors([("s", "F32", [], struct.pack("<f", 1.5)), ("z", "F32", [0, 4], b"")]),
])

bodies = [
    {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
     "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2, "stop": ["\n"]},
    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}]}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "required",
     "response_format": {"type": "json_object"}, "n": 2, "seed": 7, "logit_bias": {"5": -100}},
    {"prompt": ["abc", [1, 2, 3]], "max_tokens": 3, "echo": True, "logprobs": 1, "suffix": None},
    {"prompt": "hello", "n_predict": 4, "grammar": 'root ::= "a"+', "samplers": ["top_k", "temperature"], "id_slot": 0,
     "cache_prompt": True, "return_tokens": True},
    {"content": "hello world", "add_special": True, "with_pieces": True},
    {"tokens": [1, 2, 300, -1]},
    {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": True},
     "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}},
]
write("fuzz_chat_request", [bytes([i]) + json.dumps(b).encode() for i, b in enumerate(bodies)])
