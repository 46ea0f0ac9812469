#!/usr/bin/env bash
# bench/instructions.sh: user-space instructions per GET /token, per POST /register and per
# delivered event, counted by valgrind's callgrind: a figure hypervisor steal and other processes
# cannot move, for comparing two builds (before/after a change) side by side in one run.
#
#   bench/instructions.sh [--binary PATH] [--before PATH]   # default: builds the release binary
#
# Each figure is measured on a fresh server under callgrind (loopback only, bounded):
#   GET:      cached `GET /token` on one keep-alive connection; instructions of 5N requests minus
#             those of N, over 4N (start-up and shutdown cancel out);
#   POST:     `POST /register` with a new 64-hex token each, the same way;
#   delivery: S subscribers (bench/sse_fanout) and M changes; instrumentation is switched on
#             once every subscriber is connected (callgrind_control) and off when the client has
#             read every event and left, so the figure is everything the server ran for the
#             changes, their deliveries and the subscribers' departure, over S x M.
# The counts include libmicrohttpd's and libc's user-space work, not the kernel's. A `rep stos`
# (memset) counts one instruction per byte, which inflates libmicrohttpd's pool resets.
# Env: N (1000), S (2000), M (20).
# Needs: valgrind, python3, curl, gcc, make (bench/README.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
binary="" before=""
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2;;
    --before) before="$2"; shift 2;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0;;
    *) echo "unknown argument $1" >&2; exit 64;;
  esac
done
N="${N:-1000}" S="${S:-2000}" M="${M:-20}"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install -y valgrind)" >&2; exit 69; }
if [[ -z "$binary" ]]; then
  binary="$("$root/scripts/build-release.sh" | tail -1)"
fi
client="$(build_fanout_client)"
work="$(mktemp -d /tmp/forge-push-token-instructions.XXXXXX)"
server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill -KILL "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# start BINARY OUT [VALGRIND ARGS...]: the server under callgrind on a free port; sets PORT, server_pid.
start() {
  local bin="$1" out="$2"; shift 2
  PORT=$(free_port)
  valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$out" "$@" \
    "$bin" --host 127.0.0.1 --port "$PORT" --access-log off --max-subscribers $((S + 100)) \
    >/dev/null 2>"$work/valgrind.log" &
  server_pid=$!
  for _ in $(seq 1 300); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/livez" && return 0
    sleep 0.1
  done
  echo "the server under valgrind did not answer; $work/valgrind.log:" >&2; tail -5 "$work/valgrind.log" >&2; exit 1
}
stop() { kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""; }
total() { # a callgrind file's "totals:" line (its "summary:" says 0 when instrumentation began off)
  awk '/^totals:/ {print $2; exit}' "$1"
}

# requests KIND COUNT: COUNT keep-alive requests of KIND (get, post) on one connection.
requests() {
  python3 - "$PORT" "$1" "$2" <<'PY'
import secrets, socket, sys
port, kind, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
for _ in range(n):
    if kind == "get":
        s.sendall(b"GET /token HTTP/1.1\r\nHost: x\r\n\r\n")
    else:
        s.sendall(b"POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 64\r\n\r\n"
                  + secrets.token_hex(32).encode())
    status, length = f.readline(), 0
    if not status.startswith(b"HTTP/1.1 200"):
        sys.exit("%s answered %r" % (kind, status))
    while True:
        line = f.readline()
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
        if line in (b"\r\n", b""):
            break
    f.read(length)
PY
}

# per_request BINARY KIND: instructions per request of KIND.
per_request() {
  local bin="$1" kind="$2" count out a b
  for count in "$N" $((5 * N)); do
    out="$work/$kind.$count.cg"
    start "$bin" "$out"
    curl -fsS -o /dev/null -X POST --data "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
      "http://127.0.0.1:$PORT/register"
    requests "$kind" "$count"
    stop
  done
  a=$(total "$work/$kind.$N.cg"); b=$(total "$work/$kind.$((5 * N)).cg")
  echo $(( (b - a) / (4 * N) ))
}

# per_delivery BINARY: instructions per delivered event.
per_delivery() {
  local bin="$1" out="$work/delivery.cg"
  start "$bin" "$out" --instr-atstart=no
  "$client" --url "http://127.0.0.1:$PORT" -n "$S" -m "$M" --interval-ms 300 --seed \
    --drain-timeout 5 --ready-timeout 120 >"$work/fanout.out" 2>&1 &
  local client=$!
  for _ in $(seq 1 1200); do grep -q "connect phase" "$work/fanout.out" && break; sleep 0.1; done
  callgrind_control -i on "$server_pid" >/dev/null 2>&1
  wait "$client" || { echo "sse_fanout failed:" >&2; tail -5 "$work/fanout.out" >&2; exit 1; }
  callgrind_control -i off "$server_pid" >/dev/null 2>&1
  stop
  grep -q "missed events 0 " "$work/fanout.out" || { echo "events were missed:" >&2; tail -3 "$work/fanout.out" >&2; exit 1; }
  echo $(( $(total "$out") / (S * M) ))
}

builds=("$binary"); [[ -n "$before" ]] && builds=("$before" "$binary")
echo "callgrind, user space: N=$N requests (by difference of N and 5N), S=$S subscribers x M=$M changes"
printf '| %-40s | %12s | %12s | %14s |\n' build "per GET" "per POST" "per delivery"
printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..42})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..16})"
for bin in "${builds[@]}"; do
  get=$(per_request "$bin" get); post=$(per_request "$bin" post); delivery=$(per_delivery "$bin")
  printf '| %-40s | %12s | %12s | %14s |\n' "$bin" "$get" "$post" "$delivery"
done
