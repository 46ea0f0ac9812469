#!/usr/bin/env bash
# bench/scale.sh: how many subscribers one machine holds across replicas, and how fast one write
# reaches all of them (issue 32 §3). Loopback only; every run is bounded.
#
#   bench/scale.sh [--binary PATH]      # default: builds the release binary
#
# Each repeat, alternated ours / floor, each on fresh servers:
#   ours:  REPLICAS (3) replicas of the server sharing one Redis (--redis-url), N subscribers spread evenly
#          over them by ceil(N / PER_PROCESS) client processes (the file limit is 20,000 per
#          process), one publisher POSTing M tokens to replica A, INTERVAL_MS apart;
#   floor: the C fan-out peer (../shared/bench/peers/fanout-c, copied; epoll and one write per
#          subscriber, no HTTP parsing) run as REPLICAS processes with the same subscribers each, as many
#          threads each as a replica of ours; every publish is POSTed to all of them (they share
#          nothing), the publish time taken before the first POST.
# bench/scale/measure.py runs one measurement: the token carries its publish time (CLOCK_REALTIME
# ns), and every client process (bench/sse_fanout/sse_fanout --listen-only, the one fan-out client
# of bench/) measures each delivery from it, on the one clock. Reported, medians of REPEATS:
# p50/p99/max delay over all deliveries (client read, and kernel receive time), missed (must be 0),
# RSS per subscriber per replica, the time to connect everyone, Redis's CPU seconds; the target is
# ours' p99 at most 1.3x the floor's.
# Every measurement is wrapped in bench/cpuguard.py (a copy of ../shared/bench/cpuguard.py: foreign
# CPU and hypervisor steal) with the servers and Redis as its own processes: a run during which
# other processes used more than MAX_FOREIGN CPUs, or the hypervisor stole more than 0.10 CPUs, is
# redone with fresh servers, up to TRIES tries; every try is logged to guard.jsonl, and summary.md
# says how many runs were disturbed and by what, with the steal seen.
# A full run (N=50000) needs a quiet machine: about 2 x REPEATS x (connect + M x INTERVAL_MS).
# COUNTS="1000 10000 50000" runs the whole measurement at each count in turn (N is then unused),
# and summary.md has a table per count plus the chart of subscribers against p99 delay
# (scale.png / scale.svg, bench/charts.py --scale).
# Env: N (50000), COUNTS (N), REPLICAS (3), M (5), INTERVAL_MS (1000), REPEATS (3), PER_PROCESS (16000), THREADS
#      (as the server's default: nproc, at most 8), TRIES (3), MAX_FOREIGN (0.10), WAIT_QUIET (60).
# Needs: redis-server, gcc, make, python3, curl (bench/README.md).
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
N="${N:-50000}" M="${M:-5}" INTERVAL_MS="${INTERVAL_MS:-1000}" REPEATS="${REPEATS:-3}"
PER_PROCESS="${PER_PROCESS:-16000}" TRIES="${TRIES:-3}" MAX_FOREIGN="${MAX_FOREIGN:-0.10}"
REPLICAS="${REPLICAS:-3}"
[[ "$REPLICAS" =~ ^[1-9][0-9]*$ ]] || { echo "REPLICAS must be a positive whole number" >&2; exit 64; }
WAIT_QUIET="${WAIT_QUIET:-60}" COUNTS="${COUNTS:-$N}"
cores="$(nproc)"; THREADS="${THREADS:-$(( cores > 8 ? 8 : cores ))}"
if [[ -z "$binary" ]]; then
  binary="$("$root/scripts/build-release.sh" | tail -1)"
fi
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"

work="$(mktemp -d /tmp/forge-push-token-scale-bench.XXXXXX)"
cp -r "${SHARED_BENCH:-$root/../shared/bench}/peers/fanout-c" "$work/fanout-c"
make -s -C "$work/fanout-c" fanout_c >/dev/null
client="$(build_fanout_client)"
results="$root/bench/results/scale-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$results"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "settings: COUNTS=$COUNTS M=$M INTERVAL_MS=$INTERVAL_MS REPEATS=$REPEATS PER_PROCESS=$PER_PROCESS THREADS=$THREADS binary=$binary" \
  | tee "$results/settings.txt"

wait_http() { # url
  for _ in $(seq 1 300); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" == 200 ]] && return 0
    sleep 0.02
  done
  echo "$1 did not answer 200" >&2; return 1
}
started=()
stop_started() { local pid; for pid in "${started[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${started[@]}"; do for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true; done; started=(); }

