# Draws group.svg: writes as multiples of BEGIN IMMEDIATE's (same handler, same synchronous,
# pool of 8), per connection count, for the write path without and with group commit; the
# bar is the median of per-round ratios, each dot one round. Reads the cells.tsv files that
# benches/scripts/wrk-group.sh wrote.   python3 chart.py   (from this directory)
import sys
sys.path.insert(0, "../../scripts")
from ratio_chart import draw

draw("group.svg",
     "writes as multiples of BEGIN IMMEDIATE (bar: median of rounds, dots: rounds); wrk, own process",
     [dict(title=["synchronous = FULL"], path="full-prep0/cells.tsv", writers=[1, 4, 64, 256]),
      dict(title=["FULL, 64 writers + 16 readers"], path="full-split/cells.tsv", writers=[64]),
      dict(title=["synchronous = NORMAL"], path="normal-prep0/cells.tsv", writers=[1, 4, 64, 256])],
     [("layer-write", "#d05000", "write path, no groups"),
      ("layer-write-group", "#0070c0", "write path, group commit (default)")])
