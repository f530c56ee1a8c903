#!/usr/bin/env bash
# One device call at the end of a session: every GPU test (TESTS=none: none, for a call that carries roofline alone),
# then tg128 of the decode shapes with this build and (if carry/prev/roofline_* exists) the previous one, alternated, and
# the new architectures' synthetic shapes when this build knows them; EXTRA and LOAD (below) add rows. Carry
# ["carry/pack"]; results in $OUT. Each part has its own time limit so the whole stays under ~330 s (~480 s with LOAD).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
if [ "${TESTS:-}" != none ]; then
  stamp "GPU tests"
  ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout "${TEST_TIMEOUT:-150}" "$bin/roofline_tests" \
      --gtest_filter='Gpu*:*.Gpu*' > "$out/gpu_tests.txt" 2>&1
  stamp "GPU tests exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests.txt" | head -30 | tee -a "$out/summary.txt"
fi
prev=$(ls carry/prev/roofline_* 2>/dev/null | head -1)
for m in ${MODELS:-qwen3-32b qwen3-8b qwen3.5-27b}; do
  for b in "$bin/roofline" $prev; do
    line=$(timeout 60 "$b" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 128 -r "${REPS:-1}" 2>/dev/null | grep "tg128")
    stamp "$m [$(basename "$b")] $line"
  done
done
for m in ${NEW_MODELS:-}; do
  line=$(timeout 90 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 512 -n 128 -r 1 2>&1 | grep -E "tg128|pp512|error" | tr '\n' ' ')
  stamp "$m $line"
done
# EXTRA="cmd;cmd": further roofline commands (the binary's arguments only), each under 60 s.
if [ -n "${EXTRA:-}" ]; then
  IFS=';' read -ra extra <<< "$EXTRA"
  for e in "${extra[@]}"; do
    line=$(timeout 60 "$bin/roofline" $e 2>&1 | grep -E "^[|] .*(tg|pp)[0-9]|error" | head -8 | tr '\n' ' ')
    stamp "roofline $e: $line"
  done
fi
# LOAD="1,16,64": tests/load/load.py on `roofline serve` of synthetic:LOAD_MODEL (default qwen3-32b) at those stream
# counts, 128-token prompts, 128 generated, 2 requests a stream (issue #24's server rows), under 150 s; its table in
# $out/serve.md and the summary.
if [ -n "${LOAD:-}" ]; then
  stamp "load.py at ${LOAD} streams"
  timeout 150 python3 tests/load/load.py --bin "$bin/roofline" --model "synthetic:${LOAD_MODEL:-qwen3-32b}:Q4_K_M" \
      --server-args "-np 64 -c 32768 -ngl all -b 2048" --concurrency "$LOAD" --prompt-tokens 128 --max-tokens 128 \
      --per-stream 2 --json "$out/serve_load.json" > "$out/serve.md" 2>&1
  grep -E "^[|]|failed|error" "$out/serve.md" | tail -6 | tee -a "$out/summary.txt"
fi
