#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's command): checks the carried binaries, runs the GPU tests,
# then the benchmarks of docs/performance.md, writing everything under $OUT.
# Build here first:  scripts/gpu/build_for_device.sh   (puts binaries in carry/bin)
# Then, with the device tool: command "scripts/gpu/device_run.sh [quick|profile|full|extras|serve|split]",
# carry ["carry"] (split: on the nvidia-h200-x2 kind).
# Exit status: 1 when a GPU test run failed (non-zero exit, or no test ran), after everything else has
# run and been written; benchmarks that fail are reported in bench.log and in the last lines.
set -uo pipefail
mode="${1:-full}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
bin=carry/bin
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/carry/lib"
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
  ldd "$bin/roofline" | grep -E "not found|cuda|cublas" || true
  "$bin/roofline" --version
  which node python3; node --version 2>/dev/null
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# Gpu*: the kernel and engine tests; *.Gpu*: the transformers fixtures on the GPU (they read tests/fixtures
# of this checkout, hence ROOFLINE_SOURCE_DIR).
[ "$mode" = extras ] || ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 300 "$bin/roofline_tests" \
    --gtest_filter='Gpu*:*.Gpu*' > "$out/gpu_tests.txt" 2>&1
gpu_rc=$?
failed=()
check_tests() {  # name, exit status, log: a failing or empty gtest run fails the whole script
  if [ "$2" -ne 0 ] || ! grep -q '^\[  PASSED  \] [1-9]' "$3"; then failed+=("$1 (exit $2)"); fi
}
if [ "$mode" != extras ]; then
  echo "gpu tests exit $gpu_rc"; tail -30 "$out/gpu_tests.txt"
  check_tests "GPU tests" "$gpu_rc" "$out/gpu_tests.txt"
fi

bench_failed=()
run_bench() {  # name, args...
  local name="$1"; shift
  echo "== bench $name: $*" | tee -a "$out/bench.log"
  timeout "${BENCH_TIMEOUT:-170}" "$bin/roofline" bench "$@" -o json > "$out/bench_$name.json" 2>> "$out/bench.log"
  local rc=$?
  echo "exit $rc" >> "$out/bench.log"
  [ "$rc" -eq 0 ] || bench_failed+=("$name (exit $rc)")
  python3 - "$out/bench_$name.json" <<'PY' | tee -a "$out/bench.md"
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result:", e); sys.exit(0)
for r in rows:
    print(f"| {r['model_type']} | {r['backends']} ngl {r['n_gpu_layers']} | {r['type_k']}/{r['type_v']} | {r['test']} | "
          f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {r['gbps']:.0f} | {r['roofline_ts']:.1f} | {r['roofline_pct']:.0f}% | {r['tflops']:.1f} |")
PY
}

if [ "$mode" = profile ] || [ "$mode" = full ]; then
  prof() {  # title, bench args...
    local title="$1"; shift
    echo "== profile $title: $*" | tee -a "$out/profile.md"
    timeout 150 "$bin/roofline" bench "$@" -r 1 --no-warmup --profile 2>&1 | grep -E '^\||^per-op' >> "$out/profile.md"
  }
  prof "8b decode" -m synthetic:qwen3-8b:Q4_K_M -p 0 -n 8
  prof "32b decode" -m synthetic:qwen3-32b:Q4_K_M -p 0 -n 8
  prof "32b prefill 512" -m synthetic:qwen3-32b:Q4_K_M -p 512 -n 0
  prof "32b 16 parallel" -m synthetic:qwen3-32b:Q4_K_M -p 16 -n 4 -npl 16
  prof "32b 64 parallel" -m synthetic:qwen3-32b:Q4_K_M -p 16 -n 4 -npl 64
  cat "$out/profile.md"
fi
if [ "$mode" = full ] || [ "$mode" = quick ] || [ "$mode" = profile ]; then
  run_bench q8b -m synthetic:qwen3-8b:Q4_K_M -p 512 -n 128 -r 2
  run_bench q32b -m synthetic:qwen3-32b:Q4_K_M -p 512 -n 128 -r 2
fi
if [ "$mode" = full ] || [ "$mode" = extras ]; then
  run_bench q32b_d8192 -m synthetic:qwen3-32b:Q4_K_M -p 0 -n 128 -d 8192 -r 2
  run_bench q32b_kvq8 -m synthetic:qwen3-32b:Q4_K_M -p 512 -n 128 -ctk q8_0 -ctv q8_0 -r 2
  run_bench q32b_ngl48 -m synthetic:qwen3-32b:Q4_K_M -p 0 -n 32 -ngl 48 -r 2
  run_bench q32b_npl -m synthetic:qwen3-32b:Q4_K_M -p 128 -n 128 -npl 1,4,16,64 -r 1
fi
if [ "$mode" = split ]; then
  # Several GPUs (kind nvidia-h200-x2): layer split against one GPU, and a model over one GPU's limit.
  export NCCL_NVLS_ENABLE=0
  ROOFLINE_SHARED_DIR=carry/shared timeout 150 "$bin/roofline_tests" --gtest_filter='GpuEngine*Split*:GpuEngine*Vram*' > "$out/gpu_split_tests.txt" 2>&1
  split_rc=$?
  cat "$out/gpu_split_tests.txt" >> "$out/gpu_tests.txt"
  echo "gpu split tests exit $split_rc"
  check_tests "GPU split tests" "$split_rc" "$out/gpu_split_tests.txt"
  run_bench q32b_sm_none -m synthetic:qwen3-32b:Q4_K_M -p 512 -n 128 -r 2 -sm none
  run_bench q32b_sm_layer -m synthetic:qwen3-32b:Q4_K_M -p 512 -n 128 -r 2 -sm layer
  run_bench q32b_q8_vram24 -m synthetic:qwen3-32b:Q8_0 -p 512 -n 128 -r 2 --vram-limit 24
fi
if [ "$mode" = full ] || [ "$mode" = serve ]; then
  # The server under load (tests/load/load.py): generated tok/s at 1, 16 and 64 concurrent streams.
  echo "== serve load: synthetic:qwen3-32b:Q4_K_M" | tee -a "$out/serve.md"
  timeout 400 python3 tests/load/load.py --bin "$bin/roofline" --model synthetic:qwen3-32b:Q4_K_M \
      --server-args "-np 64 -c 32768 -ngl all -b 2048" --concurrency 1,16,64 --prompt-tokens 128 --max-tokens 128 \
      --per-stream 1 --json "$out/serve_load.json" 2>&1 | tee -a "$out/serve.md"
fi
touch "$out/bench.log"; tail -5 "$out/bench.log"
[ ${#bench_failed[@]} -eq 0 ] || echo "benchmarks that failed: ${bench_failed[*]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "device_run.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "device_run.sh: GPU tests passed"
