#!/usr/bin/env bash
# Issue 19, "one bigger shape": one training step of the GPT2-small-width presets against the PyTorch
# peer, one micro-batch of MB x 1024 tokens per step, then cemfrac alone under /usr/bin/time for
# its peak resident memory. MB=4 (the default) fits cemfrac alone in 24 GiB but not cemfrac and the
# peer together for the 162M models (OOM); MB=2 NO_RSS=1 runs the peer comparisons. Run from the repository root on a quiet machine.
set -euo pipefail
B=${B:-build/tools/cemfrac}
OUT=${OUT:-results/speed-session10}
MB=${MB:-4}
SET=(--set train.micro_batch=$MB --set train.tokens_per_step=$((MB * 1024)))
run() {  # name config [extra --set ...]
  local name=$1 config=$2; shift 2
  uptime
  # exit 1 when the peer's step 0 disagrees (the JSON still holds both sides): go on to the next
  $B --threads 2 bench train --config "$config" --steps 2 --warmup 1 "${SET[@]}" "$@" --json \
    > "$OUT/big-$name-mb$MB.json" || echo "$name: bench train exited $?"
  [[ -n "${NO_RSS:-}" ]] || /usr/bin/time -f "$name cemfrac peak RSS %M KiB (micro-batch $MB)" \
    $B --threads 2 bench train --config "$config" --steps 1 --warmup 0 --no-peer "${SET[@]}" "$@" \
    > /dev/null 2>> "$OUT/big-rss.txt"
}
[[ -n "${NO_RSS:-}" ]] || : > "$OUT/big-rss.txt"
[[ -n "${SKIP_GPT2:-}" ]] || run gpt2-124m configs/gpt2-124m.toml
run llama-162m configs/llama-162m.toml
run cem-both-162m configs/cem-both-162m.toml
run gpt2-124m-cofrgenet-f configs/gpt2-124m.toml --set model.ffn=cffn
uptime
