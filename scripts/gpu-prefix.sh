#!/usr/bin/env bash
# The C++ libraries cemfrac builds against (fmt, nlohmann-json, CLI11, toml++, SentencePiece, PCRE2,
# GoogleTest, Google Benchmark, and pkgconf to find two of them) as one prefix of unpacked Debian 12 packages, for a
# machine that has a compiler, CMake, Ninja and a torch but none of these and no way to fetch them:
# the GPU machines (scripts/gpu_check.sh). The pip leg (scripts/pip-leg.sh) builds against the same
# prefix, so every CI run proves a build from it (scripts/check_prefix_build.py).
#
#   scripts/gpu-prefix.sh [DIR]        (default: .gpu-prefix in the checkout; ignored by git)
#
# Each package of scripts/gpu-prefix.txt is fetched with `apt-get download` into the cache
# (CEMFRAC_DEB_CACHE, default .cache/debs), checked against its sha256 (a mismatch is one line naming
# both digests, and nothing is unpacked), and unpacked with dpkg-deb into a temporary folder that
# replaces DIR only when complete. DIR then holds usr/ (the packages' files), bin/pkg-config (a
# wrapper that runs the prefix's pkgconf with the prefix as its sysroot, so the .pc files' /usr
# paths land inside DIR), and .cemfrac-prefix (the pins' digest: an up-to-date DIR is left as it is).
# The prefix is relocatable: copy DIR anywhere (the GPU machine gets it through the device tool's
# `carry`) and point CMake at it with
#   -DCMAKE_PREFIX_PATH="DIR/usr;<torch's cmake prefix>" -DPKG_CONFIG_EXECUTABLE=DIR/bin/pkg-config
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/.gpu-prefix}"
pins="$root/scripts/gpu-prefix.txt"
cache="${CEMFRAC_DEB_CACHE:-$root/.cache/debs}"
say() { printf 'gpu-prefix: %s\n' "$*"; }
die() { printf 'gpu-prefix: error: %s\n' "$*" >&2; exit 1; }

key="$(cat "$pins" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
if [[ "$(cat "$out/.cemfrac-prefix" 2>/dev/null)" == "$key" ]]; then
  say "$out is up to date"
  exit 0
fi
command -v dpkg-deb >/dev/null || die "dpkg-deb not found: make the prefix on a Debian machine and copy it"
mkdir -p "$cache"

debs=()
while read -r pkg ver sha rest; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  [[ -n "$sha" && -z "$rest" ]] || die "$pins: bad line for $pkg (want: package version sha256)"
  deb=$(compgen -G "$cache/${pkg}_${ver}_*.deb" | head -n1 || true)
  if [[ -z "$deb" ]] || [[ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$sha" ]]; then
    rm -f "$cache/${pkg}_${ver}_"*.deb
    (cd "$cache" && apt-get download -q "$pkg=$ver" >/dev/null 2>&1) ||
      die "apt-get download $pkg=$ver failed (no Debian mirror reachable, or the version is gone)"
    deb=$(compgen -G "$cache/${pkg}_${ver}_*.deb" | head -n1 || true)
    [[ -n "$deb" ]] || die "apt-get download $pkg=$ver left no .deb in $cache"
  fi
  got="$(sha256sum "$deb" | cut -d' ' -f1)"
  [[ "$got" == "$sha" ]] || die "$deb has sha256 $got, but $pins pins $sha: refused, nothing unpacked"
  debs+=("$deb")
done <"$pins"

tmp="$(mktemp -d "${out%/}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$tmp"; done
rm -rf "$tmp/usr/share/doc" "$tmp/usr/share/man" "$tmp/usr/share/lintian"
mkdir -p "$tmp/bin"
cat >"$tmp/bin/pkg-config" <<'SH'
#!/bin/sh
# pkgconf from this prefix, reading only this prefix's .pc files, their /usr paths inside the prefix.
p="$(cd "$(dirname "$0")/.." && pwd)"
lib="$p/usr/lib/x86_64-linux-gnu"
PKG_CONFIG_SYSROOT_DIR="$p" PKG_CONFIG_LIBDIR="$lib/pkgconfig:$p/usr/share/pkgconfig" \
  LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$p/usr/bin/pkgconf" "$@"
SH
chmod +x "$tmp/bin/pkg-config"
"$tmp/bin/pkg-config" --modversion sentencepiece libpcre2-8 >/dev/null ||
  die "the prefix's pkg-config cannot read its own .pc files"
echo "$key" >"$tmp/.cemfrac-prefix"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
say "$out: ${#debs[@]} packages, $(du -sh "$out" | cut -f1)"
