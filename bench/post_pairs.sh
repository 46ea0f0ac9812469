#!/usr/bin/env bash
# bench/post_pairs.sh: POST /register against the C libmicrohttpd server in interleaved pairs,
# with the hypervisor's steal reported beside each ratio (issue 32, "writes that do not stall on
# a preempted lock").
#
#   bench/post_pairs.sh [--binary PATH] [--contended]
#
# PAIRS pairs of DURATION wrk runs (-t WRK_THREADS -c WRK_CONNS, bench/wrk/register.lua: a new
# 64-hex token per request), ours then the C server (../shared/bench/peers/mhd-c, copied; as many
# threads as ours), each run wrapped in bench/cpuguard.py, which measures the CPU other processes
# used and the CPU the hypervisor stole during it (/proc/stat). Both servers run for the whole
# bench; only one is loaded at a time.
#
# Quiet (default): a pair whose runs saw more than MAX_FOREIGN foreign CPUs or more than 0.10
# CPUs stolen is redone, up to TRIES times, and kept marked when no try was clean.
# --contended: LOAD busy loops (default: one per core) run beside both servers for the whole
# bench, so that request threads are preempted by the guest's scheduler while they hold whatever
# lock they hold, as a stolen vCPU preempts them on a busy host; no pair is redone, and each
# line shows the foreign CPU and the steal its runs saw.
#
# Prints one line per pair (ours, C, ratio, steal and foreign CPU of each run) and the median
# ratio; writes pairs.jsonl and summary.md to bench/results/post-pairs-<stamp>/.
# Env: PAIRS (5) DURATION (5s) WRK_THREADS (2) WRK_CONNS (64) TRIES (3) MAX_FOREIGN (0.10)
#      LOAD (nproc, with --contended) MHD_THREADS (as ours: nproc, at most 8) SHARED_BENCH
# Needs: wrk, gcc, make, libmicrohttpd-dev, python3, curl (bench/README.md). Loopback only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$here/lib.sh"
BINARY=""; CONTENDED=0
while (($#)); do
  case "$1" in
    --binary) BINARY="$2"; shift 2;;
    --contended) CONTENDED=1; shift;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
PAIRS="${PAIRS:-5}"; DURATION="${DURATION:-5s}"; WRK_THREADS="${WRK_THREADS:-2}"; WRK_CONNS="${WRK_CONNS:-64}"
TRIES="${TRIES:-3}"; MAX_FOREIGN="${MAX_FOREIGN:-0.10}"
cores="$(nproc)"; MHD_THREADS="${MHD_THREADS:-$(( cores > 8 ? 8 : cores ))}"; LOAD="${LOAD:-$cores}"
SHARED_BENCH="${SHARED_BENCH:-$repo/../shared/bench}"
for tool in wrk gcc make python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool not found (bench/README.md)" >&2; exit 1; }
done
if [[ -z "$BINARY" ]]; then BINARY="$("$repo/scripts/build-release.sh" | tail -1)"; fi
[[ -x "$BINARY" ]] || { echo "no server binary at $BINARY" >&2; exit 1; }

out="$here/results/post-pairs-$(date -u +%Y%m%dT%H%M%SZ)"
work="$(mktemp -d "${TMPDIR:-/tmp}/forge-post-pairs.XXXXXX")"
mkdir -p "$out"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  [[ -d "$work/shared-bench" ]] && "$work/shared-bench/peers/mhd-c/stop.sh" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

cp -r "$SHARED_BENCH" "$work/shared-bench"; chmod -R u+w "$work/shared-bench"
c_port=$(free_port)
PORT="$c_port" THREADS="$MHD_THREADS" "$work/shared-bench/peers/mhd-c/start.sh" >/dev/null
c_pid="$(cat "$work/shared-bench/peers/mhd-c/run/mhd_token.pid")"
our_port=$(free_port)
"$BINARY" --host 127.0.0.1 --port "$our_port" --access-log off 2>"$work/server.log" </dev/null &
our_pid=$!; pids+=("$our_pid")
for _ in $(seq 1 100); do grep -q "listening on" "$work/server.log" 2>/dev/null && break; sleep 0.05; done
ours="http://127.0.0.1:$our_port"; theirs="http://127.0.0.1:$c_port"
seed_token "$ours"; seed_token "$theirs"

max_foreign="$MAX_FOREIGN"; max_steal=0.10; tries="$TRIES"
if [[ "$CONTENDED" == 1 ]]; then
  for _ in $(seq 1 "$LOAD"); do (while :; do :; done) & pids+=($!); done
  max_foreign=1000; max_steal=1000; tries=1
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  kernel: $(uname -r)  cpus: $cores"
  echo "server: $BINARY  C server threads: $MHD_THREADS"
  echo "settings: PAIRS=$PAIRS DURATION=$DURATION WRK_THREADS=$WRK_THREADS WRK_CONNS=$WRK_CONNS contended=$CONTENDED LOAD=$([[ $CONTENDED == 1 ]] && echo "$LOAD" || echo 0)"
} | tee "$out/settings.txt"

