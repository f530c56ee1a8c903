#!/usr/bin/env bash
# KL divergence of roofline and llama.cpp from Hugging Face transformers (float32) on the Qwen3.5 fixtures and the
# dense control qwen3_f32: for each fixture, a base file from transformers (scripts/kl/hf_kld_base.py), a GGUF from
# `roofline convert` and one from llama.cpp's convert_hf_to_gguf.py (f32 or bf16 as the fixture's weights), then
# `roofline perplexity --kl-divergence` on both files with -ngl 0 (CPU) and -ngl all (GPU), and llama-perplexity's
# own number when llama.cpp's binaries are given. One table (mean KLD, same-top-token %) for every
# file x engine x device, printed and written to OUT/kl.md (+ kl.json, kl_logs.tar.gz).
#
# On the GPU machine, from the repository root, after scripts/gpu/build_for_device.sh put roofline in carry/bin and
# scripts/gpu/pack_llamacpp.sh put llama.cpp's source in carry/llamacpp.tar.gz (device call with carry ["carry"]):
#
#   bash scripts/gpu/build_llamacpp.sh carry/llamacpp.tar.gz /tmp/lcpp > $OUT/llamacpp_build.log 2>&1 &
#   python3 scripts/fixtures/make_fixtures.py --out $OUT --threads 4 --only qwen35_f32,qwen35_bf16,qwen35_vl_bf16
#   wait
#   bash scripts/kl/run_kl.sh --roofline carry/bin/roofline --fixtures /tmp/roofline_fixtures/fixtures/hf \
#        --llamacpp /tmp/lcpp --out $OUT
#
# Options:
#   --roofline BIN     roofline binary (default carry/bin/roofline, else build/roofline)
#   --fixtures DIR     where the HF fixture folders are looked up first (default /tmp/roofline_fixtures/fixtures/hf);
#                      then tests/fixtures/hf and tests/fixtures/gemma3 (--names "gemma3_f32 gemma3_vl_bf16")
#   --llamacpp DIR     the work dir of build_llamacpp.sh (DIR/llama.cpp = source, DIR/build/bin = binaries); without
#                      it, or LLAMACPP_SRC / LLAMACPP_BIN set separately, the llama.cpp rows are skipped
#   --names "A B ..."  fixtures (default "qwen35_f32 qwen35_bf16 qwen35_vl_bf16 qwen3_f32")
#   --ctx N            window (default 128); --tokens N tokens of scripts/kl/text.txt (default 512: 4 windows)
#   --text FILE        default scripts/kl/text.txt
#   --out DIR          default $OUT, else out/kl
#   --work DIR         scratch (GGUFs, bases, logs; default /tmp/roofline_kl)
#   --hf-device cpu|cuda   where transformers computes the base (default cpu; float32 either way, TF32 off)
#   --kv TYPE          KV cache type for both engines (-ctk/-ctv; default: each engine's default, f16)
# Exit status 0 when every step ran; 1 when any step failed (the table shows which).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

roofline=""; fixtures=/tmp/roofline_fixtures/fixtures/hf; lcpp=""; names="qwen35_f32 qwen35_bf16 qwen35_vl_bf16 qwen3_f32"
ctx=128; ntok=512; text=scripts/kl/text.txt; out="${OUT:-out/kl}"; work=/tmp/roofline_kl; hfdev=cpu; kv=""
while [ $# -gt 0 ]; do
  case "$1" in
    --roofline) roofline="$2"; shift 2 ;;
    --fixtures) fixtures="$2"; shift 2 ;;
    --llamacpp) lcpp="$2"; shift 2 ;;
    --names) names="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --tokens) ntok="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --hf-device) hfdev="$2"; shift 2 ;;
    --kv) kv="$2"; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "run_kl.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$roofline" ]; then
  for b in carry/bin/roofline build/roofline; do [ -x "$b" ] && { roofline=$b; break; }; done
fi
[ -n "$roofline" ] && [ -x "$roofline" ] || { echo "run_kl.sh: no roofline binary (--roofline BIN)" >&2; exit 2; }
roofline=$(cd "$(dirname "$roofline")" && pwd)/$(basename "$roofline")
[ -f "$text" ] || { echo "run_kl.sh: no text file $text" >&2; exit 2; }
lsrc="${LLAMACPP_SRC:-}"; lbin="${LLAMACPP_BIN:-}"
if [ -n "$lcpp" ]; then
  [ -z "$lsrc" ] && lsrc="$lcpp/llama.cpp"
  [ -z "$lbin" ] && lbin="$lcpp/build/bin"
