# Runs llama.cpp's convert_hf_to_gguf.py (LLAMA_CPP, default /work/llama.cpp) where transformers is not
# installed: a stub AutoConfig makes it read config.json, a stub AutoTokenizer reads tokenizer.json, and
# tokenizer.ggml.pre is fixed to PRE (default qwen35: the chkhsh table only knows the real Qwen3.5 vocabulary).
# torch without float8/uint dtypes (old Debian builds) gets placeholders; torch.exp on f16 runs in f32 and
# rounds (as torch 2.x's CPU kernel). Usage: python3 llama_convert.py MODEL_DIR --outfile X.gguf --outtype f32
import os, runpy, sys
here = os.path.dirname(os.path.abspath(__file__))
llama = os.environ.get("LLAMA_CPP", "/work/llama.cpp")
sys.path[:0] = [os.path.join(here, "stubs"), os.path.join(llama, "gguf-py"), llama]
import torch
for _n in ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "uint16", "uint32", "uint64", "float4_e2m1fn_x2"]:
    if not hasattr(torch, _n):
        setattr(torch, _n, type(_n, (), {})())
_exp = torch.exp
torch.exp = lambda x, *a, **k: _exp(x.float()).half() if x.dtype == torch.float16 else _exp(x, *a, **k)
import conversion.base as base
pre = os.environ.get("PRE", "qwen35")
base.TextModel.get_vocab_base_pre = lambda self, tok: pre
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
runpy.run_path(os.path.join(llama, "convert_hf_to_gguf.py"), run_name="__main__")
