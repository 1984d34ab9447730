#!/usr/bin/env bash
# Quiet-machine measurements, session 9. Everything at commit of /work/main/build (8671e8b).
cd /work/main
B=/work/wt/profile/build/tools/cemfrac
PROF=--profile
[[ -x $B ]] || { B=build/tools/cemfrac; PROF=; }
echo "binary $B" >> /tmp/quiet/load.log
Q=/tmp/quiet
log() { echo "$(date -u +%T) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $Q/load.log; }
log start
for c in small-llama small-cem-both small-cofrgenet-f small-cofrgenet small-cem-full; do
  log "peer $c"
  st=5; [[ $c == small-cem-full ]] && st=3
  $B bench train --config configs/$c.toml --steps $st --warmup 1 --peer $PROF --json > $Q/peer-$c.json 2> $Q/peer-$c.err
  echo "rc=$?" >> $Q/peer-$c.err
done
log layers
$B bench layers --reps 5 --kinds mha,cem_attention,cffn --json > $Q/layers.json 2> $Q/layers.err
for o in true; do
  log "dist overlap=$o"
  $B bench train --config configs/small-llama.toml --nproc 2 --steps 5 --warmup 1 --set train.dist_overlap=$o --json > $Q/dist-$o.json 2> $Q/dist-$o.err
  echo "rc=$?" >> $Q/dist-$o.err
done
if [[ -x /work/before/build/tools/cemfrac ]]; then
  log "decode before"
  CEMFRAC_THREADS=2 scripts/bench_decode.sh /work/before/build/tools/cemfrac $Q/decode-before > $Q/decode-before.log 2>&1
fi
log "decode after"
CEMFRAC_THREADS=2 scripts/bench_decode.sh $B $Q/decode-after > $Q/decode-after.log 2>&1
if (( $(date +%s) < $(date -d 18:50 +%s) )); then
  log "dist overlap=false"
  $B bench train --config configs/small-llama.toml --nproc 2 --steps 5 --warmup 1 --set train.dist_overlap=false --json > $Q/dist-false.json 2> $Q/dist-false.err
  echo "rc=$?" >> $Q/dist-false.err
fi
log end
touch $Q/DONE
