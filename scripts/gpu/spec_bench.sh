#!/usr/bin/env bash
# Speculative decoding on the GPU machine: single-stream greedy decode (roofline bench's tg after a text
# prompt) of a target with and without a draft model, for several --draft-max, printing tok/s and the
# draft's acceptance. Binaries in carry/bin as the other scripts here assume (carry ["carry/pack"]):
#
#   here:   scripts/gpu/build_for_device.sh && tar cJf carry/pack/bin.tar.xz -C carry bin lib shared
#   device: bash scripts/gpu/spec_bench.sh
#
# TARGET (default synthetic:qwen3-32b:Q4_K_M), DRAFT (default synthetic:qwen3-8b:Q4_K_M; `mtp`: the target's own MTP
# head, --spec-type draft-mtp, e.g. TARGET=synthetic:qwen3.5-27b-mtp:Q4_K_M), DRAFT_MAX
# (default "2 4 8"), N (generated tokens, default 128), REPS (default 3), PROMPT_FILE (default: a
# paragraph written below). Synthetic models have random weights, so the draft and the target agree
# only by chance: their acceptance says nothing about real models, only the cost of drafting and
# verifying does. For that, SELF (default qwen3-8b; empty to skip) also runs a synthetic model as its
# own draft, where every draft is accepted: the ceiling of tokens per target step at each draft-max.
# Synthetic specs are written once as GGUF files under the git-ignored build-spec/ (loading a file is
# much faster than building the weights in memory for every run; a warm machine reuses them). The whole
# takes about 5 minutes on an H200 (one device call); SELF= leaves out the self-draft runs.
# Everything lands in $OUT (summary.txt, one log per run).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
target="${TARGET:-synthetic:qwen3-32b:Q4_K_M}"
draft="${DRAFT:-synthetic:qwen3-8b:Q4_K_M}"
draft_max="${DRAFT_MAX:-2 4 8}"
n="${N:-128}"
reps="${REPS:-3}"
self="${SELF-qwen3-8b}"
prompt="${PROMPT_FILE:-$out/prompt.txt}"
if [ -z "${PROMPT_FILE:-}" ]; then
  cat > "$prompt" <<'EOF'
The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined a screw
press, movable metal type and oil-based ink into a system that could produce books quickly and cheaply. Within
fifty years, presses were running in more than two hundred cities across Europe, and the number of books in
circulation grew from thousands to millions. Scholars could compare texts, errors could be corrected in later
editions, and ideas travelled faster than ever before. Explain, step by step, how this invention changed
science, religion and politics in the century that followed.
EOF
fi
stamp "start: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $($bin/roofline --version | head -1)"
work=$PWD/build-spec
mkdir -p "$work"
# A model argument as a file: synthetic:SHAPE:MIX is written once to build-spec/SHAPE-MIX.gguf.
as_file() {
  case "$1" in
    synthetic:*)
      local spec=${1#synthetic:} f="$work/$(echo "${1#synthetic:}" | tr ':' '-').gguf"
      if [ ! -f "$f" ]; then
        stamp "synth $spec" >&2
        "$bin/roofline" synth "$spec" -o "$f" > /dev/null 2>&1 || { stamp "synth $spec failed" >&2; echo "$1"; return; }
      fi
      echo "$f" ;;
    *) echo "$1" ;;
  esac
}
target=$(as_file "$target")
[ "$draft" = mtp ] || draft=$(as_file "$draft")
[ -n "$self" ] && self_file=$(as_file "synthetic:$self:Q4_K_M")

# One bench run: its table rows and the acceptance line into the summary, the whole output into a log.
run() {
  local name=$1; shift
  stamp "$name: roofline bench $*"
  timeout 150 "$bin/roofline" bench -p 0 -n "$n" -r "$reps" --prompt-file "$prompt" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  grep -E "^\| .*tg|draft acceptance|^error" "$out/$name.log" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || stamp "$name: exit $rc (see $name.log)"
}

run "target_alone" -m "$target"
for k in $draft_max; do
  if [ "$draft" = mtp ]; then
    run "target_mtp_max$k" -m "$target" --spec-type draft-mtp --draft-max "$k"
  else
    run "target_draft_max$k" -m "$target" -md "$draft" --draft-max "$k"
  fi
done
if [ -n "$self" ]; then
  run "self_alone" -m "$self_file"
  for k in $draft_max; do
    run "self_draft_max$k" -m "$self_file" -md "$self_file" --draft-max "$k"
  done
fi
stamp "done"
