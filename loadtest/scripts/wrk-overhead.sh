#!/usr/bin/env bash
# What the layer costs a request that needs no retry, as production runs it: the example app
# (`examples/app.rs`) served alone with its `fmt()` subscriber, `wrk` from its own process,
# and the server's CPU per request (utime + stime from /proc) over the measured window. The
# contenders run one after the other within each round, their order rotated round by round
# (interleaved), each on a fresh SQLite file; the report gives every round's CPU per request
# and, per contender, the median of its per-round ratios to the first contender.
#
#   bash loadtest/scripts/wrk-overhead.sh OUT_DIR
#
# Environment:
#   CONTENDERS  "NAME=BINARY:CONFIG ..." (default: this checkout's app, `bare` and `layer`);
#               the first is the reference. Another commit's app binary measures a bisect.
#   LOAD        get (GET /items/{id}, the default) or post (POST /items, a 1 KiB JSON body
#               whose padding the handler ignores)
#   CONNS       wrk's connections (default 64 for get, 1 for post)
#   LOG         the server's RUST_LOG: info (the default: `info`, every layer event at INFO
#               or above on) or off
#   ROUNDS [7]  DURATION [5] (seconds measured, after 1 s of warm-up)
#   RATE        requests per second in all: the load paced by h2load (`--rps`, from its own
#               process) instead of wrk's closed loop, so that every contender serves the same
#               request stream and CPU per request compares work at equal load (nghttp2-client)
#   PIN         1: the server on CPU 1 and wrk on CPU 0 (taskset), so that the server's share of
#               the machine is the same in every cell (steadier than unpinned on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "${RATE:-}" ]; then
  command -v h2load >/dev/null || { echo "h2load is not installed (apt-get install nghttp2-client)" >&2; exit 1; }
else
  command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
fi
load=${LOAD:-get}
case $load in
  get) conns=${CONNS:-64} ;;
  post) conns=${CONNS:-1} ;;
  *) echo "LOAD is get or post" >&2; exit 2 ;;
esac
log=${LOG:-info}
rounds=${ROUNDS:-7}
duration=${DURATION:-5}
if [ -z "${CONTENDERS:-}" ]; then
  cargo build --release --example app >&2
  app=${CARGO_TARGET_DIR:-target}/release/examples/app
  CONTENDERS="bare=$app:bare layer=$app:layer"
