#!/usr/bin/env python3
"""A tiny random Qwen3.5 checkpoint for the KL-divergence harness, initialised as transformers
initialises a new model (its own _init_weights: normal(0, initializer_range) matrices, A_log from
log U(0, 16), dt_bias ones, zero-centred norms at identity), saved in bf16:

    python3 scripts/kl/make_kl_model.py OUT_DIR [--init 0.05] [--hidden 128] [--layers 8]

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
    a = ap.parse_args()
    import torch
    import transformers

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


if __name__ == "__main__":
    main()
