#!/usr/bin/env bash
# Where a batched decode step (`-npl 16/64`) goes: the per-op table of `bench --profile` (graphs off) for
# steps of 16 and 64 rows, then the tensor-core products of such steps under ncu (speed of light,
# occupancy, warp stalls, memory and compute workload), so the limit of the batched product is read,
# not guessed.
#   here:   scripts/gpu/build_for_device.sh && (cd carry && tar cJf pack/bin.tar.xz bin lib shared)
#   device: bash scripts/gpu/batched_diag.sh   (carry ["carry/pack"]; MODEL, NPL, ENVS); results in $OUT
# ENVS: settings to run the profile under beside the default (VAR=VALUE lists joined by commas); PROFILE=0
# runs only the ncu part (decode steps from depth 0: -p 0).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
m="${MODEL:-qwen3-32b}"
[ "${PROFILE:-1}" = 0 ] && ENVS="" && skip_profile=1
for setting in $([ -n "${skip_profile:-}" ] || echo default) ${ENVS:-}; do
  envs=()
  [ "$setting" = default ] || IFS=, read -r -a envs <<< "$setting"
  tag="${setting//[^A-Za-z0-9]/_}"
  env "${envs[@]}" timeout 300 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 128 -n 32 -npl "${NPL:-16,64}" -r 1 \
    > "$out/npl_$tag.txt" 2> "$out/profile_$tag.txt"
  stamp "npl $m ($setting): exit $?"
  grep -E "^\| " "$out/npl_$tag.txt" | tee -a "$out/summary.txt"
  env "${envs[@]}" timeout 300 "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 16 -n 8 -npl "${NPL:-16,64}" -r 1 --profile \
    > /dev/null 2>> "$out/profile_$tag.txt"
  stamp "profile $m ($setting): exit $?"
done
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[ -n "$ncu_bin" ] || { stamp "no ncu"; exit 0; }
for np in ${NCU_NPL:-16 64}; do
  ROOFLINE_NO_CUDA_GRAPHS=1 timeout 240 "$ncu_bin" --clock-control none --kernel-name regex:mma_rows \
    --launch-skip "${SKIP:-40}" --launch-count "${COUNT:-6}" \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats --section SchedulerStats --print-details all \
    "$bin/roofline" bench -m "synthetic:$m:Q4_K_M" -p 0 -n 4 -npl "$np" -r 1 --no-warmup > "$out/ncu_npl$np.txt" 2>&1
  stamp "ncu npl $np exit $? ($(wc -l < "$out/ncu_npl$np.txt") lines)"
done
