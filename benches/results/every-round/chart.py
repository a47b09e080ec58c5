# Draws every-round.svg: the write path's writes as multiples of BEGIN IMMEDIATE's, every
# round a dot, issue 32's goals as red lines. Reads the cells.tsv files that
# benches/scripts/wrk-group.sh wrote here.   python3 chart.py   (from this directory)
import sys
sys.path.insert(0, "../../scripts")
from ratio_chart import draw

draw("every-round.svg",
     "writes as multiples of BEGIN IMMEDIATE, every round a dot (bar: median); wrk, own process",
     [dict(title=["synchronous = FULL", "goal: ≥ 2× in every round at 64 and 256"],
           path="full/cells.tsv", writers=[1, 4, 64, 256], goal=2.0, goal_for=[64, 256]),
      dict(title=["FULL, + 16 readers", "goal: ≥ 0.9×"], path="full-split/cells.tsv",
           writers=[64], goal=0.9),
      dict(title=["NORMAL", "goal: ≥ 1.3×"], path="normal/cells.tsv", writers=[64], goal=1.3)],
     [("layer-write", "#d05000", "write path, no groups"),
      ("layer-write-group", "#0070c0", "write path, the defaults"),
      ("layer-write-group-read-limit", "#0070c0", None)],
     legend_step=200)
