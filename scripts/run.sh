#!/usr/bin/env bash
# Builds forge-push-token-server in release mode and runs it on 127.0.0.1:8080 (flags pass
# through: scripts/run.sh --port 9000). Ctrl-C stops it gracefully. The server runs in the
# directory you called this from, so relative paths in its flags (--state-file state.json,
# --auth-token-file, --tls-cert) name files there, as they would for the binary itself.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
# The same build as scripts/test.sh and docker/Dockerfile (scripts/build-release.sh prints the
# binary's absolute path).
server="$("$root/scripts/build-release.sh")"
exec "$server" "$@"
