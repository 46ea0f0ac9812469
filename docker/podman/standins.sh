#!/usr/bin/env bash
# docker/podman/standins.sh: local stand-ins for the base images that docker/Dockerfile and the
# compose files name, made from what is on this machine, because no image registry can be reached:
#
#   docker.io/library/debian:bookworm-slim  debootstrap --variant=minbase bookworm (the root
#                                           docker/verify-rootfs.sh bootstraps, shared through its
#                                           cache), laid out as the Debian image (standins/debian-slim.Containerfile);
#   docker.io/library/swift:6.3-bookworm    the Swift toolchain installed here, under /usr of a
#                                           bookworm root as the official image has it (standins/swift.Containerfile);
#   docker.io/library/redis:7-bookworm      Debian's redis-server (standins/redis.Containerfile);
#   docker.io/library/nginx:1.25-bookworm   Debian's nginx (standins/nginx.Containerfile);
#   docker.io/prom/prometheus:<compose.yaml's tag>  Debian's prometheus (standins/prometheus.Containerfile).
#
# Each carries the label forge-push-token.standin.key, a hash of what it is made from (its
# Containerfile and files, the minbase root, the toolchain's version); an image whose key matches
# is reused, so a machine builds them once. debian:bookworm-slim (and so every other) is rebuilt
# after FORGE_PUSH_TOKEN_STANDIN_MAX_AGE_DAYS (7) days, to take Debian's security updates. Prints
# what each stand-in really carries (Debian 12's versions, not the official images').
#
# Needs root, podman, runc and debootstrap (docker/verify-engine.sh installs them) and Debian's
# mirror, which the builds reach through the host's network (`--network=host`).
#
# Usage, from the repository root: bash docker/podman/standins.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
SUITE=bookworm
ARCH="$(dpkg --print-architecture)"
CACHE_ROOT="${FORGE_PUSH_TOKEN_ROOTFS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/forge-push-token}"
MAX_AGE_DAYS="${FORGE_PUSH_TOKEN_STANDIN_MAX_AGE_DAYS:-7}"
KEY_LABEL=forge-push-token.standin.key

SLIM=docker.io/library/debian:bookworm-slim
SWIFT=docker.io/library/swift:6.3-bookworm
REDIS=docker.io/library/redis:7-bookworm
NGINX=docker.io/library/nginx:1.25-bookworm
PROMETHEUS_TAG="$(sed -n 's/^ *image: *prom\/prometheus:\([^ ]*\) *$/\1/p' "$root/docker/compose.yaml" | head -n 1)"
[[ -n "$PROMETHEUS_TAG" ]] || { echo "standins.sh: no prom/prometheus image in docker/compose.yaml" >&2; exit 1; }
PROMETHEUS="docker.io/prom/prometheus:$PROMETHEUS_TAG"

die() { printf 'standins.sh: FAIL: %s\n' "$*" >&2; exit 1; }
hash_of() { sha256sum | cut -c1-16; }

# The first URI of this machine's apt sources for SUITE's main component, as apt sees them.
apt_uri() {
    # SC2016: $(REPO_URI) and the others are apt-get's own format fields, not the shell's.
    # shellcheck disable=SC2016
    apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 2>/dev/null \
        | awk -v s="$1" '$2 == s && $3 == "main" { print $1; exit }' | sed 's:/*$::'
}

label_of() { podman image inspect --format "{{ index .Labels \"$KEY_LABEL\" }}" "$1" 2>/dev/null || true; }

# build NAME KEY CONTAINERFILE CONTEXT [podman build options...]: builds NAME unless an image of
# that name carries KEY.
build() {
    local name="$1" key="$2" file="$3" context="$4" started=$SECONDS
    shift 4
    if [[ "$(label_of "$name")" == "$key" ]]; then
        echo "stand-in $name: cached (key $key)"
        return
    fi
    echo "stand-in $name: building from $(basename "$file") ..."
    podman build --runtime runc --pull=never --format docker --network=host --quiet \
        --label "$KEY_LABEL=$key" \
        --label "org.opencontainers.image.description=forge-push-token test stand-in for $name, built by docker/podman/standins.sh from Debian 12 packages" \
        -t "$name" -f "$file" "$@" "$context" >/dev/null \
        || die "podman build of the stand-in $name failed"
    echo "stand-in $name: built in $((SECONDS - started)) s"
}

# The minbase root, shared with docker/verify-rootfs.sh: the same folder name (its key is the
# suite, architecture and mirror), so whichever runs first bootstraps it.
minbase_root() {
    local mirror="$1" dir
    dir="$CACHE_ROOT/base-$SUITE-$(printf '%s\n' "minbase $SUITE $ARCH $mirror" | hash_of)"
    if [[ ! -f "$dir.ok" ]]; then
        echo "debootstrap --variant=minbase $SUITE from $mirror ..." >&2
        mkdir -p "$CACHE_ROOT"
        rm -rf "$dir" "$dir.tmp"
        unshare --mount --fork -- timeout 900 debootstrap --variant=minbase --arch="$ARCH" "$SUITE" "$dir.tmp" "$mirror" \
            >"$CACHE_ROOT/debootstrap.log" 2>&1 \
            || { tail -n 20 "$CACHE_ROOT/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE_ROOT/debootstrap.log)"; }
        mv "$dir.tmp" "$dir"
        touch "$dir.ok"
    fi
    echo "$dir"
}