# start_ours: Redis and REPLICAS replicas; sets URLS, PUBLISH, SERVER_PIDS, REDIS_PID.
start_ours() {
  local rp port i
  rp=$(free_port)
  redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --maxclients 1000 >/dev/null 2>&1 &
  REDIS_PID=$!; pids+=($!); started+=($!); disown $!
  for _ in $(seq 1 100); do redis-cli -p "$rp" PING >/dev/null 2>&1 && break; sleep 0.02; done
  URLS=(); SERVER_PIDS=()
  for i in $(seq 1 "$REPLICAS"); do
    port=$(free_port)
    "$binary" --port "$port" --access-log off --max-subscribers $((per_server + 100)) \
      --redis-url "redis://127.0.0.1:$rp/0" 2>>"$results/server.log" &
    SERVER_PIDS+=($!); pids+=($!); started+=($!); disown $!
    URLS+=("http://127.0.0.1:$port")
  done
  for url in "${URLS[@]}"; do wait_http "$url/healthz"; done
  PUBLISH=("${URLS[0]}")
  seed_token "${URLS[0]}"; sleep 0.3
}
# start_floor: REPLICAS fanout-c processes; sets URLS, PUBLISH (all of them), SERVER_PIDS; no Redis.
start_floor() {
  local port i
  URLS=(); SERVER_PIDS=(); REDIS_PID=""
  for i in $(seq 1 "$REPLICAS"); do
    port=$(free_port)
    "$work/fanout-c/fanout_c" --host 127.0.0.1 --port "$port" --threads "$THREADS" >>"$results/floor.log" 2>&1 &
    SERVER_PIDS+=($!); pids+=($!); started+=($!); disown $!
    URLS+=("http://127.0.0.1:$port")
  done
  for url in "${URLS[@]}"; do wait_http "$url/token"; seed_token "$url"; done
  PUBLISH=("${URLS[@]}")
}

# measure_try TRY_LABEL WAIT_QUIET LABEL: one try on fresh servers; returns cpuguard's status.
measure_try() {
  local try_label="$1" wait_quiet="$2" label="$3" rc=0 args=() pid url
  if [[ "$label" == ours ]]; then start_ours; else start_floor; fi
  for pid in "${SERVER_PIDS[@]}" $REDIS_PID; do args+=(--pid "$pid"); done
  local cmd=(python3 "$root/bench/scale/measure.py" --client "$client" -n "$N" -m "$M"
    --interval-ms "$INTERVAL_MS" --per-process "$PER_PROCESS" --label "$label" --json "$work/try.jsonl")
  for url in "${URLS[@]}"; do cmd+=(--url "$url"); done
  for url in "${PUBLISH[@]}"; do cmd+=(--publish-url "$url"); done
  for pid in "${SERVER_PIDS[@]}"; do cmd+=(--server-pid "$pid"); done
  [[ -n "$REDIS_PID" ]] && cmd+=(--redis-pid "$REDIS_PID")
  rm -f "$work/try.jsonl"
  python3 "$root/bench/cpuguard.py" --label "$try_label" --log "$results/guard.jsonl" "${args[@]}" \
    --max-foreign "$MAX_FOREIGN" --wait-quiet "$wait_quiet" -- "${cmd[@]}" || rc=$?
  stop_started
  return "$rc"
}

# measure LABEL: one guarded measurement on fresh servers, redone (fresh servers again) while
# cpuguard saw other processes or steal (exit 75); the kept try's line goes to scale.jsonl with
# "disturbed" when no try was clean.
measure() {
  local label="$1" rc=0
  retry_while_disturbed "$label-n$N-r$r" measure_try "$label" || rc=$?
  local disturbed=$DISTURBED
  [[ $rc == 0 || $rc == 75 ]] || echo "  ($label: measure.py exited $rc: not every subscriber was ready, or an event was missed)" >&2
  [[ -s "$work/try.jsonl" ]] && python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1]); r["disturbed"] = sys.argv[2] == "1"; r["repeat"] = int(sys.argv[3])
open(sys.argv[4], "a").write(json.dumps(r) + "\n")' "$work/try.jsonl" "$disturbed" "$r" "$results/scale.jsonl"
  return 0
}

for N in $COUNTS; do
  per_server=$(( (N + REPLICAS - 1) / REPLICAS ))
  for r in $(seq 1 "$REPEATS"); do
    echo "=== $N subscribers, repeat $r/$REPEATS"
    measure ours
    measure floor
  done
