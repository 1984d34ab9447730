#!/usr/bin/env bash
# ctest python.pip_install: `pip install --no-build-isolation --no-index .` into a fresh venv (with the
# interpreter's site packages, so its torch is the interpreter's), then python/tests against the INSTALLED
# package, run from a directory outside the source tree with no PYTHONPATH.
#   pip_install.sh PYTHON SOURCE_DIR PIP_BUILD_DIR CEMFRAC_EXE
set -euo pipefail
py=$1 src=$2 pipbuild=$3 exe=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/cemfrac-pip.XXXXXX")
trap 'rm -rf "$work"' EXIT
vpy="$work/venv/bin/python"
parent_site=$("$py" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')
if [[ -z "$parent_site" ]]; then
  "$py" -m venv --system-site-packages "$work/venv"
else
  # PYTHON is itself a venv (the pip leg's): --system-site-packages would reach its base interpreter's
  # packages (Debian's torch), not PYTHON's. A .pth file makes PYTHON's site-packages (its torch) visible.
  "$py" -m venv "$work/venv"
  echo "$parent_site" >"$("$vpy" -c 'import site; print(site.getsitepackages()[0])')/_cemfrac_parent.pth"
fi
cd "$work"  # outside the tree: nothing from the checkout is importable from here
unset PYTHONPATH
CEMFRAC_PIP_BUILD_DIR="$pipbuild" "$vpy" -m pip install -q --no-build-isolation --no-index "$src"
"$vpy" - <<'PY'
import os, sys
import torch, cemfrac
where = os.path.realpath(cemfrac.__file__)
prefix = os.path.realpath(sys.prefix)
assert where.startswith(prefix + os.sep), f"cemfrac imported from {where}, not from the venv {prefix}"
print(f"pip_install: cemfrac {cemfrac.__version__} from {where} (torch {torch.__version__})")
PY
CEMFRAC_PYTHON_REQUIRED=1 CEMFRAC_EXE="$exe" PYTHONDONTWRITEBYTECODE=1 \
  "$vpy" "$src/python/tests/run_pytest.py" -q -rs -p no:cacheprovider --rootdir="$work" "$src/python/tests"
