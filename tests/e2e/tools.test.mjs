// Tool calls end to end with the official openai client, for each prompt format the server knows:
// the fixture model served with the real Qwen3 (<tool_call> tags), Llama 3.1 (JSON name/parameters,
// ipython results) and Gemma 3 (no tools in the template: generic JSON in plain messages) chat
// templates. A random model does not call tools by itself, so each round trip sends what a client
// sends after a call (the assistant message with content null and tool_calls, then the tool result)
// and checks the request is answered, whole and streamed, and that /apply-template shows the call and
// the result rendered in that format. Parsing the model's calls is tested by the C++ unit tests.
// Run by run.sh with ROOFLINE_BIN, ROOFLINE_E2E_MODEL and ROOFLINE_E2E_TEMPLATES (a directory of
// qwen3.jinja, llama31.jinja, gemma3.jinja).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

const BIN = process.env.ROOFLINE_BIN;
const MODEL = process.env.ROOFLINE_E2E_MODEL;
const TEMPLATES = process.env.ROOFLINE_E2E_TEMPLATES;
const servers = [];
after(async () => { for (const s of servers) await s.stop(); });

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const question = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Weather in Paris?' }];
// What the client holds after the model called get_weather: the assistant turn as it came back and
// the tool's answer.
const afterCall = [
  ...question,
  { role: 'assistant', content: null,
    tool_calls: [{ id: 'call_e2e1', type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) } }] },
  { role: 'tool', tool_call_id: 'call_e2e1', content: '18C and sunny' },
];

// How each format writes the call and the result in the prompt.
const formats = {
  qwen3: [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_response>\n18C and sunny\n</tool_response>',
    '<tools>',
  ],
  llama31: [
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
    '<|start_header_id|>ipython<|end_header_id|>\n\n"18C and sunny"<|eot_id|>',
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.',
  ],
  gemma3: [
    '<start_of_turn>model\n{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"},"id":"call_e2e1"}]}<end_of_turn>',
    '<start_of_turn>user\n{"tool_response":{"name":"get_weather","tool_call_id":"call_e2e1","content":"18C and sunny"}}<end_of_turn>',
    'To call tools, answer with only this JSON object',
  ],
};

function checkChoice(choice) {
  assert.equal(choice.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(choice.finish_reason), choice.finish_reason);
  if (choice.finish_reason === 'tool_calls') {
    for (const c of choice.message.tool_calls) {
      assert.match(c.id, /^call_/);
      assert.equal(c.function.name, 'get_weather');
      JSON.parse(c.function.arguments);
    }
  } else {
    assert.equal(typeof choice.message.content, 'string');
  }
}

async function streamed(client, params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let finish = null;
  let usage = null;
  const calls = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const tc of ch.delta.tool_calls ?? []) {
      calls[tc.index] ??= { id: tc.id, name: '', arguments: '' };
      if (tc.function?.name) calls[tc.index].name += tc.function.name;
      if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { content, finish, usage, calls };
}

for (const [name, [callText, resultText, toolsText]] of Object.entries(formats)) {
  test(`tools round trip in the ${name} format, whole and streamed`, async () => {
    assert.ok(BIN && MODEL && TEMPLATES, 'ROOFLINE_BIN, ROOFLINE_E2E_MODEL and ROOFLINE_E2E_TEMPLATES must be set');
    const server = await startServer({ bin: BIN, model: MODEL, args: ['-np', '2', '-c', '4096', '-t', '2', '--chat-template-file', `${TEMPLATES}/${name}.jinja`] });
    servers.push(server);
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
    const base = { model: 'any', tools, temperature: 0, max_tokens: 8 };

    // 1. The question with tools offered (tool_choice auto): an answer, or calls, in OpenAI's shape.
    const first = await client.chat.completions.create({ ...base, messages: question, tool_choice: 'auto' });
    assert.equal(first.object, 'chat.completion');
    checkChoice(first.choices[0]);
    const firstStream = await streamed(client, { ...base, messages: question });
    assert.ok(['stop', 'length', 'tool_calls'].includes(firstStream.finish));
    assert.equal(firstStream.usage.prompt_tokens, first.usage.prompt_tokens);
    if (firstStream.finish !== 'tool_calls') assert.equal(firstStream.content, first.choices[0].message.content);

    // 2. The call and its result sent back: the final answer, whole and streamed alike.
    const final = await client.chat.completions.create({ ...base, messages: afterCall });
    checkChoice(final.choices[0]);
    assert.ok(final.usage.prompt_tokens > first.usage.prompt_tokens);
    const finalStream = await streamed(client, { ...base, messages: afterCall });
    assert.equal(finalStream.usage.prompt_tokens, final.usage.prompt_tokens);
    if (finalStream.finish !== 'tool_calls') assert.equal(finalStream.content, final.choices[0].message.content);

    // 3. What the model saw: the tools, the call and the result in this format's own form.
    const r = await fetch(`${server.base}/apply-template`, { method: 'POST', body: JSON.stringify({ messages: afterCall, tools }) });
    assert.equal(r.status, 200);
    const { prompt } = await r.json();
    assert.ok(prompt.includes(toolsText), `${name}: tools not rendered:\n${prompt}`);
    assert.ok(prompt.includes(callText), `${name}: call not rendered as expected:\n${prompt}`);
    assert.ok(prompt.includes(resultText), `${name}: result not rendered as expected:\n${prompt}`);
    assert.ok(prompt.indexOf(callText) < prompt.indexOf(resultText));

    // tool_choice none still answers; a malformed tools array is the client's 400.
    const none = await client.chat.completions.create({ ...base, messages: question, tool_choice: 'none' });
    assert.equal(typeof none.choices[0].message.content, 'string');
    assert.equal(none.choices[0].message.tool_calls, undefined);
    await assert.rejects(client.chat.completions.create({ ...base, messages: question, tools: [{ type: 'function' }] }),
                         (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
    await server.stop();
  });
}