# run LABEL PID URL: one guarded wrk run; prints "rps steal foreign clean".
run() {
  local label="$1" pid="$2" url="$3" try rc
  for try in $(seq 1 "$tries"); do
    rc=0
    python3 "$here/cpuguard.py" --label "$label#$try" --log "$work/guard.jsonl" --pid "$pid" \
      --max-foreign "$max_foreign" --max-steal "$max_steal" --wait-quiet "$([[ $CONTENDED == 1 ]] && echo 1 || echo 30)" -- \
      wrk -t "$WRK_THREADS" -c "$WRK_CONNS" -d "$DURATION" -s "$here/wrk/register.lua" "$url" -- /register \
      >"$work/wrk.out" || rc=$?
    [[ $rc == 75 && $try -lt $tries ]] && continue
    python3 - "$work/wrk.out" "$work/guard.jsonl" "$rc" <<'PY'
import json, sys
line = next((l for l in open(sys.argv[1]) if l.startswith("WRK_JSON ")), None)
rps = json.loads(line[len("WRK_JSON "):])["rps"] if line else 0
guard = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print(rps, guard.get("steal_cpu", 0), guard.get("foreign_cpu", 0), int(sys.argv[3]) != 75)
PY
    return 0
  done
}

for p in $(seq 1 "$PAIRS"); do
  read -r o_rps o_steal o_foreign o_clean < <(run "ours-$p" "$our_pid" "$ours")
  read -r c_rps c_steal c_foreign c_clean < <(run "c-$p" "$c_pid" "$theirs")
  python3 - "$p" "$o_rps" "$o_steal" "$o_foreign" "$o_clean" "$c_rps" "$c_steal" "$c_foreign" "$c_clean" "$CONTENDED" \
    "$out/pairs.jsonl" <<'PY'
import json, sys
p, o, os_, of, oc, c, cs, cf, cc, contended, dest = sys.argv[1:12]
r = dict(pair=int(p), ours_rps=float(o), ours_steal=float(os_), ours_foreign=float(of), ours_clean=oc == "True",
         c_rps=float(c), c_steal=float(cs), c_foreign=float(cf), c_clean=cc == "True", contended=contended == "1")
r["ratio"] = r["ours_rps"] / r["c_rps"] if r["c_rps"] else 0
print(f"pair {p}: ours {r['ours_rps']:>9,.0f} req/s (steal {r['ours_steal']:.2f}, foreign {r['ours_foreign']:.2f} CPUs)"
      f"   C {r['c_rps']:>9,.0f} req/s (steal {r['c_steal']:.2f}, foreign {r['c_foreign']:.2f})   ratio {r['ratio']:.2f}"
      + ("" if r["contended"] or (r["ours_clean"] and r["c_clean"]) else "   (disturbed)"))
open(dest, "a").write(json.dumps(r) + "\n")
PY
done
python3 - "$out/pairs.jsonl" "$out/summary.md" "$CONTENDED" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
contended = sys.argv[3] == "1"
lines = [f"# bench/post_pairs.sh: POST /register, ours against the C libmicrohttpd server, "
         f"{'contended (busy loops beside both)' if contended else 'quiet'}", "",
         "| pair | ours req/s | steal, foreign (CPUs) | C req/s | steal, foreign (CPUs) | ratio |", "|---|---|---|---|---|---|"]
for r in rows:
    mark = "" if contended or (r["ours_clean"] and r["c_clean"]) else " (disturbed)"
    lines.append(f"| {r['pair']} | {r['ours_rps']:,.0f} | {r['ours_steal']:.2f}, {r['ours_foreign']:.2f} | "
                 f"{r['c_rps']:,.0f} | {r['c_steal']:.2f}, {r['c_foreign']:.2f} | {r['ratio']:.2f}{mark} |")
ratios = [r["ratio"] for r in rows]
steals = [max(r["ours_steal"], r["c_steal"]) for r in rows]
disturbed = sum(1 for r in rows if not (r["ours_clean"] and r["c_clean"]))
lines += ["", f"median ratio {statistics.median(ratios):.2f} (lowest {min(ratios):.2f}); steal per run: median "
          f"{statistics.median(steals):.2f}, at most {max(steals):.2f} CPUs"
          + ("" if contended else f"; {disturbed} of {len(rows)} pairs disturbed (foreign CPU or steal over the bounds)")]
text = "\n".join(lines)
print(text)
open(sys.argv[2], "w").write(text + "\n")
PY
echo "results: $out"
