#!/usr/bin/env bash
# bench/replicas.sh: the cross-replica figures (issue 11, docs/replicas.md), side by side in one
# run with nginx + nchan sharing one Redis. Loopback only; every run is bounded.
#
#   bench/replicas.sh [--binary PATH]      # default: builds the release binary as it ships
#                                           # (scripts/build-release.sh: static Swift runtime)
#
# Rows (medians of REPEATS runs, interleaved ours / nchan):
#   1. delivery delay p50/p99, publishes through replica A, N subscribers all on replica B,
#      against two nchan instances sharing one Redis (publish on one, subscribe on the other);
#   2. POST /register req/s through one replica with Redis, against nchan's publish with Redis;
#   3. GET /token req/s through one replica with Redis, against the same build alone;
#   4. time from Redis coming back to every subscriber on every replica having the change made
#      meanwhile (bench/redis_recovery.py);
#   5. rows 1-3 again with the replicas speaking TLS to Redis (rediss://, redis-server --tls-port,
#      a CA and a certificate for 127.0.0.1 made here with openssl), as ratios to plain Redis
#      (docs/replicas.md, "TLS to Redis"). TLS=0 leaves them out.
# Every measured run (each fan-out, each http_rps.sh call, the recovery runs) is wrapped in
# bench/cpuguard.py as bench/run.sh does: it waits up to WAIT_QUIET s for a quiet machine, and a run
# during which processes other than the client and the servers under test (the replicas, Redis,
# nginx) used more than MAX_FOREIGN CPUs is redone, up to TRIES tries, with the same servers; every
# try is logged to guard.jsonl. A run with no clean try is kept but marked disturbed (* in
# summary.md), and summary.md says how many runs were. Once the script passes BUDGET seconds it
# stops waiting and retrying.
# Env: REPEATS (3), N (10000), M (5), INTERVAL_MS (1000), DURATION (10s), CONNS (64), TLS (1),
#      TRIES (3), MAX_FOREIGN (0.10), WAIT_QUIET (30), BUDGET (1200).
# Needs: redis-server, nginx with libnginx-mod-nchan, wrk, gcc, make, python3 (bench/README.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
binary=""
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0;;
    *) echo "unknown argument $1" >&2; exit 64;;
  esac
done
REPEATS="${REPEATS:-3}" N="${N:-10000}" M="${M:-5}" INTERVAL_MS="${INTERVAL_MS:-1000}"
DURATION="${DURATION:-10s}" CONNS="${CONNS:-64}" TLS="${TLS:-1}"
TRIES="${TRIES:-3}" MAX_FOREIGN="${MAX_FOREIGN:-0.10}" WAIT_QUIET="${WAIT_QUIET:-30}" BUDGET="${BUDGET:-1200}"
if [[ -z "$binary" ]]; then
  # The binary that ships (docker/Dockerfile's flags, the Swift runtime linked statically), as
  # bench/run.sh and bench/scale.sh measure it: a dynamically linked build loads the runtime's
  # shared libraries and resolves its calls through the PLT, which is not what users run.
  binary="$("$root/scripts/build-release.sh" | tail -1)"
fi
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"

work="$(mktemp -d /tmp/forge-push-token-replicas-bench.XXXXXX)"
cp -r "${SHARED_BENCH:-$root/../shared/bench}" "$work/bench"
harness="$work/bench"
client="$(build_fanout_client)"
results="$root/bench/results/replicas-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$results"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for dir in run run-b; do RUN_DIR="$dir" "$harness/peers/nginx-nchan/stop.sh" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

