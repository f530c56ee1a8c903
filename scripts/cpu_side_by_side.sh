#!/usr/bin/env bash
# Issue #18's CPU comparison on this machine: roofline bench and llama.cpp's llama-bench on the same GGUF
# files (written by `roofline synth`), CPU only, same -p/-n/-t. The engines alternate run by run (R rounds of
# one repetition each), so a shared machine whose bandwidth drifts (other tenants) weighs on both alike; the
# summary gives each engine's median per test and their ratio.
# Usage: scripts/cpu_side_by_side.sh LLAMA_BENCH [SHAPES] [MIXES]   (defaults: qwen3-1.7b; Q4_K_M Q8_0 Q4_0)
# LLAMA_BENCH is a CPU build of llama.cpp's llama-bench made outside the repository. THREADS (default: all
# cores), P (128), N (64), R (3 rounds), WORK (where the files go, default /tmp/roofline-cpu-sbs) and ROOFLINE
# (the binary, default build/roofline) override.
set -euo pipefail
cd "$(dirname "$0")/.."
lb="${1:?usage: cpu_side_by_side.sh LLAMA_BENCH [SHAPES] [MIXES]}"
shapes="${2:-qwen3-1.7b}"
mixes="${3:-Q4_K_M Q8_0 Q4_0}"
t="${THREADS:-$(nproc)}" p="${P:-128}" n="${N:-64}" r="${R:-3}"
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
echo "threads $t, -p $p -n $n, $r alternated rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
for shape in $shapes; do
  for mix in $mixes; do
    f="$work/$shape-$mix.gguf"
    echo "== $shape $mix"
    for round in $(seq "$r"); do
      # roofline's table: test in column 10, t/s in 11; llama-bench's: test in 7, t/s in 8.
      "$rl" bench -m "$f" -p "$p" -n "$n" -r 1 -t "$t" -ngl 0 2>/dev/null | grep -E "^\| (qwen|llama|gemma)" |
        tee /dev/stderr | awk -F'|' -v k="$shape $mix" '{gsub(/ /, "", $10); split($11, v, " "); print k "|" $10 "|roofline|" v[1]}' >> "$results"
      "$lb" -m "$f" -p "$p" -n "$n" -r 1 -t "$t" -ngl 0 2>/dev/null | grep -E "^\| (qwen|llama|gemma)" |
        tee /dev/stderr | awk -F'|' -v k="$shape $mix" '{gsub(/ /, "", $7); split($8, v, " "); print k "|" $7 "|llama.cpp|" v[1]}' >> "$results"
    done 2>&1 | sed -E 's/^\| (qwen|llama|gemma)/  &/'
  done
done
echo
echo "| model | test | roofline (median) | llama.cpp (median) | ratio | roofline runs | llama.cpp runs |"
echo "|---|---|---:|---:|---:|---|---|"
python3 - "$results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    key, test, engine, value = line.strip().split("|")
    runs.setdefault((key, test), {}).setdefault(engine, []).append(float(value))
for (key, test), e in runs.items():
    a, b = e.get("roofline", []), e.get("llama.cpp", [])
    if not a or not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {key} | {test} | {ma:.2f} | {mb:.2f} | {ma / mb:.2f} | {', '.join(f'{x:.1f}' for x in a)} | {', '.join(f'{x:.1f}' for x in b)} |")
PY
