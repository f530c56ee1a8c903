#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server (roofline serve, llama-server, vLLM).

Streaming POST /v1/completions with a prompt of random token ids (unique per request, so no prompt
cache helps), greedy, ignore_eos, max_tokens N, at several concurrencies. For each concurrency it
reports TTFT and inter-token latency (p50/p99), the generated tok/s of all streams together
(comparable with `roofline bench -npl`), the requests that failed and, where the server reports its
`timings` (roofline serve, llama-server), its own prompt_ms (admission to the first token: TTFT less
that is the HTTP and the queue's share), as a markdown table and
optionally JSON; exits 1 when a request failed. Python 3 standard library only (threads + http.client,
one connection a request).

  python3 tests/load/load.py --url http://127.0.0.1:8080 [--concurrency 1,4,16,64] [--prompt-tokens 128]
          [--max-tokens 128] [--per-stream 2] [--warmup 1] [--api-key KEY] [--json out.json]
  # or start `roofline serve` on a free port, wait for /health, SIGTERM it at the end:
  python3 tests/load/load.py --bin build/roofline --model M.gguf [--server-args "-np 64 -c 32768"] ...
  # GPU example (a synthetic 32B model with random weights, no download):
  python3 tests/load/load.py --bin carry/bin/roofline --model synthetic:qwen3-32b:Q4_K_M \\
          --server-args "-np 64 -c 32768 -ngl all"
"""
import argparse
import http.client
import json
import math
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                usage='load.py (--url URL | --bin ROOFLINE --model MODEL [--server-args ARGS]) [options]')
    p.add_argument('--url', default='', help='base URL of a running server, e.g. http://127.0.0.1:8080')
    p.add_argument('--bin', default='', help='roofline binary to start `serve` with (instead of --url)')
    p.add_argument('--model', default='', help='model for --bin: a GGUF file or synthetic:SHAPE:MIX')
    p.add_argument('--server-args', default='', help='extra `roofline serve` arguments (default: -np MAX_CONCURRENCY)')
    p.add_argument('--concurrency', default='1,4,16,64', help='comma-separated concurrencies (default 1,4,16,64)')
    p.add_argument('--prompt-tokens', type=int, default=128, help='prompt length in tokens (default 128)')
    p.add_argument('--max-tokens', type=int, default=128, help='tokens generated per request (default 128)')
    p.add_argument('--per-stream', type=int, default=2, help='requests each stream sends in turn (default 2)')
    p.add_argument('--api-key', default='', help='sent as Authorization: Bearer KEY')
    p.add_argument('--json', default='', help='also write the rows to this JSON file')
    p.add_argument('--server-log', default='',
                   help='with --bin: write the server\'s last 2000 log lines here once it has stopped')
    p.add_argument('--body-extra', default='', help='a JSON object merged into every request body, e.g. '
                   '\'{"response_format": {"type": "json_object"}}\' to measure constrained decoding')
    p.add_argument('--warmup', type=int, default=1, help='short requests sent once before the first level (default 1)')
    p.add_argument('--host-timeout', type=float, default=180.0,
                   help='seconds to wait for a --bin server to be healthy; also the socket timeout of a request (default 180)')
    a = p.parse_args()
    if not a.url and not (a.bin and a.model):
        p.error('give --url, or --bin and --model')
    a.levels = [int(x) for x in a.concurrency.split(',') if x.strip()]
    return a


def pct(xs, p):
    """Nearest-rank percentile; NaN for no samples."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


class Client:
    """A base URL (scheme, host, port, path prefix) and headers; a fresh connection per request."""

    def __init__(self, base, api_key, timeout):
        self.body_extra = {}  # fields merged into every completion request (--body-extra)
        u = urllib.parse.urlsplit(base)
        self.https = u.scheme == 'https'
        self.host, self.port = u.hostname or '127.0.0.1', u.port
        self.prefix = u.path.rstrip('/')
        self.timeout = timeout
        self.headers = {'Authorization': f'Bearer {api_key}'} if api_key else {}

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get(self, path):
        conn = self.connect()
        try:
            conn.request('GET', self.prefix + path, headers=self.headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def completion(self, prompt, max_tokens):
        """One streaming request; its timings (ms since its start) and token counts."""
        fields = {'model': 'load', 'prompt': prompt, 'max_tokens': max_tokens, 'temperature': 0,
                  'ignore_eos': True, 'stream': True, 'stream_options': {'include_usage': True},
                  'cache_prompt': False}
        fields.update(self.body_extra)
        body = json.dumps(fields)
        t0 = time.perf_counter()
        conn = self.connect()
        arrivals, usage, timings = [], None, None
        try:
            conn.request('POST', self.prefix + '/v1/completions', body=body,
                         headers={**self.headers, 'Content-Type': 'application/json'})
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f'HTTP {r.status}: {r.read().decode(errors="replace")[:500]}')
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode().rstrip('\r\n')
                if not line.startswith('data:'):
                    continue
                data = line[5:].lstrip(' ')
                if data == '[DONE]':
                    break
                j = json.loads(data)
                if j.get('error'):
                    e = j['error']
                    raise RuntimeError(e.get('message', str(e)) if isinstance(e, dict) else str(e))
                if j.get('usage'):
                    usage = j['usage']
                if isinstance(j.get('timings'), dict):
                    timings = j['timings']
                ch = j.get('choices') or []
                if ch and ch[0].get('text'):
                    arrivals.append((time.perf_counter() - t0) * 1000)
        finally:
            conn.close()
        total = (time.perf_counter() - t0) * 1000
        return {'ttft': arrivals[0] if arrivals else total,
                'itl': [b - a for a, b in zip(arrivals, arrivals[1:])],
                'total': total,
                'generated': (usage or {}).get('completion_tokens', len(arrivals)),
                'server_prompt_ms': (timings or {}).get('prompt_ms'),
                # The server's own time between its first and last token, over the gaps between them.
                'server_itl_ms': (timings['predicted_ms'] / (timings['predicted_n'] - 1)
                                  if timings and isinstance(timings.get('predicted_ms'), (int, float))
                                  and isinstance(timings.get('predicted_n'), int) and timings['predicted_n'] > 1 else None),
                'prompt': (usage or {}).get('prompt_tokens', len(prompt))}


def run_level(client, level, args, vocab):
    lo, hi = vocab
    lock = threading.Lock()
    serial = [0]
    results, errors = [], []

    # The ids of the former load.mjs: distinct per request of a level (up to ~n_vocab requests); the
    # request also sends cache_prompt: false, so no earlier prompt's KV is reused.
    def make_prompt():
        with lock:
            serial[0] += 1
            s = serial[0] * 7919 + level * 104729
        return [lo + ((s * 31 + i * 2654435761) & 0xFFFFFFFF) % (hi - lo) for i in range(args.prompt_tokens)]

    def stream():
        for _ in range(args.per_stream):
            try:
                r = client.completion(make_prompt(), args.max_tokens)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - any failure of one request is counted, not fatal
                with lock:
                    errors.append(f'{type(e).__name__}: {e}')

    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream, daemon=True) for _ in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    gen = sum(r['generated'] for r in results)
    ttft = [r['ttft'] for r in results]
    itl = [x for r in results for x in r['itl']]
    server_prompt = [r['server_prompt_ms'] for r in results if isinstance(r.get('server_prompt_ms'), (int, float))]
    for e in sorted(set(errors))[:3]:
        print(f'  concurrency {level}: {errors.count(e)} x {e}', file=sys.stderr)
    return {'concurrency': level, 'requests': len(results) + len(errors), 'failed': len(errors),
            'ttft_p50_ms': pct(ttft, 50), 'ttft_p99_ms': pct(ttft, 99),
            'server_prompt_p50_ms': pct(server_prompt, 50), 'server_prompt_p99_ms': pct(server_prompt, 99),
            'server_itl_p50_ms': pct([r['server_itl_ms'] for r in results if r.get('server_itl_ms') is not None], 50),
            'itl_p50_ms': pct(itl, 50), 'itl_p99_ms': pct(itl, 99),
            'itl_mean_ms': sum(itl) / len(itl) if itl else math.nan,
            # The gap after the first token (the first decode step after the prompt's), p50 and the largest.
            'itl_first_p50_ms': pct([r['itl'][0] for r in results if r['itl']], 50),
            'itl_first_max_ms': max((r['itl'][0] for r in results if r['itl']), default=math.nan),
            'tokens_per_request': gen / len(results) if results else math.nan,
            'generated_tok_s': gen / wall, 'prompt_tokens': sum(r['prompt'] for r in results),
            'generated_tokens': gen, 'wall_s': wall}


