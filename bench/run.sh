#!/usr/bin/env bash
# bench/run.sh: the service's performance on loopback, as one table of medians of REPEATS runs.
#
#   bench/run.sh [--peers] [--binary PATH] [--out DIR]
#
# Builds the release server (swift build -c release, scratch path $BENCH_SCRATCH, so that it does
# not wait on other builds in .build) unless --binary is given, then measures, every run wrapped in
# cpuguard.py (a run during which other processes used CPU is redone, up to TRIES tries):
#   http     wrk -t $WRK_THREADS -c $WRK_CONNS -d $DURATION, keep-alive: GET /token and
#            POST /register (a new 64-hex token per request), access log off; then the same with
#            the access log on (written to a file), and POST /register with --state-file (each
#            change saved durably before it is answered). A token is registered first, so GET /token
#            answers {"token":"<64 hex>"} like the peers.
#   sse      sse_fanout (bench/sse_fanout, bench/'s one fan-out client): N subscribers for
#            each N in $SSE_NS, $SSE_M publishes $SSE_INTERVAL_MS ms apart, a fresh server per run:
#            delivery delay p50/p99/max, missed events, connect time, server RSS per subscriber.
#            A count over what the open-file hard limit allows is measured at the largest whole
#            thousand that fits (about 18,000 with a hard limit of 20,000), with a note.
#   idle     $IDLE_N idle subscribers: server CPU over $IDLE_SECONDS s between heartbeats.
#   start    spawn to the `listening on` log line (bench/startup.py, 5 starts per run).
# Our server runs with --access-log off and no state file unless stated.
#
# --peers also copies $SHARED_BENCH (default ../shared/bench) to a temporary folder and measures, with
# the same tools and settings and interleaved with ours: the C libmicrohttpd server (GET /token and
# POST /register, its token kept under a mutex; epoll, as many threads as ours: one per core up to
# 8, a pool when more than one), nginx `return 200` (GET /token) and nginx + nchan (1 worker;
# POST /register publish and /token/stream fan-out, RSS per subscriber).
#
# --peers also runs the C fan-out floor (fanout-c: epoll, one write per subscriber, no HTTP
# parsing) through the same sse_fanout client, with as many threads as ours ($MHD_THREADS), so that
# the fan-out is compared with the floor on the same threads.
#
# Results (raw JSON and summary.md) go to bench/results/<stamp>/ (ignored by git) or --out DIR,
# with charts (bench/charts.py: fanout.png/.svg, the delay p50/p99 against the subscriber count;
# http.png/.svg, the request rates) when matplotlib is installed (python3-matplotlib).
# Bounded: without --peers about 4 minutes, with --peers about 10 (a busy machine adds cpuguard's
# waits; once the run passes $BUDGET seconds it stops waiting and retrying). Loopback only.
#
# Env: REPEATS (3) DURATION (5s) WRK_THREADS (2) WRK_CONNS (64) SSE_NS ("1000 5000 10000 20000") SSE_M (5)
#      SSE_INTERVAL_MS (1000) IDLE_N (10000) IDLE_SECONDS (8) TRIES (3) MAX_FOREIGN (0.10)
#      WAIT_QUIET (30) PORT_BASE (18080) BENCH_SCRATCH SHARED_BENCH BUDGET (300 / 840 with --peers)
#      MHD_THREADS (the C server's and the C fan-out floor's threads; default as ours)
#      PARTS ("http sse idle": which of the measurements to run; idle includes start, e.g.
#      PARTS=sse SSE_NS=10000 --peers for the fan-out against the floor alone, about 3 minutes)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$here/lib.sh"

PEERS=0; BINARY=""; OUT=""
while (($#)); do
  case "$1" in
    --peers) PEERS=1; shift;;
    --binary) BINARY="$2"; shift 2;;
    --out) OUT="$2"; shift 2;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2;;
  esac
done

