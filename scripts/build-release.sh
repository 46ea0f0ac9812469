#!/usr/bin/env bash
# Builds the release forge-push-token-server and prints the binary's path on standard output (the
# build's own output goes to standard error). The one place of the release flags for scripts/run.sh,
# scripts/test.sh and bench/: the Swift runtime linked statically, exactly as docker/Dockerfile's
# build stage does (docker/verify-runtime.sh reads the Dockerfile's flags and, with the same flags,
# reuses this build).
set -euo pipefail
cd "$(dirname "$0")/.."
flags=(-c release --static-swift-stdlib --product forge-push-token-server "$@")
swift build "${flags[@]}" >&2
echo "$(swift build "${flags[@]}" --show-bin-path)/forge-push-token-server"
