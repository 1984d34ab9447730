#!/usr/bin/env bash
# Decode speed of `cemfrac generate` on small presets, for a before/after comparison on a quiet machine
# (the KV cache preallocated to the context instead of concatenated per token).
#
#   scripts/bench_decode.sh CEMFRAC_BINARY [OUT_DIR] [PRESET...]
#
# For each preset (default: small-llama small-gpt2 small-cem-both small-cem-full small-cofrgenet-f
# small-synthesizer-d small-sparse-attention) it trains one step to get a checkpoint (weights do not
# matter for speed; the same seed gives the same weights for both binaries), then times greedy
# generation from a fixed prompt with --no-stop at two lengths, SHORT and LONG new tokens, REPS times
# each. Decode tokens/s = (LONG - SHORT) / (best LONG time - best SHORT time): loading, the prompt's
# prefill and the first tokens cancel. It prints one row per preset and writes OUT_DIR/decode.tsv.
# Run it with the "before" binary and the "after" binary into two OUT_DIRs on the same quiet machine,
# back to back, with the same CEMFRAC_THREADS, and compare the rows. The generated text of the two
# binaries should be identical (greedy): the script keeps it in OUT_DIR/<preset>.txt to diff.
# Settings (environment): SHORT=8 LONG=200 REPS=3 CEMFRAC_THREADS (default: all cores) DATA=data/brown.
# `cemfrac bench generate` times prefill and decode separately, in process, at several
# batch sizes and against a PyTorch peer; this script stays for whole-process before/after timing.
set -euo pipefail

if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 CEMFRAC_BINARY [OUT_DIR] [PRESET...]  (the binary must exist and be executable)" >&2
  exit 2
fi
bin=$(realpath "$1")
out=${2:-bench-decode-out}
shift $(( $# >= 2 ? 2 : 1 ))
presets=("$@")
if [[ ${#presets[@]} -eq 0 ]]; then
  presets=(small-llama small-gpt2 small-cem-both small-cem-full small-cofrgenet-f small-synthesizer-d
           small-sparse-attention)
fi
root=$(cd "$(dirname "$0")/.." && pwd)
short=${SHORT:-8}
long=${LONG:-200}
reps=${REPS:-3}
data=${DATA:-$root/data/brown}
threads=()
[[ -n "${CEMFRAC_THREADS:-}" ]] && threads=(--threads "$CEMFRAC_THREADS")
prompt="The jury said that the city"
mkdir -p "$out"
out=$(realpath "$out")

now() { date +%s.%N; }
# Best wall time of $reps greedy generations of $1 new tokens from checkpoint $2; the text goes to $3.
best_time() {
  local n=$1 ckpt=$2 text=$3 best="" t0 t1 t
  for ((r = 0; r < reps; ++r)); do
    t0=$(now)
    "$bin" "${threads[@]}" generate --checkpoint "$ckpt" --prompt "$prompt" --max-new-tokens "$n" \
      --temperature 0 --no-stop > "$text" 2>/dev/null
    t1=$(now)
    t=$(echo "$t1 - $t0" | bc -l)
    if [[ -z "$best" ]] || (( $(echo "$t < $best" | bc -l) )); then best=$t; fi
  done
  echo "$best"
}

printf "preset\tshort_s\tlong_s\tdecode_tokens_per_s\n" > "$out/decode.tsv"
printf "%-24s %10s %10s %18s\n" preset "${short} tok s" "${long} tok s" "decode tokens/s"
for preset in "${presets[@]}"; do
  config="$root/configs/$preset.toml"
  [[ -f "$config" ]] || { echo "no config $config" >&2; exit 2; }
  run="$out/run-$preset"
  if [[ ! -d "$run" ]]; then
    "$bin" "${threads[@]}" train --config "$config" --set data.path="$data" --set train.steps=1 \
      --set train.warmup_steps=0 --set train.eval_every=1 --set train.eval_tokens=512 \
      --set train.checkpoint_every=1 \
      --set train.micro_batch=1 --out "$run" > "$out/train-$preset.log" 2>&1 ||
      { echo "training $preset failed; see $out/train-$preset.log" >&2; exit 1; }
  fi
  ts=$(best_time "$short" "$run" "$out/$preset.short.txt")
  tl=$(best_time "$long" "$run" "$out/$preset.txt")
  rate=$(echo "($long - $short) / ($tl - $ts)" | bc -l)
  printf "%-24s %10.3f %10.3f %18.1f\n" "$preset" "$ts" "$tl" "$rate"
  printf "%s\t%.4f\t%.4f\t%.2f\n" "$preset" "$ts" "$tl" "$rate" >> "$out/decode.tsv"
done
