#!/bin/bash
# Interleaved rounds, the same bench source in both builds and the same work per write
# (--prep-rounds): the write path before issue 24's redesign (1636544) and after it. Each
# build's `layer-write` against its own `immediate`; the order of the builds alternates.
#   git worktree add /tmp/old 1636544
#   (cd /tmp/old && CARGO_TARGET_DIR=/work/main/target-old cargo bench --features sqlite-write --bench writepath --no-run)
#   cargo bench --features sqlite-write --bench writepath --no-run
OLD=$(ls /work/main/target-old/release/deps/writepath-* | grep -v '\.d$' | head -1)
NEW=$(ls /work/main/target/release/deps/writepath-* | grep -v '\.d$' | head -1)
ARGS="--bench --rounds 1 --duration 4 --prep-rounds 5571 --connections 64,256 --mixed-connections 64 --split 64+16 --loads writes,mixed,split --configs immediate,layer-write"
for r in 1 2 3 4 5 6; do
  if [ $(( r % 2 )) = 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    if [ $which = old ]; then B=$OLD; else B=$NEW; fi
    echo "=== round $r $which"; $B $ARGS 2>&1 | grep "^| "
  done
done
