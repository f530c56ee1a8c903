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

# fuzz_tokenize: the first byte picks one of the seven real tokenizers; texts of every script and shape.
texts = ["Hello world", "  leading spaces and\ttabs\n\nnewlines  ", "emoji 🦙🚀 and 中文字 and कि",
         "<|im_start|>user\nhi<|im_end|><think></think>", "<s>[INST] x [/INST]</s><start_of_turn>",
         "numbers 1234567 3.14159 and 'quotes' can't won't", "a\xcc\x81 e\xcc\x81 (combining) ﬁ ligature Å",
         "\u2581 spaces as U+2581 \u2581\u2581", "<0x41> <unk> <|endoftext|>", "x" * 300]
write("fuzz_tokenize", [bytes([i % 7]) + t.encode() for i, t in enumerate(texts)] +
      [bytes([i]) + b"bad \xff\xfe utf8 \xc3 \xe2\x82 end" for i in range(7)])


def vocab_seed(flags, pre, ids, tokens, merges, types, text):
    return (bytes([flags, pre]) + bytes(i & 0xFF for i in ids) + "\n".join(tokens).encode() + b"\0" +
            "\n".join(merges).encode() + b"\0" + bytes(types) + b"\0" + text.encode())


byte_level = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ", "Ġh", "he", "ll", "hell", "hello", "Ġw",
                                                                  "<|endoftext|>", "<|im_end|>"]
spm = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["▁", "▁h", "he", "▁he", "llo", "▁hello",
                                                                          "a", "b", "h", "e", "l", "o", "<user>"]
write("fuzz_vocab", [
    vocab_seed(0x40, 2, [0x80, len(byte_level) - 2, 0x80, 0x80], byte_level, [],
               [1] * (len(byte_level) - 2) + [3, 3], "hello world<|im_end|>"),
    vocab_seed(0x40, 1, [0x80] * 4, byte_level, ["h e", "l l", "he ll", "hell o", "Ġ w"], [1] * len(byte_level),
               "hello\nworld"),
    vocab_seed(0xD5, 4, [1, 2, 0x80, 0], spm, [], [2, 3, 3] + [6] * 256 + [1] * 12 + [4], "hello a b <user> é"),
    vocab_seed(0xD6, 4, [1, 2, 0x80, 0], spm, ["▁ h", "h e", "▁h e", "l l", "ll o", "▁he llo"],
               [2, 3, 3] + [6] * 256 + [1] * 12 + [4], "hello hello 🦙"),
    vocab_seed(0xF5, 4, [1, 2, 0x80, 0], spm + ["<|end|>"], [], [2, 3, 3] + [6] * 256 + [1] * 12 + [4, 3],
               "hi <|end|>  x"),
])

hf_bpe = {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(byte_level[:-2])}, "merges": ["h e", "l l"]},
          "added_tokens": [{"id": len(byte_level) - 2, "content": "<|endoftext|>", "special": True},
                           {"id": len(byte_level) - 1, "content": "<|im_end|>", "special": True}],
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
          "decoder": {"type": "ByteLevel"}}
hf_spm = {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
          "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(spm)}, "merges": [["▁", "h"], ["h", "e"]],
                    "byte_fallback": True, "unk_token": "<unk>"},
          "added_tokens": [{"id": 0, "content": "<unk>", "special": True}, {"id": 1, "content": "<s>", "special": True},
                           {"id": 2, "content": "</s>", "special": True}]}
config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": "{{ messages }}"}


def tok_bin(tokens):
    out = struct.pack("<i", max(len(t.encode()) for t in tokens))
    for i, t in enumerate(tokens):
        out += struct.pack("<fi", -float(i), len(t.encode())) + t.encode()
    return out


llama2c_tokens = ["<unk>", "\n<s>\n", "\n</s>\n"] + ["<0x%02X>" % b for b in range(256)] + [" h", "he", "llo", " hello"]
write("fuzz_tokenizer_files", [
    bytes([0, 11]) + b"hello world" + json.dumps(hf_bpe).encode(),
    bytes([2, 11]) + b"hello world" + json.dumps(hf_spm).encode() + b"\0" + json.dumps(config).encode(),
    bytes([1, 11]) + b"hello world" + tok_bin(llama2c_tokens),
    bytes([3, 5]) + b"hi \xff!" + tok_bin(llama2c_tokens),
])

