#!/usr/bin/env python3
"""Runs llama.cpp's own converter on a fixture, tolerating the fixtures' home-trained tokenizers:

    python3 scripts/kl/llamacpp_convert.py LLAMACPP_SRC HF_DIR --outfile X.gguf --outtype f32|bf16|f16 [--pre qwen2]

LLAMACPP_SRC holds convert_hf_to_gguf.py, conversion/ and gguf-py/ (scripts/gpu/build_llamacpp.sh unpacks them).
The remaining arguments go to convert_hf_to_gguf.py unchanged. llama.cpp identifies a BPE pre-tokenizer by the hash
of a test string's token ids and refuses unknown ones (NotImplementedError "BPE pre-tokenizer was not recognized");
our fixtures' 800-token BPE vocabularies are trained by make_fixtures.py, so no hash is known. Then this writes
--pre instead (default qwen2: the qwen fixtures split text with Qwen2's regex; llama for the llama fixtures). The
pre-tokenizer does not matter for --kl-divergence (the tokens come from the .kld file). Needs torch, transformers,
numpy and pyyaml (the GPU machine has them).
"""
import os
import runpy
import sys


def main():
    argv = sys.argv[1:]
    pre = "qwen2"
    if "--pre" in argv:
        i = argv.index("--pre")
        if i + 1 >= len(argv):
            sys.exit("llamacpp_convert.py: --pre needs a value")
        pre = argv[i + 1]
        del argv[i:i + 2]
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    src, rest = argv[0], argv[1:]
    script = os.path.join(src, "convert_hf_to_gguf.py")
    if not os.path.isfile(script) or not os.path.isdir(os.path.join(src, "conversion")):
        sys.exit(f"llamacpp_convert.py: {src} has no convert_hf_to_gguf.py + conversion/ (llama.cpp's source)")
    sys.path.insert(0, src)
    sys.path.insert(1, os.path.join(src, "gguf-py"))
    try:
        from conversion import base
    except ImportError as e:
        sys.exit(f"llamacpp_convert.py: cannot import llama.cpp's conversion package from {src}: {e}")
    cls = base.TextModel
    orig = cls.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            print(f"llamacpp_convert.py: unknown pre-tokenizer hash (a fixture's own tokenizer): writing "
                  f"tokenizer.ggml.pre = {pre!r}", file=sys.stderr)
            return pre

    cls.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [script] + rest
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
