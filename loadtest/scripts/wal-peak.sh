#!/usr/bin/env bash
# The WAL's peak size under steady writes: one writepath bench server (group commit, the
# default configuration `layer-write-group`), `wrk` with CONNS writers for DURATION seconds,
# no reader besides the handler's own read after its commit; the WAL file's size sampled
# every 100 ms. Prints the peak in bytes and in frames of the database's page size.
#
#   bash loadtest/scripts/wal-peak.sh OUT_DIR
#
# Environment: SYNC [full], CONNS [64], DURATION [60], CONFIG [layer-write-group].
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}
mkdir -p "$out"
sync=${SYNC:-full}
conns=${CONNS:-64}
duration=${DURATION:-60}
config=${CONFIG:-layer-write-group}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
. loadtest/scripts/serve.sh
bin=$(bench_bin)
dir=$(mktemp -d)
start_server "$bin" "$dir" "$config" "$sync" 0 || exit 1
wrk -t 2 -c "$conns" -d "${duration}s" -s loadtest/scripts/put.lua --latency "http://$addr" \
  > "$out/wrk.txt" 2>&1 &
wpid=$!
peak=0
samples="$out/wal-sizes.txt"
: > "$samples"
while kill -0 "$wpid" 2>/dev/null; do
  size=$(stat -c %s "$dir/db.sqlite-wal" 2>/dev/null || echo 0)
  echo "$size" >> "$samples"
  [ "$size" -gt "$peak" ] && peak=$size
  sleep 0.1
done
page=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA page_size').fetchone()[0])" "$dir/db.sqlite")
stop_server "$dir"
frames=$(( (peak - 32) / (page + 24) ))
echo "config $config sync $sync writers $conns duration ${duration}s: WAL peak $peak bytes = $frames frames of $page bytes; writes/s $(rps "$out/wrk.txt"), non-2xx $(sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$out/wrk.txt")" | tee "$out/summary.txt"
# The checkpointer's DEBUG events, when TSR_BENCH_FILTER asked for them.
grep "checkpoint of the WAL" "$dir/server.log" | sed 's/\x1b\[[0-9;]*m//g' | grep -o "db.write.*" > "$out/checkpoints.txt" || true
rm -rf "$dir"
