#!/bin/bash
# Interleaved rounds, the same bench source in both builds and the same work per write
# (--prep-rounds): the build before the change (115e875) and after it.
OLD=/work/main/target-old/release/deps/writepath-07a032ac8e88b310
NEW=/work/main/target/release/deps/writepath-fdeda34f3dcb15b0
ARGS="--bench --rounds 1 --duration 4 --prep-rounds 5571 --connections 64,256 --mixed-connections 64 --loads writes,mixed --configs immediate,layer-write"
for r in 1 2 3 4 5 6; do
  if [ $(( r % 2 )) = 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    if [ $which = old ]; then B=$OLD; else B=$NEW; fi
    echo "=== round $r $which"; $B $ARGS 2>&1 | grep "^| "
  done
done
