#!/usr/bin/env python3
"""Soak test of an OpenAI-compatible server (roofline serve): a mixed workload for a long time.

C clients send requests of random kinds (seeded; weights by --mix) for --duration seconds and check
every answer:
  chat_stream  streaming /v1/chat/completions, ignore_eos: finish "length", usage = max_tokens, [DONE]
  completion   non-streaming /v1/completions, ignore_eos: finish "length", usage = max_tokens
  json_schema  response_format json_schema (a small bounded object): the content parses and validates
  tools        tools with tool_choice "required", parallel_tool_calls false (one call, finish "tool_calls")
               or true (calls until finish "tool_calls" or max_tokens): calls whose JSON arguments validate
  cancel       a stream of --cancel-max-tokens that the client drops after 1-3 tokens (the slot must be freed)
  prefix       a long common system prompt (prompt cache; at most half the context) + one of 8 questions,
               greedy: the same request always gives the same text (each question goes twice in a row
               the first time)
  malformed    bad JSON, wrong types, negative max_tokens, invalid UTF-8, nesting 10000 deep, ids out of
               range, unsupported schemas, unknown routes, a prompt beyond the context: a 4xx with the
               OpenAI error envelope, never a 5xx or a dropped connection
  poll         GET /health, /metrics (when enabled), /v1/models
A failure is a 5xx, a timeout, a connection error, an answer that breaks its kind's rules above, a greedy
answer that differs from an earlier one (unless --determinism report) or a 4xx on a valid request.

Every --window seconds it records the requests done, failures, generated tok/s (tokens as they arrive),
TTFT p50/p99 of the streams and, for a server it started (or --server-pid), the server's RSS from
/proc/PID/status, and the GPU memory in use when nvidia-smi exists. At the end: a markdown summary
(per kind, per window, the checks) and optionally --json. After the clients stop, the server must go
idle (requests_processing 0 in /metrics) and answer one more request; a server it started must exit 0 on
SIGTERM. Exit 1 on any failure, when RSS (or GPU memory) grew more than --max-rss-growth-mib
(--max-gpu-growth-mib) from the first window after --warmup-windows to the last, or when tok/s in the
last window fell below --min-rate-ratio of that first one. RSS is also sampled every 2 s: the slope of
a least-squares line through the samples of the second half of the run (and after the warm-up windows)
is reported in MiB/min, and fails the run when above --max-rss-slope-mib-min (when given). Python 3
standard library only; the server handling (--url, or --bin/--model/--server-args) is load.py's.

  python3 tests/load/soak.py --url http://127.0.0.1:8080 [--duration 300] [--concurrency 8] [--window 30]
  python3 tests/load/soak.py --bin build/roofline --model M.gguf --server-args "-np 4 -c 4096" \\
          --duration 60 --concurrency 8 [--mix chat_stream=3,prefix=2,...] [--seed 1] [--json out.json]
"""
import argparse
import http.client
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import Client, Server, pct  # noqa: E402  (the sibling load test: server start/stop, percentiles)

KINDS = ['chat_stream', 'completion', 'json_schema', 'tools', 'cancel', 'prefix', 'malformed', 'poll']
DEFAULT_MIX = 'chat_stream=3,completion=2,json_schema=1,tools=1,cancel=1,prefix=2,malformed=1,poll=1'
STREAM_KINDS = {'chat_stream', 'cancel', 'json_schema', 'tools'}  # those with a TTFT (when streamed)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                usage='soak.py (--url URL | --bin ROOFLINE --model MODEL [--server-args ARGS]) [options]')
    p.add_argument('--url', default='', help='base URL of a running server, e.g. http://127.0.0.1:8080')
    p.add_argument('--bin', default='', help='roofline binary to start `serve` with (instead of --url)')
    p.add_argument('--model', default='', help='model for --bin: a GGUF file or synthetic:SHAPE:MIX')
    p.add_argument('--server-args', default='', help='extra `roofline serve` arguments (default: -np CONCURRENCY); '
                   '--metrics is added when missing')
    p.add_argument('--server-pid', type=int, default=0, help='with --url: the server process whose RSS to follow')
    p.add_argument('--api-key', default='', help='sent as Authorization: Bearer KEY')
    p.add_argument('--duration', type=float, default=300, help='seconds of load (default 300)')
    p.add_argument('--concurrency', type=int, default=8, help='clients sending requests at once (default 8)')
    p.add_argument('--window', type=float, default=30, help='seconds per reporting window (default 30)')
    p.add_argument('--warmup-windows', type=int, default=1,
                   help='windows left out of the RSS and tok/s comparisons (default 1)')
    p.add_argument('--mix', default=DEFAULT_MIX, help=f'weights of the request kinds (default {DEFAULT_MIX}); '
                   'kinds left out are not sent')
    p.add_argument('--seed', type=int, default=1, help='seed of the kinds, prompts and lengths (default 1)')
    p.add_argument('--max-tokens', type=int, default=32,
                   help='chat_stream/completion generate 4..N tokens each (default 32)')
    p.add_argument('--cancel-max-tokens', type=int, default=2000,
                   help='max_tokens of a cancelled stream, far more than it reads (default 2000)')
    p.add_argument('--prefix-words', type=int, default=300, help='words of the common prefix of prefix requests (default 300)')
    p.add_argument('--determinism', choices=['strict', 'report'], default='strict',
                   help='strict: a greedy answer that differs from an earlier one is a failure; report: counted only')
    p.add_argument('--max-rss-growth-mib', type=float, default=256, help='server RSS growth allowed (default 256)')
    p.add_argument('--max-rss-slope-mib-min', type=float, default=0,
                   help='server RSS slope allowed over the second half of the run, MiB/min (default 0: reported only)')
    p.add_argument('--max-gpu-growth-mib', type=float, default=256, help='GPU memory growth allowed (default 256)')
    p.add_argument('--min-rate-ratio', type=float, default=0.7,
                   help='tok/s of the last window must be at least this share of the first compared one (default 0.7)')
    p.add_argument('--request-timeout', type=float, default=120, help='socket timeout of a request, seconds (default 120)')
    p.add_argument('--drain-timeout', type=float, default=60,
                   help='seconds the server may take to go idle after the clients stop (default 60)')
    p.add_argument('--host-timeout', type=float, default=300, help='seconds to wait for a --bin server to be healthy (default 300)')
    p.add_argument('--json', default='', help='also write the whole result to this JSON file')
    a = p.parse_args()
    if not a.url and not (a.bin and a.model):
        p.error('give --url, or --bin and --model')
    a.weights = {}
    for part in a.mix.split(','):
        name, _, w = part.strip().partition('=')
        if name not in KINDS:
            p.error(f'unknown request kind {name!r} in --mix (kinds: {", ".join(KINDS)})')
        try:
            a.weights[name] = float(w)
        except ValueError:
            p.error(f'bad weight {w!r} for {name} in --mix')
    if not any(v > 0 for v in a.weights.values()):
        p.error('--mix gives no kind a positive weight')
    if a.concurrency < 1 or a.window <= 0 or a.warmup_windows < 0 or a.max_tokens < 4:
        p.error('--concurrency >= 1, --window > 0, --warmup-windows >= 0 and --max-tokens >= 4 please')
    if a.duration < (a.warmup_windows + 2) * a.window:
        p.error(f'--duration must cover --warmup-windows + 2 windows ({(a.warmup_windows + 2) * a.window:g} s) '
                'so that a first and a last window can be compared')
    return a