REPEATS="${REPEATS:-3}"; DURATION="${DURATION:-5s}"
WRK_THREADS="${WRK_THREADS:-2}"; WRK_CONNS="${WRK_CONNS:-64}"
SSE_NS="${SSE_NS:-1000 5000 10000 20000}"; SSE_M="${SSE_M:-5}"; SSE_INTERVAL_MS="${SSE_INTERVAL_MS:-1000}"
PARTS="${PARTS:-http sse idle}"
IDLE_N="${IDLE_N:-10000}"; IDLE_SECONDS="${IDLE_SECONDS:-8}"
TRIES="${TRIES:-3}"; MAX_FOREIGN="${MAX_FOREIGN:-0.10}"; WAIT_QUIET="${WAIT_QUIET:-30}"
PORT_BASE="${PORT_BASE:-18080}"
# Our server runs one libmicrohttpd daemon per core (at most 8); the C server gets the same count
# (1 = its single polling thread, more = MHD_OPTION_THREAD_POOL_SIZE), so that the two share a
# threading mode.
cores="$(nproc)"; MHD_THREADS="${MHD_THREADS:-$(( cores > 8 ? 8 : cores ))}"
BENCH_SCRATCH="${BENCH_SCRATCH:-${TMPDIR:-/tmp}/forge-push-token-bench-build}"
SHARED_BENCH="${SHARED_BENCH:-$repo/../shared/bench}"
if [[ "$PEERS" == 1 ]]; then BUDGET="${BUDGET:-840}"; else BUDGET="${BUDGET:-300}"; fi
OUR_PORT=$PORT_BASE; NGINX_PORT=$((PORT_BASE + 1)); MHD_PORT=$((PORT_BASE + 2)); FC_PORT=$((PORT_BASE + 3))
ours="http://127.0.0.1:$OUR_PORT"; ng="http://127.0.0.1:$NGINX_PORT"; mh="http://127.0.0.1:$MHD_PORT"
fc="http://127.0.0.1:$FC_PORT"

for tool in wrk gcc python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool not found (apt-get install -y wrk gcc python3 curl)" >&2; exit 1; }
done
hard="$(ulimit -Hn)"
if [[ "$hard" != unlimited ]]; then
  fit=$(( (hard - 1024) / 1000 * 1000 ))
  counts=()
  for n in $SSE_NS; do
    if (( n + 64 > hard )); then
      echo "fd hard limit $hard is too low for $n subscribers: fan-out measured at $fit instead" >&2
      n=$fit
    fi
    counts+=("$n")
  done
  SSE_NS="$(printf '%s\n' "${counts[@]}" | sort -nu | tr '\n' ' ' | sed 's/ $//')"
  (( IDLE_N + 64 <= hard )) || { echo "fd hard limit $hard is too low for $IDLE_N subscribers" >&2; exit 1; }
fi

