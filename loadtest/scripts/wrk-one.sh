#!/usr/bin/env bash
# One cell of loadtest/scripts/wrk-group.sh, for investigations: a writepath bench server alone
# (`--serve`, INFO `fmt()` subscriber, a fresh file), warmed for 1 s, then `wrk` from its own
# process for DURATION seconds, optionally under `perf record`; prints writes/s and the
# server's CPU per write (utime + stime from /proc), and appends the write turn's figures
# (`--turn-stats`: transactions, time held, mean held per transaction) to OUT_DIR/turn-TAG.txt.
#
#   bash loadtest/scripts/wrk-one.sh CONFIG SYNC CONNS TAG OUT_DIR
#
# Environment: BIN (a writepath bench binary; built here if unset), PERF=1 (perf record -g of
# the server into OUT_DIR/perf-TAG.data), DURATION [4].
set -euo pipefail
cd "$(dirname "$0")/../.."
config=${1:?CONFIG}; sync=${2:?SYNC}; conns=${3:?CONNS}; tag=${4:?TAG}; out=${5:?OUT_DIR}
duration=${DURATION:-4}
mkdir -p "$out"
out=$(cd "$out" && pwd)
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
. loadtest/scripts/serve.sh
bin=$(bench_bin)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start_server "$bin" "$dir" "$config" "$sync" 0 --turn-stats "$out/turn-$tag.txt"
threads=$(( conns < 2 ? 1 : 2 ))
wrk -t "$threads" -c "$conns" -d 1s -s loadtest/scripts/put.lua "http://$addr" > /dev/null 2>&1 || true
before=$(cpu_ticks "$pid")
if [ "${PERF:-0}" = 1 ]; then
  perf record -F 2000 -g -p "$pid" -o "$out/perf-$tag.data" -- sleep "$duration" > /dev/null 2>&1 &
  perf_pid=$!
fi
wrk -t "$threads" -c "$conns" -d "${duration}s" -s loadtest/scripts/put.lua --latency "http://$addr" > "$dir/wrk.txt" 2>&1
[ "${PERF:-0}" = 1 ] && wait "$perf_pid"
after=$(cpu_ticks "$pid")
stop_server "$dir"
count=$(total "$dir/wrk.txt")
rps=$(rps "$dir/wrk.txt")
tick_us=$(( 1000000 / $(getconf CLK_TCK) ))
echo "$tag $config $sync $conns writes/s $rps cpu_us_per_write $(( (after - before) * tick_us / count ))"