class Failure(Exception):
    """A request whose answer breaks the rules of its kind."""


# ---------------------------------------------------------------- the checks of structured answers

WEATHER_SCHEMA = {
    'type': 'object',
    'properties': {
        'city': {'type': 'string', 'maxLength': 10},
        'temp': {'type': 'integer'},
        'sky': {'enum': ['sun', 'rain', 'snow']},
        'alert': {'type': 'boolean'},
    },
    'required': ['city', 'temp', 'sky'],
    'additionalProperties': False,
}

TOOLS = [
    {'type': 'function', 'function': {
        'name': 'get_weather', 'description': 'Weather of a city',
        'parameters': {'type': 'object', 'properties': {'city': {'type': 'string', 'maxLength': 12}},
                       'required': ['city'], 'additionalProperties': False}}},
    {'type': 'function', 'function': {
        'name': 'get_time', 'description': 'The time now',
        'parameters': {'type': 'object', 'properties': {}, 'additionalProperties': False}}},
]


def validate(value, schema, where='$'):
    """The subset of JSON Schema used above (object, string + maxLength, integer, boolean, enum)."""
    if 'enum' in schema:
        if value not in schema['enum']:
            raise Failure(f'{where}: {value!r} is not one of {schema["enum"]}')
        return
    t = schema.get('type')
    if t == 'object':
        if not isinstance(value, dict):
            raise Failure(f'{where}: expected an object, got {value!r}')
        props = schema.get('properties', {})
        for k in schema.get('required', []):
            if k not in value:
                raise Failure(f'{where}: required key {k!r} missing')
        for k, v in value.items():
            if k in props:
                validate(v, props[k], f'{where}.{k}')
            elif schema.get('additionalProperties') is False:
                raise Failure(f'{where}: unexpected key {k!r}')
    elif t == 'string':
        if not isinstance(value, str):
            raise Failure(f'{where}: expected a string, got {value!r}')
        if any('\ud800' <= c <= '\udfff' for c in value):  # json.loads keeps a lone surrogate escape; strict parsers fail
            raise Failure(f'{where}: a lone surrogate in {value!r}')
        if len(value) > schema.get('maxLength', math.inf):
            raise Failure(f'{where}: {len(value)} characters > maxLength {schema["maxLength"]}')
    elif t == 'integer':
        if not isinstance(value, int) or isinstance(value, bool):
            raise Failure(f'{where}: expected an integer, got {value!r}')
    elif t == 'boolean':
        if not isinstance(value, bool):
            raise Failure(f'{where}: expected a boolean, got {value!r}')


def parse_json_text(text, what):
    try:
        return json.loads(text)
    except ValueError as e:
        raise Failure(f'{what} is not JSON ({e}): {text[:200]!r}') from None


# ---------------------------------------------------------------- HTTP

WORDS = ('river stone light paper garden window silver morning yellow quiet engine forest music number '
         'winter orange bridge cloud market letter summer animal island mirror ocean planet rocket shadow '
         'thunder valley').split()
CITIES = ['Paris', 'Lima', 'Oslo', 'Cairo', 'Tokyo', 'Quito', 'Rome', 'Accra']
QUESTIONS = ['What is the first word?', 'Name a colour.', 'Count to five.', 'Which word repeats?',
             'Summarize the text.', 'Is it about the sea?', 'Say hello.', 'What comes next?']


