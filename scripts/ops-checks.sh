#!/usr/bin/env bash
# scripts/ops-checks.sh: what operators run beside the service, checked by the ecosystem's own
# tools (issue 13; docs/operations.md):
#
#   1. docker/prometheus/: `promtool check rules` and `promtool test rules` (every alert firing and
#      not firing), `promtool check config` of the Prometheus configuration that loads them;
#   2. `promtool check metrics` on a live scrape of the server (with a state file and a subscriber,
#      so that every series is there), and the scrape's standard process series;
#   3. docker/systemd/forge-push-token-server.service: `systemd-analyze verify` (no output
#      allowed) and `systemd-analyze security --offline=yes` under an exposure threshold;
#   4. bench/charts.py renders the stored sample results (bench/testdata/) to PNG and SVG, twice,
#      and the two SVGs are the same bytes;
#   5. bench/scrape_cost.py: a scrape with 10,000 subscribers connected costs under 5 ms of the
#      service's CPU.
#
#   scripts/ops-checks.sh --server PATH
#
# Installs what is missing, idempotently: Debian's prometheus (promtool), systemd
# (systemd-analyze; PID 1 need not be systemd) and python3-matplotlib. Loopback only; the server it
# starts is stopped by its PID.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
server=""
while (($#)); do
  case "$1" in
    --server) server="$2"; shift 2 ;;
    *) echo "usage: $0 --server PATH" >&2; exit 64 ;;
  esac
done
[[ -x "$server" ]] || { echo "usage: $0 --server PATH (an executable)" >&2; exit 64; }

