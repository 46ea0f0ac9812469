# bench/lib.sh: what the bench scripts share; sourced by run.sh, scale.sh, replicas.sh,
# post_pairs.sh and instructions.sh, never run. Loopback only.

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# free_port: a free loopback TCP port (the one definition: e2e/e2e_support.py).
free_port() { python3 "$BENCH_DIR/../e2e/e2e_support.py" free-port; }

# seed_token URL: one random 64-hex token registered, so that GET /token answers
# {"token":"<64 hex>"} like the peers and every subscriber's first event carries a token.
seed_token() {
  curl -fsS -o /dev/null --max-time 2 -X POST --data "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
    "$1/register"
}

# build_fanout_client: builds bench/'s one fan-out client (bench/sse_fanout) and prints its path.
build_fanout_client() {
  make -s -C "$BENCH_DIR/sse_fanout" >/dev/null
  echo "$BENCH_DIR/sse_fanout/sse_fanout"
}

# retry_while_disturbed LABEL TRY [ARGS...]: cpuguard's redo loop. Calls `TRY TRY_LABEL WAIT_QUIET
# ARGS...` (one measured try: runs its command under bench/cpuguard.py with --label TRY_LABEL and
# --wait-quiet WAIT_QUIET, and returns cpuguard's status) up to TRIES times while cpuguard reports
# that other processes or the hypervisor took CPU (exit 75). Once the script has run BUDGET seconds
# (when BUDGET is set), one try and a wait of 1 s. Returns the status of the try kept (0 when every
# try was disturbed); sets DISTURBED=1 when no try was clean, else 0.
retry_while_disturbed() {
  local label="$1" try_function="$2" try rc=0 tries="$TRIES" wait_quiet="$WAIT_QUIET"
  shift 2
  if [[ -n "${BUDGET:-}" ]] && (( SECONDS > BUDGET )); then wait_quiet=1; tries=1; fi
  DISTURBED=1
  for try in $(seq 1 "$tries"); do
    rc=0
    "$try_function" "$label#$try" "$wait_quiet" "$@" || rc=$?
    if [[ $rc != 75 ]]; then DISTURBED=0; return "$rc"; fi
    if (( try < tries )); then echo "  (other processes or hypervisor steal took CPU during $label: redone)" >&2
    else echo "  (other processes or hypervisor steal took CPU during $label on every try: kept, marked disturbed)" >&2; fi
  done
  return 0
}
