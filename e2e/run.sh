#!/usr/bin/env bash
# End-to-end tests of forge-push-token-server (issue 7: /metrics, --state-file, the live page;
# issue 13: a real Prometheus scraping the service, JSON logs; issue 11: replicas sharing the token
# through Redis, behind nginx; issue 21: the edges of HTTP an attacker found; issue 17: the TLS
# and Sentinel commands of docs/replicas.md, a Sentinel failover, the delivery probe; issue 27:
# what a replica trusts, each attack against real Redis and sentinels; obs-fold, chunked trailers
# and the limits of libmicrohttpd's framing, directly and behind nginx; issue 29: the drain of a
# stopping service, a rolling deploy through three replicas behind nginx, HTTP/2 and TLS at the
# edge in headless Chromium; issue 28: read and write tokens, their reload during 1,000 streams,
# the rotation of docs/operations.md; issue 31: the allocations of a cached GET /token and of a
# delivered event, counted by a malloc shim preloaded into the server; issue 42: the state file on
# a slow, a failing and a full file system).
#
#   e2e/run.sh --server PATH [--log-format json|text] [TEST ...]
#
# TEST is one of the names in `tests` below (all of them, in that order, by default).
#
# Every server of the pass runs with --log-format json by default (FORGE_PUSH_TOKEN_LOG_FORMAT;
# the tests read its lines back as text); afterwards every line every server wrote is checked with
# jq (one slog-style JSON object: time, level, msg; access lines with their fields), for raw
# control characters, and for any device or bearer token a test sent. --log-format text runs the
# pass with text logs and skips that check.
#
# Installs what it needs, once: a venv at ${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/e2e-venv
# with e2e/requirements.txt (reused while that file is unchanged), and Debian's chromium and
# chromium-driver when missing (apt-get update only when an install fails without it). Then runs
# each test under a hard timeout (about 5 minutes in all), prints `N passed, N failed` and exits
# non-zero when any failed. Screenshots go to $E2E_ARTIFACTS (default e2e/artifacts).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# The tests, in the order they run, and each one's hard timeout in seconds: the one list of them.
tests=(metrics state_file state_file_faults browser hardening http_edges http_framing prometheus replicas tls_docs acl_docs
       sentinel sentinel_docs probe trust drain rolling http2 credentials rotation_docs allocation)
declare -A limit=([metrics]=45 [state_file]=180 [state_file_faults]=150 [browser]=75 [hardening]=90 [http_edges]=120 [http_framing]=90
                  [prometheus]=60 [replicas]=150 [tls_docs]=60 [acl_docs]=45 [sentinel]=150 [sentinel_docs]=90
                  [probe]=45 [trust]=90 [drain]=100 [rolling]=150 [http2]=75 [credentials]=90 [rotation_docs]=60
                  [allocation]=60)
