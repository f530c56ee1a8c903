#!/usr/bin/env bash
# One device call: every GPU test, `bench -npl` of one model, then tests/load/load.py on `roofline serve`
# with greedy requests and with sampled ones (temperature 0.8 and the default top-k / top-p / min-p), so that
# the server's sampled rows are compared with its greedy rows and with `bench` on one machine in one run.
#   device: bash scripts/gpu/server_sampling_check.sh   (carry ["carry/pack/bin.tar.xz"]; results in $OUT)
# MODEL (synthetic:qwen3-32b:Q4_K_M), CONCURRENCY (16,64), BODIES ('|'-separated JSON objects merged into each
# request; an empty one is greedy), BENCH (bench arguments; "none" skips it), TESTS as in device_env.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
gpu_tests
model="${MODEL:-synthetic:qwen3-32b:Q4_K_M}"
if [ "${BENCH:-}" != none ]; then
  # shellcheck disable=SC2086
  line=$(bench_row timeout 200 "$bin/roofline" bench -m "$model" ${BENCH:--p 128 -n 64 -npl 1,16,64 -r 1})
  stamp "bench $model: $line"
fi
sampled='{"temperature":0.8}'
IFS='|' read -r -a bodies <<< "${BODIES-|$sampled}"
for body in "${bodies[@]}"; do
  stamp "load.py on roofline serve, $model, body [${body:-greedy}]"
  extra=()
  [ -n "$body" ] && extra=(--body-extra "$body")
  timeout 300 python3 tests/load/load.py --bin "$bin/roofline" --model "$model" --server-args "-np 64 -c 32768 -ngl all" \
      --concurrency "${CONCURRENCY:-16,64}" --per-stream 2 "${extra[@]}" 2>&1 | grep -E "^\||failed|error|Error" | tee -a "$out/summary.txt"
done
stamp "done"
