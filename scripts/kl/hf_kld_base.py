#!/usr/bin/env python3
"""Base log-probabilities of a Hugging Face model, from transformers in float32, in llama.cpp's
--kl-divergence-base format, so that roofline (and llama-perplexity) can measure a GGUF's KL divergence
from the reference implementation:

    python3 scripts/kl/hf_kld_base.py --model HF_DIR --text scripts/kl/text.txt --ctx 128 --tokens 512 --out BASE.kld
    roofline perplexity --kl-divergence-base BASE.kld --kl-divergence -m MODEL.gguf [-ngl 0|all]
    llama-perplexity --kl-divergence-base BASE.kld --kl-divergence -m MODEL.gguf

Runs on the GPU machine (python3 + torch + transformers 5.x; no internet needed). What it replicates from
roofline's perplexity (src/engine/perplexity.cpp, src/cli/cmd_perplexity.cpp), which replicates llama-perplexity:
  - the whole text tokenized once with special tokens added the way the vocabulary adds them (BOS when the
    tokenizer's post-processor adds one; our qwen tokenizers add nothing) and special-token text not parsed;
  - non-overlapping windows of --ctx tokens, each evaluated from scratch (no cache between windows); when the
    vocabulary adds BOS, the window's first token is replaced by BOS for the evaluation (the file keeps the
    original tokens);
  - of each window the rows at positions ctx/2 .. ctx-2 (predicting tokens ctx/2+1 .. ctx-1) are stored;
  - each row as encode_kld_row() does (scripts/kl/kld_format.py, checked byte for byte against roofline's writer).
--bos overrides the BOS rule (auto: what the HF tokenizer does; none; or an id) in case the GGUF's
tokenizer.ggml.add_bos_token disagrees with the HF tokenizer.

Prints a JSON line with the settings and the base perplexity (compare with "Mean PPL(base)" of the readers).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kld_format  # noqa: E402


def die(msg):
    print("hf_kld_base.py: error: " + msg, file=sys.stderr)
    sys.exit(2)


def load_model(model_dir, torch, transformers, device):
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.exists(cfg_path):
        die(f"{model_dir} has no config.json (a Hugging Face model folder is expected)")
    with open(cfg_path) as f:
        cfg = json.load(f)
    archs = cfg.get("architectures") or []
    if not archs:
        die(f"{cfg_path} names no architectures")
    cls = getattr(transformers, archs[0], None)
    if cls is None:
        die(f"transformers {transformers.__version__} has no class {archs[0]} (needed by {cfg_path})")
    try:
        model = cls.from_pretrained(model_dir, dtype=torch.float32)
    except TypeError:
        model = cls.from_pretrained(model_dir, torch_dtype=torch.float32)
    model = model.to(torch.float32).to(device).eval()
    return model, archs[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model folder")
    ap.add_argument("--text", required=True, help="text file (UTF-8)")
    ap.add_argument("--ctx", type=int, default=128, help="window size in tokens (roofline/llama.cpp -c)")
    ap.add_argument("--tokens", type=int, default=0, help="use only the first N tokens of the text (0: all)")
    ap.add_argument("--out", required=True, help="the .kld base file to write")
    ap.add_argument("--bos", default="auto", help="auto (as the HF tokenizer adds it), none, or a token id")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    if a.ctx < 4:
        die(f"--ctx {a.ctx}: at least 4")
    try:
        with open(a.text, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        die(f"cannot read --text: {e}")
    try:
        import torch
        import transformers
    except ImportError as e:
        die(f"needs torch and transformers ({e}); run it on the GPU machine")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    # Plain float32 arithmetic everywhere (no TF32 on the GPU, also in the Gated DeltaNet's conv1d).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:  # noqa: BLE001
        pass

    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    specials = [s for s in (getattr(tok, "all_special_tokens", None) or []) if s and s in text]
    if specials:
        die(f"the text contains special-token text {specials[:5]}; roofline does not parse it as special, "
            "transformers would: use another text")
    tokens = tok(text, add_special_tokens=True)["input_ids"]
    n_text_tokens = len(tokens)
    if a.tokens:
        if a.tokens > len(tokens):
            die(f"--tokens {a.tokens}: the text has only {len(tokens)} tokens with this tokenizer")
        tokens = tokens[:a.tokens]
    if len(tokens) < 2 * a.ctx:
        die(f"the text tokenizes to only {len(tokens)} tokens; a context of {a.ctx} needs at least {2 * a.ctx}")
    n_chunk = len(tokens) // a.ctx

    if a.bos == "auto":
        probe = tok("a", add_special_tokens=True)["input_ids"]
        bos_id = tok.bos_token_id
        bos = bos_id if bos_id is not None and probe[:1] == [bos_id] else -1
    elif a.bos == "none":
        bos = -1
    else:
        bos = int(a.bos)

    device = a.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        die("--device cuda but torch sees no GPU")
    model, arch = load_model(a.model, torch, transformers, device)
    t0 = time.time()
    writer = None
    n_vocab = None
    with torch.no_grad():
        for w in range(n_chunk):
            ids = kld_format.window_input(tokens, a.ctx, w, bos)
            out = model(input_ids=torch.tensor([ids], dtype=torch.long, device=device), use_cache=False)
            logits = out.logits[0].to(torch.float32).cpu()
            if writer is None:
                n_vocab = logits.shape[-1]
                writer = kld_format.KldWriter(a.out, a.ctx, n_vocab, n_chunk, tokens)
            rows = logits[kld_format.first_scored(a.ctx):a.ctx - 1]
            rows = rows.numpy() if kld_format.np is not None else rows.tolist()
            writer.add_window(w, rows)
    ppl, err = writer.close()
    info = {"model": a.model, "class": arch, "out": a.out, "n_ctx": a.ctx, "n_chunk": n_chunk, "n_vocab": n_vocab,
            "text_tokens": n_text_tokens, "tokens_used": n_chunk * a.ctx, "bos_substituted": bos,
            "rows_scored": n_chunk * kld_format.n_scored(a.ctx), "ppl_base": ppl, "ppl_base_err": err,
            "device": device, "dtype": "float32", "seconds": round(time.time() - t0, 2),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
