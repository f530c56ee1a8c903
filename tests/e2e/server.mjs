// Starts `roofline serve` on a free port for the end-to-end tests and the load script, waits until
// /health answers 200, and stops it with SIGTERM (resolving with the exit code).
import { spawn } from 'node:child_process';

export async function startServer({ bin, model, args = [], env = {}, readyTimeoutMs = 180000 }) {
  const proc = spawn(bin, ['serve', '-m', model, '--host', '127.0.0.1', '--port', '0', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  proc.stderr.on('data', (d) => { log += d.toString(); if (log.length > 200000) log = log.slice(-100000); });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve(code ?? signal)));
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`server did not report its port:\n${log}`)), readyTimeoutMs);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on [^\s:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited with ${code}:\n${log}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + readyTimeoutMs;
  let sawLoading = false;
  for (;;) {
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) break;
      if (r.status === 503) sawLoading = true;
    } catch { /* not accepting yet */ }
    if (Date.now() > deadline) throw new Error(`server not healthy in time:\n${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port,
    base,
    sawLoading,
    proc,
    exited,
    log: () => log,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}
