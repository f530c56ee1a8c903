#!/usr/bin/env bash
# Decode on the GPU machine's host CPU (no GPU visible) with the packed kernels' fetch-ahead settings
# alternated (ROOFLINE_CPU_FETCH / ROOFLINE_CPU_FETCH_AHEAD, packed_kernel_common.h): issue #18's decode rows
# where llama.cpp leads at 4 threads (Q8_0, Q4_0). Two rounds of every setting per file and thread count,
# `bench -p 0 -n N -r 1`. SHAPES (qwen3-8b qwen3-1.7b), TYPES (Q8_0 Q4_0), THREADS_LIST (4), N (32),
# SETTINGS (space-separated FETCH:AHEAD[:HINT] settings, HINT l1 or l2) override. Carry ["carry/pack"]; results in $OUT/cpu_fetch.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=cpu_fetch.md
source scripts/gpu/device_env.sh
export CUDA_VISIBLE_DEVICES=
work="${WORK:-/tmp/cpu-host}"
mkdir -p "$work"
shapes="${SHAPES:-qwen3-8b qwen3-1.7b}" types="${TYPES:-Q8_0 Q4_0}"
settings="${SETTINGS:-k:4096 all:4096 all:1024 all:16384}"
for s in $shapes; do
  for q in $types; do
    f="$work/$s-$q.gguf"
    [ -f "$f" ] || "$bin/roofline" synth "$s:$q" -o "$f" > /dev/null 2>&1
  done
done
sync
stamp "files written; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for s in $shapes; do
  for q in $types; do
    for t in ${THREADS_LIST:-4}; do
      for round in 1 2; do
        for v in $settings; do
          IFS=: read -r fetch ahead hint <<< "$v"
          line=$(ROOFLINE_CPU_FETCH="$fetch" ROOFLINE_CPU_FETCH_AHEAD="$ahead" ROOFLINE_CPU_FETCH_HINT="${hint:-l1}" timeout 100 "$bin/roofline" bench -m "$work/$s-$q.gguf" \
                 -ngl 0 -t "$t" -p 0 -n "${N:-32}" -r 1 2>/dev/null | grep -E "tg[0-9]" | awk -F'|' '{print $11, $12}')
          stamp "$s $q t=$t fetch=$v round $round: $line"
        done
      done
    done
  done
done
stamp done
