#!/usr/bin/env bash
# The cost of constrained decoding under load on the GPU machine (issue #20's 10% bar): synthetic
# qwen3-8b Q4_K_M served with -np 16, 16 streams of 128-token prompts and 128 generated tokens
# (tests/load/load.py), plain and with {"response_format": {"type": "json_object"}}, alternated ROUNDS
# times. Optionally runs every GPU test first (GPU_TESTS=1). Carry ["carry/pack"]; results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=structured_cost.md
source scripts/gpu/device_env.sh
if [ "${GPU_TESTS:-0}" = 1 ]; then
  stamp "GPU tests"
  ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 240 "$bin/roofline_tests" --gtest_filter='Gpu*:*.Gpu*' \
      > "$out/gpu_tests.txt" 2>&1
  stamp "GPU tests exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED" "$out/gpu_tests.txt" | head -20 | tee -a "$out/structured_cost.md"
fi
m8=/tmp/qwen3-8b-Q4_K_M.gguf
[ -f "$m8" ] || "$bin/roofline" synth qwen3-8b:Q4_K_M -o "$m8" > /dev/null 2>&1
for round in $(seq 1 "${ROUNDS:-2}"); do
  for extra in "" '{"response_format":{"type":"json_object"}}'; do
    stamp "round $round, 16 streams ${extra:-plain}"
    timeout 150 python3 tests/load/load.py --bin "$bin/roofline" --model "$m8" --server-args "-np 16 -c 8192 -ngl all" \
        --concurrency 16 ${extra:+--body-extra "$extra"} 2>&1 | grep -E "^\||failed|error" | tee -a "$out/structured_cost.md"
  done
done
