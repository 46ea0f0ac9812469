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
# Environment: FUZZ_SCRATCH (default <repo>/.build/fuzz), FUZZ_OPT (default -O; -Onone for a debug
# build), FORGE_FUZZ_SKIP (comma-separated check names the harness leaves out; see README).
#
# Exit status: 0 when nothing crashed; 1 when a regression input or the fuzzer crashed (the log
# names the input: "Test unit written to ..."); 2 on a usage or build error.
set -euo pipefail

FUZZ_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$FUZZ_DIR/.." && pwd)
SCRATCH=${FUZZ_SCRATCH:-$ROOT/.build/fuzz}
OPT=${FUZZ_OPT:--O}
SECONDS_TO_RUN=60
MODE=fuzz
REPRO_FILES=()
EXTRA_ARGS=()

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

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

command -v swiftc >/dev/null || { echo "fuzz/run.sh: swiftc not found on PATH" >&2; exit 2; }
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
# The library sources are copied first, so that edits made while the compiler runs cannot break
# the build, and the fuzzer is built from one consistent snapshot of them.

# sources_stamp DIR FLAGS: a hash of the library sources under DIR, the harness, the flags and
# the compiler.
sources_stamp() {
    {
        echo "$2"
        swiftc --version 2>&1
        for module in ForgePushToken ForgePushTokenOwner ForgePushTokenHTTP PrometheusExposition ServiceLogging; do
            (cd "$1/$module" && ls && cat ./*.swift)
        done
        cat "$FUZZ_DIR"/Harness/*.swift
    } | sha256sum | cut -d' ' -f1
}

# The package's own Swift settings for the modules built here, read from the manifest
# (`swift package dump-package`), so that this second build graph compiles them as SwiftPM does:
# the language mode (-swift-version) and each setting of the three library targets
# (enableUpcomingFeature and enableExperimentalFeature, define, unsafeFlags). A setting this script
# cannot translate stops the build rather than being left out. The library targets must share one
# set of settings (Package.swift's `swiftSettings`); the harness is compiled with it too.
package_swift_flags() {
    # Its own scratch folder: the package's .build may be locked by a build running beside it.
    (cd "$ROOT" && swift package --scratch-path "$SCRATCH/manifest" dump-package) | python3 -c '
import json, sys
package = json.load(sys.stdin)
modes = package.get("swiftLanguageModes") or package.get("swiftLanguageVersions") or ["6"]
sets = set()
for target in package["targets"]:
    if target["name"] not in ("ForgePushToken", "ForgePushTokenOwner", "ForgePushTokenHTTP"):
        continue
    flags = []
    for setting in target.get("settings", []):
        if setting.get("tool") != "swift" or setting.get("condition"):
            sys.exit("fuzz/run.sh: a conditional or non-Swift setting of %s: %s" % (target["name"], setting))
        (kind, value), = setting["kind"].items()
        if kind == "enableUpcomingFeature":
            flags += ["-enable-upcoming-feature", value["_0"]]
        elif kind == "enableExperimentalFeature":
            flags += ["-enable-experimental-feature", value["_0"]]
        elif kind == "define":
            flags += ["-D", value["_0"]]
        elif kind == "unsafeFlags":
            flags += value["_0"]
        else:
            sys.exit("fuzz/run.sh: a Swift setting of %s it cannot translate: %s" % (target["name"], setting))
    sets.add(tuple(flags))
if len(sets) != 1:
    sys.exit("fuzz/run.sh: the library targets differ in their Swift settings: %s" % sorted(sets))
print(" ".join(["-swift-version", max(modes, key=float)] + list(sets.pop())))
'
}
PACKAGE_SWIFT_FLAGS=$(package_swift_flags) || { echo "fuzz/run.sh: could not read the package's Swift settings" >&2; exit 2; }

# build KIND: KIND is "fuzz" (-sanitize=fuzzer,address) or "coverage" (-sanitize=fuzzer plus
# coverage mapping, no ASan). Prints the binary's path.
build() {
    local kind=$1 out=$SCRATCH/build-$1
    local -a flags
    # shellcheck disable=SC2206 # the flags are words without blanks (checked by package_swift_flags' translation)
    flags=($PACKAGE_SWIFT_FLAGS -parse-as-library -g -package-name main)
    if [ "$kind" = fuzz ]; then
        flags+=("$OPT" -sanitize=fuzzer,address)
    else
        flags+=(-Onone -sanitize=fuzzer -profile-generate -profile-coverage-mapping)
    fi
    # Unchanged sources, harness and flags: the last build stands.
    local stamp
    stamp=$(sources_stamp "$ROOT/Sources" "${flags[*]}")
    if [ -x "$out/request-fuzzer" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
        echo "$out/request-fuzzer"
        return
    fi
    rm -rf "$out"
    mkdir -p "$out/src"
    cp -R "$ROOT/Sources/ForgePushToken" "$ROOT/Sources/ForgePushTokenOwner" "$ROOT/Sources/ForgePushTokenHTTP" \
        "$ROOT/Sources/PrometheusExposition" "$ROOT/Sources/ServiceLogging" "$out/src/"
    local log=$LOGS/build-$kind-$STAMP.log
    (
        set -x
        swiftc "${flags[@]}" -wmo -enable-testing -module-name ForgePushToken \
            -emit-module -emit-module-path "$out/ForgePushToken.swiftmodule" \
            -emit-library -static -o "$out/libForgePushToken.a" "$out"/src/ForgePushToken/*.swift
        swiftc "${flags[@]}" -wmo -enable-testing -module-name ForgePushTokenOwner -I "$out" \
            -emit-module -emit-module-path "$out/ForgePushTokenOwner.swiftmodule" \
            -emit-library -static -o "$out/libForgePushTokenOwner.a" "$out"/src/ForgePushTokenOwner/*.swift
        swiftc "${flags[@]}" -wmo -enable-testing -module-name ServiceLogging \
            -emit-module -emit-module-path "$out/ServiceLogging.swiftmodule" \
            -emit-library -static -o "$out/libServiceLogging.a" "$out"/src/ServiceLogging/*.swift
        swiftc "${flags[@]}" -wmo -enable-testing -module-name PrometheusExposition \
            -emit-module -emit-module-path "$out/PrometheusExposition.swiftmodule" \
            -emit-library -static -o "$out/libPrometheusExposition.a" "$out"/src/PrometheusExposition/*.swift
        swiftc "${flags[@]}" -wmo -enable-testing -module-name ForgePushTokenHTTP -I "$out" \
            -emit-module -emit-module-path "$out/ForgePushTokenHTTP.swiftmodule" \
            -emit-library -static -o "$out/libForgePushTokenHTTP.a" "$out"/src/ForgePushTokenHTTP/*.swift
        swiftc "${flags[@]}" -warnings-as-errors -module-name RequestFuzzer -I "$out" -L "$out" \
            -lForgePushTokenHTTP -lPrometheusExposition -lServiceLogging -lForgePushTokenOwner -lForgePushToken "$FUZZ_DIR"/Harness/*.swift -o "$out/request-fuzzer"
    ) >"$log" 2>&1 || {
        # ld.gold's "Cannot export local symbol" lines about ASan's own helpers are noise.
        grep -v "Cannot export local symbol" "$log" >&2
        echo "fuzz/run.sh: the $kind build failed; full log: $log" >&2
        exit 2
    }
    # The stamp of the sources as copied (they may have changed since it was computed above).
    sources_stamp "$out/src" "${flags[*]}" >"$out/stamp"
    echo "$out/request-fuzzer"
}

echo "== building the request fuzzer ($OPT, -sanitize=fuzzer,address) into $SCRATCH/build-fuzz"
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
    echo "== building the coverage binary into $SCRATCH/build-coverage"
    COVERAGE=$(build coverage)
    profile_dir=$SCRATCH/build-coverage/profiles
    rm -rf "$profile_dir"; mkdir -p "$profile_dir"
    inputs=("$FUZZ_DIR/corpus" "$SCRATCH/corpus")
    [ -n "$(ls -A "$FUZZ_DIR/regressions" 2>/dev/null | grep -v README)" ] && echo "   (regression inputs are left out: they may crash)"
    LLVM_PROFILE_FILE=$profile_dir/run.profraw "$COVERAGE" -runs=0 "${inputs[@]}" >"$LOGS/coverage-$STAMP.log" 2>&1 || {
        echo "fuzz/run.sh: the coverage run crashed; log: $LOGS/coverage-$STAMP.log" >&2; exit 1; }
    "$SWIFT_BIN/llvm-profdata" merge -sparse "$profile_dir"/*.profraw -o "$profile_dir/merged.profdata"
    echo "== line and region coverage of the library sources by the seed and working corpora"
    "$SWIFT_BIN/llvm-cov" report "$COVERAGE" -instr-profile="$profile_dir/merged.profdata" \
        "$SCRATCH/build-coverage/src/ForgePushTokenHTTP" "$SCRATCH/build-coverage/src/ForgePushToken" \
        | sed "s|$SCRATCH/build-coverage/src/||"
    echo "   per-line view: $SWIFT_BIN/llvm-cov show $COVERAGE -instr-profile=$profile_dir/merged.profdata $SCRATCH/build-coverage/src/ForgePushTokenHTTP/RequestBodies.swift"
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
