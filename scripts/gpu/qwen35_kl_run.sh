#!/usr/bin/env bash
# The Qwen3.5 fixtures and the KL-divergence comparison (roofline vs llama.cpp vs transformers) as ONE device call.
#
# Here, first:
#   bash scripts/gpu/build_for_device.sh          # roofline (CUDA) -> carry/bin, carry/lib
#   bash scripts/gpu/pack_llamacpp.sh             # llama.cpp's source -> carry/llamacpp.tar.gz (~5 MiB)
# Then the device tool: run, kind nvidia-h200, carry ["carry"], timeout_s 600, command
#   bash scripts/gpu/qwen35_kl_run.sh
# which does, from the repository root (work under the git-ignored build-qwen35kl/, kept while the machine
# stays warm, so a second call after a timeout reuses the llama.cpp build and, with SKIP_FIXTURES=1, the fixtures):
#   bash scripts/gpu/build_llamacpp.sh carry/llamacpp.tar.gz build-qwen35kl/lcpp > $OUT/llamacpp_build.log 2>&1 &
#   python3 scripts/fixtures/make_fixtures.py --out $OUT --work build-qwen35kl/fx --threads 4 \
#       --only qwen35_f32,qwen35_bf16,qwen35_vl_bf16
#   wait
#   bash scripts/kl/run_kl.sh --roofline carry/bin/roofline --fixtures build-qwen35kl/fx/fixtures/hf \
#       --llamacpp build-qwen35kl/lcpp --work build-qwen35kl/kl --out $OUT
# $OUT gets 7 files (the tool returns at most 8): fixtures.tar.gz + summary.json (unpack the tarball into tests/),
# llamacpp_build.log, kl.md + kl.json + kl_logs.tar.gz, run.log (everything printed).
# Expected time: llama.cpp's CUDA build ~4-6 min on 16 cores (in parallel with the fixtures, ~1-2 min), then
# ~1-2 min of KL runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/out}"
mkdir -p "$out" build-qwen35kl
export PYTHONUNBUFFERED=1
exec > >(tee -a "$out/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
stamp "start; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $(nproc) cores"
lcpp_ok=1
if [ -f carry/llamacpp.tar.gz ]; then
  ( bash scripts/gpu/build_llamacpp.sh carry/llamacpp.tar.gz build-qwen35kl/lcpp > "$out/llamacpp_build.log" 2>&1
    echo "build_llamacpp.sh exit $?" >> "$out/llamacpp_build.log" ) &
  bpid=$!
else
  echo "no carry/llamacpp.tar.gz: llama.cpp skipped (run scripts/gpu/pack_llamacpp.sh here first)"; lcpp_ok=0; bpid=
fi
fx_rc=0
if [ -z "${SKIP_FIXTURES:-}" ]; then
  stamp "make_fixtures (Qwen3.5)"
  python3 scripts/fixtures/make_fixtures.py --out "$out" --work build-qwen35kl/fx --threads 4 \
      --only qwen35_f32,qwen35_bf16,qwen35_vl_bf16 > build-qwen35kl/make_fixtures.out 2>&1
  fx_rc=$?
  tail -c 6000 build-qwen35kl/make_fixtures.out
  stamp "make_fixtures exit $fx_rc"
fi
if [ -n "${bpid:-}" ]; then
  stamp "waiting for the llama.cpp build"
  wait "$bpid"
  tail -8 "$out/llamacpp_build.log"
fi
stamp "run_kl"
lcpp_args=()
[ "$lcpp_ok" = 1 ] && lcpp_args=(--llamacpp build-qwen35kl/lcpp)
bash scripts/kl/run_kl.sh --roofline carry/bin/roofline --fixtures build-qwen35kl/fx/fixtures/hf "${lcpp_args[@]}" \
    --work build-qwen35kl/kl --out "$out"
kl_rc=$?
stamp "done: make_fixtures exit $fx_rc, run_kl exit $kl_rc"
exit $(( fx_rc != 0 || kl_rc != 0 ))