done

python3 - "$results" "$REPLICAS" <<'PY'
import json, os, statistics, sys
folder = sys.argv[1]
replicas = int(sys.argv[2])
def lines(name):
    path = os.path.join(folder, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
out = []
for n in sorted({r["n"] for r in lines("scale.jsonl")}):
    runs = [r for r in lines("scale.jsonl") if r["n"] == n]
    def med(label, key):
        values = [r[key] for r in runs if r["label"] == label and r.get(key) is not None]
        return statistics.median(values) if values else float("nan")
    def star(label):
        return "*" if any(r["disturbed"] for r in runs if r["label"] == label) else ""
    ours = [r for r in runs if r["label"] == "ours"]
    floor = [r for r in runs if r["label"] == "floor"]
    out += [f"# bench/scale.sh: {n} subscribers over {replicas} servers (medians of {len(ours)} runs each)", "",
            f"| figure | ours ({replicas} replicas, one Redis) | floor ({replicas} fanout-c processes) | ratio | target |",
            "|---|---|---|---|---|"]
    for key, name in (("read_p50_ms", "delay p50 (ms, client read)"), ("read_p99_ms", "delay p99 (ms, client read)"),
                      ("read_max_ms", "delay max (ms, client read)"), ("kern_p50_ms", "delay p50 (ms, kernel receive)"),
                      ("kern_p99_ms", "delay p99 (ms, kernel receive)")):
        o, f = med("ours", key), med("floor", key)
        target = "≤ 1.3x" if key == "read_p99_ms" else ""
        out.append(f"| {name} | {o:.2f}{star('ours')} | {f:.2f}{star('floor')} | {o / f:.2f}x | {target} |")
    out.append(f"| missed (all runs) | {sum(r['missed'] for r in ours)} | {sum(r['missed'] for r in floor)} | | 0 |")
    out.append(f"| time to connect everyone (s) | {med('ours', 'connect_s'):.2f} | {med('floor', 'connect_s'):.2f} | | |")
    per_replica = [statistics.median(r["rss_per_subscriber_kb"][i] for r in ours) for i in range(replicas)] if ours else []
    per_floor = [statistics.median(r["rss_per_subscriber_kb"][i] for r in floor) for i in range(replicas)] if floor else []
    out.append(f"| RSS per subscriber per server (kB) | {', '.join(f'{v:.2f}' for v in per_replica)} | "
               f"{', '.join(f'{v:.2f}' for v in per_floor)} | | |")
    out.append(f"| Redis CPU (s over the run; % of one CPU) | {med('ours', 'redis_cpu_s'):.2f} "
               f"({med('ours', 'redis_cpu_percent'):.1f} %) | – | | |")
    out.append("")
tries = lines("guard.jsonl")
groups = {}
for g in tries:
    groups.setdefault(g["label"].rsplit("#", 1)[0], []).append(g["clean"])
disturbed = [label for label, clean in groups.items() if not any(clean)]
bad = [g for g in tries if not g["clean"]]
stolen = sum(1 for g in bad if g.get("steal_cpu", 0) > 0.10)
steals = sorted(g.get("steal_cpu", 0) for g in tries) or [0]
kept = [g for g in tries if g["clean"]]
out += [f"cpuguard: {len(disturbed)} of {len(groups)} runs disturbed ({len(tries)} tries, {len(bad)} of them "
        f"disturbed: {len(bad) - stolen} by other processes, {stolen} by hypervisor steal); clean tries saw at most "
        f"{max((g['foreign_cpu'] for g in kept), default=0):.2f} foreign CPUs and "
        f"{max((g.get('steal_cpu', 0) for g in kept), default=0):.2f} CPUs stolen; steal over all tries: median "
        f"{steals[len(steals) // 2]:.2f}, at most {steals[-1]:.2f} CPUs." + (" * marks a median with a disturbed run."
        if disturbed else "")]
text = "\n".join(out)
print(text)
open(os.path.join(folder, "summary.md"), "w").write(text + "\n")
PY
# Debian's python3-matplotlib is for /usr/bin/python3, which may not be the python3 on PATH.
for py in python3 /usr/bin/python3 ""; do
  [[ -z "$py" ]] && { echo "(no chart: bench/charts.py needs matplotlib, bench/README.md)" >&2; break; }
  if "$py" -c "import matplotlib" 2>/dev/null; then "$py" "$root/bench/charts.py" --scale "$results"; break; fi
done
echo "results: $results"
