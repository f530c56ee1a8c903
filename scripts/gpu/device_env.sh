# Sourced by the device scripts in this folder, from the repository root: $out (OUT, default /tmp/out)
# exists; carry/pack/bin.tar.xz is unpacked into carry/ once; $bin is the carried binaries' folder
# (carry/bin, or CARRY_BIN); the carried shared libraries are on LD_LIBRARY_PATH; `stamp MSG` prints
# MSG with the seconds since the start and appends it to $out/$STAMP_FILE (default summary.txt).
out="${OUT:-/tmp/out}"
mkdir -p "$out"
bin="$PWD/${CARRY_BIN:-carry/bin}"
[ -x "$bin/roofline" ] || tar xJf carry/pack/bin.tar.xz -C carry
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/carry/lib"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/${STAMP_FILE:-summary.txt}"; }
# gpu_tests: every GPU test (or those of TESTS, a gtest filter; TESTS=none skips them) into $out/gpu_tests.txt, the
# verdict lines into the summary.
gpu_tests() {
  [ "${TESTS:-Gpu*:*.Gpu*}" = none ] && return
  CUDA_MODULE_LOADING=EAGER ROOFLINE_SHARED_DIR=carry/shared ROOFLINE_SOURCE_DIR="$PWD" timeout 240 "$bin/roofline_tests" \
      --gtest_filter="${TESTS:-Gpu*:*.Gpu*}" > "$out/gpu_tests.txt" 2>&1
  stamp "GPU tests exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure" "$out/gpu_tests.txt" | head -30 | tee -a "$out/${STAMP_FILE:-summary.txt}"
}
# start_llamacpp_build DIR: unless DIR has a llama.cpp build (or LLAMA=0), builds carry/pack/llamacpp.tar.gz there in the
# background (niced; the log in $out/llamacpp_build.log); $bpid is the job to wait for.
start_llamacpp_build() {
  if [ ! -x "$1/build/bin/llama-bench" ] && [ "${LLAMA:-1}" != 0 ]; then
    ( nice -n 10 bash scripts/gpu/build_llamacpp.sh carry/pack/llamacpp.tar.gz "$1" > "$out/llamacpp_build.log" 2>&1 ) &
    bpid=$!
  fi
}
# bench_row ARGS...: runs `ARGS` (a bench command line, environment settings first), prints its result rows as
# "tgN t/s roofline%;" per row, or "FAILED (exit N): <its last error line>" when it printed none (a crash, a bad
# setting), so that a variant that died shows as such in the summary.
bench_row() {
  local log="$out/bench_last.log" rows rc
  env "$@" > "$log" 2>&1
  rc=$?
  rows=$(grep -E "\| *(tg|pp)[0-9]" "$log" | awk -F'|' '{printf "%s%s %s;", $10, $11, $14}')
  if [ -n "$rows" ]; then echo "$rows"; else echo "FAILED (exit $rc): $(grep -v '^$' "$log" | tail -1)"; fi
}
