#!/usr/bin/env bash
# ctest entry (serve_e2e): converts a tiny Hugging Face fixture to GGUF, installs the pinned openai
# client (npm ci) and runs the end-to-end tests (serve.test.mjs, and tools.test.mjs with the chat
# templates of ../shared/testdata) against `roofline serve` with Node >= 20 (node.sh
# provides one from the npm registry where the machine's node is older, as Debian 12's 18 is).
# Where no Node >= 20 can be had: fails in CI (CI set) and everywhere unless ROOFLINE_E2E_ALLOW_SKIP=1,
# which turns it into a skip (exit 77) for a developer machine without npm access.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?usage: run.sh ROOFLINE_BINARY}")"
if ! node_dir="$(bash "$here/node.sh")"; then
  if [ -z "${CI:-}" ] && [ "${ROOFLINE_E2E_ALLOW_SKIP:-0}" = 1 ]; then
    echo "serve_e2e: SKIP: no Node >= 20 (ROOFLINE_E2E_ALLOW_SKIP=1)"
    exit 77
  fi
  echo "serve_e2e: FAILED: no Node >= 20 could be found or installed (see above; scripts/setup installs npm)"
  exit 1
fi
export PATH="$node_dir:$PATH"
echo "serve_e2e: node $(node --version) ($(command -v node)), npm $(npm --version)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin" convert "$here/../fixtures/hf/qwen3_f32" -o "$work/qwen3.gguf" --no-progress > "$work/convert.log" 2>&1 || { cat "$work/convert.log"; exit 1; }
cd "$here"
if [ ! -f node_modules/openai/package.json ] || ! cmp -s package-lock.json node_modules/.package-lock.json 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
fi
# The real chat templates of three prompt formats (../shared/testdata) for the tools round trips; without
# ../shared (a checkout on its own) those are skipped with a message and serve.test.mjs still runs.
shared="${ROOFLINE_SHARED_DIR:-$here/../../../shared}"
td="$shared/testdata/tokenizer"
tests=(serve.test.mjs)
mkdir -p "$work/templates"
if [ -d "$td" ]; then
  template_of() { node -e 'process.stdout.write(JSON.parse(require("fs").readFileSync(0, "utf8")).chat_template)'; }
  template_of < "$td/qwen3/tokenizer_config.json" > "$work/templates/qwen3.jinja"
  xz -dc "$td/gemma3/tokenizer_config.json.xz" | template_of > "$work/templates/gemma3.jinja"
  cp "$td/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja" "$work/templates/llama31.jinja"
  tests+=(tools.test.mjs)
else
  echo "serve_e2e: tools.test.mjs skipped: $td is absent (../shared is not beside this checkout)"
fi
ROOFLINE_BIN="$bin" ROOFLINE_E2E_MODEL="$work/qwen3.gguf" ROOFLINE_E2E_TEMPLATES="$work/templates" \
  node --test --test-concurrency=1 "${tests[@]}"
