#!/usr/bin/env bash
# Issue #19's check of the planner on the GPU machine: for each case (model, mix, --vram-limit emulating a
# smaller card, -c, -np), `roofline plan --gpu auto --json` predicts the placement and decode tok/s, then
# `roofline serve` with the same flags starts (its log says where the layers went) and one request of
# N generated tokens measures decode (the response's timings). One line per case in $OUT/plan_check.tsv.
# Usage (device): scripts/gpu/plan_check.sh [FIRST [LAST]] (case numbers, from 1; default all) with
# carry ["carry/pack"] (bin.tar.xz); CASES="MODEL MIX VRAM_GIB CTX NP N_PREDICT\n..." replaces the list.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
roofline=$bin/roofline
first="${1:-1}" last="${2:-1000}"
default_cases="qwen3-8b Q4_K_M 16 32768 1 128
qwen3-8b Q8_0 16 16384 1 128
qwen3-8b Q8_0 24 32768 4 128
qwen3-32b Q4_K_M 24 4096 1 128
qwen3-32b Q4_K_M 32 32768 1 128
qwen3-32b Q4_K_M 16 4096 1 32
qwen3-32b Q4_K_M 24 32768 1 32
qwen3-32b Q8_0 32 8192 1 32
qwen3-32b Q8_0 24 4096 1 32
qwen3-32b Q8_0 16 4096 1 16
qwen3-32b Q4_K_M 16 16384 1 32
qwen3-32b Q8_0 32 32768 2 32
qwen3-8b Q8_0 8 8192 1 64"
cases="${CASES:-$default_cases}"
port=18123
[ -f "$out/plan_check.tsv" ] || printf "model\tmix\tvram\tctx\tnp\tplan_fits\tplan_ngl\tserve_ngl\tplan_tok_s\tmeasured_tok_s\terror_pct\tserve_log\n" > "$out/plan_check.tsv"
i=0
while read -r model mix vram ctx np npred; do
  [ -z "$model" ] && continue
  i=$((i + 1))
  { [ $i -lt "$first" ] || [ $i -gt "$last" ]; } && continue
  spec="synthetic:$model:$mix"
  plan_json="$(mktemp)" case_out="$(mktemp)" log="$(mktemp)"
  timeout 120 "$roofline" plan -m "$spec" --gpu auto --vram-limit "$vram" -c "$ctx" -np "$np" --json > "$plan_json" 2> /dev/null
  "$roofline" plan -m "$spec" --gpu auto --vram-limit "$vram" -c "$ctx" -np "$np" > "$case_out" 2>&1
  read -r fits ngl units pred < <(python3 -c "
import json,sys
j=json.load(open('$plan_json'))
print(j['fits'], j['n_gpu_layers'], j['n_units'], round(j['decode_tok_s'],2))" 2>/dev/null || echo "? ? ? ?")
  "$roofline" serve -m "$spec" --vram-limit "$vram" -c "$ctx" -np "$np" -ngl auto --port $port > "$log" 2>&1 &
  pid=$!
  ready=0
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/health',timeout=2).status==200 else 1)" 2>/dev/null; then ready=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  measured="-"
  if [ $ready = 1 ]; then
    measured=$(python3 - <<EOF 2>>"$log"
import json, urllib.request
body = json.dumps({"prompt": "The history of the printing press begins", "n_predict": $npred, "ignore_eos": True,
                   "temperature": 0, "cache_prompt": False}).encode()
req = urllib.request.Request("http://127.0.0.1:$port/completion", data=body, headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=400))
print(round(r["timings"]["predicted_per_second"], 2))
EOF
)
  fi
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null
  serve_ngl=$(grep -o "offloaded [0-9]*/[0-9]* layers" "$log" | head -1 | grep -o "[0-9]*/[0-9]*")
  [ -z "$serve_ngl" ] && serve_ngl=$(grep -m1 -o -i "error.*\|out of memory.*" "$log" | head -c 120)
  { echo; echo "== serve log"; cat "$log"; } >> "$case_out"
  { echo "==== case $i: $model $mix --vram-limit $vram -c $ctx -np $np"; cat "$case_out"; } >> "$out/plan_cases.txt"
  rm -f "$plan_json" "$log" "$case_out"
  err=$(python3 -c "print(round(100*($pred-$measured)/$measured,1))" 2>/dev/null || echo "-")
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$model" "$mix" "$vram" "$ctx" "$np" "$fits" "$ngl/$units" "$serve_ngl" \
    "$pred" "$measured" "$err" "plan_cases.txt#$i" >> "$out/plan_check.tsv"
  echo "[$(( $(date +%s) - t0 )) s] case $i: $model $mix vram $vram c $ctx np $np: plan $fits $ngl/$units $pred tok/s; serve $serve_ngl $measured tok/s ($err%)"
done <<< "$cases"
cat "$out/plan_check.tsv"
