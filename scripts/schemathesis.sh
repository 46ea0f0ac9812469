#!/usr/bin/env bash
# Property-based API tests of a forge-push-token-server binary against openapi.yaml, with
# Schemathesis (https://schemathesis.readthedocs.io).
#
#   scripts/schemathesis.sh --server PATH [--max-examples N] [-- EXTRA_SCHEMATHESIS_ARGS...]
#
# - Installs Schemathesis (pinned below) into a venv under
#   ${XDG_CACHE_HOME:-~/.cache}/forge-push-token/schemathesis-venv, reused while its version
#   matches the pin. Needs python3 (3.9+) with venv, and PyPI the first time.
# - Starts SERVER on a free loopback port with a temporary state file and runs Schemathesis
#   against it: once plain, then, when `SERVER --help` mentions --auth-token, once more with a
#   random --auth-token (and --auth-scope all when the binary has it), Schemathesis sending
#   `Authorization: Bearer <token>` and also checking that the protected operations refuse
#   requests without it or with a wrong one (check ignored_auth). And, when the binary has
#   --read-token-file, once with a write-token file and a read-token file: every operation with the
#   write token, with the read token (writes must answer 403 insufficient_scope) and, through
#   ignored_auth, with none.
# - Every operation of openapi.yaml is tested except `GET /token/stream` (a stream never ends;
#   `HEAD /token/stream` is tested instead), with at most N generated test cases per operation and
#   phase (default 50), and the checks listed in CHECKS below.
# - Prints Schemathesis's report (with the number of test cases tried) and a summary line per run;
#   exits 0 only when every run passed.
#
# EXTRA_SCHEMATHESIS_ARGS go to every `schemathesis run`, for example `--seed 1` or
# `--exclude-method OPTIONS` (for an older binary without OPTIONS).
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5

usage() {
    echo "usage: $0 --server PATH [--max-examples N] [-- EXTRA_SCHEMATHESIS_ARGS...]" >&2
    exit 64
}

