#!/bin/bash
# Per-head D+LR fused op (issue 19): before = 9daa6a2, fused = working tree after 637d861; suite stopped.
set -u
O=/work/main/results/speed-session13
cd /work/main
/tmp/suite-pause.sh STOP
sleep 15
echo "fused window, load before: $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
for round in 1 2; do
  for which in before fused; do
    /tmp/$which-cemfrac --blas-core auto --threads 2 bench layers --reps 5 --kinds mha,cem_attention --json > $O/fused-layers-$which-r$round.json 2> $O/fused-layers-$which-r$round.err
    echo "$which r$round layers done $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
  done
done
for round in 1 2 3; do
  if [ $round = 2 ]; then order="fused before"; else order="before fused"; fi
  for which in $order; do
    /tmp/$which-cemfrac --blas-core auto --threads 2 bench train --config configs/small-cem-full.toml --steps 3 --warmup 1 --no-peer --json > $O/fused-train-small-cem-full-$which-r$round.json 2> $O/fused-train-small-cem-full-$which-r$round.err
    echo "$which train r$round done $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
  done
done
/usr/bin/time -v /tmp/fused-cemfrac --blas-core auto --threads 2 bench train --config configs/small-cem-full.toml --steps 1 --warmup 0 --no-peer --json > $O/rss-small-cem-full-fused.json 2> $O/rss-small-cem-full-fused.err
echo "fused rss $(grep 'Maximum resident' $O/rss-small-cem-full-fused.err)" | tee -a $O/load.txt
/tmp/fused-cemfrac --blas-core auto --threads 2 bench train --config configs/small-cem-full.toml --steps 1 --warmup 1 --no-peer --profile > $O/profile-small-cem-full-fused.txt 2>&1
echo "load after: $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
/tmp/suite-pause.sh CONT
