#!/usr/bin/env python3
"""One table from an Nsight Systems kernel trace of decode steps (scripts/gpu/timeline.sh).

Input: the CSV of `nsys stats -r cuda_gpu_trace -f csv` (a start, a duration and a name per kernel).
Kernels are taken in order of start; a step ends where the next kernel starts more than GAP_US after
every kernel so far has ended (the host's work between steps). The first SKIP steps (warm-up, graph
capture) are left out. Per kernel kind (the name without template arguments, and the grid), over the
steps kept:
  calls  - launches per step
  dur    - the kernel's own duration, us per call (first CTA's start to last CTA's end: under programmatic
           dependent launch that includes the wait for the kernel before)
  adds   - how much later the step's last end is after this kernel than before it, us per call: summed over
           a step's kernels this is the step's time, so it is what the kind costs on the critical path
  share  - adds as a share of the step
A second table groups the same kernels by role: each product by the last two kernels before it that are
not products (gated_product > rms_norm: q/k/v, and the output matrix; attention_combine > rms_norm:
gate/up; rope_store > attention_combine: o; rms_norm > gated_product: down), a product right after
another marked as a second launch (a v of another kind than q and k).
REQUIRE (a regular expression) keeps only steps with a kernel whose kind matches it, e.g. mma_rows for the batched
decode steps of `bench -npl` (whose one-token warm-up steps are otherwise the most frequent).
Usage: timeline_table.py TRACE.csv [GAP_US (default 15)] [SKIP (default 3)] [REQUIRE]
"""
import csv
import re
import shutil
import subprocess
import sys
from collections import OrderedDict


def column(header, *names):
    for i, h in enumerate(header):
        if any(n.lower() in h.lower() for n in names):
            return i
    raise SystemExit(f"timeline_table.py: no column like {names} in {header}")


def demangle(names):
    """Mangled kernel names -> readable ones, through c++filt where it is installed."""
    names = sorted(set(names))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def kind_of(name, grid):
    """The kernel's name with its template arguments, without namespaces and parameter list, and its grid."""
    n = name.replace("(anonymous namespace)::", "").replace("void ", "")
    n = re.sub(r"\([A-Za-z_:]+\)(-?\d)", r"\1", n)  # (roofline::cuda::Kind)0 -> 0
    n = re.sub(r"[A-Za-z_]+::", "", n)
    depth, cut = 0, len(n)
    for i, ch in enumerate(n):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    return f"{n[:cut].strip()} [{grid}]"


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    gap_us = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    skip = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    require = re.compile(sys.argv[4]) if len(sys.argv) > 4 else None
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    i_start, i_dur, i_name = column(header, "Start"), column(header, "Duration"), column(header, "Name")
    try:
        gx, gy, gz = column(header, "GrdX"), column(header, "GrdY"), column(header, "GrdZ")
    except SystemExit:
        gx = gy = gz = None
    readable = demangle(r[i_name] for r in rows[1:] if len(r) > i_name)
    kernels = []
    for r in rows[1:]:
        if len(r) <= max(i_start, i_dur, i_name) or not r[i_dur]:
            continue
        name = readable.get(r[i_name], r[i_name])
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        grid = f"{r[gx]}x{r[gy]}x{r[gz]}" if gx is not None and r[gx] else "?"
        start = float(r[i_start]) / 1000.0
        kernels.append((start, start + float(r[i_dur]) / 1000.0, kind_of(name, grid)))
    kernels.sort()
    steps, cur, last_end = [], [], None
    for k in kernels:
        if cur and k[0] > last_end + gap_us:
            steps.append(cur)
            cur = []
        last_end = k[1] if not cur else max(last_end, k[1])
        cur.append(k)
    if cur:
        steps.append(cur)
    # The steps of the common (most frequent) kernel count: decode steps of one token.
    if require:
        steps = steps[:skip] + [s for s in steps[skip:] if any(require.search(k[2]) for k in s)]
    counts = {}
    for s in steps[skip:]:
        if len(s) >= 20:  # a step's kernels, not a lone kernel between steps (uploads, probes)
            counts[len(s)] = counts.get(len(s), 0) + 1
    if not counts:
        raise SystemExit("timeline_table.py: no steps after the skipped ones")
    n_common = max(counts, key=counts.get)
    kept = [s for s in steps[skip:] if len(s) == n_common]
    stats, roles = OrderedDict(), OrderedDict()
    step_us = []
    for s in kept:
        t0 = s[0][0]
        run_end = t0
        context, prev_product = ["step start", "step start"], False
        for start, end, kind in s:
            add = max(0.0, end - run_end)
            run_end = max(run_end, end)
            base = kind.split("<")[0].split(" [")[0].replace("_kernel", "")
            product = base.startswith(("matvec", "expert_matvec", "mma_rows", "int8_rows")) or "gemm" in base or "xmma" in base
            role = f"product after {context[0]} > {context[1]}" + (" (2nd launch)" if prev_product else "") if product else base
            if not product:
                context = [context[1], base]
            prev_product = product
            for table, key in ((stats, kind), (roles, role)):
                st = table.setdefault(key, [0, 0.0, 0.0])
                st[0] += 1
                st[1] += end - start
                st[2] += add
        step_us.append(run_end - t0)
    n = len(kept)
    total = sum(step_us) / n
    print(f"steps: {len(steps)} found, {n} kept (kernels per step {n_common}); step {total:.1f} us "
          f"(min {min(step_us):.1f}, max {max(step_us):.1f}); kernels' own time summed "
          f"{sum(v[1] for v in stats.values()) / n:.1f} us")
    for title, table in (("kind", stats), ("role (products named by the kernel before them)", roles)):
        print(f"{title:70s} {'calls':>6s} {'dur':>8s} {'adds':>8s} {'share':>6s}")
        for key, (c, d, a) in sorted(table.items(), key=lambda kv: -kv[1][2]):
            print(f"{key[:70]:70s} {c / n:6.1f} {d / c:8.2f} {a / c:8.2f} {100 * a / n / total:5.1f}%")


if __name__ == "__main__":
    main()
