#!/usr/bin/env bash
# One device call for the MoE decode switches written without a GPU (twenty-eighth session): every GPU test with the
# defaults, the MoE GPU tests again under each switch (ROOFLINE_MOE_SHARED_FUSED=1 folds the shared expert into the
# fused launches; ROOFLINE_MOE_DOWN_SHORT=1 takes the eight-row down kernel for short Q4_K expert rows), then tg64 of the
# MoE models under each, alternated (variants.sh). Carry ["carry/pack/bin.tar.xz"]; results in $OUT/summary.txt.
#   device: bash scripts/gpu/moe_switches_check.sh   (ROUNDS, MODELS, BENCH as in variants.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
gpu_tests
for setting in ROOFLINE_MOE_SHARED_FUSED=1 ROOFLINE_MOE_DOWN_SHORT=1; do
  env "$setting" CUDA_MODULE_LOADING=EAGER ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 240 "$bin/roofline_tests" \
      --gtest_filter='GpuMoe*:GpuMtp*:GpuFusedInputs*:GpuEngineTest.F16Copies*' > "$out/moe_tests_${setting%%=*}.txt" 2>&1
  stamp "MoE GPU tests with $setting: exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$out/moe_tests_${setting%%=*}.txt" | head -12 | tee -a "$out/summary.txt"
done
TESTS=none VARIANTS="|ROOFLINE_MOE_SHARED_FUSED=1|ROOFLINE_MOE_DOWN_SHORT=1|ROOFLINE_MOE_SHARED_FUSED=1 ROOFLINE_MOE_DOWN_SHORT=1" \
  MODELS="${MODELS:-qwen3.5-35b-a3b qwen3-30b-a3b}" BENCH="${BENCH:--p 0 -n 64 -r 2}" ROUNDS="${ROUNDS:-2}" bash scripts/gpu/variants.sh
