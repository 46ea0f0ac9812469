#!/usr/bin/env bash
# Builds the request fuzzer (libFuzzer + AddressSanitizer) and runs it for a bounded time.
# See fuzz/README.md.
#
#   fuzz/run.sh [--seconds N]          build, replay fuzz/regressions/, fuzz N seconds (default 60)
#   fuzz/run.sh --build-only           build only
#   fuzz/run.sh --repro FILE...        build, run each FILE once, print what happened
#   fuzz/run.sh --coverage             build a coverage binary, run the corpora once, print llvm-cov's report
#   fuzz/run.sh ... -- ARGS            pass ARGS on to libFuzzer (e.g. -- -fork=2 -seed=1)
#
# Environment: FUZZ_SCRATCH (default <repo>/.build/fuzz), FUZZ_OPT (default -O, SwiftPM's release
# configuration; -Onone for its debug one), FORGE_FUZZ_SKIP (comma-separated check names the
# harness leaves out; see README).
#
# Exit status: 0 when nothing crashed; 1 when a regression input or the fuzzer crashed (the log
# names the input: "Test unit written to ..."); 2 on a usage or build error.
set -euo pipefail

FUZZ_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$FUZZ_DIR/.." && pwd)
SCRATCH=${FUZZ_SCRATCH:-$ROOT/.build/fuzz}
OPT=${FUZZ_OPT:--O}
case "$OPT" in
    -O) CONFIGURATION=release ;;
    -Onone) CONFIGURATION=debug ;;
    *) echo "fuzz/run.sh: FUZZ_OPT is -O (release) or -Onone (debug)" >&2; exit 2 ;;
esac
SECONDS_TO_RUN=60
MODE=fuzz
REPRO_FILES=()
EXTRA_ARGS=()

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) [ $# -ge 2 ] || { usage >&2; exit 2; }; SECONDS_TO_RUN=$2; shift 2 ;;
        --seconds=*) SECONDS_TO_RUN=${1#*=}; shift ;;
        --build-only) MODE=build; shift ;;
        --coverage) MODE=coverage; shift ;;
        --repro) MODE=repro; shift
                 while [ $# -gt 0 ] && [ "$1" != "--" ]; do REPRO_FILES+=("$1"); shift; done ;;
        --) shift; EXTRA_ARGS=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) echo "fuzz/run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
# (0 would mean "no limit" to libFuzzer.)
case "$SECONDS_TO_RUN" in ''|*[!0-9]*|0) echo "fuzz/run.sh: --seconds takes a whole number, at least 1" >&2; exit 2 ;; esac
if [ "$MODE" = repro ] && [ ${#REPRO_FILES[@]} -eq 0 ]; then echo "fuzz/run.sh: --repro needs files" >&2; exit 2; fi
case "$SCRATCH" in "$ROOT/.build/debug"|"$ROOT/.build/debug/"*|"$ROOT/.build/release"|"$ROOT/.build/release/"*)
    echo "fuzz/run.sh: FUZZ_SCRATCH must not be SwiftPM's own build folder" >&2; exit 2 ;; esac

command -v swift >/dev/null && command -v swiftc >/dev/null || { echo "fuzz/run.sh: swift not found on PATH" >&2; exit 2; }
SWIFT_BIN=$(dirname "$(command -v swiftc)")

# The Swift runtime's own crash backtracer would race libFuzzer's handler (and can hang after
# the fuzzer's process is gone); libFuzzer and ASan print the stack instead.
export SWIFT_BACKTRACE=enable=no
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$SWIFT_BIN/llvm-symbolizer}
# Allocation stacks of depth 4 keep heap reports useful at a fraction of the full-depth cost
# (ASan's stack depot dominated the profile). --repro uses the full depth.
FUZZ_ASAN_OPTIONS=${ASAN_OPTIONS:-malloc_context_size=4:detect_leaks=1}

mkdir -p "$SCRATCH"/{logs,corpus,artifacts}
LOGS=$SCRATCH/logs
STAMP=$(date +%Y%m%d-%H%M%S)

