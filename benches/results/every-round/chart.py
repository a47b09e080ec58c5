# Draws every-round.svg: group commit's writes as multiples of BEGIN IMMEDIATE's (same
# handler, same synchronous, pool of 8), every round a dot, the goal a red line; the write path
# without groups beside it. Reads the cells.tsv files that benches/scripts/wrk-group.sh wrote
# into this directory's subdirectories.   python3 chart.py   (from this directory)
import csv, os, statistics as st

PANELS = [  # (title lines, cells file, writer counts, goal, the counts the goal is for)
    (["synchronous = FULL", "goal: ≥ 2× in every round at 64 and 256"], "full/cells.tsv",
     [1, 4, 64, 256], 2.0, [64, 256]),
    (["FULL, + 16 readers", "goal: ≥ 0.9×"], "full-split/cells.tsv", [64], 0.9, [64]),
    (["NORMAL", "goal: ≥ 1.3×"], "normal/cells.tsv", [64], 1.3, [64]),
]
CONFIGS = [("layer-write", "#d05000", "write path, no groups"),
           ("layer-write-group", "#0070c0", "write path, the defaults"),
           ("layer-write-group-read-limit", "#0070c0", None)]

def ratios(path, config, writers):
    if not os.path.exists(path):
        return []
    rows = [r for r in csv.DictReader(open(path), delimiter="\t") if int(r["writers"]) == writers]
    base = {r["round"]: float(r["writes_s"]) for r in rows if r["config"] == "immediate"}
    return [float(r["writes_s"]) / base[r["round"]] for r in rows
            if r["config"] == config and base.get(r["round"])]

W, H, top, bottom, left = 900, 400, 70, 60, 50
ymax = 5.0
widths = [len(p[2]) for p in PANELS]
unit = (W - left - 20 - 20 * (len(PANELS) - 1)) / sum(widths)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<text x="{W/2}" y="16" text-anchor="middle" font-size="13">writes as multiples of BEGIN IMMEDIATE, every round a dot (bar: median); wrk, own process</text>']
y0, h = H - bottom, H - bottom - top
x = left
for title, path, writers, goal, goal_for in PANELS:
    pw = unit * len(writers)
    for k, line in enumerate(title):
        out.append(f'<text x="{x + pw/2}" y="{top - 22 + 13 * k}" text-anchor="middle">{line}</text>')
    out.append(f'<line x1="{x}" y1="{y0}" x2="{x + pw}" y2="{y0}" stroke="black"/>')
    for t in [0, 1, 2, 3, 4, 5]:
        y = y0 - h * t / ymax
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + pw}" y2="{y}" stroke="#ddd"/>')
        if x == left:
            out.append(f'<text x="{x - 6}" y="{y + 4}" text-anchor="end">{t}×</text>')
    y1 = y0 - h / ymax
    out.append(f'<line x1="{x}" y1="{y1}" x2="{x + pw}" y2="{y1}" stroke="black" stroke-dasharray="4 3"/>')
    yg = y0 - h * goal / ymax
    for i, w in enumerate(writers):
        if w in goal_for:
            out.append(f'<line x1="{x + unit * i}" y1="{yg}" x2="{x + unit * (i + 1)}" y2="{yg}" stroke="#c00000" stroke-width="1.5"/>')
    for i, w in enumerate(writers):
        cx = x + unit * (i + 0.5)
        out.append(f'<text x="{cx}" y="{y0 + 16}" text-anchor="middle">{w}</text>')
        j = 0
        for config, color, _ in CONFIGS:
            rs = ratios(path, config, w)
            if not rs:
                continue
            bx = cx - unit * 0.35 + j * unit * 0.35
            j += 1
            m = min(st.median(rs), ymax)
            out.append(f'<rect x="{bx}" y="{y0 - h * m / ymax}" width="{unit * 0.3}" height="{h * m / ymax}" fill="{color}" opacity="0.45"/>')
            for r in rs:
                out.append(f'<circle cx="{bx + unit * 0.15}" cy="{y0 - h * min(r, ymax) / ymax}" r="2.5" fill="{color}"/>')
    out.append(f'<text x="{x + pw/2}" y="{y0 + 32}" text-anchor="middle">writer connections</text>')
    x += pw + 20
legend = [(c, l) for _, c, l in CONFIGS if l]
for j, (color, label) in enumerate(legend):
    out.append(f'<rect x="{left + j * 200}" y="{H - 18}" width="12" height="12" fill="{color}" opacity="0.7"/>')
    out.append(f'<text x="{left + j * 200 + 18}" y="{H - 8}">{label}</text>')
out.append(f'<text x="{W - 10}" y="{H - 8}" text-anchor="end">dashed: BEGIN IMMEDIATE (1×); red: the goal</text>')
out.append("</svg>")
open("every-round.svg", "w").write("\n".join(out))