redis_start() { # port
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  pids+=($!); echo $! >"$work/redis-$1.pid"; disown $!
  for _ in $(seq 1 100); do redis-cli -p "$1" PING >/dev/null 2>&1 && return 0; sleep 0.02; done
  echo "redis-server on $1 did not start" >&2; return 1
}
redis_stop() { kill -KILL "$(cat "$work/redis-$1.pid")" 2>/dev/null || true; }
tls_files() { # a CA and a certificate for 127.0.0.1 it signed, in $work/tls (never committed)
  mkdir -p "$work/tls" && cd "$work/tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca -keyout ca.key -out ca.pem 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout redis.key -out redis.csr 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >san.ext
  openssl x509 -req -in redis.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext \
      -out redis.pem 2>/dev/null
  cd - >/dev/null
}
redis_tls_start() { # tls port
  redis-server --port 0 --tls-port "$1" --bind 127.0.0.1 --save '' --appendonly no \
      --tls-cert-file "$work/tls/redis.pem" --tls-key-file "$work/tls/redis.key" \
      --tls-ca-cert-file "$work/tls/ca.pem" --tls-auth-clients no >/dev/null 2>&1 &
  pids+=($!); echo $! >"$work/redis-$1.pid"; disown $!
  for _ in $(seq 1 100); do
    redis-cli --tls --cacert "$work/tls/ca.pem" -p "$1" PING >/dev/null 2>&1 && return 0; sleep 0.02
  done
  echo "redis-server with TLS on $1 did not start" >&2; return 1
}
ours_start() { # port [redis port [tls]]
  local args=(--port "$1" --access-log off --max-subscribers $((N + 100)))
  if [[ -n "${3:-}" ]]; then
    args+=(--redis-url "rediss://127.0.0.1:$2/0" --redis-tls-ca-file "$work/tls/ca.pem")
  elif [[ -n "${2:-}" ]]; then
    args+=(--redis-url "redis://127.0.0.1:$2/0")
  fi
  "$binary" "${args[@]}" 2>>"$results/server.log" &
  pids+=($!); echo $! >"$work/ours-$1.pid"; disown $!
  for _ in $(seq 1 200); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/healthz")" == 200 ]] && return 0
    sleep 0.02
  done
  echo "server on $1 did not become healthy" >&2; return 1
}
ours_stop() { kill -TERM "$(cat "$work/ours-$1.pid")" 2>/dev/null || true; sleep 0.3; }

# guarded LABEL "PID..." JSON -- command...: runs the command under cpuguard.py, whose foreign CPU
# leaves out the command's own processes and the servers PID... (with their children: nginx's
# workers); redoes it while other processes were busy (retry_while_disturbed, bench/lib.sh). Each
# try starts without JSON (the command's results file) and writes its output to $work/out, so that
# only the kept try's remain.
guarded() {
  local label="$1" pids="$2" json="$3"
  shift 4
  retry_while_disturbed "$label" guarded_try "$pids" "$json" "$@"
}
guarded_try() { # TRY_LABEL WAIT_QUIET "PID..." JSON command...
  local try_label="$1" wait_quiet="$2" json="$4" pid args=()
  for pid in $3; do args+=(--pid "$pid"); done
  shift 4
  [[ -z "$json" ]] || rm -f "$json"
  python3 "$root/bench/cpuguard.py" --label "$try_label" --log "$results/guard.jsonl" "${args[@]}" \
    --max-foreign "$MAX_FOREIGN" --wait-quiet "$wait_quiet" -- "$@" >"$work/out" 2>&1
}
pids() { # pid files...: their pids on one line, separated by spaces
  local file; for file; do printf '%s ' "$(cat "$file")"; done
}
# keep TMP DEST: appends the kept try's JSON lines to DEST, each with "disturbed" from the last guarded.
keep() {
  [[ -s "$1" ]] || return 0
  python3 - "$1" "$2" "$DISTURBED" <<'PY'
import json, sys
src, dest, disturbed = sys.argv[1:4]
with open(src) as f, open(dest, "a") as out:
    for line in f:
        if line.strip().startswith("{"):
            record = json.loads(line)
            record["disturbed"] = disturbed == "1"
            out.write(json.dumps(record) + "\n")
PY
  rm -f "$1"
}
fanout() { # label "server PIDs" (the first: the subscribers' server, for RSS) publish-url subscribe-url
  guarded "r$run $1" "$2" "$work/fanout.json" -- "$client" --label "$1" \
      --pid "${2%% *}" --publish-url "$3" --url "$4" -n "$N" -m "$M" --interval-ms "$INTERVAL_MS" \
      --json "$work/fanout.json" || true
  cat "$work/out" >>"$results/fanout.txt"
  keep "$work/fanout.json" "$results/fanout.jsonl"
}
rps() { # label "server PIDs" url mode
  guarded "r$run $1 $4" "$2" "$work/rps.json" -- "$harness/http_rps.sh" --url "$3" --mode "$4" -c "$CONNS" \
      -d "$DURATION" --label "$1" --json-out "$work/rps.json" || true
  tee -a "$results/rps.txt" <"$work/out"
  keep "$work/rps.json" "$results/rps.jsonl"
}

