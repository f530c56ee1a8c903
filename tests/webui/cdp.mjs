// A minimal Chrome DevTools Protocol client for the chat page test: starts headless Chromium with a
// throwaway profile, connects to its first page over the WebSocket the browser announces (Node's
// built-in WebSocket: Node 22, or Node 20 with --experimental-websocket), and sends commands /
// waits for events. No npm packages.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export async function launchChromium({ binary = process.env.CHROMIUM || '/usr/bin/chromium', width = 1100, height = 860 } = {}) {
  if (typeof WebSocket === 'undefined') throw new Error('this Node has no global WebSocket (run it with --experimental-websocket)');
  const profile = mkdtempSync(join(tmpdir(), 'roofline-chromium-'));
  const args = [
    '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--no-default-browser-check', '--disable-extensions', '--disable-background-networking', '--hide-scrollbars',
    '--remote-debugging-port=0', `--user-data-dir=${profile}`, `--window-size=${width},${height}`, 'about:blank',
  ];
  const proc = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const browserWs = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`chromium did not start in 60 s:\n${log}`)), 60000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/DevTools listening on (ws:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('error', (e) => { clearTimeout(timer); reject(new Error(`cannot start ${binary}: ${e.message}`)); });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`chromium exited with ${code}:\n${log}`)); });
  });
  const httpBase = browserWs.replace(/^ws:/, 'http:').replace(/\/devtools\/.*$/, '');
  const targets = await (await fetch(`${httpBase}/json/list`)).json();
  const page = targets.find((t) => t.type === 'page');
  if (!page) throw new Error(`chromium has no page target: ${JSON.stringify(targets)}`);
  const session = await connect(page.webSocketDebuggerUrl);
  return {
    session,
    log: () => log,
    async close() {
      session.close();
      if (proc.exitCode === null) {
        const exited = new Promise((r) => proc.on('exit', r));
        proc.kill('SIGTERM');
        await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
        if (proc.exitCode === null) proc.kill('SIGKILL');
      }
      // Chromium's helper processes can still be writing into the profile for a moment after the
      // browser exits; retry the removal, and never let a leftover temp folder fail the test.
      try {
        rmSync(profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
      } catch (e) {
        console.error(`webui: could not remove ${profile}: ${e.message}`);
      }
    },
  };
}

async function connect(url) {
  const ws = new WebSocket(url);
  await new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve, { once: true });
    ws.addEventListener('error', () => reject(new Error(`cannot connect to ${url}`)), { once: true });
  });
  let nextId = 1;
  const pending = new Map();
  const listeners = [];
  ws.addEventListener('message', (ev) => {
    const msg = JSON.parse(typeof ev.data === 'string' ? ev.data : Buffer.from(ev.data).toString());
    if (msg.id !== undefined) {
      const p = pending.get(msg.id);
      if (!p) return;
      pending.delete(msg.id);
      if (msg.error) p.reject(new Error(`${p.method}: ${msg.error.message}`));
      else p.resolve(msg.result);
      return;
    }
    for (const l of [...listeners]) if (l.method === msg.method) l.fn(msg.params);
  });
  return {
    send(method, params = {}) {
      const id = nextId++;
      ws.send(JSON.stringify({ id, method, params }));
      return new Promise((resolve, reject) => pending.set(id, { resolve, reject, method }));
    },
    on(method, fn) { listeners.push({ method, fn }); },
    once(method, timeoutMs = 30000) {
      return new Promise((resolve, reject) => {
        const l = { method, fn: (p) => { clearTimeout(timer); listeners.splice(listeners.indexOf(l), 1); resolve(p); } };
        const timer = setTimeout(() => { listeners.splice(listeners.indexOf(l), 1); reject(new Error(`no ${method} in ${timeoutMs} ms`)); }, timeoutMs);
        listeners.push(l);
      });
    },
    // Evaluates an expression in the page and returns its value (promises awaited).
    async evaluate(expression) {
      const r = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
      if (r.exceptionDetails) throw new Error(`page: ${r.exceptionDetails.exception?.description || r.exceptionDetails.text}`);
      return r.result.value;
    },
    close() { ws.close(); },
  };
}
