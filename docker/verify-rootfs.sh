#!/usr/bin/env bash
# docker/verify-rootfs.sh: the closest thing to running the image without a Docker engine.
#
#   1. `debootstrap --variant=minbase bookworm` (what debian:bookworm-slim is made from), with the
#      mirror taken from this machine's apt sources; checks that every package that
#      docker/verify-runtime.sh counts as part of debian:bookworm-slim is really there;
#   2. runs the runtime stage's RUN instructions, read from docker/Dockerfile, inside that root
#      with chroot (apt sources laid out as in the Debian image: bookworm, bookworm-updates,
#      bookworm-security): the same apt-get install, the same groupadd/useradd/install -d;
#   3. builds the binary with the Dockerfile's flags (as verify-runtime.sh does) and lays out the
#      runtime stage's COPY instructions as an image layer;
#   4. runs the ENTRYPOINT like a container: a read-only overlay of layer and root, fresh mount,
#      network, PID, IPC and UTS namespaces (the service is PID 1, listens on the image's
#      0.0.0.0:8080 inside a network namespace that has only loopback), /proc, a minimal /dev,
#      tmpfs /tmp, the data folder as a writable volume, the image's ENV, WORKDIR, and
#      `chroot --userspec=UID:GID` with the image's numeric USER under no_new_privs;
#   5. checks: the user and data folder, the libraries resolve, `--version`, the HEALTHCHECK
#      command (exit 1 with nothing listening, 0 against the service), GET /healthz,
#      POST /register, GET /token, Server-Sent Events (the first event and the change event),
#      that the root is read-only and the data folder writable for the service user, a clean exit
#      within 5 s of SIGTERM that ends an open stream cleanly, and that a crash prints a Swift
#      backtrace through the image's SWIFT_BACKTRACE setting.
#
# All traffic of the checks stays on the loopback interface of a network namespace made here.
# The bootstrapped root is cached under ${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token, keyed by
# mirror, suite, architecture and the runtime stage's RUN instructions (so by its package list),
# and rebuilt after FORGE_PUSH_TOKEN_ROOTFS_MAX_AGE_DAYS (7) days to pick up security updates.
#
# If the Debian mirror cannot be reached and no cached root exists, the check is SKIPPED, loudly,
# with exit status 0: that is the only case in which it does not run.
#
# Needs root (debootstrap, chroot, namespaces). Installs debootstrap, curl and iproute2 with apt-get
# when they are missing.
#
# Environment: FORGE_PUSH_TOKEN_ROOTFS_CACHE (the cache folder), FORGE_PUSH_TOKEN_ROOTFS_MAX_AGE_DAYS
# (7), FORGE_PUSH_TOKEN_DEBIAN_MIRROR (a mirror other than this machine's), and those of
# verify-runtime.sh.
#
# Usage, from the repository root: bash docker/verify-rootfs.sh
#
# SC2016: the single-quoted ${...} here are dpkg-query formats and scripts for another shell.
# shellcheck disable=SC2016
set -euo pipefail

# shellcheck source=docker/verify-runtime.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/verify-runtime.sh"

SUITE=bookworm
ARCH="$(dpkg --print-architecture)"
CACHE_ROOT="${FORGE_PUSH_TOKEN_ROOTFS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/forge-push-token}"
MAX_AGE_DAYS="${FORGE_PUSH_TOKEN_ROOTFS_MAX_AGE_DAYS:-7}"
SHUTDOWN_LIMIT_SECONDS=5  # http-api.md: exits 0 within 5 seconds of SIGTERM
DOCKER_DEFAULT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
TOKEN=a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90

WORK=""
STARTED_PIDS=()
PASSED=0

