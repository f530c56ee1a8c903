#!/usr/bin/env bash
# Where the time between one-token decode steps goes (the CUDA backend's ROOFLINE_STEP_GAPS=1): for each model and
# setting, `bench -p 0 -n 128 -r 1` and the backend's line for one-row steps: the GPU's idle gap before a step, the
# step's start (header upload, embedding), its layers and output, and the host's time in the layers' launch call.
#   device: MODELS="qwen3-8b qwen3-32b" ENVS="ROOFLINE_GRAPH_HEAD_LAYERS=2" bash scripts/gpu/step_gaps.sh
#   (carry ["carry/pack/bin.tar.xz"] with carry/packs/all.tar.xz); results in $OUT/summary.txt.
# ENVS: settings to run beside the default, space-separated, each a VAR=VALUE list joined by commas.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
for m in ${MODELS:-qwen3-8b qwen3-32b}; do
  for setting in default ${ENVS:-}; do
    envs=()
    [ "$setting" = default ] || IFS=, read -r -a envs <<< "$setting"
    env "${envs[@]}" ROOFLINE_STEP_GAPS=1 timeout 200 "$bin/roofline" bench -m "synthetic:$m:${MIX:-Q4_K_M}" ${BENCH:--p 0 -n 128 -r 1} \
        > /tmp/step_gaps.log 2>&1
    stamp "$m ($setting): exit $?; $(grep -E '\| *tg[0-9]' /tmp/step_gaps.log | awk -F'|' '{printf "%s%s;", $10, $11}')"
    grep -E '^step gaps' /tmp/step_gaps.log | tee -a "$out/summary.txt"
  done
done
