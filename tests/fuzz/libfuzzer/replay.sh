#!/usr/bin/env bash
# ctest fuzz_replay: every libFuzzer target's seeds (seeds.py) and regressions/TARGET/ inputs replayed by
# the plain build's fuzz_replay binary. Usage: replay.sh FUZZ_REPLAY_BINARY WORK_DIR
# fuzz_tokenize reads the real tokenizers seeds.py unpacks from ../shared; without ../shared it is left out.
set -euo pipefail
bin="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$work"
python3 "$here/seeds.py" "$work"
export ROOFLINE_FUZZ_TOKENIZERS="$work/tokenizers"
export ROOFLINE_FUZZ_FIXTURES="$here/../../fixtures"
for src in "$here"/fuzz_*.cpp; do
  t="$(basename "$src" .cpp)"
  if [ "$t" = fuzz_tokenize ] && [ ! -f "$ROOFLINE_FUZZ_TOKENIZERS/tok512.bin" ]; then
    echo "$t: left out (../shared and its tokenizers are absent)"
    continue
  fi
  paths=("$work/seeds-$t")
  [ -d "$here/regressions/$t" ] && paths+=("$here/regressions/$t")
  "$bin" "$t" "${paths[@]}" 2> "$work/$t.log" || { echo "$t FAILED:"; tail -5 "$work/$t.log"; exit 1; }
done
