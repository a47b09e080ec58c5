#!/usr/bin/env bash
# Before (056451f) / after (HEAD) of issue 48's changes on the sqlx write path: wrk at FULL,
# interleaved cells, rotated order per round.
set -u
cd /work/main
out=benches/results/issue-48/before-after
mkdir -p "$out"
: > "$out/cells.txt"
cells=("before immediate /tmp/before-target/release/writepath" "before layer-write-group /tmp/before-target/release/writepath" "after layer-write-group target/release/writepath")
for round in 0 1 2 3; do
  for conns in 64 256; do
    for i in 0 1 2; do
      set -- ${cells[$(( (i + round) % 3 ))]}
      tag=$1; config=$2; bin=$3
      line=$(BIN=$bin DURATION=4 bash loadtest/scripts/wrk-one.sh "$config" full "$conns" "r$round-$tag" "$out" 2>&1 | tail -1)
      echo -e "$round\t$tag\t$config\t$conns\t$line" | tee -a "$out/cells.txt"
    done
  done
done
