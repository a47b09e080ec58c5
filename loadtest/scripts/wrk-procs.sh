#!/usr/bin/env bash
# Several processes writing one SQLite file: `wrk` against N writepath servers (`--serve`,
# each its own process, INFO `fmt()` subscriber) sharing one fresh file, the connections split
# evenly over them (one `wrk` per server, all at once), in interleaved rounds (the
# configurations' order rotated per round).
#
#   bash loadtest/scripts/wrk-procs.sh OUT_DIR
#
# Environment (defaults in brackets):
#   SYNC        normal | full                                       [full]
#   CONNS       total writer connections                            ["64"]
#   PROCS       server process counts                               ["1 2 4"]
#   CONFIGS     configurations (loadtest/src/bin/writepath.rs)      ["immediate layer-write-group layer-thread"]
#   ROUNDS      rounds                                              [3]
#   DURATION    seconds per cell (after a 1 s warm-up)              [4]
#   BIN         a writepath binary built elsewhere (another commit's)
#   KEEP        set: each cell's directory (servers' logs, wrk's output, the file) kept in OUT_DIR
#   TURN_STATS  set: each server's write turn (transactions, time held, shared fsyncs) and its
#               log's WARN count appended to OUT_DIR/turn-stats.txt, per cell
#
# Per cell: writes/s (the sum over the servers), the worst server's p99 and the longest
# request (wrk's `Max`), non-2xx answers. Output: OUT_DIR/cells.tsv and OUT_DIR/summary.md
# (medians over rounds; per round, each configuration's p99 against its own one-process p99
# and against `immediate`'s at the same process count).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}
mkdir -p "$out"
sync=${SYNC:-full}
conns=${CONNS:-64}
procs_list=${PROCS:-"1 2 4"}
configs=(${CONFIGS:-immediate layer-write-group layer-thread})
rounds=${ROUNDS:-3}
duration=${DURATION:-4}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }

. loadtest/scripts/serve.sh
bin=$(bench_bin)
lua=loadtest/scripts/put.lua

