// End-to-end tests of `roofline serve` driven by the official openai client (openai@6, Node 20):
// chat and completions, whole and streamed, usage, stop strings, n > 1 and logprobs, 16 concurrent
// streams on 4 slots giving the same greedy text as alone, cancel mid-stream, bad inputs, auth,
// metrics, embeddings (client.embeddings.create: base64 by default, float, lists), structured output (response_format
// json_schema whose output validates, whole and streamed), a tool_choice "required" round trip (call, tool
// result, answer), and a graceful SIGTERM. Run by run.sh (ctest: serve_e2e) with ROOFLINE_BIN and
// ROOFLINE_E2E_MODEL set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';
import { startServer } from './server.mjs';

const BIN = process.env.ROOFLINE_BIN;
const MODEL = process.env.ROOFLINE_E2E_MODEL;  // tests/fixtures/hf/qwen3_f32 converted to GGUF (f32)
// What transformers computed for that fixture (float64): its greedy continuation of a prompt.
const EXPECTED = JSON.parse(readFileSync(new URL('../fixtures/hf/qwen3_f32/expected.json', import.meta.url), 'utf8'));
const KEY = 'e2e-secret';
let server;
let client;

before(async () => {
  assert.ok(BIN && MODEL, 'ROOFLINE_BIN and ROOFLINE_E2E_MODEL must be set');
  server = await startServer({ bin: BIN, model: MODEL, args: ['-np', '4', '-c', '4096', '--api-key', KEY, '--metrics', '-t', '2', '--embeddings', '--pooling', 'mean'] });
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  if (server) {
    const code = await server.stop();
    if (code !== 0) console.error(server.log());
  }
});

const chat = (content, extra = {}) => ({
  model: 'any-name',
  messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content }],
  temperature: 0,
  max_tokens: 24,
  ignore_eos: true,
  ...extra,
});

async function collectChatStream(params, onChunk) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  let text = '';
  for await (const chunk of stream) {
    chunks.push(chunk);
    const d = chunk.choices[0]?.delta;
    if (d?.content) text += d.content;
    if (onChunk && onChunk(chunk, stream) === false) break;
  }
  return { text, chunks };
}

async function metric(name) {
  const r = await fetch(`${server.base}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
  const body = await r.text();
  const m = body.match(new RegExp(`^${name.replace(/[:]/g, '\\:')} ([0-9.e+-]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

async function waitIdle(ms = 5000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if ((await metric('llamacpp:requests_processing')) === 0 && (await metric('llamacpp:requests_deferred')) === 0) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return false;
}

test('health is public, everything else needs the key', async () => {
  const h = await fetch(`${server.base}/health`);
  assert.equal(h.status, 200);
  assert.deepEqual(await h.json(), { status: 'ok' });
  const anon = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(anon.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(anon.chat.completions.create(chat('hi')), OpenAI.AuthenticationError);
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, 'model');
  assert.equal(models.data[0].owned_by, 'llamacpp');
});

test('chat completion: content, usage, finish reason', async () => {
  const r = await client.chat.completions.create(chat('Tell me a story.'));
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  // The chat template of the fixture (ChatML, tokenizer_config.json) rendered by hand: the same text as
  // a raw completion of that prompt.
  const prompt = '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n';
  const raw = await client.completions.create({ model: 'x', prompt, temperature: 0, max_tokens: 24, ignore_eos: true });
  assert.equal(r.choices[0].message.content, raw.choices[0].text);
  assert.equal(r.usage.prompt_tokens, raw.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 24);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 24);
});

test('chat stream: role first, content deltas, finish, usage chunk, same text as whole', async () => {
  const whole = await client.chat.completions.create(chat('Describe the sea.'));
  const { text, chunks } = await collectChatStream(chat('Describe the sea.'));
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1);
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, 24);
  const finish = chunks.filter((c) => c.choices[0]?.finish_reason);
  assert.equal(finish.length, 1);
  assert.equal(finish[0].choices[0].finish_reason, 'length');
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
});

test('greedy completion of token ids is transformers\' greedy continuation', async () => {
  const { prompt, tokens } = EXPECTED.greedy;  // 10 prompt ids, 16 greedy ids (float64 margins >= 0.08)
  const r = await client.completions.create({ model: 'x', prompt, temperature: 0, max_tokens: tokens.length, ignore_eos: true });
  const auth = { headers: { Authorization: `Bearer ${KEY}` } };
  const detok = await (await fetch(`${server.base}/detokenize`, { ...auth, method: 'POST', body: JSON.stringify({ tokens }) })).json();
  assert.equal(r.choices[0].text, detok.content);
  assert.equal(r.usage.prompt_tokens, prompt.length);
  assert.equal(r.usage.completion_tokens, tokens.length);
});

