# Draws pace.svg: the split load (64 writers + 16 readers), writes and reads as multiples of
# BEGIN IMMEDIATE's, per setup, median of per-round ratios with each round's ratio as a dot.
# python3 chart.py   (from this directory)
import json, statistics as st

SETUPS = [  # (label, results file, config column)
    ("before: no hand-over, no limit", "final-10ms/writepath.json", "layer-write-no-read-limit"),
    ("no hand-over, read limit 2", "final-10ms/writepath.json", "layer-write"),
    ("now: hand-over, no limit", "final/writepath.json", "layer-write"),
    ("hand-over, read limit 2", "final/writepath.json", "layer-write-read-limit"),
]

def ratios(path, config, key):
    rows = [r for r in json.load(open(path)) if r["load"] == "split"]
    base = {r["round"]: r for r in rows if r["config"] == "immediate"}
    return [r[key] / base[r["round"]][key] for r in rows if r["config"] == config]

W, H, left, top, bottom = 760, 360, 60, 40, 70
panels = [("writes ×", "writes_per_s", 1.3, 0.9), ("reads ×", "reads_per_s", 9.0, 5.0)]
pw = (W - left - 40) / 2
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<text x="{W/2}" y="18" text-anchor="middle" font-size="13">64 writers + 16 readers, as multiples of BEGIN IMMEDIATE (median, dots: rounds)</text>']
colors = ["#999999", "#c08040", "#d05000", "#0070c0"]
for p, (title, key, ymax, goal) in enumerate(panels):
    x0 = left + p * (pw + 20)
    y0, h = H - bottom, H - bottom - top
    out.append(f'<text x="{x0 + pw/2}" y="{top - 6}" text-anchor="middle">{title} (goal {"≥"} {goal})</text>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0 + pw}" y2="{y0}" stroke="black"/>')
    for t in [0, ymax / 2, ymax]:
        y = y0 - h * t / ymax
        out.append(f'<text x="{x0 - 4}" y="{y + 4}" text-anchor="end">{t:g}</text>')
    gy = y0 - h * goal / ymax
    out.append(f'<line x1="{x0}" y1="{gy}" x2="{x0 + pw}" y2="{gy}" stroke="green" stroke-dasharray="4,3"/>')
    bw = pw / len(SETUPS)
    for i, (label, path, config) in enumerate(SETUPS):
        rs = ratios(path, config, key)
        m = st.median(rs)
        bx = x0 + i * bw + bw * 0.15
        y = y0 - h * min(m, ymax) / ymax
        out.append(f'<rect x="{bx:.1f}" y="{y:.1f}" width="{bw*0.7:.1f}" height="{y0 - y:.1f}" fill="{colors[i]}"/>')
        out.append(f'<text x="{bx + bw*0.35:.1f}" y="{y - 4:.1f}" text-anchor="middle">{m:.2f}</text>')
        for r in rs:
            out.append(f'<circle cx="{bx + bw*0.35:.1f}" cy="{y0 - h*min(r, ymax)/ymax:.1f}" r="2" fill="black" fill-opacity="0.5"/>')
for i, (label, _, _) in enumerate(SETUPS):
    lx = left + (i % 2) * 340
    ly = H - 40 + (i // 2) * 16
    out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colors[i]}"/>')
    out.append(f'<text x="{lx + 14}" y="{ly}">{label}</text>')
out.append("</svg>")
open("pace.svg", "w").write("\n".join(out))