fi
[ -n "$lsrc" ] && [ ! -f "$lsrc/convert_hf_to_gguf.py" ] && { echo "run_kl.sh: $lsrc has no convert_hf_to_gguf.py: llama.cpp's converter skipped" >&2; lsrc=""; }
[ -n "$lbin" ] && [ ! -x "$lbin/llama-perplexity" ] && { echo "run_kl.sh: $lbin has no llama-perplexity: llama.cpp's engine skipped" >&2; lbin=""; }
[ -d carry/lib ] && export LD_LIBRARY_PATH="$root/carry/lib:${LD_LIBRARY_PATH:-}"
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
mkdir -p "$out" "$work/logs"
out=$(cd "$out" && pwd); work=$(cd "$work" && pwd)
results="$work/results.tsv"
: > "$results"
kvargs=()
[ -n "$kv" ] && kvargs=(-ctk "$kv" -ctv "$kv")
failed=0
log() { echo "[run_kl] $*" >&2; }
# One result row: fixture, file, engine, device, status, log path.
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$results"; }

{
  echo "roofline: $roofline"; "$roofline" --version 2>&1 | head -1
  echo "llama.cpp source: ${lsrc:-none}; binaries: ${lbin:-none}"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
} > "$work/logs/env.txt" 2>&1
cat "$work/logs/env.txt" >&2