# The real tokenizers fuzz_tokenize reads (ROOFLINE_FUZZ_TOKENIZERS = DIR/tokenizers), unpacked from ../shared.
tok_dir = os.path.join(out, "tokenizers")
models = os.path.join(shared, "..", "models", "stories260K", "tok512.bin")
if os.path.isdir(shared):
    for src, dst in [("qwen3/tokenizer.json.xz", "qwen3/tokenizer.json"), ("qwen3/tokenizer_config.json", None),
                     ("llama3_1/tokenizer.json.xz", "llama3_1/tokenizer.json"), ("llama3_1/tokenizer_config.json", None),
                     ("gemma3/tokenizer.json.xz", "gemma3/tokenizer.json"),
                     ("gemma3/tokenizer_config.json.xz", "gemma3/tokenizer_config.json"),
                     ("gguf-vocabs/ggml-vocab-gpt-2.gguf.xz", "ggml-vocab-gpt-2.gguf"),
                     ("gguf-vocabs/ggml-vocab-llama-spm.gguf.xz", "ggml-vocab-llama-spm.gguf"),
                     ("gguf-vocabs/ggml-vocab-phi-3.gguf.xz", "ggml-vocab-phi-3.gguf")]:
        path = os.path.join(tok_dir, dst or src)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        opener = lzma.open if src.endswith(".xz") else open
        with opener(os.path.join(shared, src), "rb") as f, open(path, "wb") as g:
            g.write(f.read())
    if not os.path.exists(os.path.join(tok_dir, "tok512.bin")):
        with open(models, "rb") as f, open(os.path.join(tok_dir, "tok512.bin"), "wb") as g:
            g.write(f.read())

