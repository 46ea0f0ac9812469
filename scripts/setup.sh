#!/usr/bin/env bash
# Installs what building needs on Debian 12 with Swift: libmicrohttpd-dev, libhiredis-dev,
# libgnutls28-dev and pkg-config (for the CMicroHTTPD, CHiredis and CGnuTLS system-library
# targets) and curl for the examples. With --tests (scripts/test.sh) also redis-server and nginx
# for the replica tests (which start their own instances on free loopback ports; the system
# services are not used) and openssl, with which the TLS tests make their certificates: on a host
# with systemd, installing redis-server and nginx starts their system services, which running the
# service alone (scripts/run.sh) has no use for. Idempotent: installs only what is missing. Needs
# root (or sudo) when something is missing.
set -euo pipefail

packages=(libmicrohttpd-dev libhiredis-dev libgnutls28-dev pkg-config curl)
case "${1:-}" in
  --tests) packages+=(redis-server nginx openssl) ;;
  "") ;;
  *) echo "usage: $0 [--tests]" >&2; exit 64 ;;
esac
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v swift >/dev/null || { echo "setup: swift is not on PATH (Swift 6.0 or later is needed)" >&2; exit 1; }
