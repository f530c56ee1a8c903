#!/usr/bin/env bash
# -sm row on the GPU machine (issue #21), from the repository root with carry/pack carried: the tensor-parallel
# GPU tests, then bench of -sm row against one GPU (-sm none), alternated ROUNDS times, and a server load run
# on -sm row (tests/load/load.py: no request may fail). DEVICES picks the GPUs of the split: CUDA0,CUDA1 on a
# two-GPU machine (the default when it has two), CUDA0,CUDA0 on one (two ranks sharing the GPU, kernels loaded eagerly: a check that
# the split runs and serves, not a speed). MODEL (synthetic:qwen3-32b:Q4_K_M), ROUNDS (2).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
export NCCL_NVLS_ENABLE=0
n_gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
devices="${DEVICES:-$([ "$n_gpus" -ge 2 ] && echo CUDA0,CUDA1 || echo CUDA0,CUDA0)}"
model="${MODEL:-synthetic:qwen3-32b:Q4_K_M}"
stamp "GPUs: $n_gpus; -sm row over $devices; $model"
CUDA_MODULE_LOADING=EAGER ROOFLINE_SHARED_DIR=carry/shared timeout 300 "$bin/roofline_tests" --gtest_filter='GpuTensorParallel*:TensorParallel*' \
    > "$out/tp_tests.txt" 2>&1
stamp "tensor-parallel tests exit $?"
grep -E "NMSE|^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/tp_tests.txt" | tee -a "$out/summary.txt"
for round in $(seq "${ROUNDS:-2}"); do
  for mode in none row; do
    args=(-sm none)
    [ $mode = row ] && args=(-sm row -dev "$devices")
    timeout 90 "$bin/roofline" bench -m "$model" -p 512 -n 128 -r 2 "${args[@]}" > "$out/bench_${mode}_$round.txt" 2> "$out/bench_${mode}_$round.err"
    stamp "round $round -sm $mode: exit $? $(grep -E 'pp512|tg128' "$out/bench_${mode}_$round.txt" | awk -F'|' '{printf "%s %s (%s); ", $(NF-5), $(NF-4), $(NF-1)}')"
  done
done
grep -iE "row|GPU" "$out/bench_row_1.err" | head -8 | tee -a "$out/summary.txt"
timeout 200 python3 tests/load/load.py --bin "$bin/roofline" --model "$model" \
    --server-args "-np 16 -c 8192 -ngl all -sm row -dev $devices" --concurrency 1,16 --prompt-tokens 128 --max-tokens 128 \
    --per-stream 1 --json "$out/serve_row.json" > "$out/serve_row.txt" 2>&1
stamp "serve -sm row load run exit $?"
tail -8 "$out/serve_row.txt" | tee -a "$out/summary.txt"
