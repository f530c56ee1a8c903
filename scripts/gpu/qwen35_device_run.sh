#!/usr/bin/env bash
# Qwen3.5 on the GPU machine, in two device calls (the machine stays warm between them, so the second
# reuses the first's llama.cpp build and files under the git-ignored build-q35/):
#
#   here:   scripts/gpu/build_for_device.sh && scripts/gpu/pack_llamacpp.sh
#   call 1: bash scripts/gpu/qwen35_device_run.sh check   (carry ["carry"]): llama.cpp's build in the
#           background; the GPU tests; the KL harness (roofline's and llama.cpp's conversions of a tiny
#           Qwen3.5, CPU and GPU, and llama-perplexity's own number); roofline quantize against
#           llama-quantize on tiny-qwen35 (byte for byte)
#   call 2: bash scripts/gpu/qwen35_device_run.sh bench   : synthetic qwen3.5-27b Q4_K_M written once, then
#           roofline bench and llama-bench / llama-batched-bench on that same file, alternating
# Everything lands in $OUT (summary.md, logs, a tarball of small files worth keeping).
set -uo pipefail
cd "$(dirname "$0")/../.."
check_failed=0
stage="${1:-check}"
out="${OUT:-/tmp/out}"
mkdir -p "$out" build-q35
work=$PWD/build-q35
bin=$PWD/carry/bin
lcpp=$work/lcpp
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/carry/lib"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/summary.md"; }
exec > >(tee -a "$out/run.log") 2>&1

if [ "$stage" = check ]; then
  stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cores, $($bin/roofline --version | head -1)"
  bpid=""
  if [ ! -x "$lcpp/build/bin/llama-bench" ]; then
    ( bash scripts/gpu/build_llamacpp.sh carry/llamacpp.tar.gz "$lcpp" > "$out/llamacpp_build.log" 2>&1 ) &
    bpid=$!
  fi
  stamp "GPU tests"
  ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 330 "$bin/roofline_tests" \
      --gtest_filter='Gpu*:*.Gpu*:*GpuDeltaNet*:*GpuQwen35*' > "$out/gpu_tests.txt" 2>&1
  gpu_rc=$?
  stamp "GPU tests exit $gpu_rc"
  # A failing (or empty) GPU test run fails this script, after the rest of the check stage has run.
  { [ "$gpu_rc" -eq 0 ] && grep -q '^\[  PASSED  \] [1-9]' "$out/gpu_tests.txt"; } || check_failed=1
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|NMSE vs CPU|resumed|\[fixture, GPU\] qwen35|NMSE" "$out/gpu_tests.txt" | head -60
  python3 scripts/kl/make_kl_model.py "$work/fx/qwen35_kl_bf16" > "$out/kl_model.log" 2>&1 || { stamp "make_kl_model failed"; tail -20 "$out/kl_model.log"; }
  if [ -n "$bpid" ]; then stamp "waiting for llama.cpp"; wait "$bpid"; fi
  tail -3 "$out/llamacpp_build.log"
  stamp "KL"
  bash scripts/kl/run_kl.sh --roofline "$bin/roofline" --fixtures "$work/fx" --llamacpp "$lcpp" \
      --names "qwen35_kl_bf16 qwen35_bf16 qwen3_f32" --work "$work/kl" --out "$out" > "$out/kl_run.log" 2>&1
  stamp "KL exit $?"
  cat "$out/kl.md" >> "$out/summary.md" 2>/dev/null
  stamp "quantize: roofline vs llama-quantize on synthetic tiny-qwen35 F16"
  mkdir -p "$work/q"
  "$bin/roofline" synth tiny-qwen35:F16 -o "$work/q/tq35-F16.gguf" > /dev/null 2>&1
  for t in Q4_K_M Q5_K_M Q6_K Q8_0 Q4_K_S; do
    "$lcpp/build/bin/llama-quantize" "$work/q/tq35-F16.gguf" "$work/q/lcpp-$t.gguf" "$t" > "$work/q/lq-$t.log" 2>&1
    "$bin/roofline" quantize "$work/q/tq35-F16.gguf" "$work/q/ours-$t.gguf" "$t" > "$work/q/rq-$t.log" 2>&1
    if cmp -s "$work/q/lcpp-$t.gguf" "$work/q/ours-$t.gguf"; then r="byte-identical"; else r="DIFFERENT ($(cmp "$work/q/lcpp-$t.gguf" "$work/q/ours-$t.gguf" 2>&1 | head -1))"; fi
    echo "| tiny-qwen35 $t | $(stat -c %s "$work/q/lcpp-$t.gguf" 2>/dev/null) | $(stat -c %s "$work/q/ours-$t.gguf" 2>/dev/null) | $r |" | tee -a "$out/summary.md"
  done
  tar czf "$out/keep.tar.gz" -C "$work/q" lcpp-Q4_K_M.gguf lcpp-Q8_0.gguf 2>/dev/null
  stamp "done"
fi

if [ "$stage" = bench ]; then
  model=$work/qwen3.5-27b-Q4_K_M.gguf
  [ -f "$model" ] || { stamp "synth"; "$bin/roofline" synth qwen3.5-27b:Q4_K_M -o "$model" 2>&1 | tail -1; }
  rb() { stamp "roofline bench $*"; timeout 200 "$bin/roofline" bench -m "$model" "$@" 2>&1 | grep -E "^\|" | tee -a "$out/summary.md"; }
  lb() { stamp "llama-bench $*"; timeout 200 "$lcpp/build/bin/llama-bench" -m "$model" -ngl 99 -fa 1 "$@" 2>&1 | grep -E "^\|" | tee -a "$out/summary.md"; }
  rb -p 512 -n 128 -r 3
  lb -p 512 -n 128 -r 3
  rb -p 0 -n 128 -d 8192 -r 2
  lb -p 0 -n 128 -d 8192 -r 2
  rb -p 128 -n 128 -npl 16,64 -r 1
  stamp "llama-batched-bench"
  timeout 240 "$lcpp/build/bin/llama-batched-bench" -m "$model" -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 \
      -npl 16,64 2>&1 | grep -E "^\|" | tee -a "$out/summary.md"
  stamp "done"
fi
if [ "$check_failed" -ne 0 ]; then
  stamp "FAILED: the GPU tests (gpu_tests.txt)"
  exit 1
fi
