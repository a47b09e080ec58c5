#!/bin/bash
# The write path against BEGIN IMMEDIATE as the handler's work outside its transaction shrinks:
# how far the machine's CPU, rather than the write lock, decides the ratio.
for prep in 0 50 100 200 300; do  # (and 100, 200 again with --rounds 5, into prep-$prep-r5)
  cargo bench --features sqlite-write --bench writepath -- --rounds 3 --duration 4 \
    --prep-us $prep --connections 64,256 --loads writes --configs immediate,layer-write \
    --out benches/results/writepath-prep/prep-$prep
done
