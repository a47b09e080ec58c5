#!/usr/bin/env bash
# Group commit measured from outside the server's process: `wrk` against the writepath bench's
# servers (`--serve`, each in its own process, INFO `fmt()` subscriber, its own fresh file),
# in interleaved rounds (the configurations' order rotated per round).
#
#   bash loadtest/scripts/wrk-group.sh OUT_DIR
#
# Environment (defaults in brackets):
#   SYNC        normal | full                                  [full]
#   CONNS       writer connection counts                       ["1 4 64 256"]
#   READERS     reader connections beside the writers (0: none; a second wrk of GETs) [0]
#   CONFIGS     configurations (see loadtest/src/bin/writepath.rs)      ["immediate layer-write layer-write-group"]
#   ROUNDS      rounds                                          [3]
#   DURATION    seconds per cell (after a 1 s warm-up)         [4]
#   PREP_ROUNDS hashing rounds before each write's transaction [0: no work before it]
#   PREP_US     instead: that many µs of work, measured once here (`--calibrate`) and handed
#               to every server as rounds
#   IDLE        seconds the server sits idle before its cell   [0]
#
# Writes are the bench's CalDAV-shaped PUT (read the sync token, upsert the object, bump the
# token, log the change; a read after the commit), every name unique. Per cell it records
# writes/s, reads/s, p99, non-2xx answers, and the server's CPU per write (utime + stime from
# /proc). Output: OUT_DIR/cells.tsv, one line per cell, and OUT_DIR/summary.md (medians over
# rounds of the per-round ratio to `immediate`, which must be in CONFIGS).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}
mkdir -p "$out"
sync=${SYNC:-full}
conns=${CONNS:-"1 4 64 256"}
readers=${READERS:-0}
configs=(${CONFIGS:-immediate layer-write layer-write-group})
rounds=${ROUNDS:-3}
duration=${DURATION:-4}
prep=${PREP_ROUNDS:-0}
idle=${IDLE:-0}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }

. loadtest/scripts/serve.sh
# BIN: a writepath bench binary built elsewhere (another commit's, for a before/after).
bin=$(bench_bin)
if [ -n "${PREP_US:-}" ]; then
  prep=$("$bin" --calibrate --prep-us "$PREP_US")
  echo "prep: $PREP_US µs = $prep hashing rounds" >&2
fi

lua=loadtest/scripts/put.lua
reads_lua=loadtest/scripts/get.lua

non2xx() { sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$1"; }
p99() { awk '$1 == "99%" {print $2}' "$1"; }

tsv="$out/cells.tsv"
echo -e "round\tconfig\tsync\twriters\treaders\twrites_s\treads_s\tp99\tnon2xx\tcpu_us_per_write" > "$tsv"
n=${#configs[@]}
for round in $(seq 0 $((rounds - 1))); do
  for c in $conns; do
    for i in $(seq 0 $((n - 1))); do
      config=${configs[$(( (i + round) % n ))]}
      dir=$(mktemp -d)
      start_server "$bin" "$dir" "$config" "$sync" "$prep" || exit 1
      threads=$(( c < 2 ? 1 : 2 ))
      wrk -t "$threads" -c "$c" -d 1s -s "$lua" "http://$addr" > /dev/null 2>&1 || true
      sleep "$idle"
      before=$(cpu_ticks "$pid")
      if [ "$readers" -gt 0 ]; then
        wrk -t 1 -c "$readers" -d "${duration}s" -s "$reads_lua" --latency "http://$addr" > "$dir/reads.txt" 2>&1 &
        rpid=$!
      fi
      wrk -t "$threads" -c "$c" -d "${duration}s" -s "$lua" --latency "http://$addr" > "$dir/writes.txt" 2>&1
      [ "$readers" -gt 0 ] && wait "$rpid"
      after=$(cpu_ticks "$pid")
      stop_server "$dir" || { echo "(the server was $config)" >&2; exit 1; }
      writes=$(rps "$dir/writes.txt")
      reads=0
      [ "$readers" -gt 0 ] && reads=$(rps "$dir/reads.txt")
      bad=$(( $(non2xx "$dir/writes.txt" || true) + 0 ))
      count=$(total "$dir/writes.txt")
      tick_us=$(( 1000000 / $(getconf CLK_TCK) ))
      cpu=$(awk -v t=$((after - before)) -v u="$tick_us" -v n="$count" 'BEGIN { printf "%.0f", n ? t * u / n : 0 }')
      echo -e "$round\t$config\t$sync\t$c\t$readers\t$writes\t$reads\t$(p99 "$dir/writes.txt")\t$bad\t$cpu" | tee -a "$tsv"
      rm -rf "$dir"
    done
  done
done

python3 - "$tsv" > "$out/summary.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
by = {}
for r in rows:
    by.setdefault((int(r["writers"]), r["config"]), {})[int(r["round"])] = r
print("| writers | config | writes/s (median) | × immediate per round (median, min–max) | reads × | p99 | non-2xx | CPU µs/write |")
print("|---|---|---|---|---|---|---|---|")
for (w, config) in sorted(by):
    cells = by[(w, config)]
    ref = by.get((w, "immediate"), {})
    ratios = [float(c["writes_s"]) / float(ref[k]["writes_s"]) for k, c in cells.items() if k in ref and float(ref[k]["writes_s"]) > 0]
    rr = [float(c["reads_s"]) / float(ref[k]["reads_s"]) for k, c in cells.items() if k in ref and float(ref[k]["reads_s"]) > 0]
    med = statistics.median(float(c["writes_s"]) for c in cells.values())
    ratio = f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else ""
    reads = f"{statistics.median(rr):.2f}×" if rr else ""
    p99s = "/".join(c["p99"] for c in cells.values())
    bad = sum(int(c["non2xx"] or 0) for c in cells.values())
    cpu = statistics.median(float(c["cpu_us_per_write"]) for c in cells.values())
    print(f"| {w} | {config} | {med:.0f} | {ratio} | {reads} | {p99s} | {bad} | {cpu:.0f} |")
PY
cat "$out/summary.md"