echo "results in $results"
[[ "$TLS" == 1 ]] && tls_files
for run in $(seq 1 "$REPEATS"); do
  # 1. A -> B delivery, ours.
  rp=$(free_port); redis_start "$rp"
  a=$(free_port); b=$(free_port); ours_start "$a" "$rp"; ours_start "$b" "$rp"
  servers="$(pids "$work/ours-$b.pid" "$work/ours-$a.pid" "$work/redis-$rp.pid")"
  fanout "ours A->B" "$servers" "http://127.0.0.1:$a" "http://127.0.0.1:$b"
  # 2. POST /register through A (Redis), 3. GET /token through A (Redis).
  rps "ours+redis" "$servers" "http://127.0.0.1:$a" both
  ours_stop "$a"; ours_stop "$b"; redis_stop "$rp"
  # 5. The same over TLS to Redis, right after the plain run.
  if [[ "$TLS" == 1 ]]; then
    rp=$(free_port); redis_tls_start "$rp"
    a=$(free_port); b=$(free_port); ours_start "$a" "$rp" tls; ours_start "$b" "$rp" tls
    servers="$(pids "$work/ours-$b.pid" "$work/ours-$a.pid" "$work/redis-$rp.pid")"
    fanout "ours A->B tls" "$servers" "http://127.0.0.1:$a" "http://127.0.0.1:$b"
    rps "ours+redis tls" "$servers" "http://127.0.0.1:$a" both
    ours_stop "$a"; ours_stop "$b"; redis_stop "$rp"
  fi
  # 3. GET /token alone (same build, no Redis).
  a=$(free_port); ours_start "$a"
  rps "ours alone" "$(cat "$work/ours-$a.pid")" "http://127.0.0.1:$a" get
  ours_stop "$a"
  # 1 and 2, nchan: two instances sharing one Redis.
  rp=$(free_port); redis_start "$rp"
  a=$(free_port); b=$(free_port)
  REDIS_URL="redis://127.0.0.1:$rp" PORT="$a" "$harness/peers/nginx-nchan/start.sh" >/dev/null
  REDIS_URL="redis://127.0.0.1:$rp" PORT="$b" RUN_DIR=run-b "$harness/peers/nginx-nchan/start.sh" >/dev/null
  servers="$(pids "$harness/peers/nginx-nchan/run-b/nginx.pid" "$harness/peers/nginx-nchan/run/nginx.pid" \
      "$work/redis-$rp.pid")"
  fanout "nchan A->B" "$servers" "http://127.0.0.1:$a" "http://127.0.0.1:$b"
  rps "nchan+redis" "$servers" "http://127.0.0.1:$a" post
  "$harness/peers/nginx-nchan/stop.sh" >/dev/null; RUN_DIR=run-b "$harness/peers/nginx-nchan/stop.sh" >/dev/null
  redis_stop "$rp"
done
# 4. Recovery (redis_recovery.py starts its own Redis and replicas: the command's own processes).
recovery_rc=0
guarded recovery "" "" -- python3 "$root/bench/redis_recovery.py" --server "$binary" --runs "$REPEATS" \
    || recovery_rc=$?
cat "$work/out"
grep '^{' "$work/out" >"$work/recovery.json" || true
keep "$work/recovery.json" "$results/recovery.jsonl"

python3 - "$results" <<'PY'
import json, statistics, sys
folder = sys.argv[1]
def lines(name):
    try:
        return [json.loads(l) for l in open(f"{folder}/{name}") if l.strip().startswith("{")]
    except FileNotFoundError:
        return []
def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")
fan = lines("fanout.jsonl")
rps = lines("rps.jsonl")
rec = [r for r in lines("recovery.jsonl") if "seconds" in r]
def star(runs):  # a median with a run that cpuguard saw disturbed on every try
    return "*" if any(r.get("disturbed") for r in runs) else ""
def fan_row(label):
    runs = [r for r in fan if r["label"] == label]
    return (med([r["all"]["read_p50_ms"] for r in runs]), med([r["all"]["read_p99_ms"] for r in runs]),
            f"{sum(r['missed'] for r in runs)} missed{star(runs)}", len(runs))