server=""
max_examples=50
extra=()
while (($#)); do
    case "$1" in
        --server) (($# >= 2)) || usage; server=$2; shift 2 ;;
        --server=*) server=${1#*=}; shift ;;
        --max-examples) (($# >= 2)) || usage; max_examples=$2; shift 2 ;;
        --max-examples=*) max_examples=${1#*=}; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "$0: unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n $server ]] || usage
[[ $max_examples =~ ^[1-9][0-9]*$ ]] || { echo "$0: --max-examples needs a positive integer" >&2; exit 64; }
[[ -x $server ]] || { echo "$0: $server is not an executable file" >&2; exit 64; }
server=$(cd "$(dirname "$server")" && pwd)/$(basename "$server")

root=$(cd "$(dirname "$0")/.." && pwd)
spec=$root/openapi.yaml
[[ -f $spec ]] || { echo "$0: $spec is missing" >&2; exit 1; }

# The checks that apply to this API (schemathesis run --help lists them all). Left out:
# use_after_free, ensure_resource_availability (stateful; this API has no resources to create or
# delete), object_level_authorization (one identity only), and ignored_auth, which the
# authenticated run adds.
CHECKS=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance
CHECKS+=,response_schema_conformance,negative_data_rejection,positive_data_acceptance
CHECKS+=,missing_required_header,unsupported_method,allow_header_conformance

# --- Schemathesis in its own venv -----------------------------------------------------------

venv=${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/schemathesis-venv
installed_version() {
    [[ -x $venv/bin/python ]] || return 0
    "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null || true
}
if [[ $(installed_version) != "$SCHEMATHESIS_VERSION" ]]; then
    echo "==> installing schemathesis $SCHEMATHESIS_VERSION into $venv"
    python=$(command -v python3 || true)
    [[ -n $python ]] || { echo "$0: python3 is needed" >&2; exit 1; }
    if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            apt-get install -y -qq python3-venv >/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
        else
            echo "$0: python3's venv module is missing (Debian: apt-get install python3-venv)" >&2; exit 1
        fi
    fi
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
    [[ $(installed_version) == "$SCHEMATHESIS_VERSION" ]] || { echo "$0: schemathesis $SCHEMATHESIS_VERSION did not install" >&2; exit 1; }
fi
st=$venv/bin/schemathesis

# --- The server ------------------------------------------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/forge-push-token-schemathesis.XXXXXX")
server_pid=""
stop_server() {
    if [[ -n $server_pid ]]; then
        kill -TERM "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap 'stop_server; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

server_help=$("$server" --help 2>&1 || true)
has_flag() { grep -q -- "$1" <<<"$server_help"; }

# Starts the server with extra flags "$@"; sets server_pid, server_url and server_log.
start_server() {
    local name=$1; shift
    server_log=$work/server-$name.log
    local flags=(--host 127.0.0.1 --port 0 --access-log on)
    has_flag --state-file && flags+=(--state-file "$work/state-$name.json")
    # The caller's FORGE_PUSH_TOKEN_* variables would configure the server too: drop them.
    local unset_vars=()
    while IFS= read -r variable; do unset_vars+=(-u "$variable"); done < <(compgen -e | grep '^FORGE_PUSH_TOKEN_' || true)
    env "${unset_vars[@]}" "$server" "${flags[@]}" "$@" 2>"$server_log" &
    server_pid=$!
    local address=""
    for _ in $(seq 100); do
        address=$(grep -o 'listening on http://[^ ]*' "$server_log" | head -n 1 | sed 's/^listening on //' || true)
        [[ -n $address ]] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z $address ]]; then
        echo "$0: the server did not start; its log:" >&2
        cat "$server_log" >&2
        exit 1
    fi
    server_url=$address
    echo "==> $name: $server ${flags[*]} $* (at $server_url)"
}

# --- The runs --------------------------------------------------------------------------------

summaries=()
failed=0

# run NAME SPEC [SCHEMATHESIS_ARGS...]: one Schemathesis run against the running server.
run() {
    local name=$1 schema=$2; shift 2
    local log=$work/schemathesis-$name.log
    local args=(run "$schema" --url "$server_url"
        --exclude-operation-id streamToken
        --max-examples "$max_examples"
        --workers 2
        --request-timeout 10
        --generation-database none
        --no-color
        "$@" "${extra[@]}")
    echo "==> $name: schemathesis ${args[*]}"
    local status=0
    # From the temporary folder: Schemathesis and Hypothesis keep caches in the current one.
    (cd "$work" && "$st" "${args[@]}") 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
    # Schemathesis's summary: "Test cases:" then e.g. "  152 generated, 152 passed".
    local cases tested
    cases=$(grep -A1 '^Test cases:' "$log" | tail -n 1 | sed 's/^ *//' || true)
    tested=$(grep -m1 '^  Tested:' "$log" | sed 's/^ *Tested: *//' || true)
    if ((status == 0)); then
        summaries+=("$name: passed; ${tested:-?} operations tested; test cases: ${cases:-?}")
    else
        failed=1
        summaries+=("$name: FAILED (schemathesis exit $status); ${tested:-?} operations tested; test cases: ${cases:-?}")
        echo "---- last lines of the server log ($name) ----"
        tail -n 20 "$server_log" || true
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
        failed=1
        summaries+=("$name: the server exited during the run")
        echo "---- the server exited; its log ($name) ----"
        tail -n 50 "$server_log" || true
    fi
}

start_server plain
run plain "$spec" --checks "$CHECKS"
stop_server

if has_flag --auth-token; then
    token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    scope_flags=()
    if has_flag --auth-scope; then
        scope_flags=(--auth-scope all)
        strict=all
    else
        strict=post
    fi
    # openapi.yaml lists `{}` (no credentials) beside the schemes of each protected operation,
    # since nothing is required without --auth-token. With the token set they are required: drop
    # `{}` from the operations the token now protects.
    "$venv/bin/python" - "$spec" "$work/openapi-auth.json" "$strict" <<'PY'
import json, sys, yaml
source, target, strict = sys.argv[1:4]
with open(source) as f:
    document = yaml.safe_load(f)
for item in document["paths"].values():
    for method, operation in item.items():
        if not isinstance(operation, dict) or "security" not in operation:
            continue
        if strict == "all" or method == "post":
            required = [requirement for requirement in operation["security"] if requirement]
            if required:
                operation["security"] = required
with open(target, "w") as f:
    json.dump(document, f)
PY
    start_server auth --auth-token "$token" "${scope_flags[@]}"
    run auth "$work/openapi-auth.json" --checks "$CHECKS,ignored_auth" \
        --header "Authorization: Bearer $token" --generation-with-security-parameters false
    stop_server
else
    summaries+=("auth: skipped ($server --help does not mention --auth-token)")
fi

if has_flag --read-token-file; then
    # Read and write tokens (docs/operations.md, "Read and write tokens"): every operation is tried
    # with a write token (roles-write), a read token (roles-read: the reads; roles-read-writes: the
    # writes, which must answer 403 insufficient_scope as openapi.yaml lists) and, through the
    # ignored_auth check of each run, with no token and a wrong one. Every operation but the
    # probes and OPTIONS needs a token now: `{}` is dropped from all of them.
    write_token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    read_token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    (umask 077 && printf '# schemathesis\n%s\n' "$write_token" >"$work/write-tokens" \
        && printf '%s\n' "$read_token" >"$work/read-tokens")
    "$venv/bin/python" - "$spec" "$work/openapi-roles.json" <<'PY'
import json, sys, yaml
source, target = sys.argv[1:3]
with open(source) as f:
    document = yaml.safe_load(f)
for item in document["paths"].values():
    for operation in item.values():
        if isinstance(operation, dict) and "security" in operation:
            required = [requirement for requirement in operation["security"] if requirement]
            if required:
                operation["security"] = required
with open(target, "w") as f:
    json.dump(document, f)
PY
    start_server roles --write-token-file "$work/write-tokens" --read-token-file "$work/read-tokens"
    run roles-write "$work/openapi-roles.json" --checks "$CHECKS,ignored_auth" \
        --header "Authorization: Bearer $write_token" --generation-with-security-parameters false
    run roles-read "$work/openapi-roles.json" --checks "$CHECKS,ignored_auth" \
        --include-method GET --include-method HEAD --include-method OPTIONS \
        --header "Authorization: Bearer $read_token" --generation-with-security-parameters false
    # A read token on a write is refused whatever the body: valid data gets 403 too, so
    # positive_data_acceptance does not apply; the 403 must be one openapi.yaml lists.
    run roles-read-writes "$work/openapi-roles.json" \
        --checks "${CHECKS/,positive_data_acceptance/},ignored_auth" --include-method POST \
        --header "Authorization: Bearer $read_token" --generation-with-security-parameters false
    # The read token's writes were refused with 403 (the access log: "POST /register 403 ..."),
    # and nothing it sent was accepted after the write token's run.
    refused=$(grep -c ' POST /\(register\|fail\) 403 ' "$server_log" || true)
    if ((refused == 0)); then
        failed=1
        summaries+=("roles: no POST was refused with 403 insufficient_scope for the read token")
    else
        summaries+=("roles: $refused POSTs with the read token refused with 403 insufficient_scope")
    fi
    stop_server
else
    summaries+=("roles: skipped ($server --help does not mention --read-token-file)")
fi

echo
echo "==> schemathesis $SCHEMATHESIS_VERSION, at most $max_examples test cases per operation and phase"
for line in "${summaries[@]}"; do echo "schemathesis $line"; done
if ((failed)); then
    echo "schemathesis: FAILED"
    exit 1
fi
echo "schemathesis: all runs passed"
