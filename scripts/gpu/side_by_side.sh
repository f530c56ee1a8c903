#!/usr/bin/env bash
# roofline and llama.cpp side by side on the same synthetic GGUF files (MoE and Gemma 3), in two device
# calls made back to back (the machine stays warm, so the second reuses the first's llama.cpp build and
# files under the git-ignored build-sbs/):
#
#   here:   scripts/gpu/build_for_device.sh && tar cJf carry/pack/bin.tar.xz -C carry bin lib shared
#           (and carry/pack/llamacpp.tar.gz from scripts/gpu/pack_llamacpp.sh)
#   call 1: bash scripts/gpu/side_by_side.sh prep   (carry ["carry/pack"]): llama.cpp's build in the
#           background; the synthetic files written; the KL harness on the Gemma 3 and MoE fixtures
#           (roofline's and llama.cpp's conversions, CPU and GPU); roofline's benchmarks
#   call 2: bash scripts/gpu/side_by_side.sh bench : llama-bench / llama-batched-bench on the same files
#   or one call: bash scripts/gpu/side_by_side.sh final : llama.cpp's build in the background; every GPU test;
#           --cpu-moe against llama.cpp's -ncmoe on the same file; the KL harness on tiny Gemma 3, Qwen3-MoE and
#           Qwen3.5-MoE models made like a real model's initialisation (scripts/kl/make_kl_model.py --from); the
#           cost of structured output under load (tests/load/load.py with and without a json_object format)
# MODELS overrides the synthetic shapes (default "qwen3-30b-a3b gemma3-27b"); everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage="${1:-prep}"
out="${OUT:-/tmp/out}"
mkdir -p "$out" build-sbs
work=$PWD/build-sbs
[ -x carry/bin/roofline ] || tar xJf carry/pack/bin.tar.xz -C carry
bin=$PWD/carry/bin
lcpp=$work/lcpp
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/carry/lib"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/summary.md"; }
models="${MODELS:-qwen3-30b-a3b gemma3-27b}"
file_of() { echo "$work/$1-Q4_K_M.gguf"; }
is_moe() { case "$1" in *a3b*) return 0 ;; *) return 1 ;; esac; }

if [ "$stage" = prep ]; then
  stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cores, $($bin/roofline --version | head -1)"
  if [ ! -x "$lcpp/build/bin/llama-bench" ]; then
    ( bash scripts/gpu/build_llamacpp.sh carry/pack/llamacpp.tar.gz "$lcpp" > "$out/llamacpp_build.log" 2>&1 ) &
    bpid=$!
  fi
  for m in $models; do
    f=$(file_of "$m")
    [ -f "$f" ] || { stamp "synth $m"; "$bin/roofline" synth "$m:Q4_K_M" -o "$f" 2>&1 | tail -1; }
  done
  rb() { local f=$1; shift; stamp "roofline bench $(basename "$f") $*"; timeout 150 "$bin/roofline" bench -m "$f" "$@" 2>&1 | grep -E "^\||error" | tee -a "$out/summary.md"; }
  for m in $models; do
    f=$(file_of "$m")
    rb "$f" -p 512 -n 128 -r 2
    rb "$f" -p 128 -n 128 -npl 16,64 -r 1
    if is_moe "$m"; then rb "$f" -p 0 -n 32 -r 1 --cpu-moe; else rb "$f" -p 0 -n 128 -d 8192 -r 1; fi
  done
  # The fixtures of the KL harness: the Gemma 3 and MoE checkpoints (qwen35moe_bf16 borrows the tokenizer of
  # qwen35_bf16, the same 800-token vocabulary, which its folder does not repeat).
  mkdir -p "$work/fx"
  cp -r tests/fixtures/gemma3/gemma3_f32 tests/fixtures/gemma3/gemma3_vl_bf16 tests/fixtures/hf/qwen3moe_f32 \
        tests/fixtures/hf/qwen35moe_bf16 "$work/fx/"
  cp tests/fixtures/hf/qwen35_bf16/tokenizer.json tests/fixtures/hf/qwen35_bf16/tokenizer_config.json "$work/fx/qwen35moe_bf16/"
  if [ -n "${bpid:-}" ]; then stamp "waiting for llama.cpp"; wait "$bpid"; fi
  tail -2 "$out/llamacpp_build.log"
  stamp "KL"
  timeout 200 bash scripts/kl/run_kl.sh --roofline "$bin/roofline" --fixtures "$work/fx" --llamacpp "$lcpp" \
      --names "gemma3_f32 gemma3_vl_bf16 qwen3moe_f32 qwen35moe_bf16" --work "$work/kl" --out "$out" > "$out/kl_run.log" 2>&1
  stamp "KL exit $?"
  cat "$out/kl.md" >> "$out/summary.md" 2>/dev/null
  stamp "done"
fi