say() { printf '==> %s\n' "$*"; }
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  if apt-get install -y -qq --no-install-recommends "$@" >/tmp/ops-apt.$$.log 2>&1; then rm -f /tmp/ops-apt.$$.log; return 0; fi
  if [[ $apt_updated == 0 ]]; then
    apt_updated=1
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/tmp/ops-apt.$$.log 2>&1 \
      && { rm -f /tmp/ops-apt.$$.log; return 0; }
  fi
  tail -20 /tmp/ops-apt.$$.log >&2; rm -f /tmp/ops-apt.$$.log
  return 1
}
# Debian's python3-matplotlib belongs to /usr/bin/python3, which may not be the python3 on PATH.
chart_python() {
  local py
  for py in python3 /usr/bin/python3; do
    if "$py" -c "import matplotlib" 2>/dev/null; then echo "$py"; return 0; fi
  done
  return 1
}
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v curl >/dev/null || missing+=(curl)
chart_python >/dev/null || missing+=(python3-matplotlib)
if ((${#missing[@]})); then
  say "installing ${missing[*]} (apt)"
  apt_install "${missing[@]}" || { echo "could not install ${missing[*]}" >&2; exit 1; }
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ops-checks.XXXXXX")"
pid=""
stream=""
cleanup() {
  [[ -n "$stream" ]] && kill "$stream" 2>/dev/null || true
  if [[ -n "$pid" ]]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# 1. Prometheus rules and configuration.
say "promtool check rules, test rules, check config (docker/prometheus/)"
promtool check rules docker/prometheus/rules.yml
promtool test rules docker/prometheus/rules_test.yml
promtool check config docker/prometheus/prometheus.yml

# 2. A live scrape.
say "promtool check metrics on a live scrape"
"$server" --host 127.0.0.1 --port 0 --state-file "$work/state.json" --log-format json 2>"$work/server.log" </dev/null &
pid=$!
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/server.log" | head -1)"
  [[ -n "$port" ]] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
[[ -n "$port" ]] || { echo "the server did not start:" >&2; cat "$work/server.log" >&2; exit 1; }
curl -fsS -o /dev/null --max-time 5 -X POST --data "$(printf 'ab%.0s' $(seq 1 32))" "http://127.0.0.1:$port/register"
curl -sN --max-time 30 "http://127.0.0.1:$port/token/stream" >/dev/null &
stream=$!
for _ in $(seq 1 100); do
  curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics" >"$work/metrics.txt"
  grep -qx 'forge_push_token_subscribers 1' "$work/metrics.txt" && break
  sleep 0.05
done
promtool check metrics <"$work/metrics.txt"
for series in process_cpu_seconds_total process_resident_memory_bytes process_virtual_memory_bytes \
              process_start_time_seconds process_open_fds process_max_fds forge_push_token_subscribers_limit \
              forge_push_token_state_saved 'forge_push_token_build_info{version="'; do
  grep -q "^$series" "$work/metrics.txt" || { echo "the scrape has no $series" >&2; exit 1; }
done
grep -qx 'forge_push_token_subscribers 1' "$work/metrics.txt" || { echo "the subscriber is not counted" >&2; exit 1; }
grep -q '^forge_push_token_start_time_seconds' "$work/metrics.txt" && { echo "forge_push_token_start_time_seconds is back" >&2; exit 1; }
kill "$stream" 2>/dev/null || true; stream=""
kill -TERM "$pid"; wait "$pid" || { echo "the server did not exit 0 on SIGTERM" >&2; exit 1; }
pid=""
echo "live scrape: $(grep -vc '^#' "$work/metrics.txt") samples pass promtool check metrics"

# 3. The systemd unit. verify looks for ExecStart's binary: point it at the one under test.
say "systemd-analyze verify and security --offline=yes (docker/systemd/)"
unit="$work/forge-push-token-server.service"
sed "s|^ExecStart=/usr/local/bin/forge-push-token-server$|ExecStart=$server|" \
  docker/systemd/forge-push-token-server.service >"$unit"
grep -q "^ExecStart=$server\$" "$unit" || { echo "the unit's ExecStart line is not /usr/local/bin/forge-push-token-server" >&2; exit 1; }
# verify prints what it finds (unknown settings, bad values) but exits 0 for most of it: any
# output fails the check.
verify_output="$(systemd-analyze verify "$unit" 2>&1)" || { echo "$verify_output" >&2; exit 1; }
[[ -z "$verify_output" ]] || { echo "systemd-analyze verify: $verify_output" >&2; exit 1; }
echo "systemd-analyze verify: no findings"
# shellcheck disable=SC2016 # $MAINPID is systemd's, written as it stands in the unit
for setting in DynamicUser=yes ProtectSystem=strict StateDirectory=forge-push-token NoNewPrivileges=yes \
               LoadCredential=auth-token: RestrictAddressFamilies= SystemCallFilter=@system-service \
               'ExecReload=/bin/kill -HUP $MAINPID'; do
  grep -q "^$setting" "$unit" || { echo "the unit lost $setting" >&2; exit 1; }
done
# The unit's commented token-file variant (issue 28), switched on in place of the auth-token lines,
# must verify too: its copies at start and on reload, and the variables that name them.
tokens_unit="$work/tokens/forge-push-token-server.service"
mkdir -p "$work/tokens"
sed -e '/^LoadCredential=auth-token:/d' -e '/^Environment=FORGE_PUSH_TOKEN_AUTH_TOKEN_FILE=/d' \
    -e 's/^#\(RuntimeDirectory\|ExecStartPre=+\|ExecReload=+\|Environment=FORGE_PUSH_TOKEN_\(WRITE\|READ\)_TOKEN_FILE\)/\1/' \
    "$unit" >"$tokens_unit"
[[ $(grep -c '^\(RuntimeDirectory\|ExecStartPre=+\|ExecReload=+\|Environment=FORGE_PUSH_TOKEN_\(WRITE\|READ\)_TOKEN_FILE\)' "$tokens_unit") == 6 ]] \
  || { echo "the unit's commented token-file lines are not the six expected" >&2; exit 1; }
verify_output="$(systemd-analyze verify "$tokens_unit" 2>&1)" || { echo "$verify_output" >&2; exit 1; }
[[ -z "$verify_output" ]] || { echo "systemd-analyze verify (token files): $verify_output" >&2; exit 1; }
echo "systemd-analyze verify of the token-file variant: no findings"
# The filter must keep setrlimit (@resources): the service raises RLIMIT_NOFILE at start.
if grep -Eq '^SystemCallFilter=~.*@resources' "$unit"; then echo "the unit denies @resources (setrlimit)" >&2; exit 1; fi
# Exposure threshold 2.0 of 10 (systemd's --threshold is in tenths); the unit scores about 1.2.
systemd-analyze security --offline=yes --threshold=20 --no-pager "$unit" >"$work/security.txt" 2>&1 \
  || { cat "$work/security.txt" >&2; echo "systemd-analyze security: exposure over 2.0" >&2; exit 1; }
grep 'Overall exposure level' "$work/security.txt"

# 4. Charts of the stored sample results.
say "bench/charts.py on bench/testdata (PNG and SVG, reproducible)"
py="$(chart_python)"
"$py" bench/charts.py bench/testdata --out "$work/charts-1"
"$py" bench/charts.py bench/testdata --out "$work/charts-2"
for name in fanout http; do
  for ext in png svg; do
    file="$work/charts-1/$name.$ext"
    [[ -s "$file" ]] || { echo "no $name.$ext" >&2; exit 1; }
  done
  [[ "$(head -c 8 "$work/charts-1/$name.png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] \
    || { echo "$name.png is not a PNG" >&2; exit 1; }
  cmp "$work/charts-1/$name.svg" "$work/charts-2/$name.svg" || { echo "$name.svg differs between two renders" >&2; exit 1; }
  grep -q '<dc:date>' "$work/charts-1/$name.svg" && { echo "$name.svg carries a date" >&2; exit 1; }
done
# The fan-out chart names every server of the sample and the counts; the rates chart ours and peers.
for text in forge-push-token-server nchan "C fan-out floor" "1,000" "18,000" p50 p99; do
  grep -q -- "$text" "$work/charts-1/fanout.svg" || { echo "fanout.svg does not show '$text'" >&2; exit 1; }
done
for text in "ours: GET /token" "C libmicrohttpd" "nchan: publish"; do
  grep -q -- "$text" "$work/charts-1/http.svg" || { echo "http.svg does not show '$text'" >&2; exit 1; }
done
echo "charts: fanout and http, PNG and SVG, the same SVG bytes twice"
# 5. The CPU cost of a scrape with 10,000 subscribers connected (issue 13: under 5 ms).
say "GET /metrics with 10,000 subscribers: under 5 ms of the service's CPU (bench/scrape_cost.py)"
python3 bench/scrape_cost.py --server "$server" -n 10000 -k 200 --max-ms 5
say "ops checks passed"
