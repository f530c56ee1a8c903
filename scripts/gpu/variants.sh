#!/usr/bin/env bash
# One device call: every GPU test, then one bench row set of one build under several environment
# settings, alternated round by round, so that switchable changes are compared on one machine in one run
# (ab_env.sh does two). Carry ["carry/pack"] as for ab_env.sh.
#   VARIANTS="|ROOFLINE_FLASH_PREFILL=0|ROOFLINE_WARP_DEQUANT=0" BENCH="-p 512 -n 0 -r 2" scripts/gpu/variants.sh
# VARIANTS: settings separated by '|' (an empty one is the default); MODELS, MIX (Q4_K_M), ROUNDS (2), TESTS (a gtest
# filter, "none" skips them) and BENCH (default "-p 0 -n 128 -r 2") as in ab_env.sh. Results in $OUT/summary.txt.
# A variant may name another carried binary of the same folder: "BIN=roofline_exp ROOFLINE_X=1" runs
# carry/bin/roofline_exp (for changes that are compile-time only, built beside the default one).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
if [ "${TESTS:-Gpu*:*.Gpu*}" != none ]; then
  CUDA_MODULE_LOADING=EAGER ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 300 "$bin/roofline_tests" --gtest_filter="${TESTS:-Gpu*:*.Gpu*}" \
      > "$out/gpu_tests.txt" 2>&1
  stamp "GPU tests exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$out/gpu_tests.txt" | head -20 | tee -a "$out/summary.txt"
fi
IFS='|' read -r -a variants <<< "${VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
for m in ${MODELS:-qwen3-32b qwen3-8b}; do
  for round in $(seq "${ROUNDS:-2}"); do
    for settings in "${variants[@]}"; do
      exe=roofline
      for word in $settings; do [[ $word == BIN=* ]] && exe=${word#BIN=}; done
      # shellcheck disable=SC2086
      line=$(bench_row $settings timeout 200 "$bin/$exe" bench -m "synthetic:$m:${MIX:-Q4_K_M}" ${BENCH:--p 0 -n 128 -r 2})
      stamp "$m [${settings:-default}] $line"
    done
  done
done
