"""A stand-in for transformers in scripts/kl/test_kld_writer.sh: the tokenizer returns the tokens of an existing
.kld file (FAKE_KLD) and the model returns, for each perplexity window it recognises (with the BOS rule of
FAKE_BOS), that file's stored log-probabilities at the scored positions and NaN elsewhere, so that a base file
written by hf_kld_base.py must equal `kld_format.py reencode FAKE_KLD`. Not transformers."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kld_format  # noqa: E402
import torch  # noqa: E402  (the fake one beside this file)

__version__ = "fake"
_K = kld_format.read_kld(os.environ["FAKE_KLD"])
_BOS = int(os.environ.get("FAKE_BOS", "-1"))


class AutoTokenizer:
    bos_token_id = _BOS if _BOS >= 0 else None
    all_special_tokens = []

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def __call__(self, text, add_special_tokens=True):
        if text == "a":  # hf_kld_base.py's BOS probe
            return {"input_ids": ([_BOS] if _BOS >= 0 and add_special_tokens else []) + [5]}
        return {"input_ids": list(_K["tokens"])}


class _Out:
    def __init__(self, logits):
        self.logits = logits


class _Model:
    def to(self, *a, **k):
        return self

    def eval(self):
        return self

    def __call__(self, input_ids=None, use_cache=None):
        ids = input_ids.data[0]
        n_ctx, n_vocab = _K["n_ctx"], _K["n_vocab"]
        for w in range(_K["n_chunk"]):
            if kld_format.window_input(_K["tokens"], n_ctx, w, _BOS) == ids:
                break
        else:
            raise RuntimeError("fake model: input ids are no window of the base file (window/BOS logic broken)")
        first, scored = kld_format.first_scored(n_ctx), kld_format.n_scored(n_ctx)
        nan = [float("nan")] * n_vocab
        rows = [nan] * n_ctx
        for j in range(scored):
            rows[first + j] = kld_format.decode_row(_K["rows"][w * scored + j], n_vocab)[3]
        return _Out(torch.Tensor([rows]))


class _Loader:
    @staticmethod
    def from_pretrained(path, **kwargs):
        return _Model()


def __getattr__(name):  # any model class named by config.json's architectures
    if name.endswith("ForCausalLM") or name.endswith("ForConditionalGeneration"):
        return _Loader
    raise AttributeError(name)
