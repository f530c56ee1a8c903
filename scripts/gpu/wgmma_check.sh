#!/usr/bin/env bash
# One device call for the warpgroup (wgmma) batched products (cuda_wgmma_rows.cu, on by default on Hopper): every GPU
# test, the GPU tests that run batched steps again with the kernel on for 9-64 rows (ROOFLINE_WGMMA=1, f16 copies off
# below 65 rows: the default, spelled out), then batched decode under the settings of VARIANTS (by default against the
# mma.sync kernel and the f16 copies from 33 rows, ROOFLINE_WGMMA=0), alternated round by round (variants.sh's rows).
# Carry ["carry/pack"]. Results in $OUT/summary.txt.
#   MODELS="qwen3-32b qwen3-8b" BENCH="-p 0 -n 32 -npl 16,32,64 -r 1" bash scripts/gpu/wgmma_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
gpu_tests
CUDA_MODULE_LOADING=EAGER ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" ROOFLINE_WGMMA=1 ROOFLINE_F16_COPY_MIN_ROWS=65 \
    timeout 240 "$bin/roofline_tests" --gtest_filter="${WG_TESTS:-GpuMatmul*:GpuEngine*:GpuBatched*:*.Gpu*:GpuMoe*:GpuQwen35*:GpuGemma3*:GpuMtp*:GpuFused*}" \
    > "$out/gpu_tests_wgmma.txt" 2>&1
stamp "GPU tests with ROOFLINE_WGMMA=1 exit $?"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests_wgmma.txt" | head -30 | tee -a "$out/summary.txt"
TESTS=none VARIANTS="${VARIANTS:-|ROOFLINE_WGMMA=0}" \
    MODELS="${MODELS:-qwen3-32b}" BENCH="${BENCH:--p 0 -n 32 -npl 16,32,64 -r 1}" bash scripts/gpu/variants.sh
