#!/usr/bin/env bash
# docker/verify-engine.sh: docker/Dockerfile built and run by a real OCI engine, and the compose
# stacks brought up (issue 45). Rootful podman (Debian 12's 4.3, netavark) with runc:
#
#   1. installs what it needs when missing: podman, runc, netavark, aardvark-dns, iptables and
#      debootstrap (apt-get), podman-compose (PyPI, pinned, in a virtual environment under
#      ${XDG_CACHE_HOME:-~/.cache}/forge-push-token/);
#   2. proves podman runs a container on this machine, or fails saying why (never a silent skip);
#   3. makes the base images the Dockerfile and the compose files name, from what is on this
#      machine (docker/podman/standins.sh: no registry is reached), cached between runs;
#   4. `podman build --format docker --runtime runc --pull=never -f docker/Dockerfile .` (the
#      Docker format keeps HEALTHCHECK, which the OCI format drops), printing how long it took;
#   5. docker/podman/engine_test.py: the image's labels, user and health check; the image run
#      hardened (read-only root, no capabilities, no new privileges, a volume) with the smoke
#      checks against its published port, `podman healthcheck run` healthy, frozen and draining,
#      `podman restart` keeping the token, `podman stop` draining open streams and exit 0, the
#      conformance runner through docker/podman/conformance-server.sh; then docker/compose.yaml,
#      compose.replicas.yaml and compose.sentinel.yaml brought up with podman-compose (a write
#      reaching every replica through nginx, a replica killed under a stream, a Redis failover),
#      and brought down with nothing left.
#
# podman's own configuration for the checks is docker/podman/containers.conf (CONTAINERS_CONF):
# runc, since crun refuses this machine's cgroups, and ulimits within the machine's hard limits.
# The compose files' 65,536 open files get docker/podman/compose.limits*.yaml on top. Containers,
# volumes and networks of a run are removed at its end, whatever the result; kept between runs
# are the stand-ins, the image forge-push-token:engine-test and podman's build cache.
#
# Environment: FORGE_CONFORMANCE (the conformance runner; ../shared/conformance/run.py when it is
# beside the checkout), FORGE_PUSH_TOKEN_ENGINE_ONLY (a comma-separated subset of engine_test.py's
# checks), and those of docker/podman/standins.sh.
#
# Usage, from the repository root, as root: bash docker/verify-engine.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
CACHE_ROOT="${FORGE_PUSH_TOKEN_ROOTFS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/forge-push-token}"
COMPOSE_VENV="$CACHE_ROOT/podman-compose-venv"
PODMAN_COMPOSE_VERSION=1.5.0
IMAGE=localhost/forge-push-token:engine-test
export CONTAINERS_CONF="$root/docker/podman/containers.conf"

started=$SECONDS
phase() { printf '\n== %s (%d s in)\n' "$*" "$((SECONDS - started))"; }
die() { printf 'verify-engine.sh: FAIL: %s\n' "$*" >&2; exit 1; }

cleanup() {
    # Containers of the conformance wrapper that a SIGKILL may have left, and of this script's probe.
    local name
    for name in $(podman ps -a --filter label=forge-push-token.test=engine-conformance --format '{{.Names}}' 2>/dev/null) \
                $(podman ps -a --filter label=forge-push-token.test=engine-probe --format '{{.Names}}' 2>/dev/null); do
        podman rm -f -t 0 "$name" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ "$(id -u)" == 0 ]] || die "needs root (rootful podman is what was tested; rootless was not)"

phase "tools"
missing=()
for pair in podman:podman runc:runc /usr/lib/podman/netavark:netavark /usr/lib/podman/aardvark-dns:aardvark-dns \
            iptables:iptables debootstrap:debootstrap; do
    tool="${pair%%:*}" package="${pair#*:}"
    if [[ "$tool" == /* ]]; then [[ -x "$tool" ]] || missing+=("$package")
    else command -v "$tool" >/dev/null 2>&1 || missing+=("$package"); fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
fi
if [[ ! -x "$COMPOSE_VENV/bin/podman-compose" ]] \
        || [[ "$("$COMPOSE_VENV/bin/pip" show podman-compose 2>/dev/null | sed -n 's/^Version: //p')" != "$PODMAN_COMPOSE_VERSION" ]]; then
    echo "pip install podman-compose==$PODMAN_COMPOSE_VERSION into $COMPOSE_VENV"
    mkdir -p "$CACHE_ROOT"
    python3 -m venv "$COMPOSE_VENV" || die "python3 -m venv failed (python3-venv missing?)"
    "$COMPOSE_VENV/bin/pip" install -q "podman-compose==$PODMAN_COMPOSE_VERSION" || die "pip install podman-compose failed"
fi
echo "$(podman --version), runc $(runc --version | sed -n 's/^runc version //p'), $("$COMPOSE_VENV/bin/podman-compose" --version 2>/dev/null | head -n 1)"
echo "network backend $(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null), cgroups $(podman info --format '{{.Host.CgroupsVersion}}' 2>/dev/null), open files: soft $(ulimit -Sn), hard $(ulimit -Hn)"

phase "stand-ins for the base images (docker/podman/standins.sh)"
bash docker/podman/standins.sh

phase "podman can run a container here"
probe_out="$(podman run --rm --label forge-push-token.test=engine-probe --network=none \
    docker.io/library/debian:bookworm-slim sh -c 'ulimit -n' 2>&1)" \
    || die "podman cannot run a container on this machine (runtime $(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null)): $probe_out"
echo "ok: a container ran (open files inside: $probe_out)"

phase "podman build --format docker --runtime runc --pull=never -f docker/Dockerfile ."
build_started=$SECONDS
podman build --format docker --runtime runc --pull=never --network=host -f docker/Dockerfile -t "$IMAGE" . \
    >"$CACHE_ROOT/engine-build.log" 2>&1 \
    || { tail -n 40 "$CACHE_ROOT/engine-build.log" >&2; die "podman build failed (log: $CACHE_ROOT/engine-build.log)"; }
grep -E 'WARN|warning:' "$CACHE_ROOT/engine-build.log" | grep -v 'debconf' || true
echo "built $IMAGE in $((SECONDS - build_started)) s: $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{ printf "%.1f MB", $1 / 1e6 }')"
# Earlier builds' images, now untagged: only this project's (by its title label).
podman image prune -f --filter label=org.opencontainers.image.title=forge-push-token-server >/dev/null 2>&1 || true

phase "the image run by podman, and the compose stacks (docker/podman/engine_test.py)"
conformance="${FORGE_CONFORMANCE:-}"
if [[ -z "$conformance" && -f ../shared/conformance/run.py ]]; then conformance=../shared/conformance/run.py; fi
if [[ -n "$conformance" ]]; then conformance="$(cd "$(dirname "$conformance")" && pwd)/$(basename "$conformance")"; fi
status=0
python3 docker/podman/engine_test.py --image "$IMAGE" --compose "$COMPOSE_VENV/bin/podman-compose" \
    --conformance "$conformance" --only "${FORGE_PUSH_TOKEN_ENGINE_ONLY:-}" || status=$?

phase "result"
[[ "$status" == 0 ]] || die "engine checks failed"
echo "verify-engine: PASS in $((SECONDS - started)) s"