cleanup() {
    local pid child children
    for pid in "${STARTED_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null || continue
        # The service is PID 1 of its namespace and runs as another user, so unshare's
        # --kill-child cannot reach it: kill it first (which ends its namespace), then unshare.
        children=()
        # (The file has no final newline: read fails at its end but has filled the array.)
        read -r -a children <"/proc/$pid/task/$pid/children" 2>/dev/null || true
        for child in "${children[@]}"; do kill -KILL "$child" 2>/dev/null || true; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    for pid in "${STARTED_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    # The mounts live in namespaces that are gone now; on this side these are plain folders.
    if [[ -n "$WORK" && -d "$WORK" ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

pass() { PASSED=$((PASSED + 1)); printf 'ok %2d - %s\n' "$PASSED" "$*"; }
fail() {
    printf 'not ok - %s\n' "$*" >&2
    printf 'verify-rootfs: %d passed, 1 failed\n' "$PASSED"
    exit 1
}

skip_loudly() {
    local banner
    banner="$(printf '#%.0s' {1..100})"
    {
        echo "$banner"
        echo "#  verify-rootfs.sh SKIPPED: $*"
        echo "#  The image's runtime stage was NOT exercised. Only an unreachable Debian mirror"
        echo "#  (with no cached root from an earlier run) skips this check."
        echo "$banner"
    } | tee /dev/stderr
    echo "verify-rootfs: 0 passed, 0 failed, 1 skipped"
    exit 0
}

# The URI of the first enabled `deb` source of this machine for SUITE with component main, from
# /etc/apt/sources.list, sources.list.d/*.list (one-line format) and sources.list.d/*.sources
# (deb822). Prints nothing when there is none.
apt_source_uri() {
    local suite="$1" file
    {
        for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -f "$file" ]] || continue
            awk -v suite="$suite" '
                /^[[:space:]]*deb[[:space:]]/ {
                    line = $0; sub(/\[[^]]*\]/, "", line); n = split(line, w, " ")
                    if (w[3] == suite) for (i = 4; i <= n; i++) if (w[i] == "main") { print w[2]; exit }
                }' "$file"
        done
        for file in /etc/apt/sources.list.d/*.sources; do
            [[ -f "$file" ]] || continue
            awk -v suite="$suite" '
                function flush() {
                    if ((" " types " ") ~ / deb / && enabled != "no" && (" " suites " ") ~ (" " suite " ") \
                        && (" " comps " ") ~ / main /) { split(uris, u, " "); print u[1]; found = 1; exit }
                    types = uris = suites = comps = ""; enabled = "yes"
                }
                BEGIN { enabled = "yes" }
                /^[[:space:]]*#/ { next }
                /^[[:space:]]*$/ { flush(); next }
                /^[A-Za-z-]+:/ {
                    key = tolower(substr($0, 1, index($0, ":") - 1)); value = substr($0, index($0, ":") + 1)
                    gsub(/^[ \t]+|[ \t]+$/, "", value)
                    if (key == "types") types = value; else if (key == "uris") uris = value
                    else if (key == "suites") suites = value; else if (key == "components") comps = value
                    else if (key == "enabled") enabled = tolower(value)
                }
                END { if (!found) flush() }' "$file"
        done
    } | head -n 1 | sed 's:/*$::'
}

mirror_reachable() {
    local url="$1/dists/$SUITE/InRelease"
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --max-time 20 -o /dev/null "$url" 2>/dev/null
    else
        timeout 25 python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20).read(1)' "$url" 2>/dev/null
    fi
}

hash_of() { sha256sum | cut -c1-16; }

age_days() { echo $(( ($(date +%s) - $(stat -c %Y "$1")) / 86400 )); }

# Runs COMMAND... with the root folder ROOT as / in a private mount namespace that has /proc and
# the host's /dev (for building the root, as `docker build` does for RUN).
chroot_build() {
    local root="$1"; shift
    unshare --mount --fork -- /bin/bash -c '
        set -euo pipefail
        root="$1"; shift
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        exec "$@"' chroot_build "$root" "$@"
}

# The minbase root, cached: sets BASE. (Not run in $(...): it may skip the whole check.)
base_rootfs() {
    local key dir
    key="$(printf '%s\n' "minbase $SUITE $ARCH $MIRROR" | hash_of)"
    dir="$CACHE_ROOT/base-$SUITE-$key"
    BASE="$dir"
    if [[ -f "$dir.ok" ]]; then
        echo "cached minbase root: $dir"
        return
    fi
    [[ "$MIRROR_OK" == yes ]] || skip_loudly "the Debian mirror $MIRROR cannot be reached and no minbase root is cached"
    echo "debootstrap --variant=minbase $SUITE from $MIRROR (a minute or two) ..." >&2
    rm -rf "$dir" "$dir.tmp"
    local started=$SECONDS
    if ! unshare --mount --fork -- timeout 900 debootstrap --variant=minbase --arch="$ARCH" "$SUITE" "$dir.tmp" "$MIRROR" \
            >"$CACHE_ROOT/debootstrap.log" 2>&1; then
        tail -n 20 "$CACHE_ROOT/debootstrap.log" >&2
        if ! mirror_reachable "$MIRROR"; then
            skip_loudly "debootstrap could not reach the Debian mirror $MIRROR"
        fi
        die "debootstrap failed (log: $CACHE_ROOT/debootstrap.log)"
    fi
    mv "$dir.tmp" "$dir"
    touch "$dir.ok"
    echo "debootstrap took $((SECONDS - started)) s"
}

# The instructions of the runtime stage that shape its root before the COPYs, in order, checked to
# be ones this script can replay: ENV and ARG before RUN are passed to RUN; RUN must come before
# any COPY, ADD or USER.
runtime_build_steps() {
    local stage line_stage line keyword seen_copy=no
    stage="$(runtime_stage)"
    while IFS=$'\t' read -r line_stage line; do
        [[ "$line_stage" == "$stage" ]] || continue
        keyword="${line%% *}"; keyword="${keyword^^}"
        case "$keyword" in
            RUN)
                [[ "$seen_copy" == no ]] || die "the runtime stage has a RUN after COPY/ADD/USER, which this script does not replay"
                [[ "$line" != RUN\ --* ]] || die "RUN flags in the runtime stage are not supported here: $line"
                printf 'RUN\t%s\n' "${line#RUN }" ;;
            ENV) printf 'ENV\t%s\n' "${line#ENV }" ;;
            COPY|ADD|USER) seen_copy=yes ;;
        esac
    done < <(dockerfile_instructions)
}

# The root after the runtime stage's RUN instructions, cached by their text: sets ROOTFS.
runtime_rootfs() {
    local base="$BASE" steps sources key dir
    steps="$(runtime_build_steps)"
    sources="Types: deb
URIs: $MIRROR
Suites: $SUITE${UPDATES_MIRROR:+ $SUITE-updates}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
    if [[ -n "$UPDATES_MIRROR" && "$UPDATES_MIRROR" != "$MIRROR" ]]; then
        sources="Types: deb
URIs: $MIRROR
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $UPDATES_MIRROR
Suites: $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
    fi
    if [[ -n "$SECURITY_MIRROR" ]]; then
        sources+="
Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
    fi
    key="$(printf '%s\n%s\n%s\n' "$base" "$steps" "$sources" | hash_of)"
    dir="$CACHE_ROOT/rootfs-$SUITE-$key"
    ROOTFS="$dir"
    if [[ -f "$dir.ok" ]]; then
        if [[ "$MIRROR_OK" == yes && "$(age_days "$dir.ok")" -ge "$MAX_AGE_DAYS" ]]; then
            echo "cached runtime root is $(age_days "$dir.ok") days old: rebuilding" >&2
        else
            echo "cached runtime root: $dir ($(age_days "$dir.ok") days old)"
            return
        fi
    fi
    [[ "$MIRROR_OK" == yes ]] || skip_loudly "the Debian mirror $MIRROR cannot be reached and no runtime root is cached for this Dockerfile"

    echo "replaying the runtime stage's RUN instructions in a copy of the minbase root ..."
    local started=$SECONDS tmp="$dir.tmp"
    rm -rf "$tmp" "$dir" "$dir.ok"
    cp -a "$base" "$tmp"
    # Apt sources as in the Debian image (one deb822 file), with this machine's mirrors.
    rm -f "$tmp/etc/apt/sources.list"
    printf '%s' "$sources" >"$tmp/etc/apt/sources.list.d/debian.sources"
    # As in the Debian image: no service starts during package installation.
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
    chmod 0755 "$tmp/usr/sbin/policy-rc.d"
    cp -L /etc/resolv.conf "$tmp/etc/resolv.conf"

    local kind text build_env=("PATH=$DOCKER_DEFAULT_PATH" "HOME=/root")
    while IFS=$'\t' read -r kind text; do
        case "$kind" in
            ENV)
                local pair pairs
                read -r -a pairs <<<"$text"
                for pair in "${pairs[@]}"; do
                    [[ "$pair" == *=* ]] || die "only ENV KEY=VALUE is supported here: ENV $text"
                    build_env+=("$pair")
                done ;;
            RUN)
                echo "+ RUN $text"
                chroot_build "$tmp" timeout 900 env -i "${build_env[@]}" /usr/sbin/chroot "$tmp" /bin/sh -c "$text" \
                    </dev/null >"$CACHE_ROOT/run.log" 2>&1 \
                    || { tail -n 30 "$CACHE_ROOT/run.log" >&2; die "RUN failed in the bootstrapped root (log: $CACHE_ROOT/run.log)"; } ;;
        esac
    done <<<"$steps"
    : >"$tmp/etc/resolv.conf"
    mv "$tmp" "$dir"
    touch "$dir.ok"
    # Keep one root of each kind: drop those of other keys.
    local other
    for other in "$CACHE_ROOT"/rootfs-"$SUITE"-* "$CACHE_ROOT"/base-"$SUITE"-*; do
        case "$other" in "$dir"|"$dir.ok"|"$base"|"$base.ok") continue ;; esac
        rm -rf "$other"
    done
    echo "runtime stage replayed in $((SECONDS - started)) s"
}

# Starts a container from the image (layer over root) running COMMAND..., with its output in LOG.
# Sets CONTAINER_PID (the unshare process, whose exit status is the command's). Returns at once:
# a short command may be over before its PID could be read, so only start_service waits for it.
start_container() {
    local log="$1"; shift
    unshare --mount --net --pid --ipc --uts --fork --kill-child -- /bin/bash "$WORK/container.sh" "$@" >"$log" 2>&1 9>&- &
    CONTAINER_PID=$!
    STARTED_PIDS+=("$CONTAINER_PID")
}

# start_container for a command that keeps running (the service): also sets SERVICE_PID (the
# command, PID 1 in its namespace), waiting up to 10 s for it; fails if the container ends first.
start_service() {
    local log="$1"
    start_container "$@"
    SERVICE_PID=""
    for _ in $(seq 100); do
        SERVICE_PID="$(cat "/proc/$CONTAINER_PID/task/$CONTAINER_PID/children" 2>/dev/null | awk '{ print $1 }')" || true
        [[ -n "$SERVICE_PID" ]] && return 0
        kill -0 "$CONTAINER_PID" 2>/dev/null || break
        sleep 0.1
    done
    cat "$log" >&2
    fail "the container did not start"
}

wait_container() {
    local seconds="$1"
    for _ in $(seq $((seconds * 20))); do
        kill -0 "$CONTAINER_PID" 2>/dev/null || break
        sleep 0.05
    done
    if kill -0 "$CONTAINER_PID" 2>/dev/null; then CONTAINER_STATUS=timeout; return; fi
    CONTAINER_STATUS=0
    wait "$CONTAINER_PID" || CONTAINER_STATUS=$?
}

# `docker exec`: COMMAND... in the running container's namespaces and root, as the image's USER,
# in its WORKDIR, with its ENV, for at most EXEC_TIMEOUT (30) seconds.
container_exec() {
    timeout "${EXEC_TIMEOUT:-30}" env -i "${CONTAINER_ENV[@]}" /usr/bin/nsenter --target "$SERVICE_PID" --mount --net --pid --ipc --uts \
        --root --wd --setuid "$IMAGE_UID" --setgid "$IMAGE_GID" -- "$@"
}

# curl from this side, inside the container's network namespace (loopback only).
container_curl() {
    /usr/bin/nsenter --target "$SERVICE_PID" --net -- curl -sS --max-time 5 "$@"
}

wait_for_log() {
    local file="$1" pattern="$2" seconds="$3"
    for _ in $(seq $((seconds * 20))); do
        grep -q -- "$pattern" "$file" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

main() {
    cd "$REPO_ROOT"
    local started=$SECONDS
    [[ $EUID -eq 0 ]] || die "needs root (debootstrap, chroot, namespaces)"

    section "mirror (from this machine's apt sources)"
    MIRROR="${FORGE_PUSH_TOKEN_DEBIAN_MIRROR:-$(apt_source_uri "$SUITE")}"
    SECURITY_MIRROR="$(apt_source_uri "$SUITE-security")"
    UPDATES_MIRROR="$(apt_source_uri "$SUITE-updates")"
    [[ -n "$MIRROR" ]] || skip_loudly "this machine's apt sources name no mirror for $SUITE main"
    echo "$SUITE: $MIRROR"
    echo "$SUITE-updates: ${UPDATES_MIRROR:-(none)}"
    echo "$SUITE-security: ${SECURITY_MIRROR:-(none)}"
    MIRROR_OK=no
    if mirror_reachable "$MIRROR"; then
        MIRROR_OK=yes
    else
        echo "WARNING: $MIRROR cannot be reached; only a cached root can be used" >&2
        compgen -G "$CACHE_ROOT/rootfs-$SUITE-*.ok" >/dev/null \
            || skip_loudly "the Debian mirror $MIRROR cannot be reached and no root is cached in $CACHE_ROOT"
    fi

    section "tools"
    local missing=()
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    if [[ ${#missing[@]} -gt 0 ]]; then
        [[ "$MIRROR_OK" == yes ]] || skip_loudly "the Debian mirror $MIRROR cannot be reached to install ${missing[*]}"
        apt_install "${missing[@]}"
    fi
    local tool
    for tool in unshare nsenter setpriv chroot debootstrap curl ip; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool is missing"
    done
    echo "debootstrap $(dpkg-query -W -f '${Version}' debootstrap), $(unshare --version)"

    section "binary (flags from the Dockerfile, as verify-runtime.sh builds it)"
    ensure_build_tools
    local binary backtracer
    binary="$(build_release_binary)"
    backtracer="$(dirname "$(readlink -f "$(command -v swift)")")/../libexec/swift/linux/swift-backtrace-static"
    backtracer="$(readlink -f "$backtracer")"
    [[ -x "$backtracer" ]] || die "no swift-backtrace-static in the toolchain ($backtracer)"
    echo "binary: $binary ($(stat -c %s "$binary") bytes)"
    echo "backtracer: $backtracer ($(stat -c %s "$backtracer") bytes)"

    section "root filesystem (cache: $CACHE_ROOT)"
    mkdir -p "$CACHE_ROOT"
    exec 9>"$CACHE_ROOT/lock"
    flock --timeout 1800 9 || die "another verify-rootfs.sh holds $CACHE_ROOT/lock"
    local base rootfs
    base_rootfs
    runtime_rootfs
    base="$BASE" rootfs="$ROOTFS"

    section "what debian:bookworm-slim and the runtime stage contain"
    local base_packages missing_base=()
    base_packages="$(chroot "$base" dpkg-query -W -f '${Package}\n')"
    local package
    for package in "${BOOKWORM_SLIM_PACKAGES[@]}"; do
        grep -qx -- "$package" <<<"$base_packages" || missing_base+=("$package")
    done
    [[ ${#missing_base[@]} -eq 0 ]] \
        || fail "verify-runtime.sh counts ${missing_base[*]} as part of debian:bookworm-slim, but minbase $SUITE lacks them"
    pass "the $(wc -l <<<"$base_packages") packages of minbase $SUITE include all ${#BOOKWORM_SLIM_PACKAGES[@]} that verify-runtime.sh counts as debian:bookworm-slim"
    local added
    added="$(comm -13 <(sort <<<"$base_packages") <(chroot "$rootfs" dpkg-query -W -f '${Package}\n' | sort) | tr '\n' ' ')"
    echo "packages the runtime stage added: ${added:-none}"
    local wanted
    for wanted in $(runtime_packages); do
        chroot "$rootfs" dpkg-query -W -f '${Status}' "$wanted" 2>/dev/null | grep -q 'ok installed' \
            || fail "$wanted is not installed in the runtime root"
        echo "  $wanted $(chroot "$rootfs" dpkg-query -W -f '${Version}' "$wanted")"
    done

    section "image layout (from the runtime stage of the Dockerfile)"
    local stage user workdir port entrypoint_json healthcheck
    stage="$(runtime_stage)"
    user="$(stage_instructions "$stage" USER | tail -n 1)"
    workdir="$(stage_instructions "$stage" WORKDIR | tail -n 1)"
    port="$(stage_instructions "$stage" EXPOSE | tail -n 1 | awk '{ print $1 }')"; port="${port%/tcp}"
    entrypoint_json="$(stage_instructions "$stage" ENTRYPOINT | tail -n 1)"
    healthcheck="$(stage_instructions "$stage" HEALTHCHECK | tail -n 1)"
    local entrypoint health_cmd health_timeout
    mapfile -t entrypoint < <(json_array_lines "$entrypoint_json")
    [[ "$healthcheck" == *" CMD "* ]] || die "HEALTHCHECK must be 'HEALTHCHECK [options] CMD [...]': $healthcheck"
    mapfile -t health_cmd < <(json_array_lines "${healthcheck#* CMD }")
    health_timeout="$(sed -n 's/.*--timeout=\([0-9]*\)s.*/\1/p' <<<"$healthcheck")"; health_timeout="${health_timeout:-30}"
    [[ "$user" =~ ^([0-9]+):([0-9]+)$ ]] || die "USER should be numeric UID:GID (runAsNonRoot), not '$user'"
    IMAGE_UID="${BASH_REMATCH[1]}"; IMAGE_GID="${BASH_REMATCH[2]}"
    [[ -n "$workdir" && -n "$port" ]] || die "the runtime stage needs WORKDIR and EXPOSE"
    CONTAINER_ENV=("PATH=$DOCKER_DEFAULT_PATH" "HOSTNAME=forge-push-token" "HOME=/var/lib/forge-push-token")
    local text pair
    local pairs
    while IFS= read -r text; do
        read -r -a pairs <<<"$text"
        for pair in "${pairs[@]}"; do
            [[ "$pair" == *=* ]] || die "only ENV KEY=VALUE is supported here: ENV $text"
            CONTAINER_ENV+=("$pair")
        done
    done < <(stage_instructions "$stage" ENV)
    local data_dir
    data_dir="$(awk -F: -v uid="$IMAGE_UID" '$3 == uid { print $6 }' "$rootfs/etc/passwd")"
    echo "USER $user, WORKDIR $workdir, EXPOSE $port, ENTRYPOINT ${entrypoint[*]}, HEALTHCHECK ${health_cmd[*]} (timeout ${health_timeout}s)"
    echo "ENV ${CONTAINER_ENV[*]}"

    WORK="$(mktemp -d /tmp/forge-push-token-rootfs.XXXXXX)"
    local layer="$WORK/layer" data="$WORK/volume" merged="$WORK/merged"
    mkdir -p "$layer" "$merged"
    local copy words source destination
    while IFS= read -r copy; do
        read -r -a words <<<"$copy"
        [[ ${#words[@]} -eq 3 && "${words[0]}" == --from=* ]] || die "only 'COPY --from=STAGE SOURCE DEST' is supported here: COPY $copy"
        source="${words[1]}"; destination="${words[2]}"
        case "$(basename "$source")" in
            "$(basename "$binary")") install -D -m 0755 -o root -g root "$binary" "$layer$destination" ;;
            swift-backtrace-static) install -D -m 0755 -o root -g root "$backtracer" "$layer$destination" ;;
            *) die "COPY of $source: this script knows only the server binary and swift-backtrace-static" ;;
        esac
        echo "COPY $source -> $destination"
    done < <(stage_instructions "$stage" COPY)
    [[ -d "$rootfs$workdir" ]] || install -d -m 0755 "$layer$workdir"

    # A named volume starts as a copy of the image's folder, ownership included.
    [[ -n "$data_dir" && -d "$rootfs$data_dir" ]] || fail "the service user's home $data_dir is not a folder of the image"
    cp -a "$rootfs$data_dir" "$data"

    {
        echo '#!/bin/bash'
        echo '# Generated by docker/verify-rootfs.sh: runs inside fresh mount/net/pid/ipc/uts namespaces.'
        echo 'set -euo pipefail'
        declare -p rootfs layer merged data data_dir workdir IMAGE_UID IMAGE_GID CONTAINER_ENV
        cat <<'SCRIPT'
# The image: the COPY layer over the runtime root, read-only (compose.yaml: read_only: true).
mount -t overlay overlay -o "lowerdir=$layer:$rootfs" "$merged"
mount -t proc -o nosuid,nodev,noexec proc "$merged/proc"
mount -t tmpfs -o nosuid,mode=0755,size=64k tmpfs "$merged/dev"
for node in null zero full random urandom tty; do
    : >"$merged/dev/$node"
    mount --bind "/dev/$node" "$merged/dev/$node"
done
ln -s /proc/self/fd "$merged/dev/fd"
ln -s /proc/self/fd/0 "$merged/dev/stdin"
ln -s /proc/self/fd/1 "$merged/dev/stdout"
ln -s /proc/self/fd/2 "$merged/dev/stderr"
mkdir "$merged/dev/shm"
mount -t tmpfs -o nosuid,nodev,noexec,size=16m shm "$merged/dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777,size=16m tmpfs "$merged/tmp"
mount --bind "$data" "$merged$data_dir"
ip link set lo up
hostname forge-push-token
# Default signal dispositions (a background job of a script starts with SIGINT and SIGQUIT
# ignored), the image's environment alone, no_new_privs, then the image's USER and WORKDIR.
exec env --default-signal -i "${CONTAINER_ENV[@]}" /usr/bin/setpriv --no-new-privs -- \
    /usr/sbin/chroot --userspec="$IMAGE_UID:$IMAGE_GID" "$merged" \
    /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "$@"
SCRIPT
    } >"$WORK/container.sh"

    section "checks (in namespaces of their own; traffic on their loopback only)"
    local name
    name="$(awk -F: -v uid="$IMAGE_UID" '$3 == uid { print $1 }' "$rootfs/etc/passwd")"
    [[ "$IMAGE_UID" != 0 && -n "$name" ]] || fail "USER $user is root or has no passwd entry"
    [[ "$(stat -c '%u:%g' "$rootfs$data_dir")" == "$IMAGE_UID:$IMAGE_GID" ]] \
        || fail "$data_dir is owned by $(stat -c '%u:%g' "$rootfs$data_dir"), not $IMAGE_UID:$IMAGE_GID"
    pass "USER $user is the system user '$name' ($(awk -F: -v uid="$IMAGE_UID" '$3 == uid { print $7 }' "$rootfs/etc/passwd")); its data folder $data_dir is $(stat -c '%u:%g, mode %a' "$rootfs$data_dir")"

    local log="$WORK/run.log" out
    start_container "$log" /lib64/ld-linux-x86-64.so.2 --list "${entrypoint[0]}"
    wait_container 10
    if [[ "$CONTAINER_STATUS" != 0 ]] || grep -q 'not found' "$log"; then
        cat "$log"; fail "the binary's libraries do not all resolve in the image"
    fi
    pass "every library of ${entrypoint[0]} resolves in the image: $(awk '/=>/ { printf "%s ", $3 }' "$log")"

    start_container "$log" "${entrypoint[@]}" --version
    wait_container 10
    out="$(cat "$log")"
    [[ "$CONTAINER_STATUS" == 0 && "$out" == "forge-push-token-server $(sed -n 's/^ARG VERSION=\(.*\)$/\1/p' "$DOCKERFILE" | tr -d '"')" ]] \
        || fail "--version in the image: status $CONTAINER_STATUS, output '$out'"
    pass "--version in the image: $out"

    start_container "$log" timeout "$health_timeout" "${health_cmd[@]}"
    wait_container $((health_timeout + 5))
    [[ "$CONTAINER_STATUS" == 1 ]] || { cat "$log"; fail "HEALTHCHECK with nothing listening should exit 1, exited $CONTAINER_STATUS"; }
    pass "HEALTHCHECK ${health_cmd[*]} exits 1 when nothing listens"

    local server_log="$WORK/server.log"
    start_service "$server_log" "${entrypoint[@]}"
    local server_container=$CONTAINER_PID server_pid=$SERVICE_PID
    wait_for_log "$server_log" "listening on http://0.0.0.0:$port" 10 \
        || { cat "$server_log"; fail "no 'listening on http://0.0.0.0:$port' within 10 s"; }
    pass "the service starts as PID $(awk '/^NSpid:/ { print $NF }' "/proc/$server_pid/status") of its namespace: $(grep -o 'listening on .*' "$server_log")"

    local status_file="/proc/$server_pid/status"
    [[ "$(awk '/^Uid:/ { print $2 ":" $3 }' "$status_file")" == "$IMAGE_UID:$IMAGE_UID" \
        && "$(awk '/^Gid:/ { print $2 ":" $3 }' "$status_file")" == "$IMAGE_GID:$IMAGE_GID" \
        && "$(awk '/^NoNewPrivs:/ { print $2 }' "$status_file")" == 1 \
        && "$(awk '/^CapEff:/ { print $2 }' "$status_file")" == 0000000000000000 \
        && "$(awk '/^CapPrm:/ { print $2 }' "$status_file")" == 0000000000000000 ]] \
        || { grep -E '^(Uid|Gid|NoNewPrivs|Cap)' "$status_file"; fail "the service does not run as $user without privileges"; }
    pass "the service runs as uid/gid $IMAGE_UID/$IMAGE_GID, no capabilities, no_new_privs"

    local status=0
    EXEC_TIMEOUT="$health_timeout" container_exec "${health_cmd[@]}" || status=$?
    [[ "$status" == 0 ]] || { cat "$server_log"; fail "HEALTHCHECK against the running service exited $status"; }
    pass "HEALTHCHECK ${health_cmd[*]} exits 0 against the running service (run like docker exec, as $user)"

    out="$(container_curl -i "http://127.0.0.1:$port/healthz" | tr -d '\r')"
    [[ "$out" == "HTTP/1.1 200"* && "$out" == *'{"status":"ok"}' ]] || fail "GET /healthz: $out"
    pass "GET /healthz: 200 $(tail -n 1 <<<"$out")"

    local events="$WORK/events.txt"
    /usr/bin/nsenter --target "$SERVICE_PID" --net -- curl -sS -N --max-time 30 "http://127.0.0.1:$port/token/stream" >"$events" 2>"$WORK/events.err" 9>&- &
    local stream_pid=$!
    STARTED_PIDS+=("$stream_pid")
    wait_for_log "$events" 'data: {"token":null}' 5 || { cat "$events"; fail "no first SSE event within 5 s"; }
    pass "GET /token/stream: first event at once: $(grep -m1 '^id:' "$events"), $(grep -m1 '^data:' "$events")"

    out="$(container_curl -i -d "$TOKEN" "http://127.0.0.1:$port/register" | tr -d '\r')"
    # JSON members in any order.
    [[ "$out" == "HTTP/1.1 200"* && "$(tail -n 1 <<<"$out")" == *"\"token\":\"$TOKEN\""* \
        && "$(tail -n 1 <<<"$out")" == *'"changed":true'* ]] || fail "POST /register: $out"
    pass "POST /register: 200 $(tail -n 1 <<<"$out")"

    out="$(container_curl -i "http://127.0.0.1:$port/token" | tr -d '\r')"
    [[ "$out" == "HTTP/1.1 200"* && "$out" == *"{\"token\":\"$TOKEN\"}" ]] || fail "GET /token: $out"
    pass "GET /token: 200 $(tail -n 1 <<<"$out")"

    wait_for_log "$events" "data: {\"token\":\"$TOKEN\"}" 5 || { cat "$events"; fail "no SSE event for the registered token within 5 s"; }
    grep -q '^id: 1$' "$events" || { cat "$events"; fail "the change event does not carry id 1"; }
    pass "GET /token/stream: change event id: 1, data: {\"token\":\"${TOKEN:0:8}…\"}"

    status=0
    out="$(container_exec /bin/sh -c 'touch /usr/local/bin/probe' 2>&1)" || status=$?
    [[ "$status" != 0 && "$out" == *"Read-only file system"* ]] || fail "the root should be read-only: status $status, '$out'"
    container_exec /bin/sh -c "touch '$data_dir/.probe' && rm '$data_dir/.probe'" \
        || fail "the service user cannot write its data folder $data_dir"
    pass "the root is read-only; the data folder (a volume) is writable by $user"

    local t0 elapsed
    t0=$EPOCHREALTIME
    kill -TERM "$server_pid"
    CONTAINER_PID=$server_container
    wait_container 10
    elapsed="$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')"
    [[ "$CONTAINER_STATUS" == 0 ]] || { cat "$server_log"; fail "after SIGTERM the service exited with status $CONTAINER_STATUS"; }
    awk -v e="$elapsed" -v l="$SHUTDOWN_LIMIT_SECONDS" 'BEGIN { exit !(e <= l) }' \
        || fail "the service took ${elapsed}s to exit after SIGTERM (limit ${SHUTDOWN_LIMIT_SECONDS}s)"
    status=0
    for _ in $(seq 100); do kill -0 "$stream_pid" 2>/dev/null || break; sleep 0.05; done
    wait "$stream_pid" || status=$?
    [[ "$status" == 0 ]] || { cat "$WORK/events.err"; fail "the open event stream did not end cleanly on shutdown (curl status $status)"; }
    pass "SIGTERM: exit status 0 after ${elapsed}s; the open event stream ended cleanly"

    # A crash: the runtime's handler runs the image's backtracer (SWIFT_BACKTRACE). A SIGSEGV sent
    # with kill(2) only stands in for a fault here: after the report the runtime re-raises it, and
    # the kernel drops a signal that PID 1 of a namespace sends itself without a handler, so the
    # service would run on; a real fault (a trap, a bad access) is forced and does end it. Hence
    # the check reads the report, then ends the service with SIGKILL.
    local crash_log="$WORK/crash.log"
    start_service "$crash_log" "${entrypoint[@]}"
    wait_for_log "$crash_log" "listening on" 10 || { cat "$crash_log"; fail "the second instance did not start"; }
    kill -SEGV "$SERVICE_PID"
    if ! wait_for_log "$crash_log" 'Backtrace took' 20; then
        cat "$crash_log"
        fail "no Swift crash report within 20 s of SIGSEGV (is SWIFT_BACKTRACE's swift-backtrace path right?)"
    fi
    kill -KILL "$SERVICE_PID" 2>/dev/null || true
    wait_container 10
    if ! grep -q 'Program crashed' "$crash_log" || grep -q 'unable to locate swift-backtrace' "$crash_log"; then
        cat "$crash_log"; fail "no Swift crash report (SWIFT_BACKTRACE in the image)"
    fi
    grep -q ' forge-push-token-server .*/usr/local/bin/forge-push-token-server' "$crash_log" \
        || { cat "$crash_log"; fail "the crash report does not list the service's image"; }
    pass "a crash prints a report through the image's backtracer: $(grep -m1 'Program crashed' "$crash_log" | tr -d '*' | sed 's/^ *//;s/ *$//'); $(grep -m1 '^Thread' "$crash_log")"

    section "result"
    echo "verify-rootfs: PASS in $((SECONDS - started)) s"
    printf 'verify-rootfs: %d passed, 0 failed\n' "$PASSED"
}

main "$@"
