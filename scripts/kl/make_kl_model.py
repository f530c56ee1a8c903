#!/usr/bin/env python3
"""A tiny random Qwen3.5 checkpoint for the KL-divergence harness, initialised as transformers
initialises a new model (its own _init_weights: normal(0, initializer_range) matrices, A_log from
log U(0, 16), dt_bias ones, zero-centred norms at identity), saved in bf16:

    python3 scripts/kl/make_kl_model.py OUT_DIR [--init 0.05] [--hidden 128] [--layers 8]
    python3 scripts/kl/make_kl_model.py OUT_DIR --from FIXTURE_DIR [--tokenizer-from DIR] [--init 0.05]

The second form takes another architecture's shape from a test fixture's config.json (Gemma 3, Qwen3-MoE,
Qwen3.5-MoE: tests/fixtures/...), re-initialised the same way at --init and saved in the fixture's dtype,
with the vocabulary size set to the tokenizer's (a fixture whose embedding has more rows than its
tokenizer has tokens cannot be scored token for token against a GGUF, whose vocabulary is the tokenizer's).

Unlike the test fixtures (tests/fixtures/hf/qwen35_*: std 0.15, chosen so greedy choices are never near
ties, which makes those 8-layer models amplify any rounding ~4000x), this model is conditioned like a
real one, so a KL divergence measures the engines, not the random model's chaos. The tokenizer is the
fixtures' 800-token BPE vocabulary (tests/fixtures/hf/qwen35_bf16). Needs torch + transformers 5.x.
"""
import argparse
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "fixtures", "hf", "qwen35_bf16")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--init", type=float, default=0.05, help="initializer_range (std of the matrices)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--from", dest="source", help="a fixture folder whose config.json gives the architecture and shape")
    ap.add_argument("--tokenizer-from", help="the folder holding tokenizer.json (default: the --from folder)")
    a = ap.parse_args()
    import torch
    import transformers

    if a.source:
        return from_fixture(a, torch, transformers)

    with open(os.path.join(FIXTURE, "config.json")) as f:
        cfg = json.load(f)
    for k in ("architectures", "transformers_version", "dtype", "torch_dtype", "model_type"):
        cfg.pop(k, None)
    n = a.layers
    cfg.update(hidden_size=a.hidden, intermediate_size=3 * a.hidden, num_hidden_layers=n, initializer_range=a.init,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32, tie_word_embeddings=False,
               layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)])
    torch.manual_seed(a.seed)
    config = transformers.Qwen3_5TextConfig(**cfg)
    model = transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURE, name), os.path.join(a.out, name))
    with open(os.path.join(a.out, "config.json")) as f:
        saved = json.load(f)
    for k in ("full_attention_interval", "attn_output_gate", "partial_rotary_factor"):
        if k in cfg and k not in saved:
            saved[k] = cfg[k]
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
    # The expected.json run_kl.sh reads for the source dtype.
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump({"name": os.path.basename(a.out.rstrip("/")), "source_dtype": "bfloat16",
                   "hf_class": "Qwen3_5ForCausalLM", "init": a.init}, f, indent=2)
    print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters())} parameters, init std {a.init}")


def from_fixture(a, torch, transformers):
    tok_dir = a.tokenizer_from or a.source
    with open(os.path.join(a.source, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(a.source, "expected.json")) as f:
        expected = json.load(f)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir)
    n_vocab = len(tokenizer)
    text = cfg.get("text_config", cfg)
    text["vocab_size"] = n_vocab
    text["initializer_range"] = a.init
    cfg["initializer_range"] = a.init
    for k in ("transformers_version", "dtype", "torch_dtype"):
        cfg.pop(k, None)
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(a.seed)
    arch = cfg["architectures"][0]
    model = getattr(transformers, arch)(config)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[expected.get("source_dtype", "bfloat16")]
    model = model.to(dtype).eval()
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        src = os.path.join(tok_dir if name.startswith("tokenizer") else a.source, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(a.out, name))
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump({"name": os.path.basename(a.out.rstrip("/")), "source_dtype": expected.get("source_dtype", "bfloat16"),
                   "hf_class": arch, "init": a.init, "shape_from": os.path.basename(a.source.rstrip("/"))}, f, indent=2)
    print(f"wrote {a.out}: {arch}, {sum(p.numel() for p in model.parameters())} parameters, vocab {n_vocab}, init std {a.init}")


if __name__ == "__main__":
    main()
