#!/usr/bin/env bash
# GPU tests, then decode A/B runs of kernel settings (environment variables) on the dense and hybrid
# shapes, graphed; optionally ncu of the products. Carry ["carry/pack"] (binaries packed by
# `tar cJf carry/pack/bin.tar.xz -C carry bin lib shared`); results in $OUT.
#   TESTS=filter (default every GPU test; "none" skips)  VARIANTS="ENV=.. ENV=..;ENV=.." (";" between)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/out}"
mkdir -p "$out"
if [ -f carry/pack/bin.tar.xz ] && [ ! -x carry/bin/roofline ]; then tar xJf carry/pack/bin.tar.xz -C carry; fi
bin=$PWD/carry/bin
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/carry/lib"
filter="${TESTS:-Gpu*:*.Gpu*}"
if [ "$filter" != none ]; then
  ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout "${TEST_TIMEOUT:-300}" "$bin/roofline_tests" \
      --gtest_filter="$filter" > "$out/gpu_tests.txt" 2>&1
  echo "GPU tests exit $?" | tee -a "$out/summary.txt"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests.txt" | head -30 | tee -a "$out/summary.txt"
fi
IFS=';' read -ra variants <<< "${VARIANTS:-ROOFLINE_PDL=1;ROOFLINE_PDL=0}"
for m in ${MODELS:-qwen3-32b qwen3-8b qwen3.5-27b}; do
  for v in "${variants[@]}"; do
    line=$(env $v "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 128 -r "${REPS:-2}" 2>/dev/null | grep "tg128")
    echo "$m [$v] $line" | tee -a "$out/summary.txt"
  done
done
if [ -n "${NCU:-}" ]; then
  metrics=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size
  ROOFLINE_NO_CUDA_GRAPHS=1 timeout 200 /usr/local/cuda/bin/ncu --clock-control none --metrics "$metrics" --csv \
      --launch-skip 3000 --launch-count 1500 "$bin/roofline" bench -m "synthetic:$NCU:Q4_K_M" -p 0 -n 12 -r 1 --no-warmup \
      > "$out/ncu_$NCU.csv" 2> "$out/ncu.err"
  echo "ncu exit $?" | tee -a "$out/summary.txt"
fi
# NCU_DETAIL="ENV=..;ENV=..": ncu's speed-of-light, warp-state and occupancy sections of six single-token
# products of qwen3-32b under each setting.
if [ -n "${NCU_DETAIL:-}" ]; then
  IFS=';' read -ra dv <<< "$NCU_DETAIL"
  k=0
  for v in "${dv[@]}"; do
    k=$((k + 1))
    env $v ROOFLINE_NO_CUDA_GRAPHS=1 timeout 120 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight \
        --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis -k "regex:matvec" --launch-skip 400 --launch-count 4 \
        "$bin/roofline" bench -m "synthetic:qwen3-32b:Q4_K_M" -p 0 -n 4 -r 1 --no-warmup > "$out/ncu_detail_$k.txt" 2>&1
    echo "ncu detail $k [$v] exit $?" | tee -a "$out/summary.txt"
  done
fi
# NPL="1,2,4,8": bench -npl on qwen3-32b (short-batch decode, 1-8 rows per step).
if [ -n "${NPL:-}" ]; then
  "$bin/roofline" bench -m synthetic:qwen3-32b:Q4_K_M -p 128 -n 64 -npl "$NPL" -r 1 2>&1 | grep -E "npl|pp|tg" | tee -a "$out/summary.txt"
fi