non2xx() { sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$1"; }
# wrk's latency figures in milliseconds.
ms() { awk -v v="$1" 'BEGIN { if (v ~ /us$/) print v / 1000; else if (v ~ /ms$/) print v + 0; else if (v ~ /m$/) print v * 60000; else print v * 1000 }'; }
p99() { ms "$(awk '$1 == "99%" {print $2}' "$1")"; }
max_latency() { ms "$(awk '$1 == "Latency" {print $4}' "$1")"; }

tsv="$out/cells.tsv"
echo -e "round\tconfig\tsync\tconns\tprocs\twrites_s\tp99_ms\tmax_ms\tnon2xx" > "$tsv"
n=${#configs[@]}
for round in $(seq 0 $((rounds - 1))); do
  for procs in $procs_list; do
    for i in $(seq 0 $((n - 1))); do
      config=${configs[$(( (i + round) % n ))]}
      dir=$(mktemp -d)
      pids=()
      addrs=()
      # The first server seeds the file; the others open it once it is there.
      for s in $(seq 1 "$procs"); do
        mkfifo "$dir/stdin$s"
        stats_args=()
        [ -n "${TURN_STATS:-}" ] && stats_args=(--turn-stats "$dir/turn-stats$s")
        "$bin" --serve "$config" --db "$dir/db.sqlite" --pool-size 8 --synchronous "$sync" \
          --prep-rounds 0 "${stats_args[@]}" < "$dir/stdin$s" > "$dir/stdout$s" 2> "$dir/server$s.log" &
        pids+=($!)
        eval "exec $((s + 2))> \"$dir/stdin$s\""
        for _ in $(seq 1 200); do grep -q listening "$dir/stdout$s" 2>/dev/null && break; sleep 0.05; done
        addr=$(sed -n 's/^listening //p' "$dir/stdout$s")
        [ -n "$addr" ] || { cat "$dir/server$s.log" >&2; exit 1; }
        addrs+=("$addr")
      done
      per=$(( conns / procs ))
      threads=$(( per < 2 ? 1 : 2 ))
      warm=()
      for s in $(seq 1 "$procs"); do
        wrk -t "$threads" -c "$per" -d 1s -s "$lua" "http://${addrs[$((s - 1))]}" -- "warm$s-" > "$dir/warm$s.txt" 2>&1 &
        warm+=($!)
      done
      for w in "${warm[@]}"; do wait "$w"; done
      wpids=()
      for s in $(seq 1 "$procs"); do
        wrk -t "$threads" -c "$per" -d "${duration}s" -s "$lua" --latency \
          "http://${addrs[$((s - 1))]}" -- "p$s-" > "$dir/writes$s.txt" 2>&1 &
        wpids+=($!)
      done
      for w in "${wpids[@]}"; do wait "$w"; done
      for s in $(seq 1 "$procs"); do eval "exec $((s + 2))>&-"; done
      for p in "${pids[@]}"; do
        wait "$p" || { echo "a server ($config) failed" >&2; cat "$dir"/server*.log >&2; exit 1; }
      done
      writes=0; worst=0; longest=0; bad=0; answered=0
      for s in $(seq 1 "$procs"); do
        f="$dir/writes$s.txt"
        writes=$(awk -v a="$writes" -v b="$(rps "$f")" 'BEGIN { print a + b }')
        worst=$(awk -v a="$worst" -v b="$(p99 "$f")" 'BEGIN { print (b > a) ? b : a }')
        longest=$(awk -v a="$longest" -v b="$(max_latency "$f")" 'BEGIN { print (b > a) ? b : a }')
        bad=$(( bad + $(non2xx "$f" || true) + $(non2xx "$dir/warm$s.txt" || true) + 0 ))
        answered=$(( answered + $(total "$f") + $(total "$dir/warm$s.txt") ))
      done
      # Every 2xx write is in the file once (every name is unique): one object and one change
      # per answer (wrk counts a request cut off at its run's end neither way, so the file may
      # hold up to one write per connection and run more: the warm-up's and the window's).
      python3 - "$dir/db.sqlite" "$(( answered - bad ))" "$conns" <<'PY' || exit 1
import sqlite3, sys
db, ok, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = sqlite3.connect(db)
objects = c.execute("SELECT count(*) FROM objects WHERE name NOT LIKE 'seed-%'").fetchone()[0]
changes = c.execute("SELECT count(*) FROM changes").fetchone()[0]
assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
assert objects == changes and ok <= objects <= ok + 2 * conns, (objects, changes, ok)
PY
      echo -e "$round\t$config\t$sync\t$conns\t$procs\t$writes\t$worst\t$longest\t$bad" | tee -a "$tsv"
      if [ -n "${TURN_STATS:-}" ]; then
        for s in $(seq 1 "$procs"); do
          echo "round $round procs $procs server $s: $(cat "$dir/turn-stats$s" 2>/dev/null)" \
            "warns $(grep -c WARN "$dir/server$s.log" || true)" >> "$out/turn-stats.txt"
        done
      fi
      if [ -n "${KEEP:-}" ]; then mv "$dir" "$out/cell-$round-$config-$procs"; else rm -rf "$dir"; fi
    done
  done
done

python3 - "$tsv" > "$out/summary.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
cell = {(r["config"], int(r["procs"]), int(r["round"])): r for r in rows}
configs = sorted({r["config"] for r in rows})
procs = sorted({int(r["procs"]) for r in rows})
rounds = sorted({int(r["round"]) for r in rows})
def ratio(num, den):
    vals = [num(k) / den(k) for k in rounds if den(k)]
    return f"{statistics.median(vals):.2f}× ({min(vals):.2f}–{max(vals):.2f})" if vals else ""
print("| config | processes | writes/s (median) | × its 1-process writes | p99 ms (median) | × its 1-process p99 | × `immediate`'s p99 | max ms (median) | non-2xx |")
print("|---|---:|---:|---|---:|---|---|---:|---:|")
for c in configs:
    for p in procs:
        ks = [k for k in rounds if (c, p, k) in cell]
        if not ks: continue
        w = lambda k, c=c, p=p: float(cell[(c, p, k)]["writes_s"])
        q = lambda k, c=c, p=p: float(cell[(c, p, k)]["p99_ms"])
        w1 = lambda k, c=c: float(cell[(c, 1, k)]["writes_s"]) if (c, 1, k) in cell else 0
        q1 = lambda k, c=c: float(cell[(c, 1, k)]["p99_ms"]) if (c, 1, k) in cell else 0
        qi = lambda k, p=p: float(cell[("immediate", p, k)]["p99_ms"]) if ("immediate", p, k) in cell else 0
        med_w = statistics.median(w(k) for k in ks)
        med_q = statistics.median(q(k) for k in ks)
        med_max = statistics.median(float(cell[(c, p, k)]["max_ms"]) for k in ks)
        bad = sum(int(cell[(c, p, k)]["non2xx"] or 0) for k in ks)
        print(f"| {c} | {p} | {med_w:.0f} | {ratio(w, w1)} | {med_q:.1f} | {ratio(q, q1)} | {ratio(q, qi)} | {med_max:.0f} | {bad} |")
PY
cat "$out/summary.md"
