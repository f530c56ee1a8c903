#!/usr/bin/env bash
# Where the GPU machine's host CPU spends a step (issue #18), no GPU visible: qwen3-1.7b files written
# first (and synced, so no writeback runs under a benchmark); then `roofline bench` of this build with its AMX
# prompt kernels off and on and, when carry/bin/roofline_old exists, the build before it, alternated per type and
# thread count; the packed kernels on one core (VNNI, and AMX from 16 to 128 rows); then the CPU
# per-op profile (`bench --profile`) of decode and of a 128-token prompt at 16 threads, and the thread
# pool's dispatch cost (bench/cpu_vec_dot_bench, carried as carry/bin/cpu_vec_dot_bench with its libbenchmark).
# TYPES (Q4_0 Q8_0 Q4_K_M), THREADS_LIST (4 16) and PROFILE_THREADS (16) override. Carry ["carry/pack"];
# results in $OUT/cpu_diag.md and $OUT/profile_*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=cpu_diag.md
source scripts/gpu/device_env.sh
export CUDA_VISIBLE_DEVICES=
work="${WORK:-/tmp/cpu-host}"
mkdir -p "$work"
types="${TYPES:-Q4_0 Q8_0 Q4_K_M}"
for q in $types; do
  f="$work/qwen3-1.7b-$q.gguf"
  [ -f "$f" ] || "$bin/roofline" synth "qwen3-1.7b:$q" -o "$f" > /dev/null 2>&1
done
sync
stamp "files written; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# The CPU's topology: whether the vCPUs are SMT siblings (two threads of one core share its vector units and
# its AMX tile unit, which would explain prompt products at 40% of their one-core rate at 4 and 16 threads).
{ lscpu | grep -E "^(Thread|Core|Socket|NUMA node\(s\)|L1d|L2|L3|Model name|Flags)" | cut -c1-160
  for c in 0 1 2 3; do echo "cpu$c siblings: $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"; done
} >> "$out/cpu_diag.md" 2>&1
# 4 threads on 4 vCPUs chosen two ways (0-3, and every other one), Q4_0 prompt and decode: a difference says the
# scheduler's placement on siblings matters.
f0="$work/qwen3-1.7b-Q4_0.gguf"
if [ -f "$f0" ] && command -v taskset > /dev/null; then
  for cpus in 0-3 0,2,4,6 0-3 0,2,4,6; do
    line=$(taskset -c "$cpus" timeout 100 "$bin/roofline" bench -m "$f0" -ngl 0 -t 4 -p 128 -n 32 -r 2 2>/dev/null | grep -E "pp128|tg32" | awk -F'|' '{print $11, $12}' | tr '\n' ' ')
    stamp "Q4_0 t=4 on cpus $cpus: $line"
  done
fi
# Variants, each "binary:ROOFLINE_CPU_AMX": this build with its AMX prompt kernels off and on (where the CPU has
# AMX-INT8), and the build before it when carried.
variants="$bin/roofline:0 $bin/roofline:1"
[ -x "$bin/roofline_old" ] && variants="$bin/roofline_old:1 $variants"
for q in $types; do
  f="$work/qwen3-1.7b-$q.gguf"
  for t in ${THREADS_LIST:-4 16}; do
    for v in $variants $variants; do
      b="${v%:*}" amx="${v##*:}"
      line=$(ROOFLINE_CPU_AMX=$amx timeout 100 "$b" bench -m "$f" -ngl 0 -t "$t" -p 128 -n 32 -r 2 2>/dev/null | grep -E "pp128|tg32" | awk -F'|' '{print $11, $12}' | tr '\n' ' ')
      stamp "$q t=$t $(basename "$b") amx=$amx: $line"
    done
  done
done
if [ -x "$bin/cpu_vec_dot_bench" ]; then  # one core: the VNNI kernels at 16 rows, the AMX prompt kernels at 16-128
  timeout 120 "$bin/cpu_vec_dot_bench" --benchmark_filter='BM_MatmulPacked(Prompt)?/.*/tokens:(16|32|64|128)/cold:0/threads:1' \
    --benchmark_min_time=0.2 --benchmark_format=csv 2>/dev/null | cut -d, -f1,11- | tee -a "$out/cpu_diag.md"
fi
if [ -x "$bin/cpu_vec_dot_bench" ]; then
  timeout 60 "$bin/cpu_vec_dot_bench" --benchmark_filter='BM_PoolDispatch/pool:(4|16)/' --benchmark_min_time=0.2 2>&1 |
    grep -E "^BM_" | awk '{print $1, $2, $3}' | tee -a "$out/cpu_diag.md"
fi
pt="${PROFILE_THREADS:-16}"
for q in $types; do
  f="$work/qwen3-1.7b-$q.gguf"
  timeout 100 "$bin/roofline" bench -m "$f" -ngl 0 -t "$pt" -p 128 -n 32 -r 1 --profile > "$out/profile_${q}_t$pt.txt" 2>&1
  stamp "profile $q t=$pt: $(grep -E '^\| total' "$out/profile_${q}_t$pt.txt" | tr '\n' ' ')"
done
stamp done
