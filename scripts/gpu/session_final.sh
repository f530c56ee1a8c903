#!/usr/bin/env bash
# One device call at the end of a session: every GPU test, then tg128 of the decode shapes with this
# build and (if carry/prev/roofline_* exists) the previous one, alternated, and the new architectures'
# synthetic shapes when this build knows them. Carry ["carry/pack"]; results in $OUT. Each part has
# its own time limit so the whole stays under ~330 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
stamp "GPU tests"
ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout "${TEST_TIMEOUT:-150}" "$bin/roofline_tests" \
    --gtest_filter='Gpu*:*.Gpu*' > "$out/gpu_tests.txt" 2>&1
stamp "GPU tests exit $?"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests.txt" | head -30 | tee -a "$out/summary.txt"
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
    line=$(timeout 60 "$bin/roofline" $e 2>&1 | grep -E "tg|pp|error|KV|experts" | head -6 | tr '\n' ' ')
    stamp "roofline $e: $line"
  done
fi