class Server:
    """`BIN serve -m MODEL --host 127.0.0.1 --port 0 ARGS`: reads the port from stdout, waits for /health 200."""

    def __init__(self, binary, model, extra, timeout):
        cmd = [binary, 'serve', '-m', model, '--host', '127.0.0.1', '--port', '0', *extra]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.log, self.port = [], None
        self.port_seen = threading.Event()
        self.drains = [threading.Thread(target=self._drain, args=(self.proc.stderr, False), daemon=True),
                       threading.Thread(target=self._drain, args=(self.proc.stdout, True), daemon=True)]
        for t in self.drains:
            t.start()
        deadline = time.monotonic() + timeout
        while not self.port_seen.wait(0.05):
            if self.proc.poll() is not None:
                raise RuntimeError(f'server exited with {self.proc.returncode}:\n{self.log_text()}')
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f'server did not report its port:\n{self.log_text()}')
        self.base = f'http://127.0.0.1:{self.port}'
        client = Client(self.base, '', 5)
        while True:
            try:
                if client.get('/health')[0] == 200:
                    break
            except OSError:
                pass  # not accepting yet
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f'server not healthy in time (exit {self.proc.returncode}):\n{self.log_text()}')
            time.sleep(0.05)

    def _drain(self, f, is_stdout):
        for raw in iter(f.readline, b''):
            line = raw.decode(errors='replace')
            self.log.append(line)
            del self.log[:-2000]
            m = is_stdout and self.port is None and re.search(r'listening on [^\s:]+:(\d+)', line)
            if m:
                self.port = int(m.group(1))
                self.port_seen.set()

    def log_text(self):
        return ''.join(self.log[-200:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self.drains:  # the last lines (those printed at exit) read to the end
            t.join(5)
        return self.proc.returncode


def main():
    args = parse_args()
    server = None
    base = args.url.rstrip('/')
    if not base:
        extra = shlex.split(args.server_args) if args.server_args else ['-np', str(max(args.levels))]
        server = Server(args.bin, args.model, extra, args.host_timeout)
        base = server.base
    client = Client(base, args.api_key, args.host_timeout)
    client.body_extra = json.loads(args.body_extra) if args.body_extra else {}
    try:
        n_vocab = 32000
        try:
            status, body = client.get('/v1/models')
            if status == 200:
                n_vocab = int(((json.loads(body).get('data') or [{}])[0].get('meta') or {}).get('n_vocab') or 32000)
        except (OSError, ValueError, AttributeError):
            pass
        vocab = (min(100, n_vocab - 2), min(n_vocab, 30000))  # ids in [lo, hi): no special tokens at the start
        for _ in range(args.warmup):
            client.completion([vocab[0], vocab[0] + 1, vocab[0] + 2], 4)
        print(f'prompt {args.prompt_tokens} tokens (random ids), {args.max_tokens} generated (ignore_eos, greedy), '
              f'{args.per_stream} requests per stream')
        print('| concurrency | requests | failed | TTFT p50 / p99 ms | inter-token p50 / p99 / mean ms '
              '| tokens per request | generated tok/s, all streams | server prompt_ms p50 / p99 |')
        print('|---|---|---|---|---|---|---|---|', flush=True)
        rows = []

        def f(x):
            return f'{x:.1f}' if math.isfinite(x) else '-'

        for level in args.levels:
            r = run_level(client, level, args, vocab)
            rows.append(r)
            print(f"| {level} | {r['requests']} | {r['failed']} | {f(r['ttft_p50_ms'])} / {f(r['ttft_p99_ms'])} "
                  f"| {f(r['itl_p50_ms'])} / {f(r['itl_p99_ms'])} / {f(r['itl_mean_ms'])} | {f(r['tokens_per_request'])} "
                  f"| {f(r['generated_tok_s'])} | {f(r['server_prompt_p50_ms'])} / {f(r['server_prompt_p99_ms'])} |",
                  flush=True)
        if args.json:
            with open(args.json, 'w') as out:  # NaN (no samples) is written as null
                json.dump([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                           for r in rows], out, indent=2)
        return 1 if any(r['failed'] for r in rows) else 0
    finally:
        if server:
            server.stop()
            if args.server_log:
                with open(args.server_log, 'w') as log:
                    log.write(''.join(server.log))


if __name__ == '__main__':
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError) as e:
        print(e, file=sys.stderr)
        sys.exit(1)