test('completions: whole, streamed, default max_tokens 16, echo', async () => {
  const r = await client.completions.create({ model: 'x', prompt: 'Once upon a time', temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.completion_tokens, 16);
  const stream = await client.completions.create({ model: 'x', prompt: 'Once upon a time', temperature: 0, ignore_eos: true, stream: true });
  let text = '';
  let finish = null;
  for await (const c of stream) {
    text += c.choices[0]?.text ?? '';
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(text, r.choices[0].text);
  assert.equal(finish, 'length');
  const echo = await client.completions.create({ model: 'x', prompt: 'Once upon a time', temperature: 0, max_tokens: 4, echo: true, ignore_eos: true });
  assert.ok(echo.choices[0].text.startsWith('Once upon a time'));
});

test('stop strings end the text before them, whole and streamed', async () => {
  const base = await client.chat.completions.create(chat('Write about mountains.', { max_tokens: 48 }));
  const full = base.choices[0].message.content;
  const m = full.slice(6).match(/[A-Za-z]{3}/);
  assert.ok(m, `no ASCII window in ${JSON.stringify(full)}`);
  const stop = m[0];
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.chat.completions.create(chat('Write about mountains.', { max_tokens: 48, stop: [stop, 'NEVER-APPEARS'] }));
  assert.equal(r.choices[0].message.content, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.completion_tokens < 48);
  const { text, chunks } = await collectChatStream(chat('Write about mountains.', { max_tokens: 48, stop }));
  assert.equal(text, expected);
  assert.equal(chunks.find((c) => c.choices[0]?.finish_reason).choices[0].finish_reason, 'stop');
});

test('n > 1, seeds and logprobs', async () => {
  const r = await client.chat.completions.create(chat('Pick a color.', { n: 2, max_tokens: 8, logprobs: true, top_logprobs: 3 }));
  assert.equal(r.choices.length, 2);
  assert.equal(r.choices[0].message.content, r.choices[1].message.content);  // greedy
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 8);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    assert.equal(t.top_logprobs[0].logprob, t.logprob);  // greedy picks the most likely token
    assert.ok(Array.isArray(t.bytes));
  }
  const sampled = (seed) => client.chat.completions.create(chat('Pick a color.', { temperature: 1.5, seed, max_tokens: 16 }));
  const [a, b] = [await sampled(7), await sampled(7)];
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('16 concurrent streams on 4 slots give the same greedy text as alone', async () => {
  const prompts = Array.from({ length: 16 }, (_, i) => `Question ${i}: ${'why '.repeat(i % 5)}is the sky ${['blue', 'red', 'green', 'grey'][i % 4]}?`);
  const alone = [];
  for (const p of prompts) alone.push((await client.chat.completions.create(chat(p, { max_tokens: 20 }))).choices[0].message.content);
  const results = await Promise.all(prompts.map((p) => collectChatStream(chat(p, { max_tokens: 20 }))));
  results.forEach((r, i) => assert.equal(r.text, alone[i], `stream ${i}`));
  assert.ok(await waitIdle());
  assert.ok((await metric('llamacpp:n_busy_slots_per_decode')) > 1, 'requests were batched together');
});

// 3000 tokens take ~3 s uncancelled on a 2-core machine, so the time alone proves little: the tokens
// the request generated (llamacpp:tokens_predicted_total counts a cancelled request's too) must be a
// small part of them.
test('cancelling mid-stream frees the slot', async () => {
  assert.ok(await waitIdle());
  const before = await metric('llamacpp:tokens_predicted_total');
  let seen = 0;
  const { chunks } = await collectChatStream(chat('Go on forever.', { max_tokens: 3000 }), () => ++seen < 3);
  const left = Date.now();
  assert.ok(chunks.length <= 5);
  assert.ok(await waitIdle(3000), 'the cancelled request still runs');
  const generated = (await metric('llamacpp:tokens_predicted_total')) - before;
  console.log(`# cancelled stream: idle ${Date.now() - left} ms after the client left, ${generated} of 3000 tokens generated`);
  assert.ok(generated < 1000, `the cancelled request generated ${generated} of 3000 tokens`);
  const after = await client.chat.completions.create(chat('Still there?', { max_tokens: 4 }));
  assert.equal(after.usage.completion_tokens, 4);
});

test('bad inputs are 400s with the OpenAI error envelope', async () => {
  const cases = [
    [{ temperature: 5 }, 'temperature'],
    [{ top_p: 2 }, 'top_p'],
    [{ max_tokens: 'ten' }, 'max_tokens'],
    [{ n: 0 }, 'n'],
    [{ stop: 42 }, 'stop'],
    [{ logit_bias: { abc: 3 } }, 'logit_bias'],
    [{ messages: [] }, 'messages'],
    [{ messages: [{ role: 'user', content: 7 }] }, 'messages'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(client.chat.completions.create(chat('x', extra)), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(extra)}: ${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.param, param);
      assert.equal(e.type, 'invalid_request_error');
      return true;
    });
  }
  await assert.rejects(client.chat.completions.create(chat('word '.repeat(5000))), (e) => e.status === 400 && /context/.test(e.message));
  const raw = await fetch(`${server.base}/v1/chat/completions`, {
    method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' }, body: '{"messages": [',
  });
  assert.equal(raw.status, 400);
  assert.equal((await raw.json()).error.type, 'invalid_request_error');
  const unknown = await client.chat.completions.create(chat('hi', { max_tokens: 2, some_future_field: { x: 1 }, user: 'u1', store: false }));
  assert.equal(unknown.usage.completion_tokens, 2);
  // The server is still healthy.
  assert.equal((await fetch(`${server.base}/health`)).status, 200);
});

// A small checker for the schema below (the server must never produce output that fails it).
function checkWeather(v) {
  assert.equal(typeof v, 'object');
  assert.ok(v !== null && !Array.isArray(v));
  for (const k of Object.keys(v)) assert.ok(['city', 'temp', 'tags', 'note'].includes(k), `unexpected key ${k}`);
  assert.equal(typeof v.city, 'string');
  assert.ok([...v.city].length <= 10);
  assert.ok(Number.isInteger(v.temp));
  if ('tags' in v) {
    assert.ok(Array.isArray(v.tags) && v.tags.length <= 2);
    for (const t of v.tags) assert.ok(['sun', 'rain'].includes(t));
  }
  if ('note' in v) assert.ok(v.note === null || typeof v.note === 'boolean');
}

test('structured output: json_schema output parses and validates, whole and streamed', async () => {
  const schema = {
    type: 'object',
    properties: {
      city: { type: 'string', maxLength: 10 },
      temp: { type: 'integer' },
      tags: { type: 'array', items: { enum: ['sun', 'rain'] }, maxItems: 2 },
      note: { anyOf: [{ type: 'null' }, { type: 'boolean' }] },
    },
    required: ['city', 'temp'],
    additionalProperties: false,
  };
  for (const temperature of [0, 1]) {
    const params = chat('The weather as JSON.', {
      max_tokens: 600, ignore_eos: false, temperature, seed: 7,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } },
    });
    const whole = await client.chat.completions.create(params);
    assert.equal(whole.choices[0].finish_reason, 'stop');
    checkWeather(JSON.parse(whole.choices[0].message.content));
    const { text, chunks } = await collectChatStream(params);
    checkWeather(JSON.parse(text));
    assert.equal(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0].finish_reason, 'stop');
    if (temperature === 0) assert.equal(text, whole.choices[0].message.content);
  }
  await assert.rejects(
    client.chat.completions.create(chat('x', { response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'string', pattern: 'a+' } } } })),
    (e) => e.status === 400 && /pattern/.test(e.message));
});