if [ "$stage" = bench ]; then
  lb() { local f=$1; shift; stamp "llama-bench $(basename "$f") $*"; timeout 150 "$lcpp/build/bin/llama-bench" -m "$f" -fa 1 "$@" 2>&1 | grep -E "^\||error" | tee -a "$out/summary.md"; }
  for m in $models; do
    f=$(file_of "$m")
    lb "$f" -ngl 99 -p 512 -n 128 -r 2
    if is_moe "$m"; then lb "$f" -ngl 99 -p 0 -n 32 -r 1 -ncmoe 99; else lb "$f" -ngl 99 -p 0 -n 128 -d 8192 -r 1; fi
    stamp "llama-batched-bench $m"
    timeout 200 "$lcpp/build/bin/llama-batched-bench" -m "$f" -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 \
        -npl 16,64 2>&1 | grep -E "^\|" | tee -a "$out/summary.md"
  done
  stamp "done"
fi

if [ "$stage" = final ]; then
  stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cores, $($bin/roofline --version | head -1)"
  if [ ! -x "$lcpp/build/bin/llama-bench" ]; then
    ( bash scripts/gpu/build_llamacpp.sh carry/pack/llamacpp.tar.gz "$lcpp" > "$out/llamacpp_build.log" 2>&1 ) &
    bpid=$!
  fi
  stamp "GPU tests"
  ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 200 "$bin/roofline_tests" --gtest_filter='Gpu*:*.Gpu*' \
      > "$out/gpu_tests.txt" 2>&1
  stamp "GPU tests exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests.txt" | head -30 | tee -a "$out/summary.md"
  mkdir -p "$work/fx"
  python3 scripts/kl/make_kl_model.py "$work/fx/gemma3_kl_f32" --from tests/fixtures/gemma3/gemma3_f32 > "$out/kl_models.log" 2>&1
  python3 scripts/kl/make_kl_model.py "$work/fx/qwen3moe_kl_f32" --from tests/fixtures/hf/qwen3moe_f32 >> "$out/kl_models.log" 2>&1
  python3 scripts/kl/make_kl_model.py "$work/fx/qwen35moe_kl_bf16" --from tests/fixtures/hf/qwen35moe_bf16 \
      --tokenizer-from tests/fixtures/hf/qwen35_bf16 >> "$out/kl_models.log" 2>&1
  tail -3 "$out/kl_models.log" | tee -a "$out/summary.md"
  f=$(file_of qwen3-30b-a3b)
  [ -f "$f" ] || { stamp "synth qwen3-30b-a3b"; "$bin/roofline" synth qwen3-30b-a3b:Q4_K_M -o "$f" 2>&1 | tail -1; }
  stamp "roofline MoE benches"
  timeout 90 "$bin/roofline" bench -m "$f" -p 512 -n 128 -r 2 2>&1 | grep -E "^\| qwen|error" | tee -a "$out/summary.md"
  timeout 90 "$bin/roofline" bench -m "$f" -p 128 -n 128 -npl 16,64 -r 1 2>&1 | grep -E "^\| qwen|error" | tee -a "$out/summary.md"
  timeout 90 "$bin/roofline" bench -m synthetic:qwen3.5-35b-a3b:Q4_K_M -p 512 -n 128 -r 1 2>&1 | grep -E "^\| qwen|error" | tee -a "$out/summary.md"
  stamp "roofline --cpu-moe"
  timeout 120 "$bin/roofline" bench -m "$f" -p 0 -n 32 -r 1 --cpu-moe 2>&1 | grep -E "^\| qwen|error" | tee -a "$out/summary.md"
  m8=$work/qwen3-8b-Q4_K_M.gguf
  [ -f "$m8" ] || "$bin/roofline" synth qwen3-8b:Q4_K_M -o "$m8" > /dev/null 2>&1
  for extra in "" '{"response_format":{"type":"json_object"}}'; do
    stamp "load 16 streams ${extra:-plain}"
    timeout 120 python3 tests/load/load.py --bin "$bin/roofline" --model "$m8" --server-args "-np 16 -c 8192 -ngl all" \
        --concurrency 16 ${extra:+--body-extra "$extra"} 2>&1 | grep -E "^\||failed|error" | tee -a "$out/summary.md"
  done
  if [ -n "${bpid:-}" ]; then stamp "waiting for llama.cpp"; wait "$bpid"; fi
  tail -1 "$out/llamacpp_build.log"
  stamp "llama-bench -ncmoe"
  timeout 120 "$lcpp/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 0 -n 32 -r 1 -ncmoe 99 2>&1 | grep -E "^\| qwen|error" | tee -a "$out/summary.md"
  stamp "KL"
  timeout 200 bash scripts/kl/run_kl.sh --roofline "$bin/roofline" --fixtures "$work/fx" --llamacpp "$lcpp" \
      --names "gemma3_kl_f32 qwen3moe_kl_f32 qwen35moe_kl_bf16" --work "$work/kl" --out "$out" > "$out/kl_run.log" 2>&1
  stamp "KL exit $?"
  cat "$out/kl.md" >> "$out/summary.md" 2>/dev/null
  stamp "done"
fi
