#!/usr/bin/env bash
# One device call: every GPU test, then tg128 of one build under two environment settings, alternated, so
# that a switchable change (ROOFLINE_FUSED_INPUTS, ROOFLINE_SPLIT_COMBINE, ROOFLINE_PDL, ...) is measured
# on one machine in one run. Here: scripts/gpu/build_for_device.sh, then pack carry/pack/bin.tar.xz
# (`cd carry && tar cJf pack/bin.tar.xz bin lib shared`); carry ["carry/pack"].
#   A="ROOFLINE_FUSED_INPUTS=0" B="" scripts/gpu/ab_env.sh
# MODELS (default: the five synthetic shapes), ROUNDS (2), TESTS (a gtest filter; "none" skips them) and
# DEPTH (a -d value for a second tg128 row per model, e.g. 4096) override; TESTS_B (a gtest filter) runs those
# tests again under setting B; BENCH replaces the bench arguments "-p 0 -n 128 -r 2" (e.g. "-p 128 -n 32
# -npl 16,64 -r 1": every prompt and generation row is printed). Results in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
if [ "${TESTS:-Gpu*:*.Gpu*}" != none ]; then
  CUDA_MODULE_LOADING=EAGER ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 240 "$bin/roofline_tests" --gtest_filter="${TESTS:-Gpu*:*.Gpu*}" \
      > "$out/gpu_tests.txt" 2>&1
  stamp "GPU tests exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$out/gpu_tests.txt" | head -20 | tee -a "$out/summary.txt"
fi
if [ -n "${TESTS_B:-}" ]; then  # tests under setting B too (a switch that changes which kernels the backend runs)
  env ${B:-} ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 240 "$bin/roofline_tests" --gtest_filter="$TESTS_B" \
      > "$out/gpu_tests_b.txt" 2>&1
  stamp "GPU tests under B (${B:-default}) exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$out/gpu_tests_b.txt" | head -20 | tee -a "$out/summary.txt"
fi
depths="0${DEPTH:+ $DEPTH}"
for m in ${MODELS:-qwen3-32b qwen3-8b qwen3.5-27b gemma3-27b qwen3-30b-a3b}; do
  for d in $depths; do
    for round in $(seq "${ROUNDS:-2}"); do
      for v in A B; do
        settings="${A:-}"
        [ $v = B ] && settings="${B:-}"
        # shellcheck disable=SC2086
        line=$(bench_row $settings timeout 200 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" ${BENCH:--p 0 -n 128 -r 2} -d "$d")
        stamp "$m d=$d $v[${settings:-default}] $line"
      done
    done
  done
done
