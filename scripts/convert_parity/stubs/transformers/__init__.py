# Stand-in for transformers used by scripts/convert_parity/llama_convert.py (see there).
# Minimal stand-in for transformers: AutoConfig fails (llama.cpp then reads config.json),
# AutoTokenizer reads a tokenizer.json byte-level BPE vocabulary (enough for get_vocab_base).
import json, os

class AutoConfig:
    @staticmethod
    def from_pretrained(*a, **k):
        raise RuntimeError("stub transformers: no AutoConfig")

class _Added:
    def __init__(self, d):
        self.content = d["content"]; self.special = d.get("special", False); self.normalized = d.get("normalized", False)

class _Tok:
    def __init__(self, d):
        tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
        self.vocab = dict(tj["model"]["vocab"])
        self.added_tokens_decoder = {}
        self._added = {}
        for a in tj.get("added_tokens", []):
            self.vocab[a["content"]] = a["id"]
            self.added_tokens_decoder[a["id"]] = _Added(a)
            self._added[a["content"]] = a["id"]
    def get_added_vocab(self):
        return dict(self._added)
    def encode(self, text, add_special_tokens=True):
        if text in self._added: return [self._added[text]]
        raise RuntimeError("stub encode")
    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return "".join(inv[i] for i in ids)

class AutoTokenizer:
    @staticmethod
    def from_pretrained(d, *a, **k):
        return _Tok(str(d))