out="${OUT:-$here/results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/forge-bench.XXXXXX")"
OUR_PID=""
cleanup() {
  if declare -F stop_ours >/dev/null; then stop_ours; fi
  if [[ -n "${peer_dir:-}" ]]; then
    PORT="$NGINX_PORT" "$peer_dir/peers/nginx-nchan/stop.sh" >/dev/null 2>&1 || true
    "$peer_dir/peers/mhd-c/stop.sh" >/dev/null 2>&1 || true
    "$peer_dir/peers/fanout-c/stop.sh" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# ---- build
if [[ -z "$BINARY" ]]; then
  echo "building the release server (scratch path $BENCH_SCRATCH)"
  BINARY="$("$repo/scripts/build-release.sh" --scratch-path "$BENCH_SCRATCH" 2> >(tail -1 >&2))"
fi
[[ -x "$BINARY" ]] || { echo "no server binary at $BINARY" >&2; exit 1; }
fanout="$(build_fanout_client)"

if [[ "$PEERS" == 1 ]]; then
  [[ -d "$SHARED_BENCH/peers" ]] || { echo "no peers in $SHARED_BENCH" >&2; exit 1; }
  command -v nginx >/dev/null || { echo "nginx not found (apt-get install -y nginx libnginx-mod-nchan libmicrohttpd-dev)" >&2; exit 1; }
  cp -r "$SHARED_BENCH" "$work/shared-bench"
  peer_dir="$work/shared-bench"
  chmod -R u+w "$peer_dir"
  make -s -C "$peer_dir/peers/mhd-c" mhd_token
  make -s -C "$peer_dir/peers/fanout-c" fanout_c
  NG_PID="$peer_dir/peers/nginx-nchan/run/nginx.pid"; MH_PID="$peer_dir/peers/mhd-c/run/mhd_token.pid"
  FC_PID="$peer_dir/peers/fanout-c/run/fanout_c.pid"
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kernel: $(uname -r)  cpus: $(nproc)  mem: $(free -g | awk '/Mem:/{print $2}') GiB  fd hard limit: $hard"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "swift: $(swift --version 2>&1 | head -1)"
  dpkg-query -W -f '${Package} ${Version}\n' libmicrohttpd12 wrk nginx libnginx-mod-nchan 2>/dev/null || true
  echo "server: $BINARY"
  echo "settings: REPEATS=$REPEATS DURATION=$DURATION WRK_THREADS=$WRK_THREADS WRK_CONNS=$WRK_CONNS SSE_NS='$SSE_NS' SSE_M=$SSE_M SSE_INTERVAL_MS=$SSE_INTERVAL_MS IDLE_N=$IDLE_N IDLE_SECONDS=$IDLE_SECONDS MAX_FOREIGN=$MAX_FOREIGN peers=$PEERS"
} > "$out/versions.txt"
cat "$out/versions.txt"
echo "{\"threads\": $MHD_THREADS, \"fanout_c_threads\": $MHD_THREADS}" > "$out/meta.json"

# ---- our server
start_ours() { # extra flags...
  local log="$work/server.log"
  "$BINARY" --host 127.0.0.1 --port "$OUR_PORT" --access-log off "$@" 2> "$log" < /dev/null &
  OUR_PID=$!
  for _ in $(seq 1 100); do
    grep -q "listening on" "$log" 2>/dev/null && return 0
    kill -0 "$OUR_PID" 2>/dev/null || break
    sleep 0.05
  done
  echo "our server did not start:" >&2; cat "$log" >&2; exit 1
}
stop_ours() {
  [[ -n "$OUR_PID" ]] || return 0
  kill -TERM "$OUR_PID" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$OUR_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$OUR_PID" 2>/dev/null || true
  wait "$OUR_PID" 2>/dev/null || true
  OUR_PID=""
}

# guarded LABEL PID -- command...: runs the command under cpuguard, stdout to $work/out; redoes it
# while other processes were busy (retry_while_disturbed, bench/lib.sh).
guarded() {
  local label="$1" pid="$2"; shift 3
  retry_while_disturbed "$label" guarded_try "$pid" "$@"
}
guarded_try() { # TRY_LABEL WAIT_QUIET PID command...
  local try_label="$1" wait_quiet="$2" pid="$3"; shift 3
  python3 "$here/cpuguard.py" --label "$try_label" --log "$out/guard.jsonl" --pid "$pid" \
    --max-foreign "$MAX_FOREIGN" --wait-quiet "$wait_quiet" -- "$@" > "$work/out"
}

