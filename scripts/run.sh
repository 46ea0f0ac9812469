#!/usr/bin/env bash
# Builds forge-push-token-server in release mode and runs it on 127.0.0.1:8080 (flags pass
# through: scripts/run.sh --port 9000). Ctrl-C stops it gracefully.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The same build as scripts/test.sh and docker/Dockerfile (scripts/build-release.sh).
server="$(scripts/build-release.sh)"
exec "$server" "$@"