# fuzz_model_file: byte 0 picks one of the seven tiny models, then 8-byte edit records (op, a, b, c0..c4).
edits = []
for m in range(7):
    edits.append(bytes([m]))  # unedited: must load and run
    for op in range(8):
        for k in (5, 9, 13):
            value = {0: struct.pack("<i", k - 8), 1: struct.pack("<f", 0.5 * k), 3: bytes([k, 0, 0, 0])}.get(op, bytes([k, 1, 0, 0]))
            edits.append(bytes([m, op, k, k // 2]) + value + b"\0")
edits += [bytes([m + 16 * q]) for m in range(7) for q in range(11, 15)]  # quantized with each mix, unedited
edits += [bytes([m + 16 * (11 + m % 4), 3, k, 0, 96, 0, 0, 0, 0]) for m in range(7) for k in range(0, 40, 7)]  # rows of 96
write("fuzz_model_file", edits)

# fuzz_generate: byte 0 picks chat (0), completions (1) or native (2); the request bodies above, run.
generate = [(0, bodies[0]), (0, bodies[1]), (1, bodies[2]), (2, bodies[3]), (0, bodies[6]),
            (0, {"messages": [{"role": "user", "content": "q"}], "tools": bodies[1]["tools"], "max_tokens": 8,
                 "parallel_tool_calls": True, "temperature": 1.5, "top_k": 3, "min_p": 0.2, "repeat_penalty": 1.3,
                 "presence_penalty": 0.5, "frequency_penalty": 0.5, "dry_multiplier": 0.8, "mirostat": 2}),
            (1, {"prompt": "abc", "max_tokens": 6, "n": 3, "stop": ["a", "bc"], "logit_bias": [[5, 2.5], ["b", -1]],
                 "logprobs": 3, "stream": True}),
            (2, {"prompt": [1, 2, 3], "n_predict": 5, "n_probs": 2, "ignore_eos": True, "typical_p": 0.5, "xtc_probability": 0.5,
                 "json_schema": {"type": "array", "items": {"type": "integer"}}})]
generate += [(3, {"input": ["hello", "world", [1, 2, 3]], "model": "m", "encoding_format": "base64"}),
             (4, {"content": "hi there", "embd_normalize": -1}),
             (8, {"input": "pooled nothing"}), (9, {"content": ["a", [5, 6]], "embd_normalize": 0})]
write("fuzz_generate", [bytes([e]) + json.dumps(b).encode() for e, b in generate])

# fuzz_convert: byte 0 picks a transformers fixture (their folders in path order, as the target lists
# them), the rest is its config.json as transformers wrote it.
fixtures = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
folders = sorted(os.path.join(fixtures, sub, d) for sub in ("hf", "gemma3") for d in os.listdir(os.path.join(fixtures, sub))
                 if os.path.exists(os.path.join(fixtures, sub, d, "model.safetensors")))
configs = []
for i, d in enumerate(folders):
    with open(os.path.join(d, "config.json"), "rb") as f:
        configs.append(bytes([i]) + f.read())
write("fuzz_convert", configs)


def gguf_file(kvs, tensors):
    """A GGUF v3 image: kvs [(key, "u32" | "str" | "strs", value)], tensors [(name, shape, f32 values)]."""
    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, kind, value in kvs:
        out += s(key)
        if kind == "u32":
            out += struct.pack("<II", 4, value)
        elif kind == "str":
            out += struct.pack("<I", 8) + s(value)
        else:
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(s(v) for v in value)
    offset = 0
    blobs = []
    for name, shape, values in tensors:
        out += s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", n) for n in shape)
        out += struct.pack("<IQ", 0, offset)
        blob = struct.pack("<%df" % len(values), *values)
        blob += b"\0" * (-len(blob) % 32)
        blobs.append(blob)
        offset += len(blob)
    out += b"\0" * (-len(out) % 32)
    return out + b"".join(blobs)


def imatrix_dat(entries, chunks, dataset):
    out = struct.pack("<i", len(entries))
    for name, ncall, values in entries:
        out += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, len(values))
        out += struct.pack("<%df" % len(values), *values)
    return out + struct.pack("<ii", chunks, len(dataset)) + dataset.encode()


write("fuzz_imatrix", [
    imatrix_dat([("blk.0.attn_q.weight", 4, [0.5, 1.0, 2.0, 0.25]), ("output.weight", 0, [1.0] * 8)], 4, "wiki.txt"),
    imatrix_dat([("blk.1.ffn_down.weight", 1, [3.0] * 6)], 1, ""),
    gguf_file([("general.type", "str", "imatrix"), ("imatrix.chunk_count", "u32", 3), ("imatrix.chunk_size", "u32", 512),
               ("imatrix.datasets", "strs", ["a.txt"])],
              [("blk.0.attn_k.weight.in_sum2", [4], [1.0, 2.0, 3.0, 4.0]), ("blk.0.attn_k.weight.counts", [1], [1536.0]),
               ("blk.0.ffn_up_exps.weight.in_sum2", [2, 3], [1.0] * 6),
               ("blk.0.ffn_up_exps.weight.counts", [1, 3], [512.0, 0.0, 1024.0])]),
])


# fuzz_cli: the first byte picks the command, then one argument a line; @m @o @t @j @i are the harness's files.
cli_commands = ["plan", "bench", "inspect", "tokenize", "template", "synth", "quantize", "perplexity", "imatrix"]


def cli(command, *args):
    return bytes([cli_commands.index(command)]) + "\n".join(args).encode()


write("fuzz_cli", [
    cli("plan", "-m", "synthetic:qwen3-32b:Q4_K_M", "--gpu", "v100-32gb", "-c", "8192", "-np", "4", "-ctk", "q8_0"),
    cli("plan", "-m", "synthetic:qwen3.5-27b:Q4_K_M", "--gpu", "t4", "--vram-limit", "12", "--json"),
    cli("plan", "-m", "@m", "--gpu", "cpu", "--spec-type", "draft-mtp", "-b", "0"),
    cli("bench", "-m", "@m", "-p", "8", "-n", "4", "-r", "1", "-npl", "1,3", "-o", "json"),
    cli("bench", "-m", "synthetic:tiny-qwen35:Q4_K_M", "-p", "0", "-n", "2", "-d", "4", "-r", "1", "-b", "3", "-ub", "2"),
    cli("inspect", "@m", "--json"),
    cli("inspect", "synthetic:tiny-gemma3:Q8_0", "--max-array", "3"),
    cli("tokenize", "-m", "@m", "-p", "Hello <|im_start|> world", "--ids"),
    cli("tokenize", "-m", "@m", "-f", "@t", "--no-parse-special"),
    cli("template", "-m", "@m", "--messages", "@j", "--add-generation-prompt", "--kwargs", '{"enable_thinking":false}'),
    cli("synth", "tiny-llama:Q4_0", "-o", "@o", "--seed", "3", "-t", "1"),
    cli("synth", "--list"),
    cli("quantize", "@m", "@o", "Q4_K_M", "1"),
    cli("quantize", "@m", "@o", "Q2_K", "--pure", "--output-tensor-type", "q8_0"),
    cli("perplexity", "-m", "@m", "-f", "@t", "-c", "16", "-t", "1"),
    cli("perplexity", "-m", "@m", "-f", "@t", "-c", "16", "--kl-divergence-base", "@o"),
    cli("imatrix", "-m", "@m", "-f", "@t", "-c", "16", "-o", "@i"),
])
