#!/usr/bin/env bash
# docker/podman/conformance-server.sh: the image as a server binary, for the conformance runner
# (`run.py --server docker/podman/conformance-server.sh`, which starts its server itself with
# flags and FORGE_PUSH_TOKEN_* variables): execs `podman run` of FORGE_PUSH_TOKEN_ENGINE_IMAGE with
# the arguments, in the host's network namespace (--network=host: the runner connects to
# 127.0.0.1), hardened as docs/operations.md recommends. podman's signal proxy (--sig-proxy, on by
# default) passes every signal the runner sends (SIGTERM, SIGINT, SIGHUP) on to the service, PID 1
# of the container, and `podman run` exits with the service's status.
#
# The image's ENV is made the binary's defaults again (loopback, no state file), since the runner
# expects a bare binary; the runner's own FORGE_PUSH_TOKEN_* variables come after and win. Every
# container carries the label forge-push-token.test=engine-conformance, so that one left running by
# a SIGKILL of this process (which no proxy can pass on) is found and removed afterwards.
set -euo pipefail
image="${FORGE_PUSH_TOKEN_ENGINE_IMAGE:?set FORGE_PUSH_TOKEN_ENGINE_IMAGE to the image}"
env_args=(-e FORGE_PUSH_TOKEN_HOST=127.0.0.1 -e FORGE_PUSH_TOKEN_PORT=8080 -e FORGE_PUSH_TOKEN_STATE_FILE=)
while IFS= read -r name; do
    env_args+=(-e "$name")
done < <(compgen -e | grep '^FORGE_PUSH_TOKEN_' | grep -v '^FORGE_PUSH_TOKEN_ENGINE_IMAGE$' || true)
exec podman run --rm -i --sig-proxy=true --network=host \
    --label forge-push-token.test=engine-conformance \
    --read-only --cap-drop=ALL --security-opt=no-new-privileges --tmpfs /tmp:size=16m,mode=1777 \
    "${env_args[@]}" "$image" "$@"