for name in $names; do
  hf=""
  for d in "$fixtures/$name" "tests/fixtures/hf/$name" "tests/fixtures/gemma3/$name"; do
    [ -f "$d/config.json" ] && ls "$d"/*.safetensors > /dev/null 2>&1 && { hf=$d; break; }
  done
  if [ -z "$hf" ]; then
    log "$name: no HF folder in $fixtures or tests/fixtures/hf"; row "$name" - - - "no fixture folder" -; failed=1; continue
  fi
  [ -f "$hf/expected.json" ] || log "$name: $hf has no expected.json (fixture build incomplete?)"
  dtype=$(python3 - "$hf" <<'PY' 2>/dev/null || echo float32
import json, os, sys
d = sys.argv[1]
try:
    print(json.load(open(os.path.join(d, "expected.json")))["source_dtype"])
except Exception:
    c = json.load(open(os.path.join(d, "config.json")))
    c = c.get("text_config", c) if not (c.get("dtype") or c.get("torch_dtype")) else c
    print(c.get("dtype") or c.get("torch_dtype") or "float32")
PY
)
  case "$dtype" in float32) ot=f32 ;; bfloat16) ot=bf16 ;; float16) ot=f16 ;; *) ot=f32 ;; esac
  pre=qwen2; case "$name" in llama*) pre=llama-bpe ;; esac
  lcpp_extra=(); case "$name" in qwen35*) lcpp_extra=(--no-mtp) ;; esac  # its converter asserts an MTP block otherwise
  L="$work/logs/$name"
  base="$work/$name.kld"
  log "$name ($hf, $ot): transformers float32 base"
  if ! timeout 600 python3 scripts/kl/hf_kld_base.py --model "$hf" --text "$text" --ctx "$ctx" --tokens "$ntok" \
        --device "$hfdev" --out "$base" > "$L.base.json" 2> "$L.base.log"; then
    log "$name: base failed"; tail -5 "$L.base.log" >&2; row "$name" - - - "base failed" "$L.base.log"; failed=1; continue
  fi
  files=()
  log "$name: roofline convert --outtype $ot"
  if timeout 300 "$roofline" convert "$hf" -o "$work/$name.roofline.gguf" --outtype "$ot" --no-progress > "$L.convert_roofline.log" 2>&1; then
    files+=(roofline)
  else
    log "$name: roofline convert failed"; tail -3 "$L.convert_roofline.log" >&2
    row "$name" roofline-convert - - "convert failed" "$L.convert_roofline.log"; failed=1
  fi
  if [ -n "$lsrc" ]; then
    log "$name: llama.cpp convert_hf_to_gguf.py --outtype $ot"
    if PYTHONPATH="$lsrc/gguf-py:${PYTHONPATH:-}" timeout 300 python3 scripts/kl/llamacpp_convert.py "$lsrc" "$hf" \
         --outfile "$work/$name.llamacpp.gguf" --outtype "$ot" --pre "$pre" "${lcpp_extra[@]}" > "$L.convert_llamacpp.log" 2>&1; then
      files+=(llamacpp)
    else
      log "$name: llama.cpp convert failed"; tail -3 "$L.convert_llamacpp.log" >&2
      row "$name" llamacpp-convert - - "convert failed" "$L.convert_llamacpp.log"; failed=1
    fi
  fi
  for f in "${files[@]}"; do
    g="$work/$name.$f.gguf"
    "$roofline" inspect "$g" > "$L.$f.inspect.txt" 2>&1 || true
    for dev in cpu gpu; do
      ngl=0; [ $dev = gpu ] && ngl=all
      lg="$L.$f.roofline.$dev.log"
      log "$name: $f.gguf on roofline, -ngl $ngl"
      if timeout 300 "$roofline" perplexity -m "$g" --kl-divergence-base "$base" --kl-divergence -ngl "$ngl" \
           "${kvargs[@]}" > "$lg" 2>&1; then row "$name" "$f" roofline "$dev" ok "$lg"
      else row "$name" "$f" roofline "$dev" "failed (exit $?)" "$lg"; failed=1; fi
      if [ -n "$lbin" ]; then
        lg="$L.$f.llamacpp.$dev.log"
        log "$name: $f.gguf on llama-perplexity, -ngl $ngl"
        if timeout 300 "$lbin/llama-perplexity" -m "$g" --kl-divergence-base "$base" --kl-divergence -c "$ctx" \
             -ngl "$ngl" "${kvargs[@]}" > "$lg" 2>&1; then row "$name" "$f" llama.cpp "$dev" ok "$lg"
        else row "$name" "$f" llama.cpp "$dev" "failed (exit $?)" "$lg"; failed=1; fi
      fi
    done
  done
done

python3 - "$results" "$work" "$out" "$ctx" "$ntok" <<'PY'
import glob, json, os, re, sys
results, work, out, ctx, ntok = sys.argv[1:6]
num = r"(-?[0-9.]+(?:e[-+]?[0-9]+)?|nan|inf)"
def grab(text, pattern):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None
rows = []
for line in open(results):
    name, f, engine, dev, status, logp = line.rstrip("\n").split("\t")
    r = {"fixture": name, "file": f, "engine": engine, "device": dev, "status": status, "log": os.path.basename(logp)}
    if os.path.isfile(logp):
        t = open(logp, errors="replace").read()
        r["mean_kld"] = grab(t, r"Mean\s+KLD:\s*" + num)
        r["max_kld"] = grab(t, r"Maximum KLD:\s*" + num)
        r["same_top_pct"] = grab(t, r"Same top p:\s*" + num)
        r["ppl_q"] = grab(t, r"Mean PPL\(Q\)\s*:\s*" + num)
        r["ppl_base"] = grab(t, r"Mean PPL\(base\)\s*:\s*" + num)
        if re.search(r"no GPU backend|no usable GPU|compiled without GPU", t):
            r["status"] = status = status + " (warning: no GPU backend, ran on the CPU)"
        if status != "ok" or r["mean_kld"] is None:
            tail = [l for l in t.strip().splitlines() if l.strip()][-2:]
            r["error"] = " / ".join(tail)[-300:]
    rows.append(r)
order = {}
for r in rows:
    order.setdefault(r["fixture"], len(order))
rows.sort(key=lambda r: (order[r["fixture"]], r["file"], r["engine"], r["device"]))
bases = {}
for p in glob.glob(os.path.join(work, "logs", "*.base.json")):
    try:
        bases[os.path.basename(p)[:-len(".base.json")]] = json.loads(open(p).read().strip().splitlines()[-1])
    except Exception:
        pass
def fmt(v, spec):
    return "—" if v is None else format(v, spec)
lines = [f"# KL divergence from transformers (float32), ctx {ctx}, first {ntok} tokens of scripts/kl/text.txt", "",
         "file = which converter wrote the GGUF; engine = which program evaluated it; cpu = -ngl 0, gpu = -ngl all.", "",
         "| fixture | file | engine | device | mean KLD | max KLD | same top % | PPL(Q) | PPL(base) | status |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    st = r["status"] if r["status"] != "ok" or r.get("mean_kld") is not None else "no KLD line"
    if r.get("error") and not st.startswith("ok"):
        st += ": " + r["error"].replace("|", "/")
    lines.append(f"| {r['fixture']} | {r['file']} | {r['engine']} | {r['device']} | {fmt(r.get('mean_kld'), '.3g')} | "
                 f"{fmt(r.get('max_kld'), '.3g')} | {fmt(r.get('same_top_pct'), '.2f')} | {fmt(r.get('ppl_q'), '.4f')} | "
                 f"{fmt(r.get('ppl_base'), '.4f')} | {st} |")
lines += ["", "Base files (transformers float32):", ""]
for k, b in sorted(bases.items()):
    lines.append(f"- {k}: {b.get('class')}, {b.get('n_chunk')} windows of {b.get('n_ctx')}, n_vocab {b.get('n_vocab')}, "
                 f"BOS substituted {b.get('bos_substituted')}, PPL {b.get('ppl_base', 0):.4f}, {b.get('versions')}")
md = "\n".join(lines) + "\n"
open(os.path.join(out, "kl.md"), "w").write(md)
json.dump({"rows": rows, "bases": bases}, open(os.path.join(out, "kl.json"), "w"), indent=1)
print(md)
PY
tar -czf "$out/kl_logs.tar.gz" -C "$work" logs
log "wrote $out/kl.md, kl.json, kl_logs.tar.gz"
exit $failed
