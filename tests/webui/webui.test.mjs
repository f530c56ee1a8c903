// The chat page in headless Chromium against `roofline serve` on a tiny model: the page loads with its
// embedded files and the model's name; a conversation kept in localStorage comes back after a reload,
// its Markdown rendered (code blocks, lists, emphasis) and HTML in it escaped; a message typed and sent
// with Enter streams an answer that shows its tokens and tok/s; Stop ends a long answer early; no
// console errors. Saves a screenshot (the test artifact, and the picture in the README).
// Usage: node --experimental-websocket webui.test.mjs ROOFLINE_BINARY MODEL.gguf SCREENSHOT.png
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { startServer } from '../e2e/server.mjs';
import { launchChromium } from './cdp.mjs';

const [bin, model, screenshot] = process.argv.slice(2);
assert.ok(bin && model && screenshot, 'usage: webui.test.mjs ROOFLINE_BINARY MODEL.gguf SCREENSHOT.png');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A conversation as the page stores it: one exchange whose answer uses the Markdown the renderer knows,
// and a line of HTML that must show as text.
const seeded = {
  messages: [
    { role: 'user', content: 'Show me how to add two numbers in Python.' },
    {
      role: 'assistant',
      content: '## Adding numbers\n\nUse the **`+` operator** inside a *function*:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n' +
        '1. Call `add(2, 3)`\n2. Get **5**\n\n- see [the tutorial](https://docs.python.org/3/tutorial/)\n\n' +
        '<img src=x onerror="window.__injected=1">',
      stats: { tokens: 57, tps: 0, ttft_ms: -1, finish: 'stop' },
    },
  ],
};

