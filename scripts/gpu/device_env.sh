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
