#!/usr/bin/env bash
# Issue #18's last rows (Q8_0 decode at 4 threads): what the host's memory gives T threads at all, beside what
# roofline's decode reads. Builds bench/cpu_read_lab.cpp there (g++), runs it at 4 and 16 threads (every read
# form, unpinned and one thread a physical core), then `roofline bench -ngl 0 -t 4 -p 0 -n 32` on qwen3-1.7b and
# qwen3-8b Q8_0 (its GB/s column) with no GPU visible. Carry ["carry/pack/bin.tar.xz"]; results in $OUT/cpu_read.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=cpu_read.md
source scripts/gpu/device_env.sh
export CUDA_VISIBLE_DEVICES=
work="${WORK:-/tmp/cpu-host}"
mkdir -p "$work"
stamp "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(lscpu | grep -E '^(Thread|Core|Socket|NUMA node\(s\))' | tr -s ' ' | paste -sd';')"
g++ -O2 -std=c++20 -mavx512f -mavx512bw -pthread bench/cpu_read_lab.cpp -o "$work/cpu_read_lab" || { stamp "lab build failed"; exit 1; }
timeout 240 "$work/cpu_read_lab" "${GIB:-4}" "${LAB_THREADS:-4,16}" "${PASSES:-5}" | tee -a "$out/cpu_read.md"
for s in ${SHAPES:-qwen3-1.7b qwen3-8b}; do
  f="$work/$s-Q8_0.gguf"
  [ -f "$f" ] || "$bin/roofline" synth "$s:Q8_0" -o "$f" > /dev/null 2>&1
  for t in ${THREADS_LIST:-4}; do
    for round in 1 2; do
      stamp "$s Q8_0 -t $t round $round: $(timeout 120 "$bin/roofline" bench -m "$f" -ngl 0 -t "$t" -p 0 -n 32 -r 1 2>&1 | grep -E '\| *tg' | tr -s ' ')"
    done
  done
done
stamp done