# --- Build -----------------------------------------------------------------------------------------
# SwiftPM builds the harness, the package's `request-fuzzer` product (Package.swift: the target
# RequestFuzzer in fuzz/Harness), with the package's own settings and module graph, in scratch
# paths of its own under $SCRATCH (never the package's .build/debug, which a build beside it may
# hold locked). The fuzzer's flags are given on the command line, never in Package.swift (no unsafe
# flags: app teams resolve this package by version):
#   -sanitize=fuzzer,address       libFuzzer and AddressSanitizer, compiled in and linked;
#   -D FORGE_REQUEST_FUZZER        the harness's entry point hands over to libFuzzer's driver
#                                  (fuzz/Harness/Entry.swift);
#   -enable-testing                the harness's `@testable import TokenService` in a release build;
#   -warnings-as-errors            as scripts/test.sh builds everything else.
# SwiftPM rebuilds only what changed.

# build KIND: KIND is "fuzz" (-sanitize=fuzzer,address, $CONFIGURATION) or "coverage"
# (-sanitize=fuzzer plus coverage mapping, no ASan, debug). Prints the binary's path.
build() {
    local kind=$1 configuration scratch log
    local -a flags=(-sanitize=fuzzer,address)
    configuration=$CONFIGURATION
    scratch=$SCRATCH/swiftpm
    if [ "$kind" = coverage ]; then
        flags=(-sanitize=fuzzer -profile-generate -profile-coverage-mapping)
        configuration=debug
        scratch=$SCRATCH/swiftpm-coverage
    fi
    flags+=(-D FORGE_REQUEST_FUZZER -enable-testing -warnings-as-errors)
    local -a command=(swift build --package-path "$ROOT" --scratch-path "$scratch" -c "$configuration"
        --product request-fuzzer)
    local flag
    for flag in "${flags[@]}"; do command+=(-Xswiftc "$flag"); done
    log=$LOGS/build-$kind-$STAMP.log
    {
        echo "+ ${command[*]}"
        "${command[@]}"
    } >"$log" 2>&1 || {
        # ld.gold's "Cannot export local symbol" lines about ASan's own helpers are noise.
        grep -v "Cannot export local symbol" "$log" >&2
        echo "fuzz/run.sh: the $kind build failed; full log: $log" >&2
        exit 2
    }
    echo "$("${command[@]}" --show-bin-path 2>/dev/null)/request-fuzzer"
}

echo "== building the request fuzzer (swift build -c $CONFIGURATION, -sanitize=fuzzer,address) into $SCRATCH/swiftpm"
BUILD_START=$(date +%s)
FUZZER=$(build fuzz)
echo "   built (or up to date) in $(( $(date +%s) - BUILD_START )) s: $FUZZER"
[ "$MODE" = build ] && exit 0

# --- Replaying single inputs ----------------------------------------------------------------------

# replay FILE LOG: runs FILE once; returns the fuzzer's status.
replay() {
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$FUZZER" -timeout=5 -rss_limit_mb=2048 "$1" >"$2" 2>&1
}

if [ "$MODE" = repro ]; then
    status=0
    for file in "${REPRO_FILES[@]}"; do
        log=$LOGS/repro-$(basename "$file")-$STAMP.log
        if replay "$file" "$log"; then
            echo "== $file: no crash"
        else
            status=1
            echo "== $file: CRASH (log $log)"
            grep -v "^INFO:\|^Running:\|^Executed\|^\*\*\*\|^MS:\|^artifact_prefix\|^Base64:\|^$" "$log" | head -80 || true
        fi
    done
    exit $status
fi

# --- Coverage ------------------------------------------------------------------------------------

