#!/usr/bin/env bash
# README command 1: install what is missing, build, prepare the Brown corpus, run the main job.
# Idempotent: a second run reuses the installed packages, the build and the prepared data.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cemfrac="${CEMFRAC_BUILD_DIR:-$root/build}/tools/cemfrac"
data="$root/data/brown"

echo; echo "== cemfrac info"
"$cemfrac" info

echo; echo "== cemfrac prepare --corpus brown --tokenizer sp:4096 --out $data"
if [[ -f "$data/meta.json" ]]; then
  echo "(already prepared; remove $data to prepare again)"
  "$cemfrac" prepare --summary "$data"
else
  "$cemfrac" prepare --corpus brown --tokenizer sp:4096 --out "$data"
fi
