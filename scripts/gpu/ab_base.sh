#!/usr/bin/env bash
# One device call: every GPU test, then tg128 of this build against a previous one, alternated, two rounds per
# model. Here: build the previous commit's `roofline` (e.g. `git stash; cmake --build build-device --target
# roofline; git stash pop`), strip it to carry/prev/roofline_base and `xz -1` it (the carry limit is 64 MiB);
# build this one with scripts/gpu/build_for_device.sh and pack carry/pack/bin.tar.xz. Carry
# ["carry/pack", "carry/prev"]. MODELS (default: the five synthetic shapes) and ROUNDS (2) override; results in
# $OUT/summary.txt and $OUT/gpu_tests.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
[ -x carry/prev/roofline_base ] || xz -dk carry/prev/roofline_base.xz
ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 170 "$bin/roofline_tests" --gtest_filter='Gpu*:*.Gpu*' \
    > "$out/gpu_tests.txt" 2>&1
stamp "GPU tests exit $?"
grep -E "^\[  FAILED|^\[  PASSED|Failure" "$out/gpu_tests.txt" | head -20 | tee -a "$out/summary.txt"
for m in ${MODELS:-qwen3-32b qwen3-8b qwen3.5-27b gemma3-27b qwen3-30b-a3b}; do
  for round in $(seq "${ROUNDS:-2}"); do
    for v in base new; do
      b="$bin/roofline"
      [ $v = base ] && b="$PWD/carry/prev/roofline_base"
      line=$(timeout 90 "$b" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 128 -r 2 2>/dev/null | grep "tg128" | awk -F'|' '{print $11, $14}')
      stamp "$m $v $line"
    done
  done
done
