#!/usr/bin/env bash
# Packs what building llama.cpp's llama-bench, llama-perplexity, llama-batched-bench, llama-quantize and llama-cli
# (CUDA or CPU) and running its convert_hf_to_gguf.py needs into one tarball for the GPU machine (which cannot
# fetch anything); scripts/gpu/build_llamacpp.sh builds it there.
#
#   bash scripts/gpu/pack_llamacpp.sh [LLAMACPP_SRC (default /work/llama.cpp)] [OUT (default carry/llamacpp.tar.gz)]
#
# Kept: CMakeLists.txt, LICENSE, licenses/, cmake/, ggml/ (without the backends not built: SYCL, Vulkan, OpenCL,
# Metal, CANN, Hexagon, WebGPU, OpenVINO, ET, VirtGPU, zDNN, ZenDNN), src/, include/, common/, tools/ (the web UI's
# sources, tests and docs left out: its CMake is kept and, with -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF,
# provisions no assets), vendor/, scripts/*.cmake (tools/ui's CMake runs scripts/ui-assets.cmake), gguf-py/ (no
# tests), conversion/, convert_hf_to_gguf.py, requirements.txt. Everything unpacks under llama.cpp/.
set -euo pipefail
cd "$(dirname "$0")/../.."
src="${1:-/work/llama.cpp}"
out="${2:-carry/llamacpp.tar.gz}"
[ -f "$src/CMakeLists.txt" ] && [ -f "$src/convert_hf_to_gguf.py" ] || { echo "pack_llamacpp.sh: $src is not llama.cpp's source" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
keep=(CMakeLists.txt LICENSE licenses cmake ggml src include common tools vendor gguf-py conversion convert_hf_to_gguf.py
      requirements.txt)
present=()
for k in "${keep[@]}"; do
  if [ -e "$src/$k" ]; then present+=("llama.cpp/$k"); else echo "pack_llamacpp.sh: note: $src/$k is absent" >&2; fi
done
for f in "$src"/scripts/*.cmake; do [ -e "$f" ] && present+=("llama.cpp/scripts/$(basename "$f")"); done
excludes=()
for b in sycl vulkan opencl metal cann hexagon webgpu openvino et virtgpu zdnn zendnn; do
  excludes+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
for d in src static docs tests scripts node_modules dist public build; do excludes+=(--exclude="llama.cpp/tools/ui/$d"); done
excludes+=(--exclude="llama.cpp/tools/ui/package.json" --exclude="llama.cpp/tools/ui/package-lock.json")
excludes+=(--exclude="llama.cpp/gguf-py/tests" --exclude="__pycache__" --exclude="*.pyc" --exclude=".git*")
parent="$(cd "$src/.." && pwd)"
name="$(basename "$(cd "$src" && pwd)")"
if [ "$name" = llama.cpp ]; then
  tar -czf "$out" -C "$parent" "${excludes[@]}" "${present[@]}"
else  # stage under the name llama.cpp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  ln -s "$(cd "$src" && pwd)" "$tmp/llama.cpp"
  tar -czhf "$out" -C "$tmp" "${excludes[@]}" "${present[@]}"
fi
size=$(stat -c %s "$out")
echo "wrote $out: $((size / 1024 / 1024)) MiB ($size bytes), $(tar -tzf "$out" | wc -l) entries"
if [ "$size" -gt $((30 * 1024 * 1024)) ]; then echo "pack_llamacpp.sh: over 30 MiB" >&2; exit 1; fi
