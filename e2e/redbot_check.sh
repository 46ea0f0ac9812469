#!/usr/bin/env bash
# REDbot against every route of a forge-push-token-server binary (issue 14): fails on any note of
# level WARN or BAD and prints them (see e2e/redbot_check.py for the requests and the one list of
# ignored notes).
#
#   e2e/redbot_check.sh --server PATH
#
# Installs REDbot once, pinned (e2e/redbot-requirements.txt), into its own venv at
# ${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/redbot-venv, reused while that file and the
# Python version are unchanged (python3-venv from apt when ensurepip is missing). HAR documents go
# to $E2E_ARTIFACTS/redbot (default e2e/artifacts/redbot).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

usage() { echo "usage: $0 --server PATH" >&2; exit 64; }
server=""
while [ $# -gt 0 ]; do
  case "$1" in
    --server) [ $# -ge 2 ] || usage; server="$2"; shift 2 ;;
    --server=*) server="${1#--server=}"; shift ;;
    *) usage ;;
  esac
done
[ -n "$server" ] || usage
[ -x "$server" ] && [ -f "$server" ] || { echo "not an executable file: $server" >&2; exit 64; }
server="$(cd "$(dirname "$server")" && pwd)/$(basename "$server")"

venv="${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/redbot-venv"
stamp="$venv/.redbot-requirements"
want="$(cat "$here/redbot-requirements.txt"; python3 --version 2>&1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing REDbot into $venv"
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
      python3 -m venv --clear "$venv"
    else
      echo "$0: python3's venv module is missing (Debian: apt-get install python3-venv)" >&2; exit 1
    fi
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input --timeout 60 \
      -r "$here/redbot-requirements.txt"
  printf '%s' "$want" >"$stamp"
else
  echo "==> reusing $venv"
fi

export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
exec timeout -k 5 180 "$venv/bin/python" "$here/redbot_check.py" --server "$server"
