#!/usr/bin/env bash
# One device call for the f16 weight copies (--f16-copies, cuda_f16_copies.cuh): every GPU test; the synthetic
# Q4_K_M files of qwen3-32b and qwen3-8b written under build-sbs/ (where dense_side_by_side.sh looks for them);
# llama.cpp built there in the background for a `dense_side_by_side.sh bench` call right after (LLAMA=0 skips
# it); then prompt rows (pp128, pp512) with the copies off and on, alternated; batched decode (`-npl 16,64`,
# 128-token prompts) with them off, on from 65 rows, from 33 (the default) and from 9 rows
# (ROOFLINE_F16_COPY_MIN_ROWS); and tg128, which the copies must leave as it was. MODELS: the shapes of the
# prompt rows (qwen3-32b first: the other rows are its); NPL=0, TG=0 skip those rows; LOAD=1 adds load.py on
# `roofline serve` (1, 16, 64 streams). Carry ["carry/pack"]. Results in $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=summary.md
source scripts/gpu/device_env.sh  # $out, $bin, stamp, LD_LIBRARY_PATH
mkdir -p build-sbs
work=$PWD/build-sbs
file_of() { echo "$work/$1-Q4_K_M.gguf"; }
stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cores, $($bin/roofline --version | head -1)"
start_llamacpp_build "$work/lcpp"  # LLAMA=0: none
gpu_tests
models="${MODELS:-qwen3-32b qwen3-8b}"
# row ENV ARGS...: one bench, its rows on one line, and the engine's report line on the copies.
row() {
  local m=$1 envs=$2; shift 2
  mkdir -p "$work/logs"; local log="$work/logs/bench_$(date +%s%N).txt"
  env $envs timeout 240 "$bin/roofline" bench -m "$(file_of "$m")" "$@" > "$log" 2>&1
  local line copies
  line=$(grep -E "\| *(tg|pp)[0-9]" "$log" | awk -F'|' '{printf "%s%s %s;", $10, $11, $14}')
  copies=$(grep -oE "f16 copies of [0-9]+ of [0-9]+ weight matrices kept for prompt steps, [0-9.]+ GiB|no f16 copies|error.*" "$log" | head -1)
  stamp "$m [$envs $*] $line {${copies:-no copies line}}"
}
for m in $models; do  # written one at a time (the disk holds about three); qwen3-32b's stays for the rows below
  f=$(file_of "$m")
  [ -f "$f" ] || { stamp "synth $m"; "$bin/roofline" synth "$m:Q4_K_M" -o "$f" 2>&1 | tail -1; }
  for round in 1 2; do
    row "$m" "" --f16-copies off -p 128,512 -n 0 -r 2
    row "$m" "" -p 128,512 -n 0 -r 2
  done
  [ "$m" = qwen3-32b ] || [ "$m" = qwen3-8b ] || rm -f "$f"
done
f=$(file_of qwen3-32b)
[ -f "$f" ] || { stamp "synth qwen3-32b"; "$bin/roofline" synth "qwen3-32b:Q4_K_M" -o "$f" 2>&1 | tail -1; }
m=qwen3-32b
if [ "${NPL:-1}" != 0 ]; then
  row $m "" --f16-copies off -p 128 -n 32 -npl 16,64 -r 1
  row $m "ROOFLINE_F16_COPY_MIN_ROWS=65" -p 128 -n 32 -npl 16,64 -r 1
  row $m "" -p 128 -n 32 -npl 16,64 -r 1
  row $m "ROOFLINE_F16_COPY_MIN_ROWS=9" -p 128 -n 32 -npl 16,64 -r 1
fi
if [ "${TG:-1}" != 0 ]; then
  row $m "" --f16-copies off -p 0 -n 128 -r 2
  row $m "" -p 0 -n 128 -r 2
fi
if [ "${LOAD:-0}" != 0 ]; then  # the server under load, as dense_side_by_side.sh's bench stage runs it
  stamp "load.py on roofline serve, qwen3-32b"
  timeout 240 python3 tests/load/load.py --bin "$bin/roofline" --model "$(file_of qwen3-32b)" --server-args "-np 64 -c 32768 -ngl all" \
      --concurrency 1,16,64 --per-stream 2 2>&1 | grep -E "^\||failed|error" | tee -a "$out/summary.md"
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | tee -a "$out/summary.md"
if [ -n "${bpid:-}" ]; then stamp "waiting for llama.cpp"; wait "$bpid"; fi
[ -f "$out/llamacpp_build.log" ] && tail -2 "$out/llamacpp_build.log" | tee -a "$out/summary.md"
stamp "done"
