#!/usr/bin/env bash
# Issue #24's rows side by side with llama.cpp on the same synthetic Q4_K_M files of the dense models
# (qwen3-32b, qwen3-8b), in two device calls made back to back (the machine stays warm, so the second
# reuses the first's llama.cpp build and files under the git-ignored build-sbs/):
#
#   here:   build for the device, pack carry/pack/bin.tar.xz, and carry/pack/llamacpp.tar.gz
#           (scripts/gpu/pack_llamacpp.sh); carry ["carry/pack"]
#   call 1: bash scripts/gpu/dense_side_by_side.sh prep : llama.cpp's build in the background; every GPU
#           test; the synthetic files written; VARIANTS (as variants.sh: settings separated by '|', the
#           default first; BIN=name runs another carried binary) alternated on pp512 of both models, ROUNDS
#           rounds (default 2)
#   call 2: bash scripts/gpu/dense_side_by_side.sh bench : per model, roofline's bench then llama-bench on
#           the same file (pp512 + tg128, tg128 at depth 8192 for 32b), then `-npl 16,64` against
#           llama-batched-bench (128-token prompts, 128 generated), then tests/load/load.py on
#           `roofline serve` at 1, 16 and 64 streams (32b; LOAD=0 skips it)
# MODELS overrides the shapes (any synthetic shape: the MoE, Gemma 3 and Qwen3.5 ones too); the models of DEEP
# (default qwen3-32b) also get tg128 at depth 8192 (an MoE model: tg32 with its experts in host memory, --cpu-moe
# against -ncmoe 99) and the -npl rows; KEEP_FILES=0 deletes each model's file after its rows (a 64 GB disk holds
# three of the 27-32B files at most); LLAMA=0 leaves llama.cpp out (roofline's rows alone, one call: prep then bench);
# everything lands in $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage="${1:-prep}"
STAMP_FILE=summary.md
source scripts/gpu/device_env.sh  # $out, $bin, stamp, LD_LIBRARY_PATH
mkdir -p build-sbs
work=$PWD/build-sbs
lcpp=$work/lcpp
export PYTHONUNBUFFERED=1
models="${MODELS:-qwen3-32b qwen3-8b}"
file_of() { echo "$work/$1-Q4_K_M.gguf"; }
rl() { local f=$1; shift; stamp "roofline bench $(basename "$f") $*"
       timeout 200 "$bin/roofline" bench -m "$f" "$@" 2>&1 | grep -E "^[|] *[a-z-]|error" | tee -a "$out/summary.md"; }
lb() { local f=$1; shift; [ "${LLAMA:-1}" = 0 ] && return; stamp "llama-bench $(basename "$f") $*"
       timeout 200 "$lcpp/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 "$@" 2>&1 | grep -E "^\||error" | tee -a "$out/summary.md"; }

if [ "$stage" = prep ]; then
  stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cores, $($bin/roofline --version | head -1)"
  start_llamacpp_build "$lcpp"  # LLAMA=0: none
  gpu_tests
  for m in $models; do
    f=$(file_of "$m")
    [ -f "$f" ] || [ "${KEEP_FILES:-1}" = 0 ] || { stamp "synth $m"; "$bin/roofline" synth "$m:Q4_K_M" -o "$f" 2>&1 | tail -1; }
  done
  IFS='|' read -r -a variants <<< "${VARIANTS:-}"
  [ ${#variants[@]} -eq 0 ] && variants=("")
  for m in $models; do
    for round in $(seq "${ROUNDS:-2}"); do
      for settings in "${variants[@]}"; do
        exe=roofline  # BIN=name in a variant: another carried binary (as in variants.sh)
        for word in $settings; do [[ $word == BIN=* ]] && exe=${word#BIN=}; done
        line=$(env $settings timeout 200 "$bin/$exe" bench -m "$(file_of "$m")" ${BENCH:--p 512 -n 0 -r 2} 2>/dev/null |
               grep -E "\| *(tg|pp)[0-9]" | awk -F'|' '{printf "%s%s %s;", $10, $11, $14}')
        stamp "$m [${settings:-default}] $line"
      done
    done
  done
  if [ -n "${bpid:-}" ]; then stamp "waiting for llama.cpp"; wait "$bpid"; fi
  tail -2 "$out/llamacpp_build.log" | tee -a "$out/summary.md"
  stamp "done"
fi

if [ "$stage" = bench ]; then
  [ -x "$lcpp/build/bin/llama-bench" ] || [ "${LLAMA:-1}" = 0 ] || { stamp "no llama.cpp build under $lcpp: run the prep stage first"; exit 1; }
  for m in $models; do
    f=$(file_of "$m")
    [ -f "$f" ] || { stamp "synth $m"; "$bin/roofline" synth "$m:Q4_K_M" -o "$f" 2>&1 | tail -1; }
    rl "$f" -p 512 -n 128 -r 2
    lb "$f" -p 512 -n 128 -r 2
    if [[ " ${DEEP:-qwen3-32b} " == *" $m "* ]]; then
      case "$m" in
        *a3b*) rl "$f" -p 0 -n 32 -r 1 --cpu-moe  # the experts in host memory, against llama.cpp's -ncmoe 99
               lb "$f" -p 0 -n 32 -r 1 -ncmoe 99 ;;
        *) rl "$f" -p 0 -n 128 -d 8192 -r 1
           lb "$f" -p 0 -n 128 -d 8192 -r 1 ;;
      esac
      rl "$f" -p 128 -n 128 -npl 16,64 -r 1
      [ "${LLAMA:-1}" = 0 ] || stamp "llama-batched-bench $m"
      [ "${LLAMA:-1}" = 0 ] || timeout 200 "$lcpp/build/bin/llama-batched-bench" -m "$f" -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 \
          -npl 16,64 2>&1 | grep -E "^\|" | tee -a "$out/summary.md"
    fi
    [ "${KEEP_FILES:-1}" != 0 ] || rm -f "$f"
  done
  if [ "${LOAD:-1}" != 0 ]; then
    f=$(file_of qwen3-32b)
    [ -f "$f" ] || { stamp "synth qwen3-32b"; "$bin/roofline" synth "qwen3-32b:Q4_K_M" -o "$f" 2>&1 | tail -1; }
    stamp "load.py on roofline serve, $(basename "$f")"
    timeout 240 python3 tests/load/load.py --bin "$bin/roofline" --model "$f" --server-args "-np 64 -c 32768 -ngl all" \
        --concurrency 1,16,64 --per-stream 2 2>&1 | grep -E "^\||failed|error" | tee -a "$out/summary.md"
  fi
  stamp "done"
fi
