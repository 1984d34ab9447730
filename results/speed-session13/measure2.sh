#!/bin/bash
set -u
O=/work/main/results/speed-session13
cd /work/main
/tmp/suite-pause.sh STOP
sleep 15
echo "round 2-3 load before: $(cat /proc/loadavg)" | tee -a $O/load.txt
for round in 2 3; do
  for which in after before; do
    /tmp/$which-cemfrac --blas-core auto --threads 2 bench train --config configs/small-cem-full.toml --steps 3 --warmup 1 --no-peer --json > $O/train-small-cem-full-$which-r$round.json 2> $O/train-small-cem-full-$which-r$round.err
    echo "$which train r$round done $(date +%T) $(cat /proc/loadavg)" | tee -a $O/load.txt
  done
done
echo "load after: $(cat /proc/loadavg)" | tee -a $O/load.txt
/tmp/suite-pause.sh CONT
