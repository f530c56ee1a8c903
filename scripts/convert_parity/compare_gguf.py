# Compares two GGUF files (A: llama.cpp's, B: roofline's): metadata keys in order with types and values, tensors in
# order with types, shapes and bytes. Prints IDENTICAL or the differences. Usage: python3 compare_gguf.py A.gguf B.gguf
import sys
import os; sys.path.insert(0, os.path.join(os.environ.get('LLAMA_CPP', '/work/llama.cpp'), 'gguf-py'))
import numpy as np
from gguf import GGUFReader, GGUFValueType
a, b = GGUFReader(sys.argv[1]), GGUFReader(sys.argv[2])   # a: llama.cpp, b: roofline
def kvs(r):
    out = []
    for f in r.fields.values():
        if f.name.startswith('GGUF.'): continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            sub = f.types[1] if len(f.types) > 1 else None
            if sub == GGUFValueType.STRING: v = [bytes(f.parts[i]).decode('utf-8', 'replace') for i in f.data]
            else: v = [f.parts[i].tolist() for i in f.data]
            out.append((f.name, (t.name, sub.name if sub else None), v))
        elif t == GGUFValueType.STRING: out.append((f.name, t.name, bytes(f.parts[f.data[0]]).decode()))
        else: out.append((f.name, t.name, f.parts[f.data[0]].tolist()))
    return out
ka, kb = kvs(a), kvs(b)
ok = True
if [k[0] for k in ka] != [k[0] for k in kb]:
    ok = False
    print("KEY ORDER DIFFERS\n llama.cpp:", [k[0] for k in ka], "\n roofline: ", [k[0] for k in kb])
db = {k[0]: k for k in kb}
for k in ka:
    o = db.get(k[0])
    if o is None: print("missing in roofline:", k[0], k[1], str(k[2])[:100]); ok = False; continue
    if o[1] != k[1] or o[2] != k[2]:
        ok = False; print("KV differs:", k[0], "llama.cpp", k[1], str(k[2])[:120], "| roofline", o[1], str(o[2])[:120])
for k in kb:
    if k[0] not in {x[0] for x in ka}: print("extra in roofline:", k[0], k[1], str(k[2])[:100]); ok = False
ta, tb = a.tensors, b.tensors
if [t.name for t in ta] != [t.name for t in tb]:
    ok = False
    print("TENSOR ORDER DIFFERS"); print(" llama.cpp:", [t.name for t in ta][:80]); print(" roofline: ", [t.name for t in tb][:80])
tbn = {t.name: t for t in tb}
nbad = 0
for t in ta:
    u = tbn.get(t.name)
    if u is None: print("tensor missing in roofline:", t.name); ok = False; continue
    if t.tensor_type != u.tensor_type or list(t.shape) != list(u.shape):
        print("tensor differs:", t.name, t.tensor_type.name, list(t.shape), "| roofline", u.tensor_type.name, list(u.shape)); ok = False; continue
    if bytes(t.data.tobytes()) != bytes(u.data.tobytes()):
        x = np.frombuffer(t.data.tobytes(), dtype=np.uint8); y = np.frombuffer(u.data.tobytes(), dtype=np.uint8)
        print("tensor bytes differ:", t.name, t.tensor_type.name, "bytes differing:", int((x != y).sum()), "of", x.size); ok = False; nbad += 1
print("IDENTICAL" if ok else "DIFFERENT", f"({len(ka)} keys, {len(ta)} tensors)")
