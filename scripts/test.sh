#!/usr/bin/env bash
# README command 2 (and what CI runs): install what is missing, build, run the whole test suite, first
# against the host's LibTorch (Debian 12: 1.13, into ./build), then against LibTorch 2.6 in a Debian 13
# root (scripts/trixie.sh: into ./build-2.6). Exit status: non-zero when either leg fails.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L data   (the args go to both legs)
#   CEMFRAC_TORCH26=0 scripts/test.sh   the host leg only (no root privileges needed)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
host_rc=0
(
  "$root/scripts/setup.sh"
  "$root/scripts/build.sh"
  cd "${CEMFRAC_BUILD_DIR:-$root/build}"
  ctest --output-on-failure -j"$(nproc)" "$@"
) || host_rc=$?
[[ "${CEMFRAC_TORCH26:-1}" == 0 ]] && exit "$host_rc"
echo "test: host leg (LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?')) exit $host_rc; now the LibTorch 2.6 leg"
t26_rc=0
# The root, its mounts and the chroot need root privileges: sudo for a non-root user, as setup.sh does
# for apt (the data cache stays the user's).
SUDO=(); [[ $(id -u) -eq 0 ]] || SUDO=(sudo env "CEMFRAC_CACHE=${CEMFRAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cemfrac}")
"${SUDO[@]}" "$root/scripts/trixie.sh" test "$@" || t26_rc=$?
echo "test: host leg exit $host_rc, LibTorch 2.6 leg exit $t26_rc"
((host_rc == 0 && t26_rc == 0))
