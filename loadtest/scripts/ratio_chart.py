"""Draws writes as multiples of BEGIN IMMEDIATE's (same handler, same synchronous, pool of 8)
from the cells.tsv files that loadtest/scripts/wrk-group.sh writes: one panel per load, one
group of bars per writer connection count, a bar per configuration (the median of per-round
ratios) and a dot per round; optionally a goal line. Used by the results directories'
chart.py scripts:

    import sys; sys.path.insert(0, "../../scripts"); from ratio_chart import draw
"""
import csv, os, statistics as st


def ratios(path, config, writers):
    """Per-round writes of `config` over `immediate`'s in the same round."""
    if not os.path.exists(path):
        return []
    rows = [r for r in csv.DictReader(open(path), delimiter="\t") if int(r["writers"]) == writers]
    base = {r["round"]: float(r["writes_s"]) for r in rows if r["config"] == "immediate"}
    return [float(r["writes_s"]) / base[r["round"]] for r in rows
            if r["config"] == config and base.get(r["round"])]


def draw(out_file, title, panels, configs, legend_step=300, ymax=5.0):
    """panels: dicts with "title" (lines), "path", "writers", and optionally "goal" and
    "goal_for" (the writer counts the goal is for: a red line over them).
    configs: (config, colour, legend label or None), in bar order."""
    W, H, bottom, left = 900, 400, 60, 50
    top = 50 + 13 * (max(len(p["title"]) for p in panels) - 1)
    widths = [len(p["writers"]) for p in panels]
    unit = (W - left - 20 - 20 * (len(panels) - 1)) / sum(widths)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<text x="{W/2}" y="16" text-anchor="middle" font-size="13">{title}</text>']
    y0, h = H - bottom, H - bottom - top
    x = left
    for panel in panels:
        writers = panel["writers"]
        pw = unit * len(writers)
        lines = panel["title"]
        for k, line in enumerate(lines):
            out.append(f'<text x="{x + pw/2}" y="{top - 8 - 13 * (len(lines) - 1 - k)}" text-anchor="middle">{line}</text>')
        out.append(f'<line x1="{x}" y1="{y0}" x2="{x + pw}" y2="{y0}" stroke="black"/>')
        for t in range(int(ymax) + 1):
            y = y0 - h * t / ymax
            out.append(f'<line x1="{x}" y1="{y}" x2="{x + pw}" y2="{y}" stroke="#ddd"/>')
            if x == left:
                out.append(f'<text x="{x - 6}" y="{y + 4}" text-anchor="end">{t}×</text>')
        y1 = y0 - h / ymax
        out.append(f'<line x1="{x}" y1="{y1}" x2="{x + pw}" y2="{y1}" stroke="black" stroke-dasharray="4 3"/>')
        if "goal" in panel:
            yg = y0 - h * panel["goal"] / ymax
            for i, w in enumerate(writers):
                if w in panel.get("goal_for", writers):
                    out.append(f'<line x1="{x + unit * i}" y1="{yg}" x2="{x + unit * (i + 1)}" y2="{yg}" stroke="#c00000" stroke-width="1.5"/>')
        for i, w in enumerate(writers):
            cx = x + unit * (i + 0.5)
            out.append(f'<text x="{cx}" y="{y0 + 16}" text-anchor="middle">{w}</text>')
            j = 0
            for config, color, _ in configs:
                rs = ratios(panel["path"], config, w)
                if not rs:
                    continue
                bx = cx - unit * 0.35 + j * unit * 0.35
                j += 1
                m = min(st.median(rs), ymax)
                out.append(f'<rect x="{bx}" y="{y0 - h * m / ymax}" width="{unit * 0.3}" height="{h * m / ymax}" fill="{color}" opacity="0.5"/>')
                for r in rs:
                    out.append(f'<circle cx="{bx + unit * 0.15}" cy="{y0 - h * min(r, ymax) / ymax}" r="2.5" fill="{color}"/>')
        out.append(f'<text x="{x + pw/2}" y="{y0 + 32}" text-anchor="middle">writer connections</text>')
        x += pw + 20
    legend = [(color, label) for _, color, label in configs if label]
    for j, (color, label) in enumerate(legend):
        out.append(f'<rect x="{left + j * legend_step}" y="{H - 18}" width="12" height="12" fill="{color}" opacity="0.7"/>')
        out.append(f'<text x="{left + j * legend_step + 18}" y="{H - 8}">{label}</text>')
    goal = "; red: the goal" if any("goal" in p for p in panels) else ""
    out.append(f'<text x="{W - 10}" y="{H - 8}" text-anchor="end">dashed: BEGIN IMMEDIATE (1×){goal}</text>')
    out.append("</svg>")
    open(out_file, "w").write("\n".join(out))
