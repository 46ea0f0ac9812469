#!/usr/bin/env bash
# Builds forge-push-token-server in release mode and runs it on 127.0.0.1:8080 (flags pass
# through: scripts/run.sh --port 9000). Ctrl-C stops it gracefully. The server runs in the
# directory you called this from, so relative paths in its flags (--state-file state.json,
# --auth-token-file, --tls-cert) name files there, as they would for the binary itself.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
# The same build as scripts/test.sh and docker/Dockerfile (scripts/build-release.sh prints the
# binary's absolute path). The build's progress goes to a terminal; when standard error is a file
# or a pipe (`--log-format json 2>log`), it is kept out of the service's log and shown only if the
# build fails.
if [ -t 2 ]; then
  server="$("$root/scripts/build-release.sh")"
else
  build_log="$(mktemp)"
  if ! server="$("$root/scripts/build-release.sh" 2>"$build_log")"; then
    cat "$build_log" >&2
    rm -f "$build_log"
    exit 1
  fi
  rm -f "$build_log"
fi
exec "$server" "$@"
