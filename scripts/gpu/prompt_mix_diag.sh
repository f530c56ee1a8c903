#!/usr/bin/env bash
# One device call on prompt steps that carry many sequences' prompts (the server's first wave: 16 or 64
# requests of 128 tokens at once) against one long prompt: the per-op profile of `-p 512` and of four
# 128-token prompts in one step (`-p 128 -npl 4`), batched rows (`-npl 16,64`) under the settings of
# VARIANTS ('|'-separated environments or bench flags after a ':' , e.g. "|ROOFLINE_PREFILL_MIN_KEYS=32|:-b 2048"),
# and with LOAD=1 load.py on `roofline serve` under SERVE_VARIANTS (server arguments, '|'-separated; default
# "-np 64 -c 32768 -ngl all"). qwen3-32b Q4_K_M (MODEL) written by `roofline synth` under build-sbs/.
# TESTS as in device_env.sh (default: every GPU test). Carry ["carry/pack"]. Results in $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAMP_FILE=summary.md
source scripts/gpu/device_env.sh
mkdir -p build-sbs/logs
m=${MODEL:-qwen3-32b}
f=$PWD/build-sbs/$m-Q4_K_M.gguf
stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $($bin/roofline --version | head -1)"
gpu_tests
[ -f "$f" ] || { stamp "synth $m"; "$bin/roofline" synth "$m:Q4_K_M" -o "$f" 2>&1 | tail -1; }
if [ "${PROFILE:-1}" != 0 ]; then
  timeout 200 "$bin/roofline" bench -m "$f" -p 512 -n 0 -r 1 --profile > "$out/profile_pp512.txt" 2>&1
  timeout 200 env ${PROFILE_ENV:-} "$bin/roofline" bench -m "$f" -p 128 -n 1 -npl 4 -r 1 --profile > "$out/profile_4x128.txt" 2>&1
  stamp "profiles written"
fi
IFS='|' read -r -a variants <<< "${VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
for round in $(seq "${ROUNDS:-2}"); do
  for v in "${variants[@]}"; do
    envs=${v%%:*}; flags=""; [[ $v == *:* ]] && flags=${v#*:}
    log="build-sbs/logs/bench_$(date +%s%N).txt"
    env $envs timeout 240 "$bin/roofline" bench -m "$f" ${BENCH:--p 128 -n 32 -npl 16,64 -r 1} $flags > "$log" 2>&1
    line=$(grep -E "\| *(tg|pp)[0-9]" "$log" | awk -F'|' '{printf "%s%s %s;", $10, $11, $14}')
    stamp "[$v] $line"
  done
done
if [ "${LOAD:-0}" != 0 ]; then
  IFS='|' read -r -a sv <<< "${SERVE_VARIANTS:--np 64 -c 32768 -ngl all}"
  for s in "${sv[@]}"; do
    envs=""; args=$s; [[ $s == *=*\ * && $s != -* ]] && { envs=${s%% -*}; args=-${s#* -}; }
    stamp "load.py: env [$envs] serve $args"
    env $envs timeout 240 python3 tests/load/load.py --bin "$bin/roofline" --model "$f" --server-args "$args" \
        --concurrency ${CONC:-1,16,64} --per-stream 2 2>&1 | grep -E "^\||failed|error" | tee -a "$out/summary.md"
  done
fi
stamp "done"