test('tool_choice "required": a valid call, the tool result, then an answer', async () => {
  const tools = [{
    type: 'function',
    function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } },
  }, { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const first = await client.chat.completions.create({ model: 'm', messages, tools, tool_choice: 'required', max_tokens: 400, temperature: 0 });
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const calls = first.choices[0].message.tool_calls;
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    assert.equal(c.type, 'function');
    assert.ok(['get_weather', 'get_time'].includes(c.function.name));
    const args = JSON.parse(c.function.arguments);
    if (c.function.name === 'get_weather') assert.equal(typeof args.city, 'string');
    else assert.deepEqual(args, {});
  }
  // Streamed, a named function: exactly one call to it.
  const stream = await client.chat.completions.create({
    model: 'm', messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 400, temperature: 0.8, seed: 3, stream: true,
  });
  let args = '', name = '', finish = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    for (const tc of d?.tool_calls ?? []) {
      assert.equal(tc.index, 0);
      name += tc.function?.name ?? '';
      args += tc.function?.arguments ?? '';
    }
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(name, 'get_weather');
  assert.equal(typeof JSON.parse(args).city, 'string');
  assert.equal(finish, 'tool_calls');
  // The round trip: the assistant's calls (content null) and the tool's result go back; an answer comes.
  const answer = await client.chat.completions.create({
    model: 'm', tools, max_tokens: 8, temperature: 0,
    messages: [...messages, first.choices[0].message, ...calls.map((c) => ({ role: 'tool', tool_call_id: c.id, content: '{"temp": 21}' }))],
  });
  assert.equal(typeof answer.choices[0].message.content, 'string');
  assert.ok(['stop', 'length', 'tool_calls'].includes(answer.choices[0].finish_reason));
});

