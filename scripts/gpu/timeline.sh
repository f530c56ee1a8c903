#!/usr/bin/env bash
# Where a graphed decode step's time goes, kernel by kernel, as it really runs (CUDA graphs and
# programmatic dependent launch on): the CUPTI injection library of bench/gpu_kernel_trace.cpp records
# every kernel of `bench -p 0 -n N` (start, end, grid, name; built by build_for_device.sh), and
# scripts/gpu/timeline_table.py turns the trace into one table per model: per kernel kind, the calls per
# step, the kernel's own duration and what it adds to the step's critical path. ncu (decode_diag.sh)
# times each kernel alone; this says what it costs in the pipeline.
#   here:   scripts/gpu/build_for_device.sh && (cd carry && tar cJf pack/bin.tar.xz bin lib shared)
#   device: bash scripts/gpu/timeline.sh   (carry ["carry/pack"]; MODELS, N, ENVS); results in $OUT
# ENVS: space-separated settings to trace beside the default, e.g. "ROOFLINE_PDL=0" (each a VAR=VALUE list
# joined by commas). BENCH replaces the bench arguments (e.g. "-p 512 -n 0 -r 1" for a prefill step, with
# GAP=200 SKIP=1: the gap in us that ends a step, and the steps left out, as timeline_table.py takes them).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
lib="$bin/libkernel_trace.so"
[ -f "$lib" ] || { stamp "no $lib (build_for_device.sh builds it where CUPTI is installed)"; exit 0; }
for m in ${MODELS:-qwen3-8b qwen3-32b}; do
  for setting in default ${ENVS:-}; do
    tag="${m}_${setting//[^A-Za-z0-9]/_}"
    envs=()
    [ "$setting" = default ] || IFS=, read -r -a envs <<< "$setting"
    csv="/tmp/trace_$tag.csv"
    rm -f "$csv"
    env "${envs[@]}" CUDA_INJECTION64_PATH="$lib" ROOFLINE_TRACE_OUT="$csv" timeout 240 \
      "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" ${BENCH:--p 0 -n "${N:-32}" -r 1} > "/tmp/trace_$tag.log" 2>&1
    stamp "trace $m ($setting): exit $?, $(tail -1 "/tmp/trace_$tag.log")"
    [ -s "$csv" ] || continue
    grep -E "^\| " "/tmp/trace_$tag.log" | tail -1 | tee -a "$out/summary.txt"
    python3 scripts/gpu/timeline_table.py "$csv" "${GAP:-15}" "${SKIP:-3}" > "/tmp/timeline_$tag.txt" 2>&1
    { echo "== $tag"; cat "/tmp/timeline_$tag.txt"; } >> "$out/timelines.txt"
    xz -c "$csv" > "/tmp/trace_$tag.csv.xz"
    head -30 "/tmp/timeline_$tag.txt" | tee -a "$out/summary.txt"
  done
done
# One file back (the device tool returns a few files per call): the traces, compressed.
(cd /tmp && tar cf "$out/traces.tar" trace_*.csv.xz trace_*.log 2>/dev/null)