fi
read -r -a contenders <<< "$CONTENDERS"
n=${#contenders[@]}
tick_us=$(( 1000000 / $(getconf CLK_TCK) ))
threads=$(( conns < 2 ? 1 : 2 ))
server_pin=; client_pin=
if [ "${PIN:-0}" = 1 ]; then server_pin="taskset -c 1"; client_pin="taskset -c 0"; threads=1; fi

cat > "$out/get.lua" <<'EOF'
local counter = 0
function request()
  counter = counter + 1
  return wrk.format("GET", string.format("/items/%d", counter % 50 + 1))
end
EOF
pad=$(head -c 980 /dev/zero | tr '\0' 'x')
printf '{"name":"paced","pad":"%s"}' "$pad" > "$out/post.json"
cat > "$out/post.lua" <<EOF
local counter = 0
function request()
  counter = counter + 1
  local body = string.format('{"name":"item-%d","pad":"$pad"}', counter)
  return wrk.format("POST", "/items", {["Content-Type"] = "application/json"}, body)
end
EOF

# run NAME BINARY CONFIG ROUND: one cell; appends "ROUND NAME requests cpu_us_per_request".
run() {
  local name=$1 bin=$2 config=$3 round=$4 dir port pid before after count
  dir=$(mktemp -d)
  port=$(( 21000 + (next_port++ % 800) ))
  RUST_LOG=$log $server_pin "$bin" --config "$config" --db "$dir/db.sqlite" --addr "127.0.0.1:$port" \
    > "$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$port/items/1" && break; sleep 0.05; done
  curl -s -o /dev/null "http://127.0.0.1:$port/items/1" \
    || { echo "$name round $round: the server did not start" >&2; cat "$dir/server.log" >&2; exit 1; }
  for i in $(seq 1 50); do
    curl -s -o /dev/null -X POST -H 'content-type: application/json' -d "{\"name\":\"seed$i\"}" \
      "http://127.0.0.1:$port/items"
  done
  if command -v wrk >/dev/null; then
    $client_pin wrk -t "$threads" -c "$conns" -d 1s -s "$out/$load.lua" "http://127.0.0.1:$port" > /dev/null 2>&1 || true
  fi
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  if [ -n "${RATE:-}" ]; then
    local rps=$(( (RATE + conns - 1) / conns )) h2args=()
    [ "$load" = post ] && h2args=(-d "$out/post.json" -H "content-type: application/json")
    $client_pin h2load --h1 -c "$conns" -t 1 --rps "$rps" -D "$duration" "${h2args[@]}" \
      "http://127.0.0.1:$port/$([ "$load" = post ] && echo items || echo items/7)" > "$dir/h2load.txt" 2>&1
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    sed -n 's/^requests: .* \([0-9]*\) succeeded.*/  \1 requests in (h2load)/p' "$dir/h2load.txt" > "$dir/wrk.txt"
    grep -E "^(requests|status codes):" "$dir/h2load.txt" >> "$dir/wrk.txt"
  else
    $client_pin wrk -t "$threads" -c "$conns" -d "${duration}s" -s "$out/$load.lua" "http://127.0.0.1:$port" \
      > "$dir/wrk.txt" 2>&1
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  fi
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  count=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$dir/wrk.txt")
  [ -n "$count" ] && [ "$count" -gt 0 ] \
    || { echo "$name round $round: wrk measured nothing" >&2; cat "$dir/wrk.txt" >&2; exit 1; }
  if grep -q "Non-2xx" "$dir/wrk.txt"; then
    echo "warning: $name round $round: $(grep Non-2xx "$dir/wrk.txt")" >&2
  fi
  cp "$dir/wrk.txt" "$out/wrk-$load-$log-$name-$round.txt"
  echo "$round $name $count $(( (after - before) * tick_us * 100 / count ))" >> "$out/cells-$load-$log.txt"
  rm -rf "$dir"
}

next_port=$(( RANDOM % 400 ))
: > "$out/cells-$load-$log.txt"
{
  echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) load=$load conns=$conns log=$log rounds=$rounds duration=${duration}s pin=${PIN:-0} rate=${RATE:-closed loop}"
  echo "# contenders: $CONTENDERS"
  echo "# loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/report-$load-$log.txt"
for round in $(seq 1 "$rounds"); do
  for k in $(seq 0 $(( n - 1 ))); do
    c=${contenders[$(( (k + round) % n ))]}
    name=${c%%=*}; rest=${c#*=}; bin=${rest%:*}; config=${rest##*:}
    run "$name" "$bin" "$config" "$round"
  done
done
echo "# loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/report-$load-$log.txt"

# The report: CPU per request (µs, two decimals) per round, and per-round ratios to the first.
python3 - "$out/cells-$load-$log.txt" "${contenders[@]%%=*}" >> "$out/report-$load-$log.txt" <<'EOF'
import sys, statistics
cells, names = sys.argv[1], sys.argv[2:]
cpu = {}
for line in open(cells):
    r, name, count, cpu100 = line.split()
    cpu[(int(r), name)] = int(cpu100) / 100
rounds = sorted({r for r, _ in cpu})
print("| round | " + " | ".join(f"{n} µs/req" for n in names) + " | " + " | ".join(f"{n} ÷ {names[0]}" for n in names[1:]) + " |")
print("|---" * (2 * len(names)) + "|")
ratios = {n: [] for n in names[1:]}
for r in rounds:
    row = [f"{cpu[(r, n)]:.2f}" for n in names]
    for n in names[1:]:
        ratios[n].append(cpu[(r, n)] / cpu[(r, names[0])])
    print(f"| {r} | " + " | ".join(row) + " | " + " | ".join(f"{ratios[n][-1]:.3f}" for n in names[1:]) + " |")
for n in names[1:]:
    print(f"{n} ÷ {names[0]}: median {statistics.median(ratios[n]):.3f} (range {min(ratios[n]):.3f}-{max(ratios[n]):.3f})")
EOF
cat "$out/report-$load-$log.txt"
