#!/usr/bin/env python3
"""Medians (and ranges) of per-round ratios to each build's own `immediate`, from before-after.txt."""
import re, statistics, sys
from collections import defaultdict
path = sys.argv[1] if len(sys.argv) > 1 else "before-after.txt"
rows = defaultdict(lambda: defaultdict(list))
which = None
for line in open(path):
    m = re.match(r"=== round (\d+) (\w+)", line)
    if m:
        which = m.group(2); continue
    if not line.startswith("| ") or line.startswith("| load"):
        continue
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    load, conns, config = c[0], c[1], c[2].strip("`")
    if config != "layer-write":
        continue
    cpu = float(c[11]); xw, xr, xp, xm = (float(c[i]) if c[i] != "NaN" else None for i in (12, 13, 14, 15))
    rows[(load, conns)][which].append((xw, xr, xp, xm, cpu))
def fmt(v):
    v = [x for x in v if x is not None]
    if not v: return "-"
    return f"{statistics.median(v):.2f}× ({min(v):.2f}–{max(v):.2f})"
print("| load | conns | build | writes × | reads × | p99 × | max × | rounds |")
print("|---|---|---|---|---|---|---|---|")
for (load, conns), by in rows.items():
    for w in ("old", "new"):
        r = by.get(w, [])
        print(f"| {load} | {conns} | {w} | {fmt([x[0] for x in r])} | {fmt([x[1] for x in r])} | {fmt([x[2] for x in r])} | {fmt([x[3] for x in r])} | {len(r)} |")