def rps_med(label, mode):
    runs = [r for r in rps if r["label"] == label and r["mode"] == mode]
    return med([r["rps"] for r in runs]), star(runs)
o50, o99, omiss, on = fan_row("ours A->B")
n50, n99, nmiss, nn = fan_row("nchan A->B")
(post_o, spo), (post_n, spn) = rps_med("ours+redis", "post"), rps_med("nchan+redis", "post")
(get_r, sgr), (get_a, sga) = rps_med("ours+redis", "get"), rps_med("ours alone", "get")
recovery, srec = med([r["seconds"] for r in rec]), star(rec)
t50, t99, tmiss, tn = fan_row("ours A->B tls")
(post_t, spt), (get_t, sgt) = rps_med("ours+redis tls", "post"), rps_med("ours+redis tls", "get")
out = [
    "| measurement | ours | peer | ratio | target |",
    "|---|---|---|---|---|",
    f"| delivery A→B, {fan[0]['n'] if fan else '?'} subscribers on B, p50 / p99 (ms), missed | {o50:.0f} / {o99:.0f}, {omiss} | nchan A→B: {n50:.0f} / {n99:.0f}, {nmiss} | p99 {o99 / n99:.2f}x | p99 ≤ 0.8x, 0 missed |",
    f"| POST /register req/s, one replica with Redis | {post_o:.0f}{spo} | nchan publish with Redis: {post_n:.0f}{spn} | {post_o / post_n:.2f}x | ≥ 1x |",
    f"| GET /token req/s with Redis | {get_r:.0f}{sgr} | same build alone: {get_a:.0f}{sga} | {get_r / get_a:.2f}x | ≥ 0.95x |",
    f"| Redis back → every subscriber on 3 replicas has the change (s) | {recovery:.3f}{srec} | | | < 1 s |",
]
if tn:
    out += [
        f"| TLS to Redis: delivery A→B p50 / p99 (ms), missed | {t50:.0f} / {t99:.0f}, {tmiss} | plain Redis: {o50:.0f} / {o99:.0f} | p99 {t99 / o99:.2f}x | p99 ≤ 1.1x |",
        f"| TLS to Redis: POST /register req/s | {post_t:.0f}{spt} | plain Redis: {post_o:.0f}{spo} | {post_t / post_o:.2f}x | ≥ 0.8x |",
        f"| TLS to Redis: GET /token req/s | {get_t:.0f}{sgt} | plain Redis: {get_r:.0f}{sgr} | {get_t / get_r:.2f}x | ≥ 0.95x |",
    ]
# cpuguard: a run is one guarded measurement ("<label>#<try>" in guard.jsonl); disturbed when no
# try of it was clean.
tries = lines("guard.jsonl")
runs = {}
for g in tries:
    runs.setdefault(g["label"].rsplit("#", 1)[0], []).append(g["clean"])
disturbed = [label for label, clean in runs.items() if not any(clean)]
kept = [g for g in tries if g["clean"]]
# A rejected try with steal over cpuguard.py's --max-steal (0.10, kept here) counts as stolen, any
# other as disturbed by other processes.
bad = [g for g in tries if not g["clean"]]
stolen = sum(1 for g in bad if g.get("steal_cpu", 0) > 0.10)
steals = [g.get("steal_cpu", 0) for g in tries] or [0]
out += ["", f"cpuguard: {len(disturbed)} of {len(runs)} runs disturbed ({len(tries)} tries, "
        f"{len(bad)} of them disturbed: {len(bad) - stolen} by other processes, {stolen} by hypervisor steal); "
        f"clean tries saw at most {max((g['foreign_cpu'] for g in kept), default=0):.2f} foreign CPUs and "
        f"{max((g.get('steal_cpu', 0) for g in kept), default=0):.2f} CPUs stolen; steal over all tries: "
        f"median {sorted(steals)[len(steals) // 2]:.2f}, at most {max(steals):.2f} CPUs."
        + (" * marks a median with a disturbed run: "
        + ", ".join(disturbed) + "." if disturbed else "")]
text = "\n".join(out)
print(text)
open(f"{folder}/summary.md", "w").write(text + "\n")
PY
(( recovery_rc == 0 )) || exit "$recovery_rc"
