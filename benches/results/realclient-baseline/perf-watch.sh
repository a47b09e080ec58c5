#!/bin/bash
# Records each server once: the first `--serve bare`, then `--serve layer`.
for cfg in bare layer; do
  for i in $(seq 1 600); do
    pid=$(pgrep -f -- "--serve $cfg --db" | head -1)
    [ -n "$pid" ] && break
    sleep 0.05
  done
  echo "$cfg pid $pid"
  sleep 1.5
  perf record -F 999 --call-graph dwarf,16384 -p $pid -o /tmp/perf/$cfg.data -- sleep 6 2>&1 | tail -2
  # wait for this server to exit before looking for the next
  while kill -0 $pid 2>/dev/null; do sleep 0.1; done
done
