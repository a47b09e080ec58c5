# Shared by wrk-group.sh and wrk-one.sh (sourced, from the repository's root): the writepath
# bench binary, one server started and stopped, and what is read off it and off `wrk`.

# The writepath bench binary: $BIN, or built here.
bench_bin() {
  local bin=${BIN:-}
  if [ -z "$bin" ]; then
    cargo build --release -p tower-sqlite-retry-loadtest --bin writepath >&2 || return 1
    bin=target/release/writepath
  fi
  [ -x "$bin" ] || { echo "could not build the writepath bench" >&2; return 1; }
  echo "$bin"
}

# start_server BIN DIR CONFIG SYNC PREP_ROUNDS [more --serve arguments]: a server alone on a
# fresh file in DIR, its stdin a FIFO held open on fd 3 (closing it stops the server); sets
# `pid` and `addr`.
start_server() {
  local bin=$1 dir=$2 config=$3 sync=$4 prep=$5
  shift 5
  mkfifo "$dir/stdin"
  "$bin" --serve "$config" --db "$dir/db.sqlite" --pool-size 8 --synchronous "$sync" \
    --prep-rounds "$prep" "$@" < "$dir/stdin" > "$dir/stdout" 2> "$dir/server.log" &
  pid=$!
  exec 3> "$dir/stdin"
  for _ in $(seq 1 200); do grep -q listening "$dir/stdout" 2>/dev/null && break; sleep 0.05; done
  addr=$(sed -n 's/^listening //p' "$dir/stdout")
  [ -n "$addr" ] || { cat "$dir/server.log" >&2; return 1; }
}

# stop_server DIR: closes the server's stdin and waits for it to end.
stop_server() {
  exec 3>&-
  wait "$pid" || { echo "server failed" >&2; cat "$1/server.log" >&2; return 1; }
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rps() { sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' "$1"; }
total() { sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$1"; }