# http LABEL PID MODE URL PATH
http() {
  local label="$1" pid="$2" mode="$3" url="$4" path="$5" script args=() secs
  secs="${DURATION%s}"; [[ "$DURATION" == *m ]] && secs=$(( ${DURATION%m} * 60 ))
  if [[ "$mode" == get ]]; then script="$here/wrk/get.lua"; args=("$url$path")
  else script="$here/wrk/register.lua"; args=("$url" -- "$path"); fi
  guarded "$label-$mode" "$pid" -- timeout $((secs + 30)) wrk -t "$WRK_THREADS" -c "$WRK_CONNS" -d "$DURATION" \
    --latency -s "$script" "${args[@]}" || true
  python3 - "$label" "$mode" "$DISTURBED" "$work/out" "$out/http.jsonl" <<'PY'
import json, sys
label, mode, disturbed, src, dest = sys.argv[1:6]
line = next((l for l in open(src) if l.startswith("WRK_JSON ")), None)
if line is None:
    print(f"  {label} {mode}: wrk failed:\n" + open(src).read(), file=sys.stderr)
    sys.exit(0)
r = json.loads(line[len("WRK_JSON "):])
r.update(label=label, mode=mode, disturbed=disturbed == "1")
r["errors"] = r["err_connect"] + r["err_read"] + r["err_write"] + r["err_status"] + r["err_timeout"]
print(f"  {label:<24} {mode:<4} {r['rps']:>10,.0f} req/s  p50 {r['lat_p50_us']/1000:.2f} ms  p99 {r['lat_p99_us']/1000:.2f} ms"
      f"  errors {r['errors']}{'  (disturbed)' if r['disturbed'] else ''}")
open(dest, "a").write(json.dumps(r) + "\n")
PY
}

# sse LABEL N DEST: a fresh server for every try (so that RSS per subscriber is measured from a
# clean start); redone while other processes were busy.
sse() {
  local label="$1" n="$2" dest="$3" rc=0
  retry_while_disturbed "$label-n$n" sse_try "$label" "$n" "$dest" || rc=$?
  grep -E "^all|RSS per|connect phase" "$work/out" | sed 's/^/  /' || true
  [[ $rc == 0 || $rc == 75 ]] || echo "  $label N=$n: sse_fanout exit $rc (3 = missed events or incomplete)"
  if [[ -s "$dest" && "$DISTURBED" == 1 ]]; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["disturbed"]=True; json.dump(d, open(sys.argv[1],"w"))' "$dest"
  fi
}

sse_try() { # TRY_LABEL WAIT_QUIET LABEL N DEST: one try on a fresh server; returns cpuguard's status
  local try_label="$1" wait_quiet="$2" label="$3" n="$4" dest="$5" pid url rc=0
  if [[ "$label" == ours ]]; then start_ours --max-subscribers "$((n + 16))"; pid="$OUR_PID"; url="$ours"
  elif [[ "$label" == fanout-c ]]; then fc_start; pid="$(cat "$FC_PID")"; url="$fc"
  else WORKER_CONNECTIONS="$(( n + 1024 > 16384 ? n + 1024 : 16384 ))" ng_start; sleep 0.5; pid="$(cat "$NG_PID")"; url="$ng"; fi
  rm -f "$dest"
  python3 "$here/cpuguard.py" --label "$try_label" --log "$out/guard.jsonl" --pid "$pid" \
    --max-foreign "$MAX_FOREIGN" --wait-quiet "$wait_quiet" -- "$fanout" --url "$url" -n "$n" -m "$SSE_M" \
    --interval-ms "$SSE_INTERVAL_MS" --pid "$pid" --label "$label" --max-seconds 120 --quiet --json "$dest" \
    > "$work/out" || rc=$?
  if [[ "$label" == ours ]]; then stop_ours; elif [[ "$label" == fanout-c ]]; then fc_stop; else ng_stop; fi
  return "$rc"
}

ng_start() { PORT="$NGINX_PORT" WORKERS=1 "$peer_dir/peers/nginx-nchan/start.sh" >/dev/null; }
ng_stop() { PORT="$NGINX_PORT" "$peer_dir/peers/nginx-nchan/stop.sh" >/dev/null; }
mh_start() { PORT="$MHD_PORT" THREADS="$MHD_THREADS" "$peer_dir/peers/mhd-c/start.sh" >/dev/null; }
mh_stop() { "$peer_dir/peers/mhd-c/stop.sh" >/dev/null; }
fc_start() { PORT="$FC_PORT" THREADS="$MHD_THREADS" "$peer_dir/peers/fanout-c/start.sh" >/dev/null; }
fc_stop() { "$peer_dir/peers/fanout-c/stop.sh" >/dev/null; }

