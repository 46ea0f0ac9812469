#!/usr/bin/env bash
# End-to-end tests of forge-push-token-server (issue 7: /metrics, --state-file, the live page;
# issue 11: replicas sharing the token through Redis, behind nginx).
#
#   e2e/run.sh --server PATH [metrics|state_file|browser|hardening|replicas ...]
#
# Installs what it needs, once: a venv at ${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/e2e-venv
# with e2e/requirements.txt (reused while that file is unchanged), and Debian's chromium and
# chromium-driver when missing (apt-get update only when an install fails without it). Then runs
# each test under a hard timeout (about 5 minutes in all), prints `N passed, N failed` and exits
# non-zero when any failed. Screenshots go to $E2E_ARTIFACTS (default e2e/artifacts).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

usage() { echo "usage: $0 --server PATH [metrics|state_file|browser|hardening|replicas ...]" >&2; }
server=""
selected=()
while [ $# -gt 0 ]; do
  case "$1" in
    --server) [ $# -ge 2 ] || { usage; exit 64; }; server="$2"; shift 2 ;;
    --server=*) server="${1#--server=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    metrics|state_file|browser|hardening|replicas) selected+=("$1"); shift ;;
    *) echo "unknown argument: $1" >&2; usage; exit 64 ;;
  esac
done
[ -n "$server" ] || { usage; exit 64; }
[ -x "$server" ] && [ -f "$server" ] || { echo "not an executable file: $server" >&2; exit 64; }
server="$(cd "$(dirname "$server")" && pwd)/$(basename "$server")"
[ ${#selected[@]} -gt 0 ] || selected=(metrics state_file browser hardening replicas)

say() { printf '==> %s\n' "$*"; }
export DEBIAN_FRONTEND=noninteractive

# -- apt: chromium and chromium-driver (and python3-venv where ensurepip is missing) -----------
apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then echo "need root to apt-get install $*" >&2; return 1; fi
  if apt-get install -y -qq "$@" >/tmp/e2e-apt.$$.log 2>&1; then rm -f /tmp/e2e-apt.$$.log; return 0; fi
  if [ "$apt_updated" = 0 ]; then
    apt_updated=1
    say "apt-get update (an install failed without it)"
    apt-get update -qq || return 1
    if apt-get install -y -qq "$@" >/tmp/e2e-apt.$$.log 2>&1; then rm -f /tmp/e2e-apt.$$.log; return 0; fi
  fi
  tail -20 /tmp/e2e-apt.$$.log >&2; rm -f /tmp/e2e-apt.$$.log
  return 1
}

if [[ " ${selected[*]} " == *" browser "* ]]; then
  if ! command -v chromium >/dev/null || [ ! -x /usr/bin/chromedriver ]; then
    t0=$SECONDS
    say "installing chromium chromium-driver (apt)"
    apt_install chromium chromium-driver || { echo "could not install chromium chromium-driver" >&2; exit 1; }
    say "apt install took $((SECONDS - t0)) s"
  fi
fi

if [[ " ${selected[*]} " == *" hardening "* ]]; then
  # openssl makes the self-signed certificate of the HTTPS checks; prlimit (util-linux) sets the
  # open-file limit of one check.
  missing=()
  command -v openssl >/dev/null || missing+=(openssl)
  command -v prlimit >/dev/null || missing+=(util-linux)
  if ((${#missing[@]})); then
    say "installing ${missing[*]} (apt)"
    apt_install "${missing[@]}" || { echo "could not install ${missing[*]}" >&2; exit 1; }
  fi
fi

if [[ " ${selected[*]} " == *" replicas "* ]]; then
  # The replica test starts its own redis-server and nginx on free loopback ports (never the
  # system services) and uses redis-cli to inspect and damage the state.
  missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v redis-cli >/dev/null || missing+=(redis-tools)
  command -v nginx >/dev/null || missing+=(nginx)
  if ((${#missing[@]})); then
    say "installing ${missing[*]} (apt)"
    apt_install "${missing[@]}" || { echo "could not install ${missing[*]}" >&2; exit 1; }
  fi
fi

# -- venv --------------------------------------------------------------------------------------
venv="${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/e2e-venv"
stamp="$venv/.e2e-requirements"
want="$(cat "$here/requirements.txt"; python3 --version 2>&1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  t0=$SECONDS
  say "creating $venv"
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
    apt_install python3-venv || { echo "python3 -m venv fails and python3-venv cannot be installed" >&2; exit 1; }
    python3 -m venv --clear "$venv" || exit 1
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input --timeout 60 \
      -r "$here/requirements.txt" || { echo "pip install failed" >&2; exit 1; }
  printf '%s' "$want" >"$stamp"
  say "venv ready in $((SECONDS - t0)) s"
else
  say "reusing $venv"
fi

# -- tests -------------------------------------------------------------------------------------
export E2E_ARTIFACTS="${E2E_ARTIFACTS:-$here/artifacts}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
mkdir -p "$E2E_ARTIFACTS"
declare -A limit=([metrics]=45 [state_file]=120 [browser]=75 [hardening]=90 [replicas]=150)
passed=0
failed=0
failures=()
started=$SECONDS
say "server: $server"
for name in "${selected[@]}"; do
  say "$name (at most ${limit[$name]} s)"
  t0=$SECONDS
  timeout -k 5 "${limit[$name]}" "$venv/bin/python" "$here/${name}_test.py" --server "$server"
  code=$?
  if [ "$code" = 0 ]; then
    passed=$((passed + 1)); say "$name passed in $((SECONDS - t0)) s"
  else
    failed=$((failed + 1)); failures+=("$name")
    [ "$code" = 124 ] || [ "$code" = 137 ] && echo "$name: timed out after ${limit[$name]} s" >&2
    say "$name FAILED (exit $code) in $((SECONDS - t0)) s"
  fi
done
say "tests took $((SECONDS - started)) s; artifacts in $E2E_ARTIFACTS"
[ $failed = 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ $failed = 0 ]
