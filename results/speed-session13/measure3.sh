#!/bin/bash
set -u
O=/work/main/results/speed-session13
cd /work/main
/tmp/suite-pause.sh STOP
sleep 5
for which in before after; do
  /usr/bin/time -v /tmp/$which-cemfrac --blas-core auto --threads 2 bench train --config configs/small-cem-full.toml --steps 1 --warmup 0 --no-peer --json > $O/rss-small-cem-full-$which.json 2> $O/rss-small-cem-full-$which.err
  echo "$which rss done $(date +%T) $(grep 'Maximum resident' $O/rss-small-cem-full-$which.err)" | tee -a $O/load.txt
done
/tmp/suite-pause.sh CONT
