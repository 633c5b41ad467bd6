#!/usr/bin/env bash
# The system packages the tests use: redis-server (a real Redis for the shared cache's tests, started by them on
# localhost) and ccache (the compiler cache shimgen puts behind the compiler). Installed with apt-get where missing,
# as root or through sudo; elsewhere the tests that need them skip and say why.
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v ccache >/dev/null || missing+=(ccache)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
  echo "system packages: ${missing[*]} missing and no root to install them; their tests will skip" >&2; exit 0; fi
if ! command -v apt-get >/dev/null; then
  echo "system packages: ${missing[*]} missing and no apt-get; install them with your package manager" >&2; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
  || { "${sudo[@]}" apt-get update -q >/dev/null 2>&1 && "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
echo "system packages: installed ${missing[*]}"
