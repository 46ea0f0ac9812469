#!/usr/bin/env bash
# bench/replicas.sh: the cross-replica figures (issue 11, docs/replicas.md), side by side in one
# run with nginx + nchan sharing one Redis. Loopback only; every run is bounded.
#
#   bench/replicas.sh [--binary PATH]      # default: builds the release binary
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
# Env: REPEATS (3), N (10000), M (5), INTERVAL_MS (1000), DURATION (10s), CONNS (64), TLS (1).
# Needs: redis-server, nginx with libnginx-mod-nchan, wrk, gcc, make, python3 (bench/README.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
binary=""
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2;;
    -h|--help) sed -n '2,19p' "$0"; exit 0;;
    *) echo "unknown argument $1" >&2; exit 64;;
  esac
done
REPEATS="${REPEATS:-3}" N="${N:-10000}" M="${M:-5}" INTERVAL_MS="${INTERVAL_MS:-1000}"
DURATION="${DURATION:-10s}" CONNS="${CONNS:-64}" TLS="${TLS:-1}"
if [[ -z "$binary" ]]; then
  (cd "$root" && swift build -c release --product forge-push-token-server -Xswiftc -warnings-as-errors >/dev/null)
  binary="$root/.build/release/forge-push-token-server"
fi
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"

work="$(mktemp -d /tmp/forge-push-token-replicas-bench.XXXXXX)"
cp -r "${SHARED_BENCH:-$root/../shared/bench}" "$work/bench"
harness="$work/bench"
make -s -C "$harness/sse_fanout" >/dev/null
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

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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
fanout() { # label pid publish-url subscribe-url
  "$harness/sse_fanout/sse_fanout" --label "$1" --pid "$2" --publish-url "$3" --url "$4" -n "$N" -m "$M" \
      --interval-ms "$INTERVAL_MS" --json "$results/fanout.jsonl.tmp" >>"$results/fanout.txt" 2>&1 || true
  cat "$results/fanout.jsonl.tmp" >>"$results/fanout.jsonl"; rm -f "$results/fanout.jsonl.tmp"
}

echo "results in $results"
[[ "$TLS" == 1 ]] && tls_files
for run in $(seq 1 "$REPEATS"); do
  # 1. A -> B delivery, ours.
  rp=$(free_port); redis_start "$rp"
  a=$(free_port); b=$(free_port); ours_start "$a" "$rp"; ours_start "$b" "$rp"
  fanout "ours A->B" "$(cat "$work/ours-$b.pid")" "http://127.0.0.1:$a" "http://127.0.0.1:$b"
  # 2. POST /register through A (Redis), 3. GET /token through A (Redis).
  "$harness/http_rps.sh" --url "http://127.0.0.1:$a" --mode both -c "$CONNS" -d "$DURATION" --label "ours+redis" \
      --json-out "$results/rps.jsonl" | tee -a "$results/rps.txt"
  ours_stop "$a"; ours_stop "$b"; redis_stop "$rp"
  # 5. The same over TLS to Redis, right after the plain run.
  if [[ "$TLS" == 1 ]]; then
    rp=$(free_port); redis_tls_start "$rp"
    a=$(free_port); b=$(free_port); ours_start "$a" "$rp" tls; ours_start "$b" "$rp" tls
    fanout "ours A->B tls" "$(cat "$work/ours-$b.pid")" "http://127.0.0.1:$a" "http://127.0.0.1:$b"
    "$harness/http_rps.sh" --url "http://127.0.0.1:$a" --mode both -c "$CONNS" -d "$DURATION" \
        --label "ours+redis tls" --json-out "$results/rps.jsonl" | tee -a "$results/rps.txt"
    ours_stop "$a"; ours_stop "$b"; redis_stop "$rp"
  fi
  # 3. GET /token alone (same build, no Redis).
  a=$(free_port); ours_start "$a"
  "$harness/http_rps.sh" --url "http://127.0.0.1:$a" --mode get -c "$CONNS" -d "$DURATION" --label "ours alone" \
      --json-out "$results/rps.jsonl" | tee -a "$results/rps.txt"
  ours_stop "$a"
  # 1 and 2, nchan: two instances sharing one Redis.
  rp=$(free_port); redis_start "$rp"
  a=$(free_port); b=$(free_port)
  REDIS_URL="redis://127.0.0.1:$rp" PORT="$a" "$harness/peers/nginx-nchan/start.sh" >/dev/null
  REDIS_URL="redis://127.0.0.1:$rp" PORT="$b" RUN_DIR=run-b "$harness/peers/nginx-nchan/start.sh" >/dev/null
  fanout "nchan A->B" "$(cat "$harness/peers/nginx-nchan/run-b/nginx.pid")" "http://127.0.0.1:$a" "http://127.0.0.1:$b"
  "$harness/http_rps.sh" --url "http://127.0.0.1:$a" --mode post -c "$CONNS" -d "$DURATION" --label "nchan+redis" \
      --json-out "$results/rps.jsonl" | tee -a "$results/rps.txt"
  "$harness/peers/nginx-nchan/stop.sh" >/dev/null; RUN_DIR=run-b "$harness/peers/nginx-nchan/stop.sh" >/dev/null
  redis_stop "$rp"
