#!/usr/bin/env bash
# ctest entry (serve_webui): the chat page's Markdown renderer under node:test, then the page itself in
# headless Chromium (Debian's chromium package) against `roofline serve` on the tiny Qwen3 fixture.
# Usage: run.sh ROOFLINE_BINARY SCREENSHOT.png
# Without Chromium or Node >= 20 it fails in CI (CI set) and everywhere unless ROOFLINE_WEBUI_ALLOW_SKIP=1,
# which makes it a skip (exit 77) on a developer machine without them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?usage: run.sh ROOFLINE_BINARY SCREENSHOT.png}")"
screenshot="${2:?usage: run.sh ROOFLINE_BINARY SCREENSHOT.png}"
skip_or_fail() {
  if [ -z "${CI:-}" ] && [ "${ROOFLINE_WEBUI_ALLOW_SKIP:-0}" = 1 ]; then
    echo "serve_webui: SKIP: $1 (ROOFLINE_WEBUI_ALLOW_SKIP=1)"
    exit 77
  fi
  echo "serve_webui: FAILED: $1 (scripts/setup installs it)"
  exit 1
}
node_dir="$(bash "$here/../e2e/node.sh")" || skip_or_fail "no Node >= 20"
export PATH="$node_dir:$PATH"
chromium="${CHROMIUM:-$(command -v chromium || true)}"
[ -n "$chromium" ] && [ -x "$chromium" ] || skip_or_fail "no chromium"
export CHROMIUM="$chromium"
echo "serve_webui: node $(node --version), $("$chromium" --version 2>/dev/null | head -1)"
node --test "$here/markdown.test.mjs"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin" convert "$here/../fixtures/hf/qwen3_f32" -o "$work/qwen3.gguf" --no-progress > "$work/convert.log" 2>&1 || { cat "$work/convert.log"; exit 1; }
# Node 22 has a global WebSocket; Node 20 has it behind --experimental-websocket.
ws_flag=""
node -e 'process.exit(typeof WebSocket === "undefined" ? 1 : 0)' || ws_flag="--experimental-websocket"
node $ws_flag --no-warnings "$here/webui.test.mjs" "$bin" "$work/qwen3.gguf" "$screenshot"
