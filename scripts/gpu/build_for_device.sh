#!/usr/bin/env bash
# Builds roofline and its tests with the CUDA backend for the GPU machine (sm_90 by default) and puts
# the binaries, plus the shared test data the GPU tests read, in carry/ (git-ignored) for the device tool.
set -euo pipefail
cd "$(dirname "$0")/../.."
arch="${1:-90}"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DROOFLINE_CUDA=ON -DROOFLINE_CUDA_ARCHITECTURES="$arch" \
      -DROOFLINE_SANITIZE_FUZZ=OFF > /dev/null
cmake --build build-device -j "$(nproc)" --target roofline roofline_tests
mkdir -p carry/bin
cp build-device/roofline build-device/tests/roofline_tests carry/bin/
strip carry/bin/roofline carry/bin/roofline_tests
if [ -d ../shared/testdata ]; then
  mkdir -p carry/shared/testdata/models
  cp -r ../shared/testdata/models/stories260K carry/shared/testdata/models/ 2>/dev/null || true
fi
# Debian's cpp-httplib is a shared library the GPU machine lacks: carry it (and brotli, which it links).
mkdir -p carry/lib
for lib in $(ldd carry/bin/roofline | awk '/libcpp-httplib|libbrotli/ {print $3}'); do cp -L "$lib" carry/lib/; done
du -sh carry
ldd carry/bin/roofline | grep -v -E "linux-vdso|libc.so|libm.so|libgcc|libstdc|ld-linux|libpthread|libdl|librt" || true
