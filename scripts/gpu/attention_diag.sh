#!/usr/bin/env bash
# Why decode attention's split kernel takes ~11 us a layer at short depth (scripts/gpu/timeline.sh): tg32 with
# shorter key spans per split (ROOFLINE_ATTN_MIN_SPAN 16 against the default 32: twice the CTAs, half the keys
# each), alternated; then one launch of the split kernel under ncu with every section (stall reasons, source
# counters) for qwen3-8b. Carry ["carry/pack"]; results in $OUT/attention.md and $OUT/ncu_attention.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=attention.md
source scripts/gpu/device_env.sh
for m in ${MODELS:-qwen3-8b qwen3-32b}; do
  for round in 1 2; do
    for span in 32 16; do
      line=$(ROOFLINE_ATTN_MIN_SPAN=$span timeout 120 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 32 -r 1 2>/dev/null | grep -E "tg32" | awk -F'|' '{print $11}')
      stamp "$m min_span=$span round $round: tg32 $line"
    done
  done
done
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[ -n "$ncu_bin" ] || { stamp "no ncu"; exit 0; }
ROOFLINE_NO_CUDA_GRAPHS=1 timeout 240 "$ncu_bin" --kernel-name regex:attention_split --launch-skip 300 --launch-count 1 --set full \
  --import-source yes --print-details all "$bin/roofline" bench -m synthetic:qwen3-8b:Q4_K_M -p 0 -n 16 -r 1 --no-warmup > "$out/ncu_attention.txt" 2>&1
stamp "ncu exit $? ($(wc -l < "$out/ncu_attention.txt") lines)"
ROOFLINE_NO_CUDA_GRAPHS=1 timeout 120 "$ncu_bin" --kernel-name regex:attention_split --launch-skip 300 --launch-count 1 --section SourceCounters \
  --print-details all --page source --csv --print-source sass "$bin/roofline" bench -m synthetic:qwen3-8b:Q4_K_M -p 0 -n 16 -r 1 --no-warmup \
  > /tmp/ncu_source.csv 2>&1
stamp "ncu source exit $?"
xz -c /tmp/ncu_source.csv > "$out/ncu_attention_source.csv.xz"
stamp done
