#!/usr/bin/env bash
# The server's soak test on the GPU machine (issue #20): tests/load/soak.py starts
# `roofline serve -m synthetic:qwen3-8b:Q4_K_M -np 16 -c 32768 -ngl all` and runs its mixed workload
# (streamed chat, completions, json_schema, tools with tool_choice "required", dropped streams, greedy
# prompt-cache repeats, malformed requests, /health /metrics /v1/models polls) at 16 clients for 240 s,
# reporting per 30 s window the requests, failures, tok/s, TTFT, the server's RSS and the GPU memory used.
# The synthetic model has random weights and a byte-level vocabulary with a ChatML template
# (src/model/synthetic.cpp), so every kind works: the texts are noise, but the structured ones are
# grammar-bound and must still parse and validate.
#
#   here:   scripts/gpu/build_for_device.sh && tar cJf carry/pack/bin.tar.xz -C carry bin lib shared
#   device: bash scripts/gpu/soak_gpu.sh   (carry ["carry/pack"])
#
# RSS may grow up to ~200 MiB without a leak: the scheduler keeps the automata of 8 recent grammars, each
# up to 16384 states (16 MiB of transitions) and 256 token masks (19 KiB each at a 151k vocabulary), and
# the soak's random-weight model fills them (seen on the CPU: +150 MiB, then flat); the limit here is
# 384 MiB, above that bound.
# DURATION (default 240), CONCURRENCY (16), SERVER_ARGS ("-np 16 -c 32768 -ngl all"), MODEL
# (synthetic:qwen3-8b:Q4_K_M) and SOAK_ARGS (more soak.py options) override the defaults. Results in $OUT:
# soak.md (the markdown summary), soak.json, soak_progress.log (the per-window lines as they came, and
# the server log's tail on a failure), summary.txt (timings, exit status, nvidia-smi before and after).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
export PYTHONUNBUFFERED=1
duration="${DURATION:-240}"
stamp "start: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | head -1), $(nproc) cores, $("$bin/roofline" --version | head -1)"
# soak.py's own limits: the server's start (the synthetic weights are generated there) + duration + drain.
timeout $(( duration + 300 )) python3 tests/load/soak.py --bin "$bin/roofline" --model "${MODEL:-synthetic:qwen3-8b:Q4_K_M}" \
    --server-args "${SERVER_ARGS:--np 16 -c 32768 -ngl all}" --duration "$duration" --concurrency "${CONCURRENCY:-16}" \
    --window 30 --max-rss-growth-mib 384 --json "$out/soak.json" ${SOAK_ARGS:-} > "$out/soak.md" 2> "$out/soak_progress.log"
rc=$?
stamp "soak.py exit $rc"
grep -E "^- (PASS|FAIL)|^Result" "$out/soak.md" | tee -a "$out/summary.txt"
stamp "after: $(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | head -1)"
exit $rc
