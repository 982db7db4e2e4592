#!/usr/bin/env bash
# Installs the Debian packages stockade builds against, if any is missing.
# Works on Debian 12 and 13, as root or through sudo. Idempotent and quiet when all is there.
set -euo pipefail

# postgresql brings initdb/pg_ctl (the test suite and the demo start their own server) and
# the postgres system user they drop to when run as root; psql comes with it.
# redis-server (with redis-benchmark) lets `stockade bench --peers` measure Redis too.
# pgbouncer: the suite runs its PostgreSQL tests a second time through one in transaction
# mode (it starts its own; the package's service is not used).
packages=(g++ make pkg-config libboost-dev libgtest-dev libpqxx-dev postgresql redis-server pgbouncer)
# A Python without ensurepip (Debian's own python3) needs python3-venv for `make`'s venv,
# and one without its C headers (Debian's own again) python3-dev for the extension.
python3 -c "import ensurepip" 2>/dev/null || packages+=(python3-venv)
python3 -c "import os, sysconfig
raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" ||
  packages+=(python3-dev)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "installing Debian packages: ${missing[*]}"
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