class Api:
    """The requests of one kind each against a base URL (a fresh connection per request, as load.py)."""

    def __init__(self, client, args, recorder):
        self.c = client
        self.args = args
        self.rec = recorder
        self.metrics_enabled = False
        self.n_ctx = 0
        self.json_headers = {**client.headers, 'Content-Type': 'application/json'}
        prefix_rng = random.Random(args.seed * 7919 + 1)
        self.prefix = 'Read this text. ' + ' '.join(prefix_rng.choice(WORDS) for _ in range(args.prefix_words))
        self.greedy_lock = threading.Lock()
        self.greedy_first = {}  # question index -> the text of its first answer
        self.greedy_compared = 0
        self.greedy_divergent = []
        self.cached_tokens = [0, 0]  # prefix requests: prompt tokens served from the cache, all prompt tokens

    def _post(self, path, body, conn=None):
        """POST body (a dict, or bytes sent as they are); returns (connection, response) with headers read."""
        conn = conn or self.c.connect()
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request('POST', self.c.prefix + path, body=data, headers=self.json_headers)
        return conn, conn.getresponse()

    def _post_json(self, path, body):
        conn, r = self._post(path, body)
        try:
            raw = r.read()
        finally:
            conn.close()
        if r.status != 200:
            raise Failure(f'HTTP {r.status} on a valid request: {raw.decode(errors="replace")[:300]}')
        return parse_json_text(raw.decode(errors='replace'), 'the response')

    def _stream(self, path, body, on_chunk=None):
        """A streaming POST: its chunks, the TTFT (first chunk with content or a tool call, ms) and whether
        [DONE] came. on_chunk(chunk) returning False stops reading (the caller then drops the connection)."""
        t0 = time.perf_counter()
        conn, r = self._post(path, body)
        chunks, ttft, done = [], None, False
        try:
            if r.status != 200:
                raise Failure(f'HTTP {r.status} on a valid request: {r.read().decode(errors="replace")[:300]}')
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode(errors='replace').rstrip('\r\n')
                if not line.startswith('data:'):
                    continue
                data = line[5:].lstrip(' ')
                if data == '[DONE]':
                    done = True
                    break
                j = parse_json_text(data, 'an SSE chunk')
                if j.get('error'):
                    raise Failure(f'error event in the stream: {json.dumps(j["error"])[:300]}')
                chunks.append(j)
                ch = (j.get('choices') or [{}])[0]
                d = ch.get('delta') or {}
                n = 1 if (d.get('content') or d.get('tool_calls') or ch.get('text')) else 0
                if n:
                    if ttft is None:
                        ttft = (time.perf_counter() - t0) * 1000
                    self.rec.tokens(n)
                if on_chunk and on_chunk(j) is False:
                    break
        finally:
            conn.close()
        return chunks, ttft, done

    @staticmethod
    def _usage_tokens(chunks):
        for j in reversed(chunks):
            if j.get('usage'):
                return j['usage'].get('completion_tokens')
        return None

    @staticmethod
    def _finish(chunks):
        for j in chunks:
            ch = (j.get('choices') or [{}])[0]
            if ch.get('finish_reason'):
                return ch['finish_reason']
        return None

    def _chat_body(self, rng, content, **extra):
        return {'model': 'soak', 'messages': [{'role': 'system', 'content': 'You are terse.'},
                                              {'role': 'user', 'content': content}], **extra}

    def _words(self, rng, n):
        return ' '.join(rng.choice(WORDS) for _ in range(n))

    # Each kind returns {'ttft': ms or None, 'tokens': generated tokens} or raises Failure.
    def chat_stream(self, rng):
        n = rng.randint(4, self.args.max_tokens)
        body = self._chat_body(rng, f'Write about {self._words(rng, rng.randint(2, 12))}.', max_tokens=n,
                               temperature=rng.choice([0, 0.7]), seed=rng.randint(0, 1 << 30), ignore_eos=True,
                               stream=True, stream_options={'include_usage': True})
        chunks, ttft, done = self._stream('/v1/chat/completions', body)
        if not done:
            raise Failure('the stream ended without [DONE]')
        if chunks and (chunks[0].get('choices') or [{}])[0].get('delta', {}).get('role') != 'assistant':
            raise Failure('the first chunk does not carry role "assistant"')
        got, finish = self._usage_tokens(chunks), self._finish(chunks)
        if got != n or finish != 'length':
            raise Failure(f'ignore_eos with max_tokens {n}: usage {got}, finish_reason {finish!r}')
        self.rec.tokens_left(n, chunks)
        return {'ttft': ttft, 'tokens': n}

    def completion(self, rng):
        n = rng.randint(4, self.args.max_tokens)
        j = self._post_json('/v1/completions', {'model': 'soak', 'prompt': f'Once upon a time {self._words(rng, rng.randint(1, 20))}',
                                                'max_tokens': n, 'temperature': rng.choice([0, 0.9]),
                                                'seed': rng.randint(0, 1 << 30), 'ignore_eos': True})
        ch = (j.get('choices') or [{}])[0]
        got = (j.get('usage') or {}).get('completion_tokens')
        if j.get('object') != 'text_completion' or not isinstance(ch.get('text'), str):
            raise Failure(f'not a text_completion: {json.dumps(j)[:300]}')
        if got != n or ch.get('finish_reason') != 'length':
            raise Failure(f'ignore_eos with max_tokens {n}: usage {got}, finish_reason {ch.get("finish_reason")!r}')
        self.rec.tokens(n)
        return {'ttft': None, 'tokens': n}

    def json_schema(self, rng):
        stream = rng.random() < 0.5
        body = self._chat_body(rng, f'The weather in {rng.choice(CITIES)} as JSON.', max_tokens=400,
                               temperature=rng.choice([0, 0.8]), seed=rng.randint(0, 1 << 30),
                               response_format={'type': 'json_schema',
                                                'json_schema': {'name': 'weather', 'schema': WEATHER_SCHEMA, 'strict': True}})
        if stream:
            body.update(stream=True, stream_options={'include_usage': True})
            chunks, ttft, done = self._stream('/v1/chat/completions', body)
            if not done:
                raise Failure('the stream ended without [DONE]')
            text = ''.join(((j.get('choices') or [{}])[0].get('delta') or {}).get('content') or '' for j in chunks)
            finish, tokens = self._finish(chunks), self._usage_tokens(chunks) or 0
            self.rec.tokens_left(tokens, chunks)
        else:
            j = self._post_json('/v1/chat/completions', body)
            ch = (j.get('choices') or [{}])[0]
            text, finish, ttft = (ch.get('message') or {}).get('content') or '', ch.get('finish_reason'), None
            tokens = (j.get('usage') or {}).get('completion_tokens') or 0
            self.rec.tokens(tokens)
        if finish != 'stop':
            raise Failure(f'structured output ended with finish_reason {finish!r}: {text[:200]!r}')
        validate(parse_json_text(text, 'the structured output'), WEATHER_SCHEMA)
        return {'ttft': ttft, 'tokens': tokens}

    def tools(self, rng):
        stream, parallel = rng.random() < 0.5, rng.random() < 0.5
        body = {'model': 'soak', 'messages': [{'role': 'user', 'content': f'Weather in {rng.choice(CITIES)}? Or the time.'}],
                'tools': TOOLS, 'tool_choice': 'required', 'max_tokens': 400, 'parallel_tool_calls': parallel,
                'temperature': rng.choice([0, 0.8]), 'seed': rng.randint(0, 1 << 30)}
        calls = {}
        if stream:
            body.update(stream=True, stream_options={'include_usage': True})
            chunks, ttft, done = self._stream('/v1/chat/completions', body)
            if not done:
                raise Failure('the stream ended without [DONE]')
            for j in chunks:
                for tc in ((j.get('choices') or [{}])[0].get('delta') or {}).get('tool_calls') or []:
                    c = calls.setdefault(tc.get('index', 0), {'name': '', 'arguments': ''})
                    c['name'] += (tc.get('function') or {}).get('name') or ''
                    c['arguments'] += (tc.get('function') or {}).get('arguments') or ''
            finish, tokens = self._finish(chunks), self._usage_tokens(chunks) or 0
            content = ''.join(((j.get('choices') or [{}])[0].get('delta') or {}).get('content') or '' for j in chunks)
            self.rec.tokens_left(tokens, chunks)
        else:
            j = self._post_json('/v1/chat/completions', body)
            ch = (j.get('choices') or [{}])[0]
            content = (ch.get('message') or {}).get('content') or ''
            for i, tc in enumerate((ch.get('message') or {}).get('tool_calls') or []):
                if tc.get('type') != 'function' or not tc.get('id'):
                    raise Failure(f'a tool call without type "function" or an id: {json.dumps(tc)[:200]}')
                calls[i] = {'name': tc['function'].get('name', ''), 'arguments': tc['function'].get('arguments', '')}
            finish, ttft = ch.get('finish_reason'), None
            tokens = (j.get('usage') or {}).get('completion_tokens') or 0
            self.rec.tokens(tokens)
        # One call without parallel_tool_calls; with it, calls until the model stops or max_tokens cuts the
        # next one off (that part stays content, the whole calls before it must still be right).
        ok_finish = finish == 'tool_calls' or (parallel and finish == 'length' and tokens == body['max_tokens'])
        if not ok_finish or not calls or (not parallel and len(calls) != 1):
            raise Failure(f'tool_choice "required", parallel_tool_calls {str(parallel).lower()}{", streamed" if stream else ""}: '
                          f'finish_reason {finish!r}, {len(calls)} tool calls, {tokens} tokens, content {content[:300]!r}')
        schemas = {t['function']['name']: t['function']['parameters'] for t in TOOLS}
        for c in calls.values():
            if c['name'] not in schemas:
                raise Failure(f'a call of an unknown function {c["name"]!r}')
            validate(parse_json_text(c['arguments'], f'the arguments of {c["name"]}'), schemas[c['name']], c['name'])
        return {'ttft': ttft, 'tokens': tokens}

    def cancel(self, rng):
        want = rng.randint(1, 3)
        seen = [0]

        def on_chunk(j):
            if ((j.get('choices') or [{}])[0].get('delta') or {}).get('content'):
                seen[0] += 1
            return seen[0] < want

        body = self._chat_body(rng, f'Go on forever about {self._words(rng, 3)}.', max_tokens=self.args.cancel_max_tokens,
                               temperature=0.7, seed=rng.randint(0, 1 << 30), ignore_eos=True, stream=True)
        _, ttft, done = self._stream('/v1/chat/completions', body, on_chunk)  # the connection is closed mid-stream
        if seen[0] < want:
            raise Failure(f'the stream ended after {seen[0]} tokens of {self.args.cancel_max_tokens} ({"[DONE]" if done else "no [DONE]"})')
        return {'ttft': ttft, 'tokens': seen[0]}

    def _greedy(self, q):
        j = self._post_json('/v1/chat/completions', {
            'model': 'soak', 'messages': [{'role': 'system', 'content': self.prefix}, {'role': 'user', 'content': QUESTIONS[q]}],
            'max_tokens': 16, 'temperature': 0, 'ignore_eos': True})
        usage = j.get('usage') or {}
        if usage.get('completion_tokens') != 16:
            raise Failure(f'ignore_eos with max_tokens 16: usage {usage.get("completion_tokens")}')
        self.rec.tokens(16)
        with self.greedy_lock:
            self.cached_tokens[0] += (usage.get('prompt_tokens_details') or {}).get('cached_tokens') or 0
            self.cached_tokens[1] += usage.get('prompt_tokens') or 0
        return ((j.get('choices') or [{}])[0].get('message') or {}).get('content')

    def prefix_request(self, rng):
        q = rng.randrange(len(QUESTIONS))
        with self.greedy_lock:
            first = self.greedy_first.get(q)
        texts = [self._greedy(q)]
        if first is None:  # the first time: the same request twice in a row
            texts.append(self._greedy(q))
            with self.greedy_lock:
                first = self.greedy_first.setdefault(q, texts[0])
        for text in texts:
            with self.greedy_lock:
                self.greedy_compared += 1
                if text == first:
                    continue
                i = next((k for k, (a, b) in enumerate(zip(text, first)) if a != b), min(len(text), len(first)))
                note = f'question {q}: greedy answer differs at char {i}: {first[i:i + 30]!r} then {text[i:i + 30]!r}'
                self.greedy_divergent.append(note)
            if self.args.determinism == 'strict':
                raise Failure(f'nondeterministic {note}')
        return {'ttft': None, 'tokens': 16 * len(texts)}

    def malformed_cases(self):
        chat = {'model': 'soak', 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 4}
        cases = [
            ('bad JSON', '/v1/chat/completions', b'{"messages": [{"role": "user", "content": "hi"'),
            ('empty body', '/v1/chat/completions', b''),
            ('a JSON array', '/v1/chat/completions', b'[1, 2, 3]'),
            ('max_tokens -5', '/v1/chat/completions', {**chat, 'max_tokens': -5}),
            ('max_tokens "ten"', '/v1/chat/completions', {**chat, 'max_tokens': 'ten'}),
            ('temperature "hot"', '/v1/chat/completions', {**chat, 'temperature': 'hot'}),
            ('model 123', '/v1/chat/completions', {**chat, 'model': 123}),
            ('messages "hi"', '/v1/chat/completions', {**chat, 'messages': 'hi'}),
            ('content 7', '/v1/chat/completions', {**chat, 'messages': [{'role': 'user', 'content': 7}]}),
            ('role 5', '/v1/chat/completions', {**chat, 'messages': [{'role': 5, 'content': 'hi'}]}),
            ('n 0', '/v1/chat/completions', {**chat, 'n': 0}),
            ('stop 42', '/v1/chat/completions', {**chat, 'stop': 42}),
            ('tools "x"', '/v1/chat/completions', {**chat, 'tools': 'x'}),
            ('schema 42', '/v1/chat/completions',
             {**chat, 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', 'schema': 42}}}),
            ('invalid UTF-8', '/v1/chat/completions', b'{"messages": [{"role": "user", "content": "a\xff\xfeb"}]}'),
            ('no prompt', '/v1/completions', {'model': 'soak', 'max_tokens': 4}),
            ('completions max_tokens -7', '/v1/completions', {'model': 'soak', 'prompt': 'hi', 'max_tokens': -7}),
            ('prompt {}', '/v1/completions', {'model': 'soak', 'prompt': {}}),
            ('unknown route', '/v1/nonexistent', {'model': 'soak'}),
            ('messages nested 10000 deep', '/v1/chat/completions', b'{"messages": ' + b'[' * 10000 + b']' * 10000 + b'}'),
            ('max_tokens 3.5', '/v1/chat/completions', {**chat, 'max_tokens': 3.5}),
            ('seed 2^70', '/v1/chat/completions', {**chat, 'seed': 2 ** 70}),
            ('1000 stop strings', '/v1/chat/completions', {**chat, 'stop': ['x' * 50] * 1000}),
            ('logit_bias id out of range', '/v1/chat/completions', {**chat, 'logit_bias': {'99999999999': 5}}),
            ('prompt id out of range', '/v1/completions', {'model': 'soak', 'prompt': [2 ** 31 - 1], 'max_tokens': 4}),
            ('schema keyword pattern', '/v1/chat/completions',
             {**chat, 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', 'schema': {'type': 'string', 'pattern': 'a+'}}}}),
            ('tool $ref that does not resolve', '/v1/chat/completions',
             {**chat, 'tool_choice': 'required', 'tools': [{'type': 'function', 'function': {
                 'name': 'f', 'parameters': {'type': 'object', 'properties': {'a': {'$ref': '#/nope'}}}}}]}),
            ('tool_choice names no tool', '/v1/chat/completions',
             {**chat, 'tools': TOOLS, 'tool_choice': {'type': 'function', 'function': {'name': 'nope'}}}),
        ]
        if self.n_ctx:
            cases.append(('prompt beyond the context', '/v1/completions',
                          {'model': 'soak', 'prompt': ' word' * (self.n_ctx + 64), 'max_tokens': 4}))
        return cases

    def malformed(self, rng):
        name, path, body = rng.choice(self.malformed_cases())
        conn, r = self._post(path, body)
        try:
            raw = r.read()
        finally:
            conn.close()
        if not 400 <= r.status < 500:
            raise Failure(f'{name}: HTTP {r.status}, not a 4xx: {raw.decode(errors="replace")[:200]}')
        err = parse_json_text(raw.decode(errors='replace'), f'{name}: the error body').get('error')
        if not isinstance(err, dict) or not isinstance(err.get('message'), str) or not isinstance(err.get('type'), str):
            raise Failure(f'{name}: HTTP {r.status} without the error envelope: {raw[:200]!r}')
        return {'ttft': None, 'tokens': 0}

    def poll(self, rng):
        paths = ['/health', '/v1/models'] + (['/metrics'] if self.metrics_enabled else [])
        path = rng.choice(paths)
        status, raw = self.c.get(path)
        if status != 200:
            raise Failure(f'GET {path}: HTTP {status}: {raw[:200]!r}')
        if path == '/health' and parse_json_text(raw.decode(errors='replace'), '/health').get('status') != 'ok':
            raise Failure(f'GET /health: {raw[:200]!r}')
        if path == '/v1/models' and not (parse_json_text(raw.decode(errors='replace'), '/v1/models').get('data') or [{}])[0].get('id'):
            raise Failure(f'GET /v1/models without a model id: {raw[:200]!r}')
        if path == '/metrics' and b'# TYPE' not in raw:
            raise Failure('GET /metrics: no Prometheus metrics in the body')
        return {'ttft': None, 'tokens': 0}

    def metric(self, name):
        """A sample of /metrics (NaN when absent or the scrape fails)."""
        try:
            status, raw = self.c.get('/metrics')
        except OSError:
            return math.nan
        for line in raw.decode(errors='replace').splitlines():
            if status == 200 and line.startswith(name + ' '):
                return float(line.split()[1])
        return math.nan


# ---------------------------------------------------------------- recording and windows

class Recorder:
    """Every finished request and every generated token, with times (seconds since the start)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.requests = []  # dicts: kind, start, end, ok, error, ttft, tokens
        self.token_times = []  # (t, n)

    def now(self):
        return time.monotonic() - self.t0

    def tokens(self, n):
        if n > 0:
            with self.lock:
                self.token_times.append((self.now(), n))

    def tokens_left(self, total, chunks):
        """A stream's tokens beyond its chunks with text (a chunk can carry several), counted at its end."""
        shown = sum(1 for j in chunks if ((j.get('choices') or [{}])[0].get('delta') or {}).get('content')
                    or ((j.get('choices') or [{}])[0].get('delta') or {}).get('tool_calls'))
        self.tokens(total - shown)

    def add(self, **r):
        with self.lock:
            self.requests.append(r)


def window_stats(rec, lo, hi, label):
    with rec.lock:
        reqs = [r for r in rec.requests if lo <= r['end'] < hi]
        toks = sum(n for t, n in rec.token_times if lo <= t < hi)
    ttft = [r['ttft'] for r in reqs if r['ttft'] is not None and r['ok']]
    return {'window': label, 'start_s': lo, 'end_s': hi, 'requests': len(reqs),
            'failed': sum(1 for r in reqs if not r['ok']), 'generated_tok_s': toks / max(hi - lo, 1e-9),
            'ttft_p50_ms': pct(ttft, 50), 'ttft_p99_ms': pct(ttft, 99)}


def rss_mib(pid):
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def gpu_used_mib():
    """nvidia-smi's memory.used summed over the GPUs; NaN without nvidia-smi."""
    if not shutil.which('nvidia-smi'):
        return math.nan
    try:
        out = subprocess.run(['nvidia-smi', '--query-gpu=memory.used', '--format=csv,noheader,nounits'],
                             capture_output=True, text=True, timeout=20).stdout
        return float(sum(float(x) for x in out.split()))
    except (OSError, ValueError, subprocess.SubprocessError):
        return math.nan


# ---------------------------------------------------------------- the run

def run(args, api, rec, server, pid):
    kinds = [k for k in KINDS if args.weights.get(k, 0) > 0]
    weights = [args.weights[k] for k in kinds]
    handlers = {'chat_stream': api.chat_stream, 'completion': api.completion, 'json_schema': api.json_schema,
                'tools': api.tools, 'cancel': api.cancel, 'prefix': api.prefix_request, 'malformed': api.malformed,
                'poll': api.poll}
    deadline = args.duration
    stop = threading.Event()

    def client(i):
        rng = random.Random(args.seed * 1000003 + i)
        while not stop.is_set() and rec.now() < deadline:
            kind = rng.choices(kinds, weights)[0]
            start = rec.now()
            ok, error, out = True, None, {'ttft': None, 'tokens': 0}
            try:
                out = handlers[kind](rng)
            except Failure as e:
                ok, error = False, str(e)
            except (OSError, http.client.HTTPException, ValueError) as e:  # timeouts, resets, bad HTTP
                ok, error = False, f'{type(e).__name__}: {e}'
            rec.add(kind=kind, start=start, end=rec.now(), ok=ok, error=error, ttft=out['ttft'], tokens=out['tokens'])

    # Windows are [k*W, (k+1)*W) for every full one inside the duration; samples are taken at each end.
    n_windows = int(args.duration // args.window)
    samples = []  # per window: RSS MiB, GPU MiB
    rss_trace = []  # (s, RSS MiB) every RSS_EVERY seconds, for the slope
    next_rss = 0.0
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    print(f'# soak: {args.duration:g} s, concurrency {args.concurrency}, windows of {args.window:g} s, '
          f'kinds {", ".join(f"{k}={args.weights[k]:g}" for k in kinds)}, seed {args.seed}', file=sys.stderr, flush=True)
    crashed = None
    for k in range(n_windows):
        end = (k + 1) * args.window
        while rec.now() < end:
            time.sleep(min(0.25, max(0.0, end - rec.now())))
            if pid and rec.now() >= next_rss:
                rss_trace.append((rec.now(), rss_mib(pid)))
                next_rss = rec.now() + RSS_EVERY
            if server and server.proc.poll() is not None:
                crashed = server.proc.returncode
                break
        if crashed is not None:
            break
        samples.append({'rss_mib': rss_mib(pid) if pid else math.nan, 'gpu_mib': gpu_used_mib()})
        w = window_stats(rec, end - args.window, end, str(k + 1))
        print(f"# window {k + 1}/{n_windows} ({end - args.window:g}-{end:g} s): {w['requests']} requests, "
              f"{w['failed']} failed, {w['generated_tok_s']:.1f} tok/s, TTFT p50 {w['ttft_p50_ms']:.0f} ms, "
              f"RSS {samples[-1]['rss_mib']:.0f} MiB, GPU {samples[-1]['gpu_mib']:.0f} MiB", file=sys.stderr, flush=True)
    if crashed is not None:
        stop.set()
        rec.add(kind='server', start=rec.now(), end=rec.now(), ok=False,
                error=f'the server exited with {crashed} during the run', ttft=None, tokens=0)
    for t in threads:
        t.join(args.request_timeout + 30)
    return samples, rss_trace, crashed


def final_checks(args, api, rec, server):
    """After the clients stop: the server goes idle (no slot left busy by a cancelled stream) and still answers."""
    problems = []
    if api.metrics_enabled and not math.isnan(api.metric('llamacpp:requests_processing')):  # roofline's, llama-server's
        deadline = time.monotonic() + args.drain_timeout
        busy = math.nan
        while time.monotonic() < deadline:
            busy = api.metric('llamacpp:requests_processing') + api.metric('llamacpp:requests_deferred')
            if busy == 0:
                break
            time.sleep(0.1)
        if busy != 0:
            problems.append(f'the server was not idle {args.drain_timeout:g} s after the clients stopped '
                            f'(requests processing + deferred: {busy})')
    try:
        api.chat_stream(random.Random(args.seed))
    except (Failure, OSError, http.client.HTTPException, ValueError) as e:
        problems.append(f'a request after the soak failed: {e}')
    for p in problems:
        rec.add(kind='after', start=rec.now(), end=rec.now(), ok=False, error=p, ttft=None, tokens=0)
    return problems


def fmt(x, digits=1):
    return f'{x:.{digits}f}' if isinstance(x, (int, float)) and math.isfinite(x) else '-'


RSS_EVERY = 2.0  # seconds between RSS samples of the slope


def rss_slope(args, trace):
    """MiB/min of a least-squares line through the RSS samples of the second half of the run (and after
    the warm-up windows), and the samples used; NaN with fewer than 5."""
    start = max(args.duration / 2, args.warmup_windows * args.window)
    pts = [(t, m) for t, m in trace if t >= start and math.isfinite(m)]
    if len(pts) < 5:
        return math.nan, pts
    mt = sum(t for t, _ in pts) / len(pts)
    mm = sum(m for _, m in pts) / len(pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return (sum((t - mt) * (m - mm) for t, m in pts) / var * 60 if var > 0 else math.nan), pts


def report(args, api, rec, samples, rss_trace, extra_checks):
    n_full = len(samples)
    windows = [window_stats(rec, k * args.window, (k + 1) * args.window, str(k + 1)) for k in range(n_full)]
    for w, s in zip(windows, samples):
        w.update(s)
    drain = window_stats(rec, n_full * args.window, max(rec.now(), n_full * args.window + 1e-3), 'drain')

    kinds = {}
    for kind in KINDS + ['server', 'after']:
        rs = [r for r in rec.requests if r['kind'] == kind]
        if not rs:
            continue
        lat = [(r['end'] - r['start']) * 1000 for r in rs if r['ok']]
        ttft = [r['ttft'] for r in rs if r['ok'] and r['ttft'] is not None]
        kinds[kind] = {'requests': len(rs), 'failed': sum(1 for r in rs if not r['ok']),
                       'latency_p50_ms': pct(lat, 50), 'latency_p99_ms': pct(lat, 99),
                       'ttft_p50_ms': pct(ttft, 50), 'ttft_p99_ms': pct(ttft, 99),
                       'generated_tokens': sum(r['tokens'] for r in rs)}
    errors = {}
    for r in rec.requests:
        if not r['ok']:
            key = f"{r['kind']}: {r['error']}"
            errors[key] = errors.get(key, 0) + 1

    checks = []  # (name, passed, detail)
    slope, slope_pts = rss_slope(args, rss_trace)
    n_failed = sum(1 for r in rec.requests if not r['ok'])
    checks.append(('no failed request', n_failed == 0, f'{n_failed} of {len(rec.requests)} failed'))
    first, last = windows[min(args.warmup_windows, n_full - 1)] if windows else None, windows[-1] if windows else None
    if not windows or len(windows) < args.warmup_windows + 2:
        checks.append(('trend windows', False, f'{n_full} full windows; {args.warmup_windows + 2} needed'))
    else:
        ratio = last['generated_tok_s'] / first['generated_tok_s'] if first['generated_tok_s'] > 0 else 0.0
        checks.append(('tok/s kept', ratio >= args.min_rate_ratio,
                       f"window {first['window']} {fmt(first['generated_tok_s'])} -> window {last['window']} "
                       f"{fmt(last['generated_tok_s'])} tok/s, ratio {ratio:.2f} (min {args.min_rate_ratio:g})"))
        for key, what, limit in (('rss_mib', 'server RSS', args.max_rss_growth_mib),
                                 ('gpu_mib', 'GPU memory used', args.max_gpu_growth_mib)):
            a, b = first[key], last[key]
            if math.isfinite(a) and math.isfinite(b):
                checks.append((f'{what} growth', b - a <= limit,
                               f"window {first['window']} {fmt(a, 0)} MiB -> window {last['window']} {fmt(b, 0)} MiB, "
                               f"{b - a:+.0f} MiB (max {limit:g})"))
    if math.isfinite(slope):
        detail = (f'{slope:+.2f} MiB/min from {slope_pts[0][0]:.0f} s to {slope_pts[-1][0]:.0f} s '
                  f'({slope_pts[0][1]:.1f} -> {slope_pts[-1][1]:.1f} MiB, {len(slope_pts)} samples)')
        if args.max_rss_slope_mib_min > 0:
            checks.append(('server RSS slope, second half', slope <= args.max_rss_slope_mib_min,
                           f'{detail} (max {args.max_rss_slope_mib_min:g})'))
        else:
            checks.append(('server RSS slope, second half', True, f'{detail} (reported only)'))
    for name, ok, detail in extra_checks:
        checks.append((name, ok, detail))
    if api.greedy_compared:
        checks.append(('greedy answers repeat', not api.greedy_divergent or args.determinism == 'report',
                       f'{len(api.greedy_divergent)} of {api.greedy_compared} prefix answers differed from the first '
                       f'({args.determinism})'))
    passed = all(ok for _, ok, _ in checks)

    out = []
    out.append(f'## Soak: {args.duration:g} s at concurrency {args.concurrency}, seed {args.seed}')
    out.append('')
    out.append('| kind | requests | failed | latency p50 / p99 ms | TTFT p50 / p99 ms | generated tokens |')
    out.append('|---|---|---|---|---|---|')
    for k, s in kinds.items():
        out.append(f"| {k} | {s['requests']} | {s['failed']} | {fmt(s['latency_p50_ms'])} / {fmt(s['latency_p99_ms'])} "
                   f"| {fmt(s['ttft_p50_ms'])} / {fmt(s['ttft_p99_ms'])} | {s['generated_tokens']} |")
    out.append('')
    out.append('| window | s | requests | failed | generated tok/s | TTFT p50 / p99 ms | server RSS MiB | GPU MiB used |')
    out.append('|---|---|---|---|---|---|---|---|')
    for w in windows + [drain]:
        warm = ' (warm-up)' if w['window'].isdigit() and int(w['window']) <= args.warmup_windows else ''
        out.append(f"| {w['window']}{warm} | {fmt(w['start_s'], 0)}-{fmt(w['end_s'], 0)} | {w['requests']} | {w['failed']} "
                   f"| {fmt(w['generated_tok_s'])} | {fmt(w['ttft_p50_ms'])} / {fmt(w['ttft_p99_ms'])} "
                   f"| {fmt(w.get('rss_mib', math.nan), 0)} | {fmt(w.get('gpu_mib', math.nan), 0)} |")
    out.append('')
    if api.cached_tokens[1]:
        out.append(f'Prompt cache: {api.cached_tokens[0]} of {api.cached_tokens[1]} prompt tokens of the prefix requests '
                   f'({100 * api.cached_tokens[0] / api.cached_tokens[1]:.0f}%) came from the cache.')
        out.append('')
    for name, ok, detail in checks:
        out.append(f"- {'PASS' if ok else 'FAIL'} {name}: {detail}")
    if errors:
        out.append('')
        out.append(f'Failures ({len(errors)} distinct messages, the 10 most frequent):')
        for e, n in sorted(errors.items(), key=lambda kv: -kv[1])[:10]:
            out.append(f'- {n} x {e}')
    if api.greedy_divergent and args.determinism == 'report':
        out.append('')
        out.append('Greedy answers that differed (first 5): ' + '; '.join(api.greedy_divergent[:5]))
    out.append('')
    out.append(f"Result: {'PASS' if passed else 'FAIL'}")
    print('\n'.join(out), flush=True)

    if args.json:
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v
        with open(args.json, 'w') as f:
            json.dump(clean({'duration_s': args.duration, 'concurrency': args.concurrency, 'window_s': args.window,
                             'seed': args.seed, 'mix': args.weights, 'server_args': args.server_args, 'model': args.model,
                             'kinds': kinds, 'windows': windows, 'drain': drain,
                             'checks': [{'name': n, 'passed': ok, 'detail': d} for n, ok, d in checks],
                             'failures': errors, 'greedy_divergent': api.greedy_divergent,
                             'prompt_cache_tokens': {'cached': api.cached_tokens[0], 'total': api.cached_tokens[1]},
                             'rss_trace': [[round(t, 1), m] for t, m in rss_trace], 'rss_slope_mib_min': slope,
                             'passed': passed}), f, indent=2)
    return passed


def main():
    args = parse_args()
    server = None
    base = args.url.rstrip('/')
    pid = args.server_pid
    if not base:
        extra = shlex.split(args.server_args) if args.server_args else ['-np', str(args.concurrency)]
        if '--metrics' not in extra:
            extra.append('--metrics')
        server = Server(args.bin, args.model, extra, args.host_timeout)
        base, pid = server.base, server.proc.pid
    rec = Recorder()
    client = Client(base, args.api_key, args.request_timeout)
    api = Api(client, args, rec)
    extra_checks = []
    try:
        status, raw = client.get('/metrics')
        api.metrics_enabled = status == 200
        try:
            status, raw = client.get('/props')
            if status == 200:
                props = json.loads(raw)
                api.n_ctx = int((props.get('default_generation_settings') or {}).get('n_ctx') or 0)
                if api.n_ctx:  # a prefix request within half the context (a byte-level vocabulary: a token a byte)
                    api.prefix = api.prefix[:max(100, api.n_ctx // 2)]
        except (ValueError, AttributeError):
            pass
        api.chat_stream(random.Random(args.seed))  # warm-up, outside the windows
        rec.t0 = time.monotonic()
        rec.requests.clear()
        rec.token_times.clear()
        samples, rss_trace, crashed = run(args, api, rec, server, pid)
        if crashed is None:
            final_checks(args, api, rec, server)
    finally:
        if server:
            code = server.stop()
            extra_checks.append(('server exit on SIGTERM', code == 0, f'exit status {code}'))
    passed = report(args, api, rec, samples, rss_trace, extra_checks)
    if server and not passed:
        print('--- the last lines of the server log ---\n' + ''.join(server.log[-60:]), file=sys.stderr)
    return 0 if passed else 1


if __name__ == '__main__':
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, Failure) as e:
        print(e, file=sys.stderr)
        sys.exit(1)
