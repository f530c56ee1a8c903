#!/usr/bin/env python3
"""Per-kernel table of an ncu --csv run (raw metrics, one row per launch and metric, as scripts/gpu/fused_diag.sh
writes them): launches, mean time, DRAM MB and GB/s, warp instructions where measured, grouped by kernel,
grid and registers (a product's shape shows in its grid).
Usage: scripts/gpu/ncu_kernel_table.py NCU.csv [NCU.csv ...]"""
import collections
import csv
import re
import sys


def table(path):
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    if not rows:
        print(f"{path}: no ncu rows")
        return
    head = rows[0]
    col = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    launches = collections.defaultdict(dict)
    for r in rows[1:]:
        launch = launches[r[col["ID"]]]
        launch["name"] = r[col["Kernel Name"]]
        launch[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", "") or 0)
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for launch in launches.values():
        name = re.sub(r"^void ", "", re.sub(r"\(.*", "", launch["name"]))
        name = re.sub(r"^.*(unnamed>|namespace\))::", "", name)
        key = f"{name} grid {int(launch.get('launch__grid_size', 0))} regs {int(launch.get('launch__registers_per_thread', 0))}"
        g = groups[key]
        g[0] += 1
        g[1] += launch.get("gpu__time_duration.sum", 0)
        g[2] += launch.get("dram__bytes_read.sum", 0)
        g[3] += launch.get("smsp__inst_executed.sum", 0)
    total = sum(g[1] for g in groups.values())
    print(f"{path}: {len(launches)} launches, {total / 1e3:.1f} us")
    print(f"{'n':>5} {'us':>8} {'share':>6} {'MB':>8} {'GB/s':>6} {'warp instr':>11}  kernel")
    for key, (n, ns, dram, inst) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{n:5d} {ns / n / 1e3:8.2f} {100 * ns / total:5.1f}% {dram / n / 1e6:8.2f} {dram / ns if ns else 0:6.0f} "
              f"{inst / n:11.0f}  {key}")


for p in sys.argv[1:]:
    table(p)
