#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/libfuzzer/fuzz_*.cpp) with Clang under ASan/UBSan and runs each for
# FUZZ_SECONDS (default 120) in one process, from seed inputs written here plus the corpus kept in FUZZ_DIR
# (default build-fuzz/corpus). A target that finds a crash, a hang or a defect stops with the input in
# FUZZ_DIR/artifacts; this script then exits 1. Usage: scripts/fuzz.sh [TARGET ...]   (default: all)
# Not part of scripts/test (it takes as long as you give it); a crash found here becomes a unit test.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz
dir="${FUZZ_DIR:-$build/corpus}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"  # absolute: fuzz_cli runs the commands in a folder of its own
seconds="${FUZZ_SECONDS:-120}"  # not SECONDS: bash keeps its own (the shell's age) in that name
command -v clang++ > /dev/null || { echo "fuzz.sh: clang++ is needed (apt-get install clang)"; exit 2; }
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
      -DROOFLINE_LIBFUZZER=ON -DROOFLINE_TESTS=OFF > /dev/null
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_gbnf fuzz_json_schema fuzz_jinja fuzz_tool_calls fuzz_safetensors fuzz_chat_request
                                    fuzz_tokenize fuzz_vocab fuzz_tokenizer_files fuzz_model_file fuzz_generate fuzz_convert fuzz_imatrix fuzz_cli)
ninja -C "$build" "${targets[@]}"
python3 tests/fuzz/libfuzzer/seeds.py "$dir"  # also unpacks ../shared's tokenizers into $dir/tokenizers
export ROOFLINE_FUZZ_TOKENIZERS="$dir/tokenizers"
export ROOFLINE_FUZZ_FIXTURES="$PWD/tests/fixtures"  # fuzz_convert's Hugging Face folders
mkdir -p "$dir/artifacts"
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$dir/$t"
  echo "== $t, ${seconds}s"
  if ! "$build/$t" "$dir/$t" "$dir/seeds-$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
       -artifact_prefix="$dir/artifacts/$t-" -print_final_stats=1 > "$dir/$t.log" 2>&1; then
    failed=1
    echo "$t: FOUND A DEFECT (log $dir/$t.log, input $dir/artifacts/$t-*)"
    grep -m3 -E "DEFECT|ERROR: |runtime error" "$dir/$t.log" || true
  fi
  grep -h -m1 "stat::number_of_executed_units" "$dir/$t.log" || true
done
exit "$failed"
