#!/bin/bash
# Per-head D+LR split (issue 19): before = 9daa6a2, after = working tree; suite paused (SIGSTOP).
set -u
O=/work/main/results/speed-session13
cd /work/main
/tmp/suite-pause.sh STOP
sleep 20
echo "load before: $(cat /proc/loadavg)" | tee $O/load.txt
for round in 1 2; do
  for which in before after; do
    /tmp/$which-cemfrac --blas-core auto --threads 2 bench layers --reps 5 --kinds mha,cem_attention --json > $O/layers-$which-r$round.json 2> $O/layers-$which-r$round.err
    echo "$which r$round layers done $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
  done
done
for which in before after; do
  /tmp/$which-cemfrac --blas-core auto --threads 2 bench train --config configs/small-cem-full.toml --steps 3 --warmup 1 --no-peer --json > $O/train-small-cem-full-$which.json 2> $O/train-small-cem-full-$which.err
  echo "$which train done $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
done
echo "load after: $(cat /proc/loadavg)" | tee -a $O/load.txt
/tmp/suite-pause.sh CONT
