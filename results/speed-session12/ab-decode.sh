#!/usr/bin/env bash
# Decode before/after a change of the projections (cemfrac/ops/linear.h), interleaved rounds, same
# window.
#   BEFORE=path/to/old/cemfrac AFTER=build/tools/cemfrac ROUNDS=2 [BATCHES=1,8] [TAG=decode] \
#     results/speed-session12/ab-decode.sh
# Writes $TAG-{before,after}-rN.json next to this script.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tag="${TAG:-decode}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in before after; do
    bin=$([[ $side == before ]] && echo "$BEFORE" || echo "$AFTER")
    "$bin" --blas-core auto --threads 2 bench generate --config configs/small-llama.toml \
      --kinds mha,cem_attention --batches "${BATCHES:-1,8}" --reps 5 --json > "$here/$tag-$side-r$r.json"
    echo "round $r $side done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
