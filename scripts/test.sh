#!/usr/bin/env bash
# Runs every test of the project, in the order a failure is cheapest to find:
#   1. debug build of everything with -warnings-as-errors, and the unit and live-server tests;
#   2. the same tests under Thread Sanitizer (own scratch folder, so neither build evicts the other);
#   3. the release build of the server (static Swift runtime, exactly as docker/Dockerfile builds
#      it), checked by the conformance runner ../shared/conformance/run.py;
#   4. end-to-end tests of the release binary: /metrics parsed by prometheus_client, the state
#      file across restarts and SIGKILLs, and the live page in headless Chromium (e2e/run.sh);
#   5. the container checks: hadolint, the runtime-library check, and the debootstrap rootfs run.
# Each configuration is built once and reused. Set SKIP_TSAN=1 or SKIP_DOCKER=1 to leave a step out
# locally; CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

step() { printf '\n==> %s\n' "$*"; }
started=$SECONDS
conformance="${FORGE_CONFORMANCE:-../shared/conformance/run.py}"
if [ ! -f "$conformance" ]; then
  echo "test.sh: the conformance runner is not at $conformance;" >&2
  echo "         set FORGE_CONFORMANCE=/path/to/shared/conformance/run.py" >&2
  exit 2
fi

step "debug build (-warnings-as-errors) and tests"
swift build --build-tests -Xswiftc -warnings-as-errors
swift test --skip-build

if [ "${SKIP_TSAN:-0}" != 1 ]; then
  step "tests under Thread Sanitizer"
  swift build --build-tests --sanitize=thread --scratch-path .build/tsan -Xswiftc -warnings-as-errors
  swift test --skip-build --sanitize=thread --scratch-path .build/tsan
fi

step "release build (static Swift runtime) and conformance"
# Exactly docker/Dockerfile's flags, so docker/verify-runtime.sh reuses this build.
release_flags=(-c release --static-swift-stdlib --product forge-push-token-server)
swift build "${release_flags[@]}"
server="$(swift build "${release_flags[@]}" --show-bin-path)/forge-push-token-server"
python3 "$conformance" --server "$server"

step "1,000 idle subscribers cost under 2% of a core"
python3 bench/idle_subscribers.py --server "$server" -n 1000 --seconds 10 --max-percent 2

step "end-to-end: metrics (Prometheus parser), state file (restarts, SIGKILL), live page (Chromium)"
bash e2e/run.sh --server "$server"

if [ "${SKIP_DOCKER:-0}" != 1 ]; then
  step "container checks"
  # verify-runtime.sh builds with the Dockerfile's flags; in .build that is the build above.
  export FORGE_PUSH_TOKEN_DOCKER_SCRATCH="$PWD/.build"
  for check in docker/lint.sh docker/verify-runtime.sh docker/verify-rootfs.sh; do
    if [ -f "$check" ]; then bash "$check"; else echo "missing $check" >&2; exit 1; fi
  done
fi

step "all tests passed in $((SECONDS - started)) s"
