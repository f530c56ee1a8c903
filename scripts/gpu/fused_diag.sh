#!/usr/bin/env bash
# Where the decode epilogues (ROOFLINE_FUSED_INPUTS) and the in-kernel combine (ROOFLINE_SPLIT_COMBINE) lose:
# tg128 of each switch alone and both, then every kernel of a few decode steps under ncu, default and each
# switch alone (tabled by scripts/gpu/ncu_kernel_table.py).
#   device: bash scripts/gpu/fused_diag.sh (carry ["carry/pack"]); MODELS, NCU_MODEL override; results in $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
for m in ${MODELS:-qwen3-8b qwen3-30b-a3b}; do
  for s in "" "ROOFLINE_FUSED_INPUTS=1" "ROOFLINE_SPLIT_COMBINE=1" "ROOFLINE_FUSED_INPUTS=1 ROOFLINE_SPLIT_COMBINE=1"; do
    line=$(env $s timeout 120 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 128 -r 2 2>/dev/null |
           grep "tg128" | awk -F'|' '{print $11, $14}')
    stamp "$m [${s:-default}] $line"
  done
done
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[ -n "$ncu_bin" ] || { stamp "no ncu"; exit 0; }
metrics=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size,launch__block_size,smsp__inst_executed.sum
m=${NCU_MODEL:-qwen3-8b}
for s in "" "ROOFLINE_FUSED_INPUTS=1" "ROOFLINE_SPLIT_COMBINE=1"; do
  tag=$(echo "${s:-default}" | tr ' =' '__')
  env $s ROOFLINE_NO_CUDA_GRAPHS=1 timeout 200 "$ncu_bin" --clock-control none --metrics "$metrics" --csv \
      --launch-skip "${SKIP:-3000}" --launch-count "${COUNT:-800}" \
      "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 12 -r 1 --no-warmup > "$out/ncu_$tag.csv" 2> "$out/ncu_$tag.err"
  stamp "ncu $m $tag exit $? ($(wc -l < "$out/ncu_$tag.csv") lines)"
done
