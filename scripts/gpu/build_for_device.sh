#!/usr/bin/env bash
# Builds roofline and its tests with the CUDA backend for the GPU machine (sm_90a by default: the wgmma kernels need it) and puts
# the binaries, plus the shared test data the GPU tests read, in carry/ (git-ignored) for the device tool, and (sm_90a) one
# pack of both in carry/packs (below).
# Usage: build_for_device.sh [ARCH]. Another architecture list builds in build-device-ARCH and puts its
# binaries in carry/bin-ARCH (e.g. `75-virtual`: PTX only, which the H200's driver JIT-compiles, so the
# GPU tests run the kernels' sm_75 branches there).
set -euo pipefail
cd "$(dirname "$0")/../.."
arch="${1:-90a}"
build=build-device bin=carry/bin
if [ "$arch" != 90a ]; then
  build="build-device-${arch//;/_}" bin="carry/bin-${arch//;/_}"
fi
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DROOFLINE_CUDA=ON -DROOFLINE_CUDA_ARCHITECTURES="$arch" \
      -DROOFLINE_SANITIZE_FUZZ=OFF > /dev/null
cmake --build "$build" -j "$(nproc)" --target roofline roofline_tests
mkdir -p "$bin"
cp "$build/roofline" "$build/tests/roofline_tests" "$bin/"
strip "$bin/roofline" "$bin/roofline_tests"
if [ -d ../shared/testdata ]; then
  mkdir -p carry/shared/testdata/models
  cp -r ../shared/testdata/models/stories260K carry/shared/testdata/models/ 2>/dev/null || true
fi
# Debian's cpp-httplib is a shared library the GPU machine lacks: carry it (and brotli, which it links).
mkdir -p carry/lib
for lib in $(ldd "$bin/roofline" | awk '/libcpp-httplib|libbrotli/ {print $3}'); do cp -L "$lib" carry/lib/; done
# The kernel timeline tool (bench/gpu_kernel_trace.cpp, scripts/gpu/timeline.sh) where CUPTI is installed, with the
# CUPTI library it was built against (the GPU machine's toolkit may not have it).
cuda_root="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
if [ "$arch" = 90a ] && [ -f "$cuda_root/include/cupti.h" ]; then
  cupti_lib="$(ls "$cuda_root"/lib/libcupti.so.* "$cuda_root"/lib64/libcupti.so.* "$cuda_root"/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null | head -1 || true)"
  if [ -n "$cupti_lib" ]; then
    g++ -O2 -shared -fPIC -std=c++17 bench/gpu_kernel_trace.cpp -I"$cuda_root/include" -L"$(dirname "$cupti_lib")" -lcupti \
        -o "$bin/libkernel_trace.so"
    cp -L "$cupti_lib" carry/lib/
  fi
fi
# The device tool carries at most 64 MiB with the tracked tree (~35 MiB), so the binaries travel packed: carry/packs/all.tar.xz
# holds roofline, roofline_tests, the trace library, the libraries and the test data in one xz stream at -9, whose 64 MiB
# window finds the two binaries' common code (~26 MiB where each alone packs to ~24). Copy it (or bench.tar.xz / tests.tar.xz,
# one binary each, PACKS=2) to carry/pack/bin.tar.xz, which device_env.sh unpacks, and carry ["carry/pack/bin.tar.xz"]. PACKS=0
# skips them.
if [ "$arch" = 90a ] && [ "${PACKS:-1}" != 0 ]; then
  mkdir -p carry/packs
  extra=()
  [ -f "$bin/libkernel_trace.so" ] && extra=(bin/libkernel_trace.so)
  (cd carry && tar cf - bin/roofline bin/roofline_tests "${extra[@]}" lib shared | xz -9 -T1 > packs/all.tar.xz)
  if [ "${PACKS:-1}" = 2 ]; then
    (cd carry && tar cJf packs/bench.tar.xz bin/roofline "${extra[@]}" lib shared && tar cJf packs/tests.tar.xz bin/roofline_tests lib shared)
  fi
  ls -l carry/packs
fi
du -sh carry
ldd "$bin/roofline" | grep -v -E "linux-vdso|libc.so|libm.so|libgcc|libstdc|ld-linux|libpthread|libdl|librt" || true
