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
# RSS should be flat after the first minute: the grammar automata the scheduler keeps are bounded to
# 64 MiB in all (serve/automaton_cache.h), a random model's bytes no longer make a state per partial
# UTF-8 character, and malloc arenas are capped at 8 (serve/malloc_arenas.h); before those, 64 streams
# here grew +229 MiB in 300 s. soak.py reports the RSS slope of the run's second half (MiB/min); add
# SOAK_ARGS="--max-rss-slope-mib-min 2" to fail on it. The growth limit here stays 384 MiB.
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