usage() { echo "usage: $0 --server PATH [--log-format json|text] [$(IFS='|'; echo "${tests[*]}") ...]" >&2; }
server=""
log_format=json
selected=()
while [ $# -gt 0 ]; do
  case "$1" in
    --server) [ $# -ge 2 ] || { usage; exit 64; }; server="$2"; shift 2 ;;
    --server=*) server="${1#--server=}"; shift ;;
    --log-format) [ $# -ge 2 ] || { usage; exit 64; }; log_format="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) if [ -n "${limit[$1]:-}" ]; then selected+=("$1"); shift
       else echo "unknown argument: $1" >&2; usage; exit 64; fi ;;
  esac
done
[ -n "$server" ] || { usage; exit 64; }
[ -x "$server" ] && [ -f "$server" ] || { echo "not an executable file: $server" >&2; exit 64; }
server="$(cd "$(dirname "$server")" && pwd)/$(basename "$server")"
[ ${#selected[@]} -gt 0 ] || selected=("${tests[@]}")
case "$log_format" in json|text) ;; *) echo "--log-format must be json or text" >&2; exit 64 ;; esac

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

if [[ " ${selected[*]} " =~ " "(browser|http2)" " ]]; then
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

# Debian's prometheus (a real one scrapes the service); jq checks the JSON log lines.
missing=()
if [[ " ${selected[*]} " == *" prometheus "* ]]; then command -v prometheus >/dev/null || missing+=(prometheus); fi
if [ "$log_format" = json ]; then command -v jq >/dev/null || missing+=(jq); fi
if [[ " ${selected[*]} " =~ " "(sentinel|sentinel_docs|probe|acl_docs|trust)" " ]]; then
  # A master, a replica and three sentinels (redis-server --sentinel), inspected with redis-cli;
  # the probe test's redis-server behind its own proxy; the ACL user of docs/replicas.md, set
  # with redis-cli; the trust test's Redis, sentinels, attacking proxy and rogue sentinel.
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v redis-cli >/dev/null || missing+=(redis-tools)
fi
if [[ " ${selected[*]} " =~ " "(credentials|rotation_docs)" " ]]; then
  # curl makes the role checks; curl and openssl run the rotation steps of docs/operations.md.
  command -v curl >/dev/null || missing+=(curl)
  command -v openssl >/dev/null || missing+=(openssl)
  # unshare (util-linux) runs the service as PID 1 of a PID namespace, as a container does.
  command -v unshare >/dev/null || missing+=(util-linux)
fi
if [[ " ${selected[*]} " == *" tls_docs "* ]]; then
  # The commands of docs/replicas.md, "TLS on one machine": openssl and a TLS redis-server.
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v openssl >/dev/null || missing+=(openssl)
fi
if [[ " ${selected[*]} " == *" http_framing "* ]]; then
  # Starts its own nginx on a free loopback port, configured by docker/nginx/replicas.conf.
  command -v nginx >/dev/null || missing+=(nginx)
fi
if [[ " ${selected[*]} " =~ " "(replicas|rolling|http2)" " ]]; then
  # The replica, rolling-deploy and HTTP/2 tests start their own redis-server and nginx on free loopback ports (never the
  # system services) and uses redis-cli to inspect and damage the state.
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v redis-cli >/dev/null || missing+=(redis-tools)
  command -v nginx >/dev/null || missing+=(nginx)
fi
if [[ " ${selected[*]} " == *" http2 "* ]]; then
  # The edge of docs/replicas.md: a certificate made with openssl, checked with curl --http2.
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
fi
if [[ " ${selected[*]} " == *" allocation "* ]]; then
  # The allocation test builds its malloc-counting shim (e2e/malloc_counter.c) with cc.
  command -v cc >/dev/null || missing+=(gcc)
fi
if [[ " ${selected[*]} " == *" state_file_faults "* ]]; then
  # The state file on a FUSE passthrough that injects faults (e2e/faultfs.c, built with cc and
  # libfuse3) and on a full loop device (ext4).
  command -v cc >/dev/null || missing+=(gcc)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v fusermount3 >/dev/null || missing+=(fuse3)
  pkg-config --exists fuse3 2>/dev/null || missing+=(libfuse3-dev)
  command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
  command -v losetup >/dev/null || missing+=(mount)
fi
if ((${#missing[@]})); then
  say "installing ${missing[*]} (apt)"
  apt_install "${missing[@]}" || { echo "could not install ${missing[*]}" >&2; exit 1; }
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
export E2E_LOG_FORMAT="$log_format"
E2E_LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/e2e-logs.XXXXXX")"
export E2E_LOG_DIR
say "server logs: --log-format $log_format, kept in $E2E_LOG_DIR"
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
# -- every log line of the pass: one slog-style JSON object, no raw control character, no secret --
if [ "$log_format" = json ]; then
  say "checking every server log line with jq"
  files=("$E2E_LOG_DIR"/stderr-*.log)
  lines=0
  bad=0
  # shellcheck disable=SC2016 # $line is jq's variable, not the shell's
  jq_program='. as $line | try (fromjson
    | if type == "object"
         and (.time | type == "string" and test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?Z$"))
         and (.level | IN("DEBUG", "INFO", "WARN", "ERROR"))
         and (.msg | type == "string")
         and ((has("method") | not) or ((.method | type == "string") and (.path | type == "string")
              and (.bytes | type == "number") and (.duration_us | type == "number")
              and ((.status // 0) | type == "number") and ((.remote // "") | type == "string")))
      then empty else "not a slog record: \($line)" end)
    catch "not JSON: \($line)"'
  for file in "${files[@]}"; do
    [ -f "$file" ] || continue
    lines=$((lines + $(wc -l < "$file")))
    if [ -s "$file" ] && [ "$(tail -c 1 "$file" | od -An -c | tr -d ' ')" != '\n' ]; then
      echo "$file: the last line has no newline" >&2; bad=$((bad + 1))
    fi
    out="$(jq -rR "$jq_program" "$file" 2>&1)" || { echo "jq failed on $file: $out" >&2; bad=$((bad + 1)); }
    if [ -n "$out" ]; then echo "$file:" >&2; printf '%s\n' "$out" | head -5 >&2; bad=$((bad + 1)); fi
    if LC_ALL=C grep -naP '[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' "$file" | head -3 >&2; then
      echo "$file: a raw control character" >&2; bad=$((bad + 1))
    fi
    if [ -s "$E2E_LOG_DIR/secrets.txt" ] && grep -n -i -F -f "$E2E_LOG_DIR/secrets.txt" "$file" | head -3 >&2; then
      echo "$file: a device token or bearer token a test sent is in the log" >&2; bad=$((bad + 1))
    fi
  done
  secrets=$(sort -u "$E2E_LOG_DIR/secrets.txt" 2>/dev/null | wc -l)
  if [ ! -f "${files[0]}" ] || [ "$lines" -lt 2 ]; then
    echo "only ${#files[@]} server logs with $lines lines: the JSON pass did not run" >&2; bad=$((bad + 1))
  fi
  if [ "$bad" = 0 ]; then
    passed=$((passed + 1)); say "json logs passed: $lines lines of ${#files[@]} servers parse with jq; none holds one of $secrets secrets"
    rm -rf "$E2E_LOG_DIR"
  else
    failed=$((failed + 1)); failures+=(json_logs); say "json logs FAILED ($bad problems); logs kept in $E2E_LOG_DIR"
  fi
fi
say "tests took $((SECONDS - started)) s; artifacts in $E2E_ARTIFACTS"
[ $failed = 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ $failed = 0 ]
