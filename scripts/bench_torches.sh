#!/usr/bin/env bash
# The same benchmark rows against both torches of CI, in one window on one machine: the
# host leg's build (Debian's LibTorch 1.13, OpenBLAS 0.3.21; build/) and the pip leg's (torch
# 2.11.0+cu130 from PyPI, which carries its own BLAS; build-pip/), each against the PyTorch eager peer
# of its own torch (the peers run under the build's interpreter, cli/peer_util.h). The builds alternate
# row by row, so a change of load touches both alike. Raw JSON goes to OUT (one file per row and build).
#   scripts/bench_torches.sh OUT [REPEATS]      (REPEATS: how many times each row runs per build; 3)
# Run it on a quiet machine (nothing else building or testing); it prints the load before and after.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=${1:?usage: scripts/bench_torches.sh OUT [REPEATS]}
reps=${2:-3}
mkdir -p "$out"
declare -A exe=([host]="$root/build/tools/cemfrac" [pip]="$root/build-pip/tools/cemfrac")
for b in host pip; do [[ -x "${exe[$b]}" ]] || { echo "bench_torches: no ${exe[$b]} (build both legs first)" >&2; exit 1; }; done
# OPENBLAS_CORETYPE is left as the machine sets it (it only concerns the host build's OpenBLAS).
rows=(
  "train-small-llama|bench train --config configs/small-llama.toml --steps 5 --warmup 1 --peer --json"
  "train-small-cem-both|bench train --config configs/small-cem-both.toml --steps 5 --warmup 1 --peer --json"
  "train-small-cofrgenet-f|bench train --config configs/small-cofrgenet-f.toml --steps 5 --warmup 1 --peer --json"
  "ladder-d8|bench ladder --depths 8 --reps 7 --peer --json"
  "layers|bench layers --reps 5 --json"
)
{ echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"; echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD)"; date -u; } | tee "$out/machine.txt"
cd "$root"
for ((r = 1; r <= reps; r++)); do
  for row in "${rows[@]}"; do
    name=${row%%|*} cmd=${row#*|}
    for b in host pip; do
      echo "bench_torches: repeat $r, $name, $b" >&2
      # shellcheck disable=SC2086  # cmd is a list of words
      "${exe[$b]}" $cmd >"$out/$name.$b.$r.json"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
