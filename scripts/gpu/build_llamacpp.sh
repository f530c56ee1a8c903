#!/usr/bin/env bash
# Builds llama.cpp on the GPU machine from the tarball of scripts/gpu/pack_llamacpp.sh: llama-bench,
# llama-perplexity, llama-batched-bench, llama-quantize and llama-cli with CUDA for sm_90 (H200), all cores.
#
#   bash scripts/gpu/build_llamacpp.sh carry/llamacpp.tar.gz /tmp/lcpp [CUDA_ARCH (default 90; "cpu": no CUDA)]
#
# Unpacks to WORK/llama.cpp, builds in WORK/build (binaries in WORK/build/bin), writes WORK/env.sh
# (LLAMACPP_SRC, LLAMACPP_BIN, PYTHONPATH with gguf-py for convert_hf_to_gguf.py) and prints the binaries' paths.
# The build log is WORK/build.log (its tail is printed on failure). A second run with the same WORK reuses the
# build. CONFIGURE_ONLY=1 stops after cmake's configure step. On 16 cores the CUDA build takes a few minutes (141 nvcc units for sm_90, ~20-35 s each); it can run in
# the background while scripts/fixtures/make_fixtures.py works:
#
#   bash scripts/gpu/build_llamacpp.sh carry/llamacpp.tar.gz /tmp/lcpp > $OUT/llamacpp_build.log 2>&1 &
#   ... ; wait
#   source /tmp/lcpp/env.sh; python3 $LLAMACPP_SRC/convert_hf_to_gguf.py HF_DIR --outfile X.gguf --outtype bf16
#
# CMake options (checked against the 2026-08-18 snapshot's CMakeLists): GGML_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=90,
# LLAMA_BUILD_UI=OFF + LLAMA_USE_PREBUILT_UI=OFF (no web UI, no download), LLAMA_BUILD_TESTS/EXAMPLES/APP=OFF
# (those folders are not packed), LLAMA_OPENSSL=OFF (no HTTPS), GGML_CUDA_NCCL=OFF (one GPU; no libnccl needed).
# LLAMA_CURL is deprecated there (a no-op with a warning) and not passed.
set -euo pipefail
tarball="${1:?usage: build_llamacpp.sh TARBALL WORKDIR [CUDA_ARCH|cpu]}"
work="${2:?usage: build_llamacpp.sh TARBALL WORKDIR [CUDA_ARCH|cpu]}"
arch="${3:-90}"
[ -f "$tarball" ] || { echo "build_llamacpp.sh: no tarball $tarball (make it with scripts/gpu/pack_llamacpp.sh)" >&2; exit 2; }
mkdir -p "$work"
work="$(cd "$work" && pwd)"
t0=$(date +%s)
if [ ! -f "$work/llama.cpp/CMakeLists.txt" ] || [ "$tarball" -nt "$work/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$work/llama.cpp"
  tar -xzf "$tarball" -C "$work"
  touch "$work/llama.cpp/CMakeLists.txt"
fi
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
opts=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF)
if [ "$arch" = cpu ]; then
  opts+=(-DGGML_CUDA=OFF)
else
  command -v nvcc > /dev/null || { echo "build_llamacpp.sh: nvcc not found (PATH=$PATH)" >&2; exit 2; }
  opts+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_CUDA_NCCL=OFF)
fi
targets=(llama-bench llama-perplexity llama-batched-bench llama-quantize llama-cli)
jobs=$(nproc)
{
  echo "== cmake ${opts[*]}"
  cmake -S "$work/llama.cpp" -B "$work/build" "${gen[@]}" "${opts[@]}"
  if [ -z "${CONFIGURE_ONLY:-}" ]; then
    echo "== build ${targets[*]} with $jobs jobs"
    cmake --build "$work/build" -j "$jobs" --target "${targets[@]}"
  fi
} > "$work/build.log" 2>&1 || { echo "build_llamacpp.sh: build failed; the end of $work/build.log:" >&2; tail -40 "$work/build.log" >&2; exit 1; }
if [ -n "${CONFIGURE_ONLY:-}" ]; then echo "configured $work/build (CONFIGURE_ONLY set: not built)"; exit 0; fi
cat > "$work/env.sh" <<EOF
export LLAMACPP_SRC="$work/llama.cpp"
export LLAMACPP_BIN="$work/build/bin"
export PYTHONPATH="$work/llama.cpp/gguf-py:\${PYTHONPATH:-}"
EOF
echo "llama.cpp built in $(( $(date +%s) - t0 )) s (arch $arch); source $work/env.sh for LLAMACPP_SRC/LLAMACPP_BIN/PYTHONPATH"
for t in "${targets[@]}"; do
  if [ -x "$work/build/bin/$t" ]; then echo "$work/build/bin/$t"; else echo "MISSING $work/build/bin/$t" >&2; exit 1; fi
done
echo "$work/llama.cpp/convert_hf_to_gguf.py"
