#!/usr/bin/env bash
# (Superseded by `cemfrac compare --suite configs/suites/<suite>.toml`, docs/compare.md; kept for the
# commands recorded in docs/history/suites.md.)
# Train a family of presets on Brown at one shape and one token budget, evaluate each on the
# validation and test splits, and print a Markdown table (parameters, val/test perplexity and bits
# per byte, training tokens/s, largest gradient norm).
#
#   scripts/compare.sh cem        # Llama baseline + the CEM variants
#   scripts/compare.sh cofrgenet  # GPT-2 baseline + the CoFrGeNet variants and their baselines
#   scripts/compare.sh cem --set train.steps=400   # extra overrides go to every run
#
# Every model gets the same shape (D 256, L 4, H 4, context 128), the same data order and seed, the
# same schedule (200 steps x 2048 tokens, lr 1e-3 -> 1e-4 cosine, 20 warm-up steps, clip 1.0) and
# logs every step, so the largest gradient norm is over all steps. A finished run is reused
# (remove runs/compare/<name> to train it again). Needs data/brown (scripts/quickstart.sh makes it).
# COMPARE_THREADS=N passes --threads N (e.g. to run the two families side by side on 2 cores).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cemfrac="${CEMFRAC_BUILD_DIR:-$root/build}/tools/cemfrac"
family="${1:?usage: scripts/compare.sh cem|cofrgenet [--set key=value ...]}"
shift
extra=("$@")
global=()
[[ -n "${COMPARE_THREADS:-}" ]] && global=(--threads "$COMPARE_THREADS")
data="${COMPARE_DATA:-data/brown}"
out="${COMPARE_OUT:-runs/compare}"
[[ -f "$data/meta.json" ]] || { echo "error: $data/meta.json not found: run scripts/quickstart.sh (or cemfrac prepare) first" >&2; exit 1; }

case "$family" in
  cem)
    presets=(small-llama small-cem-attn-only small-cem-mlp-only small-cem-both small-cem-full)
    d_ff=704 ;;
  cofrgenet)
    presets=(small-gpt2 small-cofrgenet-f small-cofrgenet-a small-cofrgenet-au small-cofrgenet
             small-cofrgenet-b small-synthesizer-d small-sparse-attention)
    d_ff=1024 ;;
  *) echo "error: unknown family '$family' (expected cem or cofrgenet)" >&2; exit 2 ;;
esac

shape=(--set model.d_model=256 --set model.n_layers=4 --set model.n_heads=4 --set model.context=128
       --set "model.d_ff=$d_ff")
budget=(--set train.steps=200 --set train.micro_batch=16 --set train.warmup_steps=20
        --set train.lr_max=1e-3 --set train.lr_min=1e-4 --set train.log_every=1
        --set train.eval_every=50 --set train.checkpoint_every=200 --set "data.path=$data")
for s in "${extra[@]}"; do [[ "$s" == --set ]] || budget+=(--set "$s"); done

rows=()
for p in "${presets[@]}"; do
  run="$out/$p"
  if ! grep -qs '"status": "completed"' "$run/summary.json"; then
    echo "== train $p -> $run" >&2
    rm -rf "$run"
    "$cemfrac" "${global[@]}" train --config "configs/$p.toml" "${shape[@]}" "${budget[@]}" --out "$run"
  fi
  for split in val test; do
    if [[ ! -s "$run/eval-$split.json" ]]; then
      "$cemfrac" "${global[@]}" eval --checkpoint "$run" --data "$data:$split" --json > "$run/eval-$split.json.tmp"
      mv -f "$run/eval-$split.json.tmp" "$run/eval-$split.json"
    fi
  done
  "$cemfrac" params --config "configs/$p.toml" "${shape[@]}" --json > "$run/params.json"
  rows+=("$p")
done

python3 - "$out" "${rows[@]}" <<'EOF'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
print("| model | mixer / ffn | params | val ppl | val bits/byte | test ppl | test bits/byte | train tokens/s (median step) | max grad norm (step) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for n in names:
    d = f"{out}/{n}"
    ev = {s: json.load(open(f"{d}/eval-{s}.json")) for s in ("val", "test")}
    params = json.load(open(f"{d}/params.json"))
    steps = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    rate = statistics.median(s["tokens_per_s"] for s in steps)
    top = max(steps, key=lambda s: s["grad_norm"])
    cfg = open(f"{d}/config.toml").read()
    def field(k):
        for line in cfg.splitlines():
            line = line.split("#", 1)[0]
            if line.split("=")[0].strip() == k:
                return line.split("=", 1)[1].strip().strip('"')
        return "?"
    print(f"| {n} | {field('mixer')} / {field('ffn')} | {params['total']:,} | "
          f"{ev['val']['perplexity']:.1f} | {ev['val']['bits_per_byte']:.3f} | "
          f"{ev['test']['perplexity']:.1f} | {ev['test']['bits_per_byte']:.3f} | "
          f"{rate:,.0f} | {top['grad_norm']:.2f} ({top['step']}) |")
EOF
