#!/usr/bin/env bash
# Instructions per request, counted by callgrind: repeatable on a shared, noisy machine where
# CPU time is not (the same binary and inputs give the same count to within a few percent).
#
#   bash loadtest/scripts/instructions.sh           # needs valgrind, h2load (nghttp2-client), curl
#
#   APP=PATH        the example app's binary to measure (another commit's, for a bisect); then
#                   only the server part runs (step 1), nothing is built
#   CONFIGS="bare layer"   LOGS="info off"   ROUNDS=2
#   KEEP=DIR        keeps each server's callgrind file there (callgrind_annotate reads them)
#
# 1. Server: the example app (`--config bare` and `--config layer`, a `fmt()` subscriber at
#    INFO and with its filter off) under callgrind; 200 warm-up GETs /items/1, then the count is
#    zeroed, 2,000 GETs are sent by h2load over 8 HTTP/1.1 keep-alive connections, and the
#    count is dumped. User-space instructions only (the kernel's share of a request is not
#    counted). Two rounds.
# 2. In-process: `benches/allocs.rs` narrowed to one contender and one request shape, run with
#    1,000 and 3,000 requests; the difference over 2,000 is one request of bare plus one of
#    the contender (bare alone is the `none` row).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_PROFILE_BENCH_DEBUG=line-tables-only
# Its own target directory (debug line tables in release builds); INSTRUCTIONS_TARGET_DIR to
# reuse another.
export CARGO_TARGET_DIR="${INSTRUCTIONS_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/instructions}"
if [ -n "${APP:-}" ]; then
  app=$APP
else
  cargo build --release --example app
  app="$CARGO_TARGET_DIR/release/examples/app"
  allocs=$(cargo bench --bench allocs --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*allocs[^"]*\)".*/\1/p' | tail -1)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=39011

summary() { sed -n 's/^summary: //p' "$1" | head -1; }

server() { # CONFIG LOG ROUND
  rm -f "$work"/db.* "$work"/cg.*
  RUST_LOG=$2 valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
    "$app" --config "$1" --db "$work/db.sqlite" --addr "127.0.0.1:$port" >"$work/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$port/items/1" && break; sleep 0.5; done
  for i in $(seq 1 20); do
    curl -s -o /dev/null -X POST -H 'content-type: application/json' -d "{\"name\":\"seed$i\"}" \
      "http://127.0.0.1:$port/items"
  done
  h2load --h1 -n 200 -c 8 -t 1 "http://127.0.0.1:$port/items/1" >/dev/null
  callgrind_control --zero "$pid" >/dev/null
  h2load --h1 -n 2000 -c 8 -t 1 "http://127.0.0.1:$port/items/1" | grep -q '2000 succeeded'
  callgrind_control --dump=window "$pid" >/dev/null
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  local out; out=$(ls "$work"/cg.*.1 | head -1)
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP"; cp "$out" "$KEEP/$1-$2-$3.callgrind"; fi
  echo "$(( $(summary "$out") / 2000 ))"
}

echo "| round | config | log | instructions per GET |"
echo "|---|---|---|---:|"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for config in ${CONFIGS:-bare layer}; do
    for log in ${LOGS:-info off}; do
      echo "| $round | $config | $log | $(server "$config" "$log" "$round") |"
    done
  done
done

[ -n "${APP:-}" ] && exit 0

inproc() { # SIZE CONTENDER
  for n in 1000 3000; do
    ALLOCS_SIZES="$1" ALLOCS_ONLY="$2" ALLOCS_REQUESTS=$n \
      valgrind --tool=callgrind --callgrind-out-file="$work/in.$n" "$allocs" --bench >/dev/null 2>&1
  done
  echo $(( ($(summary "$work/in.3000") - $(summary "$work/in.1000")) / 2000 ))
}

echo
echo "| request | contender | instructions (bare + contender) |"
echo "|---|---|---:|"
for size in GET "POST 1 KiB"; do
  for contender in none "bare + head copy" layer tower_retry; do
    echo "| $size | $contender | $(inproc "$size" "$contender") |"
  done
done
