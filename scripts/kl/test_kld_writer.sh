#!/usr/bin/env bash
# Checks the .kld writer of scripts/kl (kld_format.py, hf_kld_base.py) against roofline's reader and writer,
# without torch, on this machine:
#
#   bash scripts/kl/test_kld_writer.sh [ROOFLINE_BIN]      (default build/roofline)
#
# For qwen3_f32 (no BOS) and llama_f32 (BOS substituted at each window's start) from tests/fixtures/hf:
#  1. roofline convert --outtype f32; roofline perplexity -c 128 --chunks 4 --kl-divergence-base A.kld (roofline's own file);
#  2. kld_format.py reencode A.kld B.kld: A's log-probabilities encoded again by the python writer;
#  3. hf_kld_base.py with scripts/kl/fake_hf as torch/transformers (the fake model returns A's log-probabilities at
#     the positions it is asked about, NaN elsewhere; it only recognises windows built with the right BOS rule):
#     its file must be byte-identical to B (same tokens, windows, scored rows, row encoding);
#  4. roofline perplexity --kl-divergence-base C.kld --kl-divergence: roofline reads the python file and finds
#     KLD ~0 and 100% same top token against the model that produced A.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-build/roofline}"
[ -x "$bin" ] || { echo "no roofline binary at $bin (build it, or pass its path)" >&2; exit 2; }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
text=scripts/kl/text.txt
for n in qwen3_f32 llama_f32; do
  hf=tests/fixtures/hf/$n
  "$bin" convert "$hf" -o "$w/$n.gguf" --outtype f32 --no-progress > /dev/null 2>&1
  "$bin" perplexity -m "$w/$n.gguf" -f "$text" -c 128 --chunks 4 --kl-divergence-base "$w/$n.A.kld" -ngl 0 > "$w/$n.ppl.log" 2>&1
  bos=-1
  if "$bin" inspect "$w/$n.gguf" | grep -q "tokenizer.ggml.add_bos_token = true"; then
    bos=$("$bin" inspect "$w/$n.gguf" | sed -n 's/.*tokenizer.ggml.bos_token_id = \([0-9]*\).*/\1/p')
  fi
  python3 scripts/kl/kld_format.py reencode "$w/$n.A.kld" "$w/$n.B.kld" > /dev/null
  python3 scripts/kl/kld_format.py compare "$w/$n.A.kld" "$w/$n.B.kld" | sed "s/^/$n roofline vs re-encoded: /"
  FAKE_KLD="$w/$n.A.kld" FAKE_BOS=$bos PYTHONPATH=scripts/kl/fake_hf python3 scripts/kl/hf_kld_base.py \
      --model "$hf" --text "$text" --ctx 128 --tokens 512 --out "$w/$n.C.kld" > "$w/$n.C.json"
  if ! cmp -s "$w/$n.B.kld" "$w/$n.C.kld"; then
    echo "FAIL $n: hf_kld_base.py's file differs from the re-encoded one" >&2; exit 1
  fi
  "$bin" perplexity -m "$w/$n.gguf" --kl-divergence-base "$w/$n.C.kld" --kl-divergence -ngl 0 > "$w/$n.kl.log" 2>&1
  kld=$(sed -n 's/^Mean *KLD: *\([-0-9.e]*\).*/\1/p' "$w/$n.kl.log")
  top=$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$w/$n.kl.log")
  echo "$n: BOS $bos; hf_kld_base.py file == re-encoded file; roofline reads it: mean KLD $kld, same top $top %"
  python3 - "$kld" "$top" <<'PY' || { echo "FAIL $n: KLD not ~0" >&2; exit 1; }
import sys
kld, top = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(kld) < 1e-5 and top == 100.0 else 1)
PY
done
echo "PASS"