part() { [[ " $PARTS " == *" $1 "* ]]; }

part http && for r in $(seq 1 "$REPEATS"); do
  echo "=== HTTP, repeat $r/$REPEATS"
  start_ours; seed_token "$ours"
  http ours "$OUR_PID" get "$ours" /token
  http ours "$OUR_PID" post "$ours" /register
  stop_ours
  if [[ "$PEERS" == 1 ]]; then
    mh_start
    http mhd-c "$(cat "$MH_PID")" get "$mh" /token
    http mhd-c "$(cat "$MH_PID")" post "$mh" /register
    mh_stop
    ng_start
    http nginx "$(cat "$NG_PID")" get "$ng" /token
    http nchan "$(cat "$NG_PID")" post "$ng" /register
    ng_stop
  fi
  start_ours --access-log on; seed_token "$ours"
  http ours-access-log "$OUR_PID" get "$ours" /token
  http ours-access-log "$OUR_PID" post "$ours" /register
  stop_ours
  # Every change written durably (write, fsync, rename, fsync of the folder) before it is answered.
  rm -f "$work/state.json"
  start_ours --state-file "$work/state.json"; seed_token "$ours"
  http ours-state-file "$OUR_PID" post "$ours" /register
  stop_ours
done

part sse && for r in $(seq 1 "$REPEATS"); do
  for n in $SSE_NS; do
    echo "=== SSE fan-out N=$n, $SSE_M publishes ${SSE_INTERVAL_MS} ms apart, repeat $r/$REPEATS"
    sse ours "$n" "$out/sse-ours-n$n-r$r.json"
    if [[ "$PEERS" == 1 ]]; then
      sse nchan "$n" "$out/sse-nchan-n$n-r$r.json"
      sse fanout-c "$n" "$out/sse-fanout-c-n$n-r$r.json"
    fi
  done
done

part idle && for r in $(seq 1 "$REPEATS"); do
  echo "=== idle: $IDLE_N subscribers, $IDLE_SECONDS s between heartbeats, repeat $r/$REPEATS"
  # Each try writes its own JSON; only the kept one is appended.
  # shellcheck disable=SC2016 # $1..$5 are the inner shell's arguments
  guarded idle "$$" -- bash -c 'rm -f "$1"; exec python3 "$2" --server "$3" -n "$4" --seconds "$5" --max-percent 100 --json "$1"' \
    _ "$work/idle.json" "$here/idle_subscribers.py" "$BINARY" "$IDLE_N" "$IDLE_SECONDS" || true
  [[ -s "$work/idle.json" ]] && cat "$work/idle.json" >> "$out/idle.jsonl"
  sed 's/^/  /' "$work/out"
  echo "=== start to listening, repeat $r/$REPEATS"
  # shellcheck disable=SC2016 # as above
  guarded startup "$$" -- bash -c 'rm -f "$1"; exec python3 "$2" --server "$3" --runs 5 --json "$1"' \
    _ "$work/startup.json" "$here/startup.py" "$BINARY" || true
  [[ -s "$work/startup.json" ]] && cat "$work/startup.json" >> "$out/startup.jsonl"
  sed 's/^/  /' "$work/out"
done

python3 "$here/summarize.py" "$out" | tee "$out/summary.md"
# Debian's python3-matplotlib is for /usr/bin/python3, which may not be the python3 on PATH.
chart_python=""
for py in python3 /usr/bin/python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then chart_python="$py"; break; fi
done
if [[ -n "$chart_python" ]]; then
  "$chart_python" "$here/charts.py" "$out" || echo "charts.py failed" >&2
else
  echo "no charts: matplotlib is missing (apt-get install -y python3-matplotlib)" >&2
fi
echo "raw results and summary: $out/ (whole run ${SECONDS} s)"
