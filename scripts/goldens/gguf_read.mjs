// Minimal GGUF metadata reader (no tensors) for the golden generators: returns {key: value}.
import fs from "fs";

export function readGgufMetadata(path) {
  const buf = fs.readFileSync(path);
  let p = 0;
  const u32 = () => { const v = buf.readUInt32LE(p); p += 4; return v; };
  const u64 = () => { const v = Number(buf.readBigUInt64LE(p)); p += 8; return v; };
  const str = () => { const n = u64(); const s = buf.toString("utf8", p, p + n); p += n; return s; };
  const scalar = (t) => {
    switch (t) {
      case 0: return buf.readUInt8(p++);
      case 1: return buf.readInt8(p++);
      case 2: { const v = buf.readUInt16LE(p); p += 2; return v; }
      case 3: { const v = buf.readInt16LE(p); p += 2; return v; }
      case 4: return u32();
      case 5: { const v = buf.readInt32LE(p); p += 4; return v; }
      case 6: { const v = buf.readFloatLE(p); p += 4; return v; }
      case 7: return buf.readUInt8(p++) !== 0;
      case 8: return str();
      case 10: return u64();
      case 11: { const v = Number(buf.readBigInt64LE(p)); p += 8; return v; }
      case 12: { const v = buf.readDoubleLE(p); p += 8; return v; }
      default: throw new Error(`bad gguf type ${t}`);
    }
  };
  if (buf.toString("ascii", 0, 4) !== "GGUF") throw new Error(`${path}: not GGUF`);
  p = 4;
  u32();          // version
  u64();          // tensor count
  const nkv = u64();
  const md = {};
  for (let i = 0; i < nkv; i++) {
    const key = str();
    const t = u32();
    if (t === 9) {
      const et = u32();
      const n = u64();
      const arr = new Array(n);
      for (let j = 0; j < n; j++) arr[j] = scalar(et);
      md[key] = arr;
    } else {
      md[key] = scalar(t);
    }
  }
  return md;
}