test('embeddings: base64 (the client default) and float agree, unit norm, lists, token ids, errors', async () => {
  const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  const b64 = await client.embeddings.create({ model: 'any-name', input: 'The quick brown fox' });
  assert.equal(b64.object, 'list');
  assert.equal(b64.data.length, 1);
  assert.equal(b64.data[0].object, 'embedding');
  const v = b64.data[0].embedding;
  assert.ok(Array.isArray(v) && v.length > 0);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5, `norm ${norm(v)}`);
  assert.ok(b64.usage.prompt_tokens > 0 && b64.usage.total_tokens === b64.usage.prompt_tokens);
  const flt = await client.embeddings.create({ model: 'any-name', input: 'The quick brown fox', encoding_format: 'float' });
  assert.deepEqual(flt.data[0].embedding.map((x) => Math.fround(x)), v.map((x) => Math.fround(x)));
  const list = await client.embeddings.create({ model: 'any-name', input: ['The quick brown fox', 'jumps over'], encoding_format: 'float' });
  assert.deepEqual(list.data.map((d) => d.index), [0, 1]);
  assert.ok(list.data[0].embedding.every((x, i) => Math.abs(x - v[i]) < 1e-5));
  const ids = await client.embeddings.create({ model: 'any-name', input: [[1, 2, 3], [4, 5]] });
  assert.equal(ids.data.length, 2);
  assert.equal(ids.usage.prompt_tokens, 5);
  await assert.rejects(client.embeddings.create({ model: 'any-name', input: 'x', dimensions: 3 }),
    (e) => e.status === 400 && /dimensions/.test(e.message));
  await assert.rejects(client.embeddings.create({ model: 'any-name', input: 'word '.repeat(5000) }),
    (e) => e.status === 400 && /context/.test(e.message));
});

test('metrics, slots, props, tokenize', async () => {
  const auth = { headers: { Authorization: `Bearer ${KEY}` } };
  const m = await (await fetch(`${server.base}/metrics`, auth)).text();
  for (const name of ['llamacpp:prompt_tokens_total', 'llamacpp:tokens_predicted_total', 'llamacpp:requests_processing',
    'llamacpp:kv_cache_usage_ratio', 'llamacpp:time_to_first_token_seconds_bucket', 'llamacpp:inter_token_latency_seconds_count'])
    assert.ok(m.includes(name), name);
  const slots = await (await fetch(`${server.base}/slots`, auth)).json();
  assert.equal(slots.length, 4);
  const props = await (await fetch(`${server.base}/props`, auth)).json();
  assert.equal(props.total_slots, 4);
  const tok = await (await fetch(`${server.base}/tokenize`, { ...auth, method: 'POST', body: JSON.stringify({ content: 'hello world' }) })).json();
  const detok = await (await fetch(`${server.base}/detokenize`, { ...auth, method: 'POST', body: JSON.stringify({ tokens: tok.tokens }) })).json();
  assert.equal(detok.content, 'hello world');
});

test('SIGTERM lets a running stream finish and exits cleanly', async () => {
  const s2 = await startServer({ bin: BIN, model: MODEL, args: ['-np', '2', '-c', '2048', '-t', '1'] });
  const c2 = new OpenAI({ baseURL: `${s2.base}/v1`, apiKey: 'none', maxRetries: 0 });
  const stream = await c2.chat.completions.create({ ...chat('Count slowly.', { max_tokens: 200 }), stream: true });
  let n = 0;
  let signalled = false;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content) n++;
    finish = chunk.choices[0]?.finish_reason ?? finish;
    if (!signalled && n >= 2) {
      s2.proc.kill('SIGTERM');
      signalled = true;
    }
  }
  assert.equal(finish, 'length');
  assert.equal(await s2.exited, 0);
});
