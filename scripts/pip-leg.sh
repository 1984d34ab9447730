#!/usr/bin/env bash
# The pip leg: cemfrac built and tested against PyTorch from PyPI, the stack a GPU user has.
#  1. A venv (build-pip/venv, from Debian's python3) with the torch 2.11.0 of scripts/pip-torch.txt,
#     installed with --require-hashes; remade only when that file changes. The interop tests'
#     transformers (scripts/pip-interop.txt) is added on top, also with --require-hashes. pip's own cache
#     (~/.cache/pip) keeps the wheels between runs.
#  2. CMake against that torch with the CUDA build on (-DCEMFRAC_CUDA=ON: this machine's nvcc compiles
#     the .cu kernels for sm_80 and sm_90 plus PTX) and the C++ libraries from the dependency prefix
#     the GPU machines build from (scripts/gpu-prefix.sh: Debian's packages unpacked into .gpu-prefix),
#     every target built into build-pip; scripts/check_prefix_build.py then proves that nothing came
#     from the system's copies (CMake's finds, the headers compiled, the libraries loaded); then the
#     whole ctest suite on the CPU (tests that need a GPU are labelled cuda and skip naming the
#     device).
#  3. The Python leg: a fresh venv, the same pinned packages, `pip install --no-build-isolation .`
#     configured from scratch in a build directory of its own (build-pip-fresh, removed afterwards),
#     then python/tests against the installed package from outside the tree. build-pip-fresh holds its
#     venv and build as build-pip does, and ccache's base_dir is the checkout, so the compiler sees the
#     same relative paths in both and the second build of the same sources is served from ccache.
#   scripts/pip-leg.sh [ctest args...]       (the args go to ctest, e.g. -L data)
# Environment: CEMFRAC_PIP_LEG_DIR (build-pip), CEMFRAC_PIP_PYTHON (/usr/bin/python3),
# CEMFRAC_PIP_LEG_PYTHON=0 (skip step 3), CUDACXX (nvcc; else PATH, else /usr/local/cuda/bin/nvcc;
# without one the leg runs without the CUDA build and says so, unless CEMFRAC_PIP_LEG_CUDA=required).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CEMFRAC_PIP_LEG_DIR:-$root/build-pip}"
lock="$root/scripts/pip-torch.txt"
base_py="${CEMFRAC_PIP_PYTHON:-/usr/bin/python3}"
say() { printf 'pip-leg: %s\n' "$*"; }
die() { printf 'pip-leg: error: %s\n' "$*" >&2; exit 1; }
t0=$SECONDS
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
stamp() { say "$1 ($((SECONDS - t0)) s)"; }

nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
cuda=ON
if [[ ! -x "$nvcc" ]]; then
  # CI requires the CUDA build (.ci/run sets CEMFRAC_PIP_LEG_CUDA=required); a user's machine without
  # the toolkit still tests the pip torch, without the kernels, and is told so.
  [[ "${CEMFRAC_PIP_LEG_CUDA:-}" == required ]] && die "no nvcc (CUDACXX, PATH, /usr/local/cuda/bin): this leg must compile the CUDA build"
  say "no nvcc (CUDACXX, PATH, /usr/local/cuda/bin): the CUDA build is NOT compiled in this leg" \
      "(a CUDA torch's CMake config may still ask for the toolkit)"
  cuda=OFF
fi
"$base_py" -c 'import venv, ensurepip' 2>/dev/null || die "$base_py cannot make a venv (apt-get install python3-venv)"

# Installs the pinned packages into a new venv at $1 (removed first).
make_venv() {
  rm -rf "$1"
  "$base_py" -m venv "$1"
  "$1/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --only-binary=:all: \
    -r "$lock" || { rm -rf "$1"; die "installing $lock into $1 failed"; }
}

# Adds the interop tests' packages (transformers, ...) of scripts/pip-interop.txt to the venv at $1.
interop="$root/scripts/pip-interop.txt"
add_interop() {
  "$1/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --only-binary=:all: \
    --no-binary=sqlitedict,word2number --no-build-isolation -r "$interop" \
    || die "installing $interop into $1 failed"
}

# ---- 1. the venv ----------------------------------------------------------------------------------
mkdir -p "$build"
venv="$build/venv"
key="$(sha256sum "$lock" | cut -c1-16) $("$base_py" -V 2>&1)"
ckey="$key${cuda/ON/}"  # the configure stamp: the venv's key, plus OFF when the CUDA build is off
if [[ "$(cat "$venv/.cemfrac-lock" 2>/dev/null)" != "$key" ]]; then
  say "creating $venv from $lock"
  make_venv "$venv"
  echo "$key" >"$venv/.cemfrac-lock"