if [ "$MODE" = coverage ]; then
    echo "== building the coverage binary into $SCRATCH/swiftpm-coverage"
    COVERAGE=$(build coverage)
    profile_dir=$SCRATCH/coverage-profiles
    rm -rf "$profile_dir"; mkdir -p "$profile_dir"
    inputs=("$FUZZ_DIR/corpus" "$SCRATCH/corpus")
    [ -n "$(ls -A "$FUZZ_DIR/regressions" 2>/dev/null | grep -v README)" ] && echo "   (regression inputs are left out: they may crash)"
    LLVM_PROFILE_FILE=$profile_dir/run.profraw "$COVERAGE" -runs=0 "${inputs[@]}" >"$LOGS/coverage-$STAMP.log" 2>&1 || {
        echo "fuzz/run.sh: the coverage run crashed; log: $LOGS/coverage-$STAMP.log" >&2; exit 1; }
    "$SWIFT_BIN/llvm-profdata" merge -sparse "$profile_dir"/*.profraw -o "$profile_dir/merged.profdata"
    echo "== line and region coverage of the library sources by the seed and working corpora"
    "$SWIFT_BIN/llvm-cov" report "$COVERAGE" -instr-profile="$profile_dir/merged.profdata" \
        "$ROOT/Sources/TokenService" "$ROOT/Sources/HTTPServing" "$ROOT/Sources/ForgePushToken" \
        | sed "s|$ROOT/Sources/||"
    echo "   per-line view: $SWIFT_BIN/llvm-cov show $COVERAGE -instr-profile=$profile_dir/merged.profdata $ROOT/Sources/TokenService/RequestBodies.swift"
    exit 0
fi

# --- Regressions, then fuzzing -------------------------------------------------------------------

status=0
regressions=()
if [ -d "$FUZZ_DIR/regressions" ]; then
    while IFS= read -r -d '' file; do regressions+=("$file"); done \
        < <(find "$FUZZ_DIR/regressions" -type f ! -name 'README*' ! -name '.*' -print0 | sort -z)
fi
if [ ${#regressions[@]} -gt 0 ]; then
    echo "== replaying ${#regressions[@]} regression input(s) from fuzz/regressions/"
    for file in "${regressions[@]}"; do
        log=$LOGS/regression-$(basename "$file")-$STAMP.log
        if replay "$file" "$log"; then
            echo "   ok    $(basename "$file")"
        else
            status=1
            echo "   CRASH $(basename "$file") (log $log):"
            grep -m3 "INVARIANT VIOLATED\|ERROR: AddressSanitizer\|ERROR: libFuzzer\|Fatal error" "$log" | sed 's/^/         /' || true
        fi
    done
fi

log=$LOGS/fuzz-$STAMP.log
echo "== fuzzing for $SECONDS_TO_RUN s (working corpus $SCRATCH/corpus, seed corpus fuzz/corpus, log $log)"
set +e
ASAN_OPTIONS=$FUZZ_ASAN_OPTIONS "$FUZZER" \
    -max_total_time="$SECONDS_TO_RUN" -timeout=5 -rss_limit_mb=2048 -max_len=8192 \
    -dict="$FUZZ_DIR/http.dict" -print_final_stats=1 \
    -artifact_prefix="$SCRATCH/artifacts/" \
    "${EXTRA_ARGS[@]}" \
    "$SCRATCH/corpus" "$FUZZ_DIR/corpus" >"$log" 2>&1
fuzz_status=$?
set -e

# The report below must not stop at a pattern that is absent (a crash before the first status line).
set +o pipefail
executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
last=$(grep -E "^#[0-9]+" "$log" | tail -1)
coverage=$(sed -nE 's/.* cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+)\/([^ ]+).*/\1 edges, \2 features, corpus \3 inputs (\4)/p' <<<"$last")
echo "   executions: ${executions:-?} (${per_second:-?}/s); coverage: ${coverage:-?}"

if [ $fuzz_status -ne 0 ]; then
    status=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "== CRASH (libFuzzer exit status $fuzz_status); input: ${artifact:-see the log}"
    grep -v "^INFO:\|^#[0-9]\|^\s*NEW_FUNC\|^MS:\|^stat::\|^Dictionary\|^\"" "$log" \
        | grep -v "Cannot export local symbol" | head -80
    echo "== full log: $log"
    [ -n "$artifact" ] && echo "== to keep it as a regression: cp '$artifact' '$FUZZ_DIR/regressions/<name>'; replay: fuzz/run.sh --repro '$artifact'"
fi
exit $status
