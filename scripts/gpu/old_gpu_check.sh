#!/usr/bin/env bash
# Issue #19's old-GPU check on the H200: the binaries built PTX-only for compute_75
# (`scripts/gpu/build_for_device.sh 75-virtual`, carried as carry/bin-75-virtual) run with the driver
# JIT-compiling their PTX, so every kernel takes its sm_75 branch (__CUDA_ARCH__ == 750) and the host
# picks the forms an sm_75 card gets (no PDL, no chunked DeltaNet, m16n8k8 tensor-core products). Runs
# --version, every GPU test, and a short bench in that build. Carry ["carry/pack"]; results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
CARRY_BIN=carry/bin-75-virtual STAMP_FILE=old_gpu_summary.txt
source scripts/gpu/device_env.sh
export CUDA_CACHE_MAXSIZE=4294967296  # the JIT-compiled kernels are cached for the later processes
"$bin/roofline" --version 2>&1 | tee "$out/version_75.txt"
stamp "GPU tests (compute_75 PTX, JIT)"
ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout "${TEST_TIMEOUT:-420}" "$bin/roofline_tests" \
    --gtest_filter='Gpu*:*.Gpu*' > "$out/gpu_tests_75.txt" 2>&1
stamp "GPU tests exit $?"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests_75.txt" | head -40 | tee -a "$out/old_gpu_summary.txt"
for m in ${MODELS:-qwen3-8b qwen3.5-27b}; do
  timeout 120 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 512 -n 64 -r 1 > "$out/bench_75_$m.txt" 2>&1
  stamp "bench $m exit $?: $(grep -E 'pp512|tg64|kernels running|error' "$out/bench_75_$m.txt" | tr -s ' ' | tr '\n' ' ')"
done
