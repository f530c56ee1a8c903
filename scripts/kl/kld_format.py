#!/usr/bin/env python3
"""llama.cpp's --kl-divergence-base file ("_logits_"), as roofline's src/engine/perplexity.cpp reads and writes it.

Layout (little-endian):
    char[8]  "_logits_"
    int32    n_ctx, n_vocab, n_chunk
    int32    tokens[n_chunk * n_ctx]          the text's tokens as tokenized (not with BOS substituted)
    per chunk, per scored row (n_ctx - 1 - n_ctx/2 rows: positions n_ctx/2 .. n_ctx-2 of the window,
    predicting tokens n_ctx/2+1 .. n_ctx-1):
        uint16 row[2*((n_vocab+1)/2) + 4] = float32 scale, float32 min_log_prob, uint16 q[n_vocab], zero padding
    log p(i) ~= scale * q[i] + min_log_prob; log-probabilities below max-16 are stored as the floor (q = 0).

Window w is tokens[w*n_ctx : (w+1)*n_ctx], evaluated from scratch, its first token replaced by BOS when the
vocabulary adds BOS (tokenizer.ggml.add_bos_token), as llama-perplexity and roofline do.

The row encoder replicates encode_kld_row() in float32 arithmetic (numpy when present, else pure python with
float32 rounding through struct): the result matches roofline's bytes except where numpy's/python's exp and the C
library's expf differ in the last bit of one term (then min_log_prob may differ by one float32 ulp).

Command line (pure python, no torch; see scripts/kl/test_kld_writer.sh):
    kld_format.py info FILE                     header, rows, the perplexity stored in the file
    kld_format.py reencode IN OUT               decode IN's rows to log-probabilities, encode them again into OUT
    kld_format.py compare A B                   tokens equal? rows byte-identical? max difference of the decoded rows
    kld_format.py from-logits --logits F --tokens T --ctx N --n-vocab V [--chunks C] OUT
        F: float32 logits of every position of each window ([n_chunk][n_ctx][n_vocab], computed on the window
        inputs with BOS substituted as above), T: the text's tokens as int32 (at least n_chunk*n_ctx); selects the
        scored rows and writes OUT through KldWriter, the path hf_kld_base.py takes.
"""
import argparse
import array
import math
import os
import struct
import sys

try:
    import numpy as np  # noqa: F401
except ImportError:  # the pure-python path below is used
    np = None

MAGIC = b"_logits_"


