#!/usr/bin/env bash
# One device call for ROOFLINE_MATVEC_MMA (cuda_matvec_mma.cu): every GPU test, then qwen3-32b and qwen3-8b
# decode of 1-8 streams with the tensor-core products of 2-8 tokens off and on, and tg128 of this build against
# carry/bin/roofline_old (the build before q4k_lane_term spelled out the float roundings), alternated.
# Carry ["carry/pack/bin.tar.xz"]; results in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
gpu_tests
for m in ${MODELS:-qwen3-32b qwen3-8b}; do
  for settings in "ROOFLINE_MATVEC_MMA=0" "ROOFLINE_MATVEC_MMA=1"; do
    # shellcheck disable=SC2086
    stamp "$m [$settings] $(bench_row $settings timeout 200 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 128 -n 32 -npl 2,4,8 -r 1)"
  done
  if [ -x "$bin/roofline_old" ]; then
    for exe in roofline_old roofline; do
      stamp "$m [$exe] $(bench_row timeout 200 "$bin/$exe" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 128 -r 2)"
    done
  fi
done