fi
# The interop packages do not touch the build: added to the venv in place, with a stamp of their own.
ikey="$(sha256sum "$interop" | cut -c1-16)"
if [[ "$(cat "$venv/.cemfrac-interop" 2>/dev/null)" != "$ikey" ]]; then
  add_interop "$venv"
  echo "$ikey" >"$venv/.cemfrac-interop"
fi
py="$venv/bin/python"
# Here the interop tests must run: a missing transformers fails them instead of skipping them.
export CEMFRAC_INTEROP_REQUIRED=1
torch_info=$("$py" -c 'import torch; print(torch.__version__, torch.version.cuda)')
stamp "torch $torch_info in $venv"

# ---- 2. CMake, every target, ctest ------------------------------------------------------------------
deps="$root/.gpu-prefix"
"$root/scripts/gpu-prefix.sh" "$deps"
ckey="$ckey $(cat "$deps/.cemfrac-prefix")"
torch_root="$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
prefix="$deps/usr;$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)');$("$py" -m pybind11 --cmakedir)"
cuda_args=(-DCEMFRAC_CUDA="$cuda")
[[ "$cuda" == ON ]] && cuda_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
if [[ ! -f "$build/build.ninja" || "$(cat "$build/.cemfrac-configured" 2>/dev/null)" != "$ckey" ]]; then
  rm -f "$build/CMakeCache.txt"  # packages found before (another prefix, the system's) are forgotten
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix" -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkg-config" \
    -DCEMFRAC_PYTHON=ON -DCEMFRAC_PYTHON_EXECUTABLE="$py"
  echo "$ckey" >"$build/.cemfrac-configured"
fi
cmake --build "$build" -- -j"$(nproc)"
stamp "built every target in $build"
"$base_py" "$root/scripts/check_prefix_build.py" "$build" "$deps" "$torch_root"
# The GPU check's own skip path and report format, on this machine without a GPU.
"$root/scripts/gpu_check.sh" --build "$build" --python "$py" --out "$build/gpu-check" --no-build
stamp "scripts/gpu_check.sh --no-build: report in $build/gpu-check"
ctest_rc=0
(cd "$build" && ctest --output-on-failure -j"$(nproc)" "$@") || ctest_rc=$?
stamp "ctest exit $ctest_rc"

# ---- 3. the Python leg --------------------------------------------------------------------------------
py_rc=0
if [[ "${CEMFRAC_PIP_LEG_PYTHON:-1}" != 0 ]]; then
  work="$root/build-pip-fresh" elsewhere=$(mktemp -d "${TMPDIR:-/tmp}/cemfrac-pipleg.XXXXXX")
  rm -rf "$work"
  trap 'rm -rf "$work" "$elsewhere"' EXIT
  (
    make_venv "$work/venv"
    add_interop "$work/venv"
    stamp "fresh venv $work/venv"
    cd "$elsewhere"  # outside the tree: nothing from the checkout is importable from here
    unset PYTHONPATH
    CEMFRAC_PIP_BUILD_DIR="$work" "$work/venv/bin/python" -m pip install -q --no-build-isolation \
      --no-index "$root"
    stamp "pip install --no-build-isolation . (configured from scratch in $work)"
    "$work/venv/bin/python" - <<'PY'
import os, sys
import torch, cemfrac
where = os.path.realpath(cemfrac.__file__)
assert where.startswith(os.path.realpath(sys.prefix) + os.sep), f"cemfrac imported from {where}"
print(f"pip-leg: cemfrac {cemfrac.__version__} from {where} (torch {torch.__version__})")
PY
    CEMFRAC_PYTHON_REQUIRED=1 CEMFRAC_EXE="$build/tools/cemfrac" PYTHONDONTWRITEBYTECODE=1 \
      "$work/venv/bin/python" "$root/python/tests/run_pytest.py" -q -rs -p no:cacheprovider \
      --rootdir="$elsewhere" "$root/python/tests"
  ) || py_rc=$?
  # 77: every test passed or skipped, some skipped (run_pytest.py names them above).
  if ((py_rc == 77)); then stamp "Python leg: passed, with skips (named above)"; py_rc=0
  else stamp "Python leg exit $py_rc"; fi
fi
((ctest_rc == 0 && py_rc == 0))
