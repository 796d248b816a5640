#!/usr/bin/env bash
# Install the Debian packages ringps uses, when they are missing and we may (root + apt-get).
set -u
need=()
[ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
[ ${#need[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${need[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: missing Debian packages ($pkgs); install them as root: apt-get install $pkgs" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q $pkgs >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $pkgs >/dev/null; } \
  || echo "note: could not install $pkgs; the tests that need them will skip" >&2
exit 0