def row_values(n_vocab):
    """uint16 values per row (kld_row_values)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def first_scored(n_ctx):
    return n_ctx // 2


def n_scored(n_ctx):
    return n_ctx - 1 - n_ctx // 2


def window_input(tokens, n_ctx, w, bos):
    """The ids window w is evaluated on: its first token replaced by BOS when bos >= 0."""
    ids = list(tokens[w * n_ctx:(w + 1) * n_ctx])
    if len(ids) != n_ctx:
        raise ValueError(f"window {w} needs tokens up to {(w + 1) * n_ctx}, only {len(tokens)} given")
    if bos is not None and bos >= 0:
        ids[0] = int(bos)
    return ids


# ---------------------------------------------------------------- float32 helpers (pure python)

_F = struct.Struct("<f")


def f32(x):
    return _F.unpack(_F.pack(x))[0]


def _encode_row_py(logits, n_vocab, token):
    """encode_kld_row() in float32 arithmetic, pure python. logits: n_vocab numbers already float32-valued."""
    mx = logits[0]
    mn = logits[0]
    for v in logits[1:n_vocab]:
        if v > mx:
            mx = v
        if v < mn:
            mn = v
    mn = max(mn, f32(mx - 16))
    s = 0.0
    for v in logits[:n_vocab]:
        s += f32(math.exp(f32(v - mx)))  # std::exp(float) is expf: a float, summed in double
    log_sum = f32(math.log(s))
    min_log_prob = f32(f32(mn - mx) - log_sum)
    scale = f32(f32(mx - mn) / 65535.0)
    q = [0] * (row_values(n_vocab) - 4)
    if scale != 0:
        inv = f32(1.0 / scale)
        for i in range(n_vocab):
            v = logits[i]
            if v > mn:
                q[i] = int(round(f32(inv * f32(v - mn))))  # lrintf: round half to even, as python's round
    nll = f32(f32(mx + log_sum) - logits[token])
    head = struct.unpack("<4H", struct.pack("<ff", scale, min_log_prob))
    return list(head) + q, nll


def _encode_row_np(logits, n_vocab, token):
    x = np.ascontiguousarray(np.asarray(logits, dtype=np.float32)[:n_vocab])
    mx = x.max()
    mn = np.float32(max(x.min(), np.float32(mx - np.float32(16))))
    s = float(np.exp(x - mx).astype(np.float64).sum())
    log_sum = np.float32(math.log(s))
    min_log_prob = np.float32(np.float32(mn - mx) - log_sum)
    scale = np.float32(np.float32(mx - mn) / np.float32(65535))
    row = np.zeros(row_values(n_vocab), dtype="<u2")
    row[:4] = np.frombuffer(struct.pack("<ff", float(scale), float(min_log_prob)), dtype="<u2")
    if scale != 0:
        inv = np.float32(np.float32(1) / scale)
        v = np.rint(inv * (x - mn)).astype(np.int64)  # float32 products, round half to even (lrintf)
        v[x <= mn] = 0
        row[4:4 + n_vocab] = v.astype("<u2")
    nll = np.float32(np.float32(mx + log_sum) - x[token])
    return row, float(nll)


def encode_row(logits, n_vocab, token):
    """(row of row_values(n_vocab) uint16, -log p(token)) from one row of float32 logits."""
    if np is not None:
        return _encode_row_np(logits, n_vocab, token)
    return _encode_row_py([f32(v) for v in logits[:n_vocab]], n_vocab, token)


def row_bytes(row):
    if np is not None and isinstance(row, np.ndarray):
        return row.astype("<u2").tobytes()
    a = array.array("H", row)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def decode_row(raw, n_vocab):
    """raw: bytes of one row -> (scale, min_log_prob, q list, log-probabilities list)."""
    scale, min_lp = struct.unpack("<ff", raw[:8])
    q = struct.unpack(f"<{n_vocab}H", raw[8:8 + 2 * n_vocab])
    return scale, min_lp, q, [f32(f32(scale * v) + min_lp) for v in q]


# ---------------------------------------------------------------- files

class KldWriter:
    """Writes a base file window by window: add_window(w, rows) with the logits of every position of window w
    (n_ctx rows of n_vocab float32) or of its scored positions only (n_scored rows)."""

    def __init__(self, path, n_ctx, n_vocab, n_chunk, tokens):
        if n_ctx < 4:
            raise ValueError(f"n_ctx {n_ctx} < 4")
        if len(tokens) < n_chunk * n_ctx:
            raise ValueError(f"{len(tokens)} tokens for {n_chunk} windows of {n_ctx}")
        for t in tokens[:n_chunk * n_ctx]:
            if not 0 <= t < n_vocab:
                raise ValueError(f"token {t} outside the vocabulary of {n_vocab}")
        self.path, self.n_ctx, self.n_vocab, self.n_chunk = path, n_ctx, n_vocab, n_chunk
        self.tokens = [int(t) for t in tokens[:n_chunk * n_ctx]]
        self.tmp = path + ".tmp"
        self.f = open(self.tmp, "wb")
        self.f.write(MAGIC)
        self.f.write(struct.pack("<3i", n_ctx, n_vocab, n_chunk))
        self.f.write(struct.pack(f"<{len(self.tokens)}i", *self.tokens))
        self.next_window = 0
        self.nll = 0.0
        self.nll2 = 0.0
        self.count = 0

    def add_window(self, w, rows):
        if w != self.next_window:
            raise ValueError(f"windows must come in order: got {w}, expected {self.next_window}")
        first, scored = first_scored(self.n_ctx), n_scored(self.n_ctx)
        if len(rows) == self.n_ctx:
            rows = rows[first:first + scored]  # positions first .. n_ctx-2
        elif len(rows) != scored:
            raise ValueError(f"window {w}: {len(rows)} rows, expected {self.n_ctx} (all) or {scored} (scored)")
        base = w * self.n_ctx
        for j, logits in enumerate(rows):
            target = self.tokens[base + first + 1 + j]
            row, nll = encode_row(logits, self.n_vocab, target)
            self.f.write(row_bytes(row))
            self.nll += nll
            self.nll2 += nll * nll
            self.count += 1
        self.next_window += 1

    def close(self):
        if self.next_window != self.n_chunk:
            self.f.close()
            os.remove(self.tmp)
            raise ValueError(f"{self.next_window} windows written, {self.n_chunk} announced")
        self.f.close()
        os.replace(self.tmp, self.path)
        return self.ppl()

    def ppl(self):
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        err = math.sqrt(var / (self.count - 1)) * math.exp(mean) if var > 0 and self.count > 1 else 0.0
        return math.exp(mean), err


def read_kld(path):
    """-> dict(n_ctx, n_vocab, n_chunk, tokens, rows: list of raw row bytes), checking the size as roofline does."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a _logits_ file")
    n_ctx, n_vocab, n_chunk = struct.unpack("<3i", data[8:20])
    nrows = n_chunk * n_scored(n_ctx)
    rb = 2 * row_values(n_vocab)
    expected = 20 + n_chunk * n_ctx * 4 + nrows * rb
    if len(data) != expected:
        raise ValueError(f"{path}: {len(data)} bytes, header (n_ctx {n_ctx}, n_vocab {n_vocab}, {n_chunk} chunks) "
                         f"needs {expected}")
    tokens = list(struct.unpack(f"<{n_chunk * n_ctx}i", data[20:20 + n_chunk * n_ctx * 4]))
    off = 20 + n_chunk * n_ctx * 4
    rows = [data[off + i * rb: off + (i + 1) * rb] for i in range(nrows)]
    return dict(n_ctx=n_ctx, n_vocab=n_vocab, n_chunk=n_chunk, tokens=tokens, rows=rows)


