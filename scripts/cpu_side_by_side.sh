#!/usr/bin/env bash
# Issue #18's CPU comparison on this machine: roofline bench and llama.cpp's llama-bench on the same GGUF
# files (written by `roofline synth`), CPU only, one engine after the other per file, same -p/-n/-t.
# Usage: scripts/cpu_side_by_side.sh LLAMA_BENCH [SHAPES] [MIXES]   (defaults: qwen3-1.7b; Q4_K_M Q8_0 Q4_0)
# LLAMA_BENCH is a CPU build of llama.cpp's llama-bench made outside the repository. THREADS (default: all
# cores), P (128), N (64), R (2), WORK (where the files go, default /tmp/roofline-cpu-sbs) and ROOFLINE (the
# binary, default build/roofline) override.
set -euo pipefail
cd "$(dirname "$0")/.."
lb="${1:?usage: cpu_side_by_side.sh LLAMA_BENCH [SHAPES] [MIXES]}"
shapes="${2:-qwen3-1.7b}"
mixes="${3:-Q4_K_M Q8_0 Q4_0}"
t="${THREADS:-$(nproc)}" p="${P:-128}" n="${N:-64}" r="${R:-2}"
work="${WORK:-/tmp/roofline-cpu-sbs}"
rl="${ROOFLINE:-build/roofline}"
mkdir -p "$work"
# Every file first, then sync: no writeback of a file just written runs under a benchmark.
for shape in $shapes; do
  for mix in $mixes; do
    f="$work/$shape-$mix.gguf"
    [ -f "$f" ] || "$rl" synth "$shape:$mix" -o "$f" > /dev/null
  done
done
sync
echo "threads $t, -p $p -n $n -r $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for shape in $shapes; do
  for mix in $mixes; do
    f="$work/$shape-$mix.gguf"
    echo "== $shape $mix"
    "$rl" bench -m "$f" -p "$p" -n "$n" -r "$r" -t "$t" -ngl 0 2>/dev/null | grep -E "^\| (qwen|llama)" | sed 's/^/roofline  /'
    "$lb" -m "$f" -p "$p" -n "$n" -r "$r" -t "$t" -ngl 0 2>/dev/null | grep -E "^\| (qwen|llama)" | sed 's/^/llama.cpp /'
  done
done
