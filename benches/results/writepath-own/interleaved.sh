#!/bin/bash
# Interleaved rounds: the old build (48... HEAD before the change) and the new, each against its own `immediate`.
OLD=$(ls /work/main/target-old/release/deps/writepath-* | grep -v '\.d$' | head -1)
NEW=/work/main/target/release/deps/writepath-fdeda34f3dcb15b0
ARGS="--bench --rounds 1 --duration 4 --connections 64,256 --mixed-connections 64 --loads writes,mixed --configs immediate,layer-write"
for r in 1 2 3 4 5; do
  for which in old new; do
    if [ $which = old ]; then B=$OLD; else B=$NEW; fi
    if [ $(( r % 2 )) = 0 ] && [ $which = old ]; then continue; fi
    echo "=== round $r $which"; $B $ARGS 2>&1 | grep "^| "
  done
  if [ $(( r % 2 )) = 0 ]; then echo "=== round $r old"; $OLD $ARGS 2>&1 | grep "^| "; fi
done
