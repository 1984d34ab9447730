#!/usr/bin/env bash
# Configures (once) and builds cemfrac into ./build (Release, Ninja, ccache when present).
#   scripts/build.sh [extra cmake args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CEMFRAC_BUILD_DIR:-$root/build}"
if [[ ! -f "$build/build.ninja" || $# -gt 0 ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$build" -- -j"$(nproc)"
echo "build: $build/tools/cemfrac is ready"
