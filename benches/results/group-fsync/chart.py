# Draws group.svg: writes as multiples of BEGIN IMMEDIATE's (same handler, same synchronous,
# pool of 8), per connection count, for the write path without and with group commit; the
# bar is the median of per-round ratios, each dot one round. Reads the cells.tsv files that
# benches/scripts/wrk-group.sh wrote.   python3 chart.py   (from this directory)
import csv, statistics as st

PANELS = [  # (title, cells file, writer counts, readers)
    ("synchronous = FULL", "full-prep0/cells.tsv", [1, 4, 64, 256]),
    ("FULL, 64 writers + 16 readers", "full-split/cells.tsv", [64]),
    ("synchronous = NORMAL", "normal-prep0/cells.tsv", [1, 4, 64, 256]),
]
CONFIGS = [("layer-write", "#d05000", "write path, no groups"),
           ("layer-write-group", "#0070c0", "write path, group commit (default)")]

def ratios(path, config, writers):
    rows = [r for r in csv.DictReader(open(path), delimiter="\t") if int(r["writers"]) == writers]
    base = {r["round"]: float(r["writes_s"]) for r in rows if r["config"] == "immediate"}
    return [float(r["writes_s"]) / base[r["round"]] for r in rows
            if r["config"] == config and base.get(r["round"])]

W, H, top, bottom, left = 900, 380, 50, 60, 50
ymax = 5.0
widths = [len(p[2]) for p in PANELS]
unit = (W - left - 20 - 20 * (len(PANELS) - 1)) / sum(widths)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<text x="{W/2}" y="18" text-anchor="middle" font-size="13">writes as multiples of BEGIN IMMEDIATE (bar: median of rounds, dots: rounds); wrk, own process</text>']
y0, h = H - bottom, H - bottom - top
x = left
for title, path, writers in PANELS:
    pw = unit * len(writers)
    out.append(f'<text x="{x + pw/2}" y="{top - 8}" text-anchor="middle">{title}</text>')
    out.append(f'<line x1="{x}" y1="{y0}" x2="{x + pw}" y2="{y0}" stroke="black"/>')
    for t in [0, 1, 2, 3, 4, 5]:
        y = y0 - h * t / ymax
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + pw}" y2="{y}" stroke="#ddd"/>')
        if x == left:
            out.append(f'<text x="{x - 6}" y="{y + 4}" text-anchor="end">{t}×</text>')
    y1 = y0 - h / ymax
    out.append(f'<line x1="{x}" y1="{y1}" x2="{x + pw}" y2="{y1}" stroke="black" stroke-dasharray="4 3"/>')
    for i, w in enumerate(writers):
        cx = x + unit * (i + 0.5)
        out.append(f'<text x="{cx}" y="{y0 + 16}" text-anchor="middle">{w}</text>')
        for j, (config, color, _) in enumerate(CONFIGS):
            rs = ratios(path, config, w)
            if not rs:
                continue
            bx = cx - unit * 0.35 + j * unit * 0.35
            m = min(st.median(rs), ymax)
            out.append(f'<rect x="{bx}" y="{y0 - h * m / ymax}" width="{unit * 0.3}" height="{h * m / ymax}" fill="{color}" opacity="0.55"/>')
            for r in rs:
                out.append(f'<circle cx="{bx + unit * 0.15}" cy="{y0 - h * min(r, ymax) / ymax}" r="2.5" fill="{color}"/>')
    out.append(f'<text x="{x + pw/2}" y="{y0 + 32}" text-anchor="middle">writer connections</text>')
    x += pw + 20
for j, (_, color, label) in enumerate(CONFIGS):
    out.append(f'<rect x="{left + j * 300}" y="{H - 18}" width="12" height="12" fill="{color}" opacity="0.7"/>')
    out.append(f'<text x="{left + j * 300 + 18}" y="{H - 8}">{label}</text>')
out.append(f'<text x="{W - 10}" y="{H - 8}" text-anchor="end">dashed: BEGIN IMMEDIATE (1×)</text>')
out.append("</svg>")
open("group.svg", "w").write("\n".join(out))
