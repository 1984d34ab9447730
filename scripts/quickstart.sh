#!/usr/bin/env bash
# README command 1: install what is missing, build, prepare the Brown corpus, run the main job: the
# `quick` comparison suite (Llama vs CEM vs CoFrGeNet-F, configs/suites/quick.toml), printing its table
# and where its plots are.
#   scripts/quickstart.sh            # the quick suite (runs/suites/quick)
#   scripts/quickstart.sh --single   # the single-model quickstart instead: train, eval and sample a small Llama
# Idempotent: a second run reuses the installed packages, the build, the prepared data and finished
# runs (an interrupted one is resumed).
set -euo pipefail
mode="${1:-suite}"
[[ "$mode" == suite || "$mode" == --single ]] || { echo "usage: scripts/quickstart.sh [--single]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cemfrac="${CEMFRAC_BUILD_DIR:-$root/build}/tools/cemfrac"
data="$root/data/brown"

echo; echo "== cemfrac info"
"$cemfrac" info

echo; echo "== cemfrac prepare --corpus brown --tokenizer sp:4096 --out $data"
if [[ -f "$data/meta.json" ]]; then
  echo "(already prepared: $data/meta.json; remove $data to prepare again)"
else
  "$cemfrac" prepare --corpus brown --tokenizer sp:4096 --out "$data"
fi

if [[ "$mode" == suite ]]; then
  # The main job: the quick suite (three models, one seed; about 5 minutes on an idle 2-core machine).
  suite="$root/configs/suites/quick.toml"
  out="$root/runs/suites/quick"
  echo; echo "== cemfrac compare --suite $suite --out $out"
  cd "$root"
  "$cemfrac" compare --suite "$suite" --out "$out"
  echo; echo "== table: $out/results.md; plots: $out/plots/*.svg"
  exit 0
fi

# The single-model quickstart: train a small Llama on Brown for a few minutes, evaluate it on the test split,
# generate a sample. A finished run is reused; an interrupted one is resumed.
config="$root/configs/quickstart-llama.toml"
run="$root/runs/quickstart-llama"
echo; echo "== cemfrac train --config $config"
if grep -qs '"status": "completed"' "$run/summary.json"; then
  echo "(already trained: $run/summary.json; remove $run to train again)"
elif ls -d "$run"/checkpoints/step-* 2>/dev/null | grep -qv '\.tmp-'; then  # not a save's temporary
  "$cemfrac" train --config "$config" --set data.path="$data" --out "$run" --resume "$run"
else
  "$cemfrac" train --config "$config" --set data.path="$data" --out "$run"
fi

echo; echo "== cemfrac eval --checkpoint $run --data $data:test"
"$cemfrac" eval --checkpoint "$run" --data "$data:test"

echo; echo "== cemfrac generate --checkpoint $run --prompt 'The jury said'"
"$cemfrac" generate --checkpoint "$run" --prompt "The jury said" --max-new-tokens 80 --temperature 0.8 --top-p 0.95 --seed 1
