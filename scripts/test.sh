#!/usr/bin/env bash
# README command 2 (and what CI runs): install what is missing, build, run the whole test suite.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L data
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "${CEMFRAC_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j"$(nproc)" "$@"