async function waitFor(session, expression, what, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await session.evaluate(expression);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

async function typeAndSend(session, text) {
  await session.evaluate(`document.getElementById('input').focus()`);
  await session.send('Input.insertText', { text });
  const key = { key: 'Enter', code: 'Enter', windowsVirtualKeyCode: 13, nativeVirtualKeyCode: 13 };
  await session.send('Input.dispatchKeyEvent', { type: 'keyDown', ...key, text: '\r' });
  await session.send('Input.dispatchKeyEvent', { type: 'keyUp', ...key });
}

async function setField(session, id, value) {
  await session.evaluate(`(() => { const el = document.getElementById(${JSON.stringify(id)});
    el.value = ${JSON.stringify(String(value))}; el.dispatchEvent(new Event('change')); })()`);
}

const lastAnswer = `(() => {
  const all = document.querySelectorAll('.message.assistant');
  const m = all[all.length - 1];
  if (!m) return null;
  return { count: all.length, done: m.dataset.done === '1', text: m.querySelector('.content').textContent,
           stats: (m.querySelector('.stats') || {}).textContent || '', error: (m.querySelector('.error') || {}).textContent || '' };
})()`;

const server = await startServer({ bin, model, args: ['-np', '2', '-c', '4096', '-t', '2'] });
let browser;
let failed = false;
try {
  browser = await launchChromium();
  const { session } = browser;
  const problems = [];
  session.on('Runtime.exceptionThrown', (p) => problems.push(`exception: ${p.exceptionDetails.exception?.description || p.exceptionDetails.text}`));
  session.on('Runtime.consoleAPICalled', (p) => {
    if (p.type === 'error') problems.push(`console.error: ${p.args.map((a) => a.value ?? a.description).join(' ')}`);
  });
  // Failed loads (a missing file, a refused request) reach the browser's log, not the console API.
  session.on('Log.entryAdded', (p) => {
    if (p.entry.level === 'error') problems.push(`log: ${p.entry.text} ${p.entry.url || ''}`);
  });
  await session.send('Page.enable');
  await session.send('Runtime.enable');
  await session.send('Log.enable');

  let loaded = session.once('Page.loadEventFired');
  await session.send('Page.navigate', { url: `${server.base}/` });
  await loaded;
  assert.equal(await session.evaluate('document.title'), 'roofline chat');
  assert.equal(await session.evaluate('typeof window.renderMarkdown'), 'function', 'markdown.js did not load');
  const modelName = await waitFor(session, `(() => { const t = document.getElementById('model').textContent;
    return t.endsWith('.gguf') ? t : null; })()`, 'the model name from /v1/models');
  console.log(`webui: page loaded, model ${modelName}`);

  // A stored conversation comes back, rendered.
  await session.evaluate(`localStorage.setItem('roofline.chat.v1', ${JSON.stringify(JSON.stringify(seeded))})`);
  loaded = session.once('Page.loadEventFired');
  await session.send('Page.reload', { ignoreCache: true });
  await loaded;
  const rendered = await session.evaluate(`(() => {
    const c = document.querySelectorAll('.message.assistant .content')[0];
    return { h2: c.querySelector('h2')?.textContent, code: c.querySelector('pre code.language-python')?.textContent,
             strong: c.querySelectorAll('strong').length, em: c.querySelector('em')?.textContent,
             items: c.querySelectorAll('ol li').length, link: c.querySelector('a')?.getAttribute('href'),
             imgs: c.querySelectorAll('img').length, text: c.textContent, injected: window.__injected === 1 };
  })()`);
  assert.equal(rendered.h2, 'Adding numbers');
  assert.equal(rendered.code, 'def add(a, b):\n    return a + b');
  assert.equal(rendered.strong, 2);
  assert.equal(rendered.em, 'function');
  assert.equal(rendered.items, 2);
  assert.equal(rendered.link, 'https://docs.python.org/3/tutorial/');
  assert.equal(rendered.imgs, 0, 'HTML in an answer became an element');
  assert.ok(rendered.text.includes('<img src=x'), 'HTML in an answer is shown as text');
  assert.equal(rendered.injected, false);

  // A message typed and sent with Enter: the answer streams in and ends with its stats.
  await setField(session, 'temperature', 0);
  await setField(session, 'max-tokens', 40);
  await setField(session, 'system-prompt', 'You are a helpful assistant.');
  await typeAndSend(session, 'Hello! What can you do?');
  let sawPartial = false;
  const answer = await waitFor(session, `(() => { const a = ${lastAnswer}; return a && a.count === 2 ? a : null; })()`, 'a second answer');
  const done = await (async () => {
    const deadline = Date.now() + 120000;
    for (;;) {
      const a = await session.evaluate(lastAnswer);
      if (!a.done && a.text.length > 0) sawPartial = true;
      if (a.done) return a;
      if (Date.now() > deadline) throw new Error('the answer did not finish in 120 s');
      await sleep(10);
    }
  })();
  assert.ok(answer);
  assert.equal(done.error, '', `the answer failed: ${done.error}`);
  assert.ok(done.text.trim().length > 0, 'the answer is empty');
  assert.match(done.stats, /^\d+ tokens · [\d.]+ tok\/s · first token \d+ ms · (stop|length)$/);
  const tokens = Number(done.stats.split(' ')[0]);
  assert.ok(tokens >= 1 && tokens <= 40, done.stats);
  console.log(`webui: streamed answer (${done.stats})${sawPartial ? ', seen while streaming' : ''}`);
  const stored = JSON.parse(await session.evaluate(`localStorage.getItem('roofline.chat.v1')`));
  assert.equal(stored.messages.length, 4);
  assert.equal(stored.messages[3].content.trim(), done.text.trim());

  const shot = await session.send('Page.captureScreenshot', { format: 'png' });
  mkdirSync(dirname(screenshot), { recursive: true });
  writeFileSync(screenshot, Buffer.from(shot.data, 'base64'));
  console.log(`webui: screenshot ${screenshot}`);

  // Stop: a long answer is cut short once it has begun; the page is usable again.
  await setField(session, 'max-tokens', 3000);
  await typeAndSend(session, 'Now write a very long story.');
  await waitFor(session, `(() => { const a = ${lastAnswer}; return a && a.count === 3 && (a.text.length > 0 || a.done); })()`, 'the long answer to begin');
  await session.evaluate(`document.getElementById('stop').click()`);
  const stopped = await waitFor(session, `(() => { const a = ${lastAnswer}; return a && a.done ? a : null; })()`, 'the stopped answer');
  if (/stopped/.test(stopped.stats)) {
    assert.match(stopped.stats, /^\d+ tokens .*stopped$/);
    console.log(`webui: stopped (${stopped.stats})`);
  } else {
    console.log(`webui: the long answer ended before Stop was clicked (${stopped.stats})`);
  }
  assert.equal(await session.evaluate(`document.getElementById('send').hidden`), false);
  assert.equal(await session.evaluate(`document.getElementById('input').disabled`), false);
  // The server freed the slot of the aborted stream.
  await waitFor(session, `fetch('/slots').then((r) => r.json()).then((s) => s.every((x) => !x.is_processing))`, 'idle slots', 10000);

  // The conversation survives a reload.
  loaded = session.once('Page.loadEventFired');
  await session.send('Page.reload', {});
  await loaded;
  assert.equal(await session.evaluate(`document.querySelectorAll('.message').length`), 6);
  assert.deepEqual(problems, []);
  console.log('webui: PASS');
} catch (e) {
  failed = true;
  console.error(`webui: FAILED: ${e.stack || e}`);
  console.error(`--- server log ---\n${server.log().slice(-4000)}`);
  if (browser) console.error(`--- chromium log ---\n${browser.log().slice(-4000)}`);
} finally {
  if (browser) await browser.close();
  await server.stop();
}
process.exit(failed ? 1 : 0);
