#!/usr/bin/env node
// Load test of an OpenAI-compatible server (roofline serve, llama-server, vLLM): streaming
// /v1/completions with a prompt of random token ids (unique per request, so no prompt cache helps),
// greedy, ignore_eos, at several concurrencies. Reports TTFT, inter-token latency (p50/p99) and the
// generated tok/s of all streams together, comparable with `roofline bench -npl`.
//
//   node tests/load/load.mjs --url http://127.0.0.1:8080 [--concurrency 1,4,16,64] [--prompt-tokens 128]
//        [--max-tokens 128] [--per-stream 2] [--api-key KEY] [--json out.json]
//   node tests/load/load.mjs --bin build/roofline --model M.gguf [--server-args "-np 64 -c 32768"] ...
import { startServer } from '../e2e/server.mjs';

function parseArgs(argv) {
  const a = { url: '', bin: '', model: '', serverArgs: '', concurrency: '1,4,16,64', promptTokens: 128, maxTokens: 128,
    perStream: 2, apiKey: '', json: '', warmup: 1 };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i];
    const v = () => argv[++i];
    if (k === '--url') a.url = v();
    else if (k === '--bin') a.bin = v();
    else if (k === '--model') a.model = v();
    else if (k === '--server-args') a.serverArgs = v();
    else if (k === '--concurrency') a.concurrency = v();
    else if (k === '--prompt-tokens') a.promptTokens = Number(v());
    else if (k === '--max-tokens') a.maxTokens = Number(v());
    else if (k === '--per-stream') a.perStream = Number(v());
    else if (k === '--api-key') a.apiKey = v();
    else if (k === '--json') a.json = v();
    else if (k === '--warmup') a.warmup = Number(v());
    else if (k === '-h' || k === '--help') { console.log(readmeText()); process.exit(0); }
    else throw new Error(`unknown option ${k}`);
  }
  return a;
}

function readmeText() {
  return 'usage: load.mjs (--url URL | --bin ROOFLINE --model MODEL [--server-args ARGS]) [--concurrency 1,4,16,64] ' +
    '[--prompt-tokens 128] [--max-tokens 128] [--per-stream 2] [--api-key KEY] [--json FILE]';
}

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};

// One streaming request; returns its timings (ms since its start) and token counts.
async function oneRequest(base, headers, prompt, maxTokens) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { ...headers, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'load', prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true }, cache_prompt: false }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const decoder = new TextDecoder();
  let buf = '';
  const arrivals = [];
  let usage = null;
  for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, end);
      buf = buf.slice(end + 2);
      if (!ev.startsWith('data: ')) continue;
      const data = ev.slice(6);
      if (data === '[DONE]') continue;
      const j = JSON.parse(data);
      if (j.error) throw new Error(j.error.message);
      if (j.usage) usage = j.usage;
      if (j.choices?.length && j.choices[0].text) arrivals.push(performance.now() - t0);
    }
  }
  const total = performance.now() - t0;
  const itl = [];
  for (let i = 1; i < arrivals.length; i++) itl.push(arrivals[i] - arrivals[i - 1]);
  return { ttft: arrivals[0] ?? total, itl, total, generated: usage?.completion_tokens ?? arrivals.length,
    prompt: usage?.prompt_tokens ?? prompt.length };
}

async function runLevel(base, headers, level, args, vocab) {
  let serial = 0;
  const makePrompt = () => {
    const s = ++serial * 7919 + level * 104729;
    const ids = [];
    for (let i = 0; i < args.promptTokens; i++) ids.push(vocab.lo + ((s * 31 + i * 2654435761) >>> 0) % (vocab.hi - vocab.lo));
    return ids;
  };
  const results = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: level }, async () => {
    for (let k = 0; k < args.perStream; k++) results.push(await oneRequest(base, headers, makePrompt(), args.maxTokens));
  }));
  const wall = (performance.now() - t0) / 1000;
  const gen = results.reduce((s, r) => s + r.generated, 0);
  const itl = results.flatMap((r) => r.itl);
  return {
    concurrency: level,
    requests: results.length,
    ttft_p50_ms: pct(results.map((r) => r.ttft), 50),
    ttft_p99_ms: pct(results.map((r) => r.ttft), 99),
    itl_p50_ms: pct(itl, 50),
    itl_p99_ms: pct(itl, 99),
    generated_tok_s: gen / wall,
    prompt_tokens: results.reduce((s, r) => s + r.prompt, 0),
    generated_tokens: gen,
    wall_s: wall,
  };
}

async function main() {
  const args = parseArgs(process.argv);
  let server = null;
  let base = args.url.replace(/\/$/, '');
  if (!base) {
    if (!args.bin || !args.model) throw new Error(readmeText());
    const levels = args.concurrency.split(',').map(Number);
    const extra = args.serverArgs ? args.serverArgs.split(/\s+/).filter(Boolean) : ['-np', String(Math.max(...levels))];
    server = await startServer({ bin: args.bin, model: args.model, args: extra });
    base = server.base;
  }
  const headers = args.apiKey ? { Authorization: `Bearer ${args.apiKey}` } : {};
  try {
    const models = await (await fetch(`${base}/v1/models`, { headers })).json();
    const nVocab = models.data?.[0]?.meta?.n_vocab ?? 32000;
    const vocab = { lo: Math.min(100, nVocab - 2), hi: Math.min(nVocab, 30000) };
    for (let w = 0; w < args.warmup; w++) await oneRequest(base, headers, [vocab.lo, vocab.lo + 1, vocab.lo + 2], 4);
    const rows = [];
    console.log(`prompt ${args.promptTokens} tokens (random ids), ${args.maxTokens} generated (ignore_eos, greedy), ` +
      `${args.perStream} requests per stream`);
    console.log('| concurrency | requests | TTFT p50 / p99 ms | inter-token p50 / p99 ms | generated tok/s, all streams |');
    console.log('|---|---|---|---|---|');
    for (const level of args.concurrency.split(',').map(Number)) {
      const r = await runLevel(base, headers, level, args, vocab);
      rows.push(r);
      const f = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
      console.log(`| ${level} | ${r.requests} | ${f(r.ttft_p50_ms)} / ${f(r.ttft_p99_ms)} | ${f(r.itl_p50_ms)} / ${f(r.itl_p99_ms)} | ${f(r.generated_tok_s)} |`);
    }
    if (args.json) (await import('node:fs')).writeFileSync(args.json, JSON.stringify(rows, null, 2));
  } finally {
    if (server) await server.stop();
  }
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
