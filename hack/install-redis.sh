#!/usr/bin/env bash
# Makes sure redis-server 7.x is on PATH for the tests (which start their own
# servers on free loopback ports; no server is left running). Installs
# Debian's package when it is missing and we are root; otherwise says what to
# install. Idempotent.
set -euo pipefail

want_major=7

have_redis() {
  command -v redis-server >/dev/null 2>&1 || return 1
  local version major
  version="$(redis-server --version | sed -n 's/.* v=\([0-9.]*\).*/\1/p')"
  major="${version%%.*}"
  if [[ -z "${major}" || "${major}" -lt "${want_major}" ]]; then
    echo "install-redis: redis-server ${version:-of unknown version} is too old; ${want_major}.x or later is needed" >&2
    return 1
  fi
}

if have_redis; then
  exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
  echo "install-redis: redis-server ${want_major}.x is missing. Install it, for example: sudo apt-get install redis-server" >&2
  exit 1
fi

echo "install-redis: installing Debian's redis-server package" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# policy-rc.d 101 keeps the package from starting a system-wide server.
policy=/usr/sbin/policy-rc.d
created_policy=false
if [[ ! -e "${policy}" ]]; then
  printf '#!/bin/sh\nexit 101\n' >"${policy}" && chmod +x "${policy}" && created_policy=true
fi
apt-get install -y -qq redis-server >&2
if "${created_policy}"; then rm -f "${policy}"; fi

have_redis || { echo "install-redis: redis-server still unusable after install" >&2; exit 1; }