def file_ppl(k):
    first, scored = first_scored(k["n_ctx"]), n_scored(k["n_ctx"])
    nll = []
    for i, raw in enumerate(k["rows"]):
        c, j = divmod(i, scored)
        tok = k["tokens"][c * k["n_ctx"] + first + 1 + j]
        scale, min_lp = struct.unpack("<ff", raw[:8])
        (q,) = struct.unpack_from("<H", raw, 8 + 2 * tok)
        nll.append(-(scale * q + min_lp))
    return math.exp(sum(nll) / len(nll))


# ---------------------------------------------------------------- command line

def cmd_info(a):
    k = read_kld(a.file)
    print(f"{a.file}: n_ctx {k['n_ctx']}, n_vocab {k['n_vocab']}, {k['n_chunk']} chunks, {len(k['rows'])} rows, "
          f"PPL from the stored rows {file_ppl(k):.4f}")


def cmd_reencode(a):
    k = read_kld(a.inp)
    n_ctx, n_vocab = k["n_ctx"], k["n_vocab"]
    w = KldWriter(a.out, n_ctx, n_vocab, k["n_chunk"], k["tokens"])
    scored = n_scored(n_ctx)
    for c in range(k["n_chunk"]):
        rows = [decode_row(raw, n_vocab)[3] for raw in k["rows"][c * scored:(c + 1) * scored]]
        w.add_window(c, rows)
    ppl, err = w.close()
    print(f"wrote {a.out}: PPL {ppl:.4f} +/- {err:.5f}")


def cmd_compare(a):
    ka, kb = read_kld(a.a), read_kld(a.b)
    for key in ("n_ctx", "n_vocab", "n_chunk"):
        if ka[key] != kb[key]:
            print(f"DIFFERENT {key}: {ka[key]} vs {kb[key]}")
            return 1
    n_vocab = ka["n_vocab"]
    same_tokens = ka["tokens"] == kb["tokens"]
    identical = sum(1 for x, y in zip(ka["rows"], kb["rows"]) if x == y)
    head_diff = sum(1 for x, y in zip(ka["rows"], kb["rows"]) if x[:8] != y[:8])
    q_diff_values = 0
    max_lp = 0.0
    max_q = 0
    for x, y in zip(ka["rows"], kb["rows"]):
        if x == y:
            continue
        _, _, qa, la = decode_row(x, n_vocab)
        _, _, qb, lb = decode_row(y, n_vocab)
        for i in range(n_vocab):
            if qa[i] != qb[i]:
                q_diff_values += 1
                max_q = max(max_q, abs(qa[i] - qb[i]))
            if la[i] > -16 or lb[i] > -16:
                max_lp = max(max_lp, abs(la[i] - lb[i]))
    print(f"tokens equal: {same_tokens}; rows byte-identical: {identical}/{len(ka['rows'])}; rows whose scale/min "
          f"differ: {head_diff}; q values that differ: {q_diff_values} (max |dq| {max_q}); max |log p difference| "
          f"(above -16): {max_lp:.3g}; PPL {file_ppl(ka):.6f} vs {file_ppl(kb):.6f}")
    return 0 if same_tokens and max_lp < 1e-3 else 1


def cmd_from_logits(a):
    with open(a.tokens, "rb") as f:
        raw = f.read()
    tokens = list(struct.unpack(f"<{len(raw) // 4}i", raw))
    n_ctx, n_vocab = a.ctx, a.n_vocab
    n_chunk = a.chunks if a.chunks else len(tokens) // n_ctx
    per_window = n_ctx * n_vocab * 4
    w = KldWriter(a.out, n_ctx, n_vocab, n_chunk, tokens)
    with open(a.logits, "rb") as f:
        for c in range(n_chunk):
            buf = f.read(per_window)
            if len(buf) != per_window:
                raise ValueError(f"{a.logits}: window {c} truncated")
            if np is not None:
                rows = np.frombuffer(buf, dtype="<f4").reshape(n_ctx, n_vocab)
            else:
                flat = struct.unpack(f"<{n_ctx * n_vocab}f", buf)
                rows = [flat[i * n_vocab:(i + 1) * n_vocab] for i in range(n_ctx)]
            w.add_window(c, rows)
    ppl, err = w.close()
    print(f"wrote {a.out}: {n_chunk} windows of {n_ctx}, PPL {ppl:.4f} +/- {err:.5f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info")
    p.add_argument("file")
    p = sub.add_parser("reencode")
    p.add_argument("inp")
    p.add_argument("out")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("from-logits")
    p.add_argument("--logits", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--n-vocab", type=int, required=True)
    p.add_argument("--chunks", type=int, default=0)
    p.add_argument("out")
    a = ap.parse_args()
    return {"info": cmd_info, "reencode": cmd_reencode, "compare": cmd_compare,
            "from-logits": cmd_from_logits}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