main() {
    local started=$SECONDS mirror updates security base sources slim_key created age
    mirror="${FORGE_PUSH_TOKEN_DEBIAN_MIRROR:-$(apt_uri "$SUITE")}"
    updates="$(apt_uri "$SUITE-updates")"
    security="$(apt_uri "$SUITE-security")"
    [[ -n "$mirror" ]] || die "this machine's apt sources name no mirror for $SUITE main"

    # The Debian image's /etc/apt/sources.list.d/debian.sources, with this machine's mirrors.
    sources="Types: deb\nURIs: $mirror\nSuites: $SUITE${updates:+ $SUITE-updates}\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    if [[ -n "$security" ]]; then
        sources+="\nTypes: deb\nURIs: $security\nSuites: $SUITE-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    fi

    slim_key="$( { cat "$here/standins/debian-slim.Containerfile"; printf '%s\n' "$mirror" "$sources"; } | hash_of)"
    if [[ "$(label_of "$SLIM")" == "$slim_key" ]]; then
        created="$(podman image inspect --format '{{ .Created.Unix }}' "$SLIM")"
        age=$(( ($(date +%s) - created) / 86400 ))
        if [[ "$age" -ge "$MAX_AGE_DAYS" ]]; then
            echo "stand-in $SLIM is $age days old: rebuilding it and the images made from it"
            slim_key="$slim_key-$(date +%Y%m%d)"
        fi
    fi
    if [[ "$(label_of "$SLIM")" != "$slim_key" ]]; then
        base="$(minbase_root "$mirror")"
        echo "importing the minbase root $base"
        tar -C "$base" --numeric-owner -c . \
            | podman import --quiet - forge-push-token-standin/minbase:bookworm >/dev/null \
            || die "podman import of $base failed"
        build "$SLIM" "$slim_key" "$here/standins/debian-slim.Containerfile" "$here/standins" --build-arg "SOURCES=$sources"
        podman rmi forge-push-token-standin/minbase:bookworm >/dev/null
    else
        echo "stand-in $SLIM: cached (key $slim_key)"
    fi
    # The key of every image made from the stand-in slim: its key and the image's own files.
    child_key() { { echo "$slim_key"; cat "$@"; } | hash_of; }

    local swift_bin toolchain
    swift_bin="$(readlink -f "$(command -v swift)")" || die "no swift on PATH"
    toolchain="$(dirname "$(dirname "$(dirname "$swift_bin")")")"
    [[ -x "$toolchain/usr/bin/swift" && -x "$toolchain/usr/libexec/swift/linux/swift-backtrace-static" ]] \
        || die "$toolchain does not hold a Swift toolchain under usr/ with the static backtracer"
    # The Swift stand-in takes minutes (its toolchain layer is over 3 GB, most of it disk work):
    # the other three are built meanwhile.
    build "$SWIFT" "$( { child_key "$here/standins/swift.Containerfile"; echo "$toolchain"; swift --version 2>&1; } | hash_of)" \
        "$here/standins/swift.Containerfile" "$toolchain" &
    local swift_build=$!
    build "$REDIS" "$(child_key "$here/standins/redis.Containerfile" "$here/standins/redis-entrypoint.sh" "$here/standins/redis-server-wrapper.sh")" \
        "$here/standins/redis.Containerfile" "$here/standins"
    build "$NGINX" "$(child_key "$here/standins/nginx.Containerfile" "$here/standins/nginx.conf")" \
        "$here/standins/nginx.Containerfile" "$here/standins"
    build "$PROMETHEUS" "$(child_key "$here/standins/prometheus.Containerfile")" \
        "$here/standins/prometheus.Containerfile" "$here/standins"
    wait "$swift_build" || die "the stand-in $SWIFT was not built"

    echo "what the stand-ins carry (Debian 12's packages, not the official images' versions):"
    printf '  %-45s %s\n' "$SLIM" "Debian $(podman run --rm --network=none "$SLIM" cat /etc/debian_version)"
    printf '  %-45s %s\n' "$SWIFT" "$(podman run --rm --network=none "$SWIFT" swift --version 2>&1 | head -n 1)"
    printf '  %-45s %s\n' "$REDIS" "$(podman run --rm --network=none "$REDIS" /usr/bin/redis-server --version)"
    printf '  %-45s %s\n' "$NGINX" "$(podman run --rm --network=none "$NGINX" nginx -v 2>&1)"
    printf '  %-45s %s\n' "$PROMETHEUS" "$(podman run --rm --network=none --entrypoint /bin/prometheus "$PROMETHEUS" --version 2>&1 | head -n 1)"
    echo "stand-ins ready in $((SECONDS - started)) s"
}

main "$@"
