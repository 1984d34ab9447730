#!/usr/bin/env bash
# Session 11 (issue 19): the fused RMSNorm and SiLU gate, before/after, on a quiet machine.
#   BEFORE: a copy of build/tools/cemfrac at 664b953 (main before the change)
#   AFTER:  a copy of build/tools/cemfrac with the change (the commit is in docs/history/speed.md)
# 1. Each binary against the PyTorch peer once (before-*.json, after-*.json), then
# 2. before/after interleaved without the peer, 3 rounds (ab-{before,after}-<config>-<round>.json).
set -euo pipefail
: "${BEFORE:?} ${AFTER:?}"
for w in before after; do
  B=$BEFORE; [[ $w == after ]] && B=$AFTER
  for c in small-llama small-cem-both; do
    $B --blas-core auto bench train --config configs/$c.toml --steps 5 --warmup 1 --peer --json > $w-$c.json
  done
done
for r in 1 2 3; do
  for c in small-llama small-cem-both; do
    for w in before after; do
      B=$BEFORE; [[ $w == after ]] && B=$AFTER
      $B --blas-core auto bench train --config configs/$c.toml --steps 6 --warmup 1 --no-peer --json > ab-$w-$c-$r.json
    done
  done
done
