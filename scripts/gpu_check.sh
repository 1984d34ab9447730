#!/usr/bin/env bash
# The first GPU run in one command: build against the machine's torch with the carried dependency
# prefix, run the `cuda` tests, `bench ladder` and `bench train` in bf16 on the GPU, and write one report
# (DIR/gpu-check.json and .md; docs/gpu.md, "The GPU check"). scripts/gpu_check.py has the steps and
# the flags (--help); on a machine without a GPU the GPU steps are skipped with the reason.
# On the device tool's GPU machine (the tree and .gpu-prefix carried; $OUT comes back):
#   scripts/gpu_check.sh            (report in $OUT, build in build-gpu/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${CEMFRAC_CHECK_PYTHON:-python3}" "$root/scripts/gpu_check.py" "$@"
