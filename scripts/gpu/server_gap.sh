#!/usr/bin/env bash
# Where one stream of the server loses against `bench` (issue #24: within 3% of tg128), with settings compared side
# by side: the graph tests (TESTS, a gtest filter; "none" skips them), then `bench -p 128 -n 128 -d 0,128` and
# tests/load/load.py at one stream (PER_STREAM requests of 128-token prompts, 128 generated) with the CUDA backend's
# ROOFLINE_STEP_GAPS=1 (the GPU's idle time before each step, and the graphs captured and their host time, printed
# at exit) under each of SETTINGS ('|'-separated environment settings, an empty one the default; by default
# "ROOFLINE_WARMUP_WALK=0|": the serve warm-up without and with its walk through the decode graphs' depths); then
# (LOAD, default "1,16,64"; none skips) the usual load.py rows under each setting, ROUNDS (default 1) times in turn.
# MODEL (default qwen3-32b) is a synthetic Q4_K_M shape. LOAD_GAPS=1 runs those rows with the step gaps too and prints the
# graphs each row count captured while requests were served (the server's log, printed at exit).
#   device: bash scripts/gpu/server_gap.sh   (carry ["carry/pack/bin.tar.xz"]; results in $OUT/summary.txt)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
m="synthetic:${MODEL:-qwen3-32b}:Q4_K_M"
stamp "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $("$bin/roofline" --version 2>&1 | head -1)"
TESTS="${TESTS:-GpuDecodeGraphs*:GpuBatchedGraphs*}" gpu_tests
ROOFLINE_STEP_GAPS=1 timeout 200 "$bin/roofline" bench -m "$m" -p 128 -n 128 -d 0,128 -r "${REPS:-3}" > "$out/bench_gaps.txt" 2>&1
stamp "bench: $(grep -E '\| *(tg|pp)[0-9]' "$out/bench_gaps.txt" | awk -F'|' '{printf "%s%s %s;", $10, $11, $14}')"
grep -E '^step gaps|^graph captures' "$out/bench_gaps.txt" | tee -a "$out/summary.txt"
args=(--bin "$bin/roofline" --model "$m" --server-args "-np 64 -c 32768 -ngl all -b 2048" --prompt-tokens 128 --max-tokens 128)
IFS='|' read -r -a settings <<< "${SETTINGS-ROOFLINE_WARMUP_WALK=0|}"
[ ${#settings[@]} -eq 0 ] && settings=("")
[[ "${SETTINGS-x|}" == *"|" ]] && settings+=("")  # a trailing '|': the default last
for k in "${!settings[@]}"; do
  s="${settings[$k]}"
  # shellcheck disable=SC2086
  env $s ROOFLINE_STEP_GAPS=1 timeout 150 python3 tests/load/load.py "${args[@]}" --concurrency 1 \
      --per-stream "${PER_STREAM:-4}" --json "$out/serve_gaps_$k.json" --server-log "$out/serve_gaps_$k.log" > "$out/serve_gaps_$k.md" 2>&1
  stamp "[${s:-default}] load.py one stream with step gaps: exit $?"
  grep -E '^[|] 1 ' "$out/serve_gaps_$k.md" | tee -a "$out/summary.txt"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print({k: round(r[k], 3) for k in r if 'itl' in k or 'ttft' in k or 'server' in k})" \
      "$out/serve_gaps_$k.json" | tee -a "$out/summary.txt"
  grep -E '^step gaps, 1-row|^graph captures, 1-row|warm-up' "$out/serve_gaps_$k.log" | tee -a "$out/summary.txt"
done
if [ "${LOAD:-1,16,64}" != none ]; then
  for round in $(seq "${ROUNDS:-1}"); do
    for k in "${!settings[@]}"; do
      s="${settings[$k]}"
      # shellcheck disable=SC2086
      gaps=""
      [ "${LOAD_GAPS:-0}" = 1 ] && gaps="ROOFLINE_STEP_GAPS=1"
      # shellcheck disable=SC2086
      env $s $gaps timeout 200 python3 tests/load/load.py "${args[@]}" --concurrency "${LOAD:-1,16,64}" --per-stream 2 \
          --json "$out/serve_load_${k}_$round.json" --server-log "$out/serve_load_${k}_$round.log" > "$out/serve_${k}_$round.md" 2>&1
      stamp "[${s:-default}] round $round: load.py at ${LOAD:-1,16,64} streams: exit $?"
      grep -E "^[|] [0-9]|failed|error" "$out/serve_${k}_$round.md" | tail -4 | tee -a "$out/summary.txt"
      [ -n "$gaps" ] && grep -E '^graph captures|warm-up' "$out/serve_load_${k}_$round.log" | tee -a "$out/summary.txt"
    done
  done
fi
