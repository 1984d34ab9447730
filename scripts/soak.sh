#!/usr/bin/env bash
# Kill soak (docs/formats.md, "One writer per directory"): a tiny-llama run with
# train.checkpoint_every = 1 and train.keep_checkpoints = 2 is killed with SIGKILL at a random moment
# KILLS times in a row (default 50), each time resumed the documented way (--resume RUN), then run
# to the end; its last checkpoint's model.safetensors and optimizer.safetensors and its losses must
# equal an uninterrupted run's bit for bit, and only the newest 2 checkpoints may be left.
# Not in CI (minutes). Prints one line per kill and a verdict; exit 0 when equal, 1 otherwise.
#   scripts/soak.sh [KILLS] [STEPS]       e.g. scripts/soak.sh 50 400
# Environment: CEMFRAC (default build/tools/cemfrac), SOAK_DIR (default: a fresh mktemp -d, kept),
# SOAK_MAX_DELAY_MS (the kill comes 100..this many ms after the start; default 2500).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${CEMFRAC:-$root/build/tools/cemfrac}"
kills="${1:-50}"
steps="${2:-400}"
max_delay="${SOAK_MAX_DELAY_MS:-2500}"
for n in "$kills" "$steps" "$max_delay"; do
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 ]] || { echo "soak.sh: KILLS, STEPS and SOAK_MAX_DELAY_MS must be positive integers" >&2; exit 2; }
done
[[ "$max_delay" -gt 100 ]] || { echo "soak.sh: SOAK_MAX_DELAY_MS must exceed 100" >&2; exit 2; }
[[ -x "$bin" ]] || { echo "soak.sh: no cemfrac at $bin (run scripts/build.sh, or set CEMFRAC)" >&2; exit 2; }
work="${SOAK_DIR:-$(mktemp -d -t cemfrac-soak.XXXXXX)}"
mkdir -p "$work"
echo "soak: $kills kills, $steps steps, in $work"

# A byte-level dataset of generated text (deterministic).
if [[ ! -f "$work/data/meta.json" ]]; then
  mkdir -p "$work/src"
  for d in $(seq 1 40); do
    for i in $(seq 1 60); do echo "document $d says line $i of the soak text."; done > "$work/src/doc$d.txt"
  done
  "$bin" prepare --text "$work/src" --tokenizer byte --out "$work/data" --split 80,10,10 > /dev/null 2>&1
fi
train=(--threads 1 train --config "$root/configs/tiny-llama.toml" --quiet
  --set "data.path=$work/data" --set model.context=32 --set train.seq_len=32
  --set train.micro_batch=2 --set train.tokens_per_step=0 --set "train.steps=$steps"
  --set train.warmup_steps=10 --set train.log_every=1 --set train.eval_every=0
  --set train.checkpoint_every=1 --set train.keep_checkpoints=2)

full="$work/full" crashed="$work/crashed"
rm -rf "$full" "$crashed"
"$bin" "${train[@]}" --out "$full" > "$work/full.log" 2>&1 || { echo "soak: the uninterrupted run failed (see $work/full.log)" >&2; exit 1; }

killed=0
for k in $(seq 1 "$kills"); do
  more=()
  if ls -d "$crashed"/checkpoints/step-* 2> /dev/null | grep -qv '\.tmp-'; then more=(--resume "$crashed"); fi
  "$bin" "${train[@]}" --out "$crashed" "${more[@]}" > "$work/run-$k.log" 2>&1 &
  pid=$!
  delay=$((100 + RANDOM % (max_delay - 100)))
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  if kill -KILL "$pid" 2> /dev/null; then
    killed=$((killed + 1))
    wait "$pid" 2> /dev/null || true
    step=$(sed -n 's/.*"step": \([0-9]*\).*/\1/p' "$crashed/summary.json" 2> /dev/null | head -1 || true)
    echo "kill $k after ${delay} ms: summary step ${step:-?}, checkpoints: $(ls "$crashed/checkpoints" 2> /dev/null | tr '\n' ' ')"
  else
    wait "$pid" || { echo "soak: run $k failed before its kill (see $work/run-$k.log)" >&2; exit 1; }
    echo "kill $k: the run had finished (raise STEPS for more kills)"
    break
  fi
done
"$bin" "${train[@]}" --out "$crashed" --resume "$crashed" > "$work/final.log" 2>&1 || { echo "soak: the final resume failed (see $work/final.log)" >&2; exit 1; }

last=$(printf 'step-%06d' "$steps")
ok=1
for f in model.safetensors optimizer.safetensors; do
  if cmp -s "$full/checkpoints/$last/$f" "$crashed/checkpoints/$last/$f"; then echo "equal: $last/$f"; else echo "DIFFERENT: $last/$f"; ok=0; fi
done
loss() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1/metrics.jsonl"; }
if [[ "$(loss "$full")" == "$(loss "$crashed")" ]]; then echo "equal: the $steps losses"; else echo "DIFFERENT: losses"; ok=0; fi
left=$(ls "$crashed/checkpoints" | tr '\n' ' ')
if [[ "$left" == "$(printf 'step-%06d step-%06d ' $((steps - 1)) "$steps")" ]]; then echo "left: $left"; else echo "UNEXPECTED leftovers: $left"; ok=0; fi
if [[ $ok == 1 ]]; then echo "soak: PASS ($killed kills)"; else echo "soak: FAIL ($killed kills; files in $work)"; exit 1; fi
