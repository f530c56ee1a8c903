#!/usr/bin/env bash
# ctest entry (serve_e2e): converts a tiny Hugging Face fixture to GGUF, installs the pinned openai
# client (npm ci) and runs the end-to-end tests against `roofline serve`. Exits 77 (skipped) when
# node >= 20 or npm is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?usage: run.sh ROOFLINE_BINARY}")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "serve_e2e: SKIP: node/npm not found (scripts/setup installs them)"
  exit 77
fi
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "serve_e2e: SKIP: node $(node --version) is older than 20"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin" convert "$here/../fixtures/hf/qwen3_f32" -o "$work/qwen3.gguf" --no-progress > "$work/convert.log" 2>&1 || { cat "$work/convert.log"; exit 1; }
cd "$here"
if [ ! -f node_modules/openai/package.json ] || ! cmp -s package-lock.json node_modules/.package-lock.json 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
fi
ROOFLINE_BIN="$bin" ROOFLINE_E2E_MODEL="$work/qwen3.gguf" node --test --test-concurrency=1 serve.test.mjs