done
# 4. Recovery.
python3 "$root/bench/redis_recovery.py" --server "$binary" --runs "$REPEATS" | tee "$results/recovery.jsonl"

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
def fan_row(label):
    runs = [r for r in fan if r["label"] == label]
    return (med([r["all"]["read_p50_ms"] for r in runs]), med([r["all"]["read_p99_ms"] for r in runs]),
            sum(r["missed"] for r in runs), len(runs))
def rps_med(label, mode):
    return med([r["rps"] for r in rps if r["label"] == label and r["mode"] == mode])
o50, o99, omiss, on = fan_row("ours A->B")
n50, n99, nmiss, nn = fan_row("nchan A->B")
post_o, post_n = rps_med("ours+redis", "post"), rps_med("nchan+redis", "post")
get_r, get_a = rps_med("ours+redis", "get"), rps_med("ours alone", "get")
recovery = med([r["seconds"] for r in rec])
t50, t99, tmiss, tn = fan_row("ours A->B tls")
post_t, get_t = rps_med("ours+redis tls", "post"), rps_med("ours+redis tls", "get")
out = [
    "| measurement | ours | peer | ratio | target |",
    "|---|---|---|---|---|",
    f"| delivery A→B, {fan[0]['n'] if fan else '?'} subscribers on B, p50 / p99 (ms), missed | {o50:.0f} / {o99:.0f}, {omiss} missed | nchan A→B: {n50:.0f} / {n99:.0f}, {nmiss} missed | p99 {o99 / n99:.2f}x | p99 ≤ 0.8x, 0 missed |",
    f"| POST /register req/s, one replica with Redis | {post_o:.0f} | nchan publish with Redis: {post_n:.0f} | {post_o / post_n:.2f}x | ≥ 1x |",
    f"| GET /token req/s with Redis | {get_r:.0f} | same build alone: {get_a:.0f} | {get_r / get_a:.2f}x | ≥ 0.95x |",
    f"| Redis back → every subscriber on 3 replicas has the change (s) | {recovery:.3f} | | | < 1 s |",
]
if tn:
    out += [
        f"| TLS to Redis: delivery A→B p50 / p99 (ms), missed | {t50:.0f} / {t99:.0f}, {tmiss} missed | plain Redis: {o50:.0f} / {o99:.0f} | p99 {t99 / o99:.2f}x | p99 ≤ 1.1x |",
        f"| TLS to Redis: POST /register req/s | {post_t:.0f} | plain Redis: {post_o:.0f} | {post_t / post_o:.2f}x | ≥ 0.8x |",
        f"| TLS to Redis: GET /token req/s | {get_t:.0f} | plain Redis: {get_r:.0f} | {get_t / get_r:.2f}x | ≥ 0.95x |",
    ]
text = "\n".join(out)
print(text)
open(f"{folder}/summary.md", "w").write(text + "\n")
PY
