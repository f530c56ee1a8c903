#!/usr/bin/env bash
# Issue #18's bars on the GPU machine's host CPU: roofline and a CPU build of llama.cpp's llama-bench on
# the same synthetic files, no GPU visible to either (CUDA_VISIBLE_DEVICES=), at 4 and 16 threads, through
# scripts/cpu_side_by_side.sh; then roofline's partial offload, qwen3-32b Q4_K_M -ngl 48 (the host CPU
# runs 17 of 65 units; llama.cpp's 12.7 tok/s is in ../shared/reference/performance-targets.md).
#
#   here:  scripts/gpu/build_for_device.sh && (cd carry && XZ_OPT="-9 -T2" tar cJf pack/bin.tar.xz bin/roofline lib shared)
#          (roofline alone, ~23 MB: with the tests' binary the pack and llama.cpp's tarball no longer fit one call's carry)
#          and carry/pack/llamacpp.tar.gz from scripts/gpu/pack_llamacpp.sh
#   there: bash scripts/gpu/cpu_host_check.sh small   (carry ["carry/pack"]): qwen3-1.7b
#          bash scripts/gpu/cpu_host_check.sh large   : qwen3-8b, then -ngl 48
#          SHAPES and MIXES override the models and mixes (e.g. SHAPES=qwen3-0.6b MIXES="F16 BF16" ... small)
# Each stage fits one 10-minute call; the second reuses the first's llama.cpp build and files when the
# machine is still warm (WORK, default /tmp/cpu-host). Results: $OUT/cpu_host.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage="${1:-small}"
STAMP_FILE=cpu_host.md
source scripts/gpu/device_env.sh
work="${WORK:-/tmp/cpu-host}"
mkdir -p "$work"
lb="$work/lcpp/build/bin/llama-bench"
stamp "stage $stage: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $("$bin/roofline" --version | head -1)"
if [ ! -x "$lb" ]; then
  stamp "building llama.cpp (CPU)"
  bash scripts/gpu/build_llamacpp.sh carry/pack/llamacpp.tar.gz "$work/lcpp" cpu > "$out/llamacpp_cpu_build.log" 2>&1 ||
    { stamp "llama.cpp CPU build failed (tail of its log follows)"; tail -20 "$out/llamacpp_cpu_build.log" | tee -a "$out/cpu_host.md"; exit 1; }
fi
shapes=qwen3-1.7b reps=2
[ "$stage" = large ] && shapes=qwen3-8b reps=1
shapes="${SHAPES:-$shapes}" mixes="${MIXES:-Q4_K_M Q8_0 Q4_0}"
for t in 4 16; do
  stamp "side by side, $t threads, $shapes"
  CUDA_VISIBLE_DEVICES= THREADS=$t WORK="$work" ROOFLINE="$bin/roofline" R=$reps \
    timeout 280 bash scripts/cpu_side_by_side.sh "$lb" "$shapes" "$mixes" 2>&1 | tee -a "$out/cpu_host.md"
done
if [ "$stage" = large ]; then
  stamp "partial offload: qwen3-32b Q4_K_M -ngl 48"
  timeout 200 "$bin/roofline" bench -m synthetic:qwen3-32b:Q4_K_M -ngl 48 -p 0 -n 32 -r 2 2>&1 | grep -E "^\||error" | tee -a "$out/cpu_host.md"
fi
stamp "done"
