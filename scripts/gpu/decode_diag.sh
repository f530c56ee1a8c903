#!/usr/bin/env bash
# Decode diagnostics on the GPU machine: graphed tg128 for the dense and hybrid shapes, then every
# kernel of a few decode steps of each under ncu (time, DRAM bytes and throughput, registers,
# occupancy): where the step goes, kernel by kernel, without launch gaps.
#   here:   scripts/gpu/build_for_device.sh && tar cJf carry/pack/bin.tar.xz -C carry bin lib shared
#   device: bash scripts/gpu/decode_diag.sh   (carry ["carry/pack"]); results in $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/out}"
mkdir -p "$out"
if [ -f carry/pack/bin.tar.xz ] && [ ! -x carry/bin/roofline ]; then tar xJf carry/pack/bin.tar.xz -C carry; fi
bin=$PWD/carry/bin
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/carry/lib"
models="${MODELS:-qwen3-32b qwen3-8b qwen3.5-27b}"
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
echo "ncu: ${ncu_bin:-none}" | tee "$out/summary.txt"
for m in $models; do
  "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 128 -r 2 2>&1 | tee -a "$out/summary.txt" | tail -4
done
[ -n "$ncu_bin" ] || exit 0
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size
for m in ${NCU_MODELS:-qwen3-32b qwen3.5-27b}; do
  ROOFLINE_NO_CUDA_GRAPHS=1 timeout 300 "$ncu_bin" --clock-control none --metrics "$metrics" --csv \
      --launch-skip "${SKIP:-3000}" --launch-count "${COUNT:-1500}" \
      "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 12 -r 1 --no-warmup > "$out/ncu_$m.csv" 2> "$out/ncu_$m.err"
  echo "ncu $m exit $? ($(wc -l < "$out/ncu_$m.csv") lines)" | tee -a "$out/summary.txt"
done
