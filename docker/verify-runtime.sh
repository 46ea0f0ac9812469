#!/usr/bin/env bash
# docker/verify-runtime.sh: proves, without a Docker engine, that the runtime stage of
# docker/Dockerfile installs every Debian package the server binary needs, and nothing else.
#
#   1. docker/check-version.sh (the image's version label and `--version` agree);
#   2. builds the release binary with exactly the `swift build` flags of the Dockerfile's build
#      stage (read from the Dockerfile), into a scratch path of its own;
#   3. lists the binary's NEEDED libraries (`readelf -d`), checks that no Swift runtime library is
#      among them (the stdlib and Foundation are linked statically) and that symbols are kept;
#   4. maps each library to its Debian package (`dpkg -S`) and fails unless the package is in the
#      runtime stage's `apt-get install` list (read from the Dockerfile, so the two cannot drift) or
#      in the package set of debian:bookworm-slim itself (BOOKWORM_SLIM_PACKAGES below); and fails
#      when the install list holds a package that no NEEDED library comes from (but for the data
#      packages of RUNTIME_DATA_PACKAGES below, which hold files the binary reads, not libraries);
#   5. reports the binary's size and fails above FORGE_PUSH_TOKEN_MAX_BINARY_BYTES (28 MB; it was 25 MB until TLS,
#      Sentinel and the delivery probe for Redis brought the binary to about 25.2 MB, then 27 MB
#      until the write path's fault handling (answers kept for the stop, the Redis batch and its
#      deadlines, the state file's decisions, paced stream ages) brought it to about 27.2 MB).
#
# This machine is Debian 12 like the swift:6.3-bookworm build image, so the sonames and packages
# found here are the ones the image build sees.
#
# Usage, from the repository root: bash docker/verify-runtime.sh
# Environment: FORGE_PUSH_TOKEN_DOCKER_SCRATCH (default /tmp/docker-scratch), the build folder;
#              FORGE_PUSH_TOKEN_MAX_BINARY_BYTES (default 28000000);
#              FORGE_PUSH_TOKEN_DOCKERFILE (default docker/Dockerfile), to try a variant.
#
# docker/verify-rootfs.sh sources this file for its Dockerfile-reading functions; `main` runs only
# when the file is executed.
set -euo pipefail

# The packages of debian:bookworm-slim: Priority "required" plus apt, which is what
# `debootstrap --variant=minbase bookworm` installs and what the image is made from (debuerreotype
# runs that debootstrap, then removes documentation files, not packages). docker/verify-rootfs.sh
# checks this list against a real minbase bootstrap and fails if any of these is missing there.
BOOKWORM_SLIM_PACKAGES=(
    adduser apt base-files base-passwd bash bsdutils coreutils dash debconf
    debian-archive-keyring debianutils diffutils dpkg e2fsprogs findutils gcc-12-base gpgv grep
    gzip hostname init-system-helpers libacl1 libapt-pkg6.0 libattr1 libaudit-common libaudit1
    libblkid1 libbz2-1.0 libc-bin libc6 libcap-ng0 libcap2 libcom-err2 libcrypt1 libdb5.3
    libdebconfclient0 libext2fs2 libffi8 libgcc-s1 libgcrypt20 libgmp10 libgnutls30 libgpg-error0
    libhogweed6 libidn2-0 liblz4-1 liblzma5 libmd0 libmount1 libnettle8 libp11-kit0 libpam-modules
    libpam-modules-bin libpam-runtime libpam0g libpcre2-8-0 libseccomp2 libselinux1
    libsemanage-common libsemanage2 libsepol2 libsmartcols1 libss2 libstdc++6 libsystemd0
    libtasn1-6 libtinfo6 libudev1 libunistring2 libuuid1 libxxhash0 libzstd1 login logsave mawk
    mount ncurses-base ncurses-bin passwd perl-base sed sysvinit-utils tar tzdata usr-is-merged
    util-linux util-linux-extra zlib1g
)

# Packages the runtime stage installs for files the binary reads at run time rather than for a
# library it links: ca-certificates, the system trust store that a rediss:// connection to a
# managed Redis with a public CA verifies against when no --redis-tls-ca-file is given
# (docs/replicas.md, "TLS to Redis").
RUNTIME_DATA_PACKAGES=(ca-certificates)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKERFILE="${FORGE_PUSH_TOKEN_DOCKERFILE:-$REPO_ROOT/docker/Dockerfile}"
SCRATCH="${FORGE_PUSH_TOKEN_DOCKER_SCRATCH:-/tmp/docker-scratch}"
MAX_BINARY_BYTES="${FORGE_PUSH_TOKEN_MAX_BINARY_BYTES:-28000000}"

section() { printf '\n== %s\n' "$*"; }
die() { printf '%s: FAIL: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# Reading docker/Dockerfile.

# Prints the Dockerfile's instructions one per line as "STAGE<TAB>INSTRUCTION ARGUMENTS":
# comment and blank lines dropped (Docker drops them inside continued lines too), lines ending in
# a backslash joined, runs of blanks squeezed to one space. STAGE is the `AS` name of the stage
# (or its index), "-" before the first FROM.
dockerfile_instructions() {
    awk '
        BEGIN { stage = "-"; index_ = -1; buf = "" }
        /^[[:space:]]*#/ { next }
        /^[[:space:]]*$/ { next }
        {
            line = $0
            continued = (line ~ /\\[[:space:]]*$/)
            if (continued) sub(/\\[[:space:]]*$/, "", line)
            buf = buf " " line
            if (continued) next
            gsub(/[[:space:]]+/, " ", buf); sub(/^ /, "", buf); sub(/ $/, "", buf)
            split(buf, words, " ")
            if (toupper(words[1]) == "FROM") {
                index_++
                stage = index_
                for (i = 2; i < length(words); i++) if (toupper(words[i]) == "AS") stage = words[i + 1]
            }
            print stage "\t" buf
            buf = ""
        }' "$DOCKERFILE"
}

# The arguments of every KEYWORD instruction of STAGE, one per line, in order.
stage_instructions() {
    local stage="$1" keyword="$2"
    dockerfile_instructions | awk -F '\t' -v stage="$stage" -v keyword="$keyword" '
        $1 == stage {
            n = index($2, " "); word = (n ? substr($2, 1, n - 1) : $2)
            if (toupper(word) == toupper(keyword)) print (n ? substr($2, n + 1) : "")
        }'
}

# The name of the last stage: the image `docker build` produces.
runtime_stage() { dockerfile_instructions | awk -F '\t' '$1 != "-" { s = $1 } END { print s }'; }

# The stage whose RUN calls `swift build`.
build_stage() {
    dockerfile_instructions | awk -F '\t' '$2 ~ /^RUN / && $2 ~ /swift build / { print $1; exit }'
}

# The runtime stage's `apt-get install` packages, one per line.
runtime_packages() {
    local stage
    stage="$(runtime_stage)"
    stage_instructions "$stage" RUN | sed 's/&&/\n/g; s/;/\n/g' \
        | awk '/apt-get( [^ ]+)* install( |$)/ {
                   seen = 0
                   for (i = 1; i <= NF; i++) {
                       if (seen && $i !~ /^-/) print $i
                       if ($i == "install") seen = 1
                   }
               }'
}

# The `swift build` arguments of the build stage, one per line (the first `swift build` that is
# not a `--show-bin-path` query).
build_flags() {
    local stage
    stage="$(build_stage)"
    [[ -n "$stage" ]] || die "no RUN with 'swift build' in $DOCKERFILE"
    stage_instructions "$stage" RUN | sed 's/&&/\n/g; s/;/\n/g' \
        | awk '/swift build / && !/--show-bin-path/ {
                   sub(/.*swift build /, ""); n = split($0, words, " ")
                   for (i = 1; i <= n; i++) print words[i]
                   exit
               }'
}

# Splits a Dockerfile exec-form JSON array of plain strings (no escapes) into lines.
json_array_lines() {
    local text="$1"
    [[ "$text" =~ ^\[.*\]$ ]] || die "expected an exec-form JSON array, got: $text"
    [[ "$text" != *\\* ]] || die "escapes in exec-form arrays are not supported here: $text"
    text="${text#[}"; text="${text%]}"
    local IFS=','
    local part
    for part in $text; do
        part="${part#"${part%%[![:space:]]*}"}"; part="${part%"${part##*[![:space:]]}"}"
        [[ "$part" =~ ^\"([^\"]*)\"$ ]] || die "not a plain JSON string in exec-form array: $part"
        printf '%s\n' "${BASH_REMATCH[1]}"
    done
}

# ---------------------------------------------------------------------------------------------
# Tools and the build.

apt_install() {
    echo "installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get -q update >/dev/null || die "apt-get update failed"
    timeout 600 apt-get -q install -y --no-install-recommends "$@" >/dev/null || die "apt-get install $* failed"
}

ensure_swift() {
    if ! command -v swift >/dev/null 2>&1; then
        [[ -x /opt/swift/usr/bin/swift ]] || die "no swift on PATH and none at /opt/swift/usr/bin"
        export PATH="$PATH:/opt/swift/usr/bin"
    fi
}

ensure_build_tools() {
    ensure_swift
    local missing=()
    command -v readelf >/dev/null 2>&1 || missing+=(binutils)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    dpkg-query -W -f '${Status}' libmicrohttpd-dev 2>/dev/null | grep -q 'ok installed' || missing+=(libmicrohttpd-dev)
    dpkg-query -W -f '${Status}' libhiredis-dev 2>/dev/null | grep -q 'ok installed' || missing+=(libhiredis-dev)
    dpkg-query -W -f '${Status}' libgnutls28-dev 2>/dev/null | grep -q 'ok installed' || missing+=(libgnutls28-dev)
    if [[ ${#missing[@]} -gt 0 ]]; then apt_install "${missing[@]}"; fi
}

# Builds the product with the Dockerfile's flags; prints the binary's path on standard output.
build_release_binary() {
    local flags product
    mapfile -t flags < <(build_flags)
    [[ ${#flags[@]} -gt 0 ]] || die "could not read the swift build flags from $DOCKERFILE"
    product="$(printf '%s\n' "${flags[@]}" | awk 'p { print; exit } $0 == "--product" { p = 1 }')"
    [[ -n "$product" ]] || die "the Dockerfile's swift build has no --product"
    echo "+ swift build ${flags[*]} --scratch-path $SCRATCH" >&2
    (cd "$REPO_ROOT" && timeout 1800 swift build "${flags[@]}" --scratch-path "$SCRATCH" >&2) \
        || die "swift build failed"
    local bin_path
    bin_path="$(cd "$REPO_ROOT" && swift build "${flags[@]}" --scratch-path "$SCRATCH" --show-bin-path)"
    [[ -x "$bin_path/$product" ]] || die "no binary at $bin_path/$product"
    printf '%s\n' "$bin_path/$product"
}

# The Debian package (without :arch) that ships the library at PATH.
package_of_library() {
    local path="$1" candidate owner
    local candidates=("$path" "$(readlink -f "$path")")
    # usrmerge: dpkg may know the file under /lib or under /usr/lib.
    for candidate in "${candidates[@]}"; do
        case "$candidate" in
            /usr/lib/*) candidates+=("/lib/${candidate#/usr/lib/}") ;;
            /lib/*|/lib64/*) candidates+=("/usr$candidate") ;;
        esac
    done
    for candidate in "${candidates[@]}"; do
        if owner="$(dpkg -S "$candidate" 2>/dev/null | head -n 1)"; then
            owner="${owner%%: *}"
            printf '%s\n' "${owner%%:*}"
            return 0
        fi
    done
    return 1
}

# ---------------------------------------------------------------------------------------------

main() {
    cd "$REPO_ROOT"
    local started=$SECONDS

    section "version"
    bash "$REPO_ROOT/docker/check-version.sh"

    section "build (flags from $DOCKERFILE)"
    ensure_build_tools
    local binary
    binary="$(build_release_binary)"
    echo "binary: $binary"

    local version expected
    expected="$(sed -n 's/^ARG VERSION=\(.*\)$/\1/p' "$DOCKERFILE" | tr -d '"')"
    version="$("$binary" --version)"
    [[ "$version" == "forge-push-token-server $expected" ]] \
        || die "the binary says '$version', the Dockerfile's label would say $expected"
    echo "--version: $version"

    section "binary"
    local bytes
    bytes="$(stat -c %s "$binary")"
    printf 'size: %d bytes (%s MB), budget %d bytes\n' "$bytes" "$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1000000 }')" "$MAX_BINARY_BYTES"
    local sections
    sections="$(readelf -SW "$binary")"
    grep -q ' \.symtab ' <<<"$sections" || die "the binary has no .symtab: symbols are needed for readable crash reports"
    local name hex code=0 data=0 symbols=0 unwind=0 meta=0 debug=0
    while read -r name hex; do
        case "$name" in
            .text) code=$((code + 16#$hex)) ;;
            .rodata|.data.rel.ro|.data) data=$((data + 16#$hex)) ;;
            .symtab|.strtab) symbols=$((symbols + 16#$hex)) ;;
            .eh_frame|.eh_frame_hdr) unwind=$((unwind + 16#$hex)) ;;
            swift5_*) meta=$((meta + 16#$hex)) ;;
            .debug_*) debug=$((debug + 16#$hex)) ;;
        esac
    done < <(sed -n 's/^ *\[ *[0-9]*\] *\([^ ]*\) *[^ ]* *[0-9a-f]* *[0-9a-f]* *\([0-9a-f]*\) .*/\1 \2/p' <<<"$sections")
    printf '  code (.text)               %10d\n' "$code"
    printf '  constants and data         %10d\n' "$data"
    printf '  symbol table (kept)        %10d\n' "$symbols"
    printf '  unwind tables (.eh_frame*) %10d\n' "$unwind"
    printf '  Swift metadata (swift5_*)  %10d\n' "$meta"
    printf '  DWARF (.debug_*)           %10d\n' "$debug"

    local needed
    mapfile -t needed < <(readelf -dW "$binary" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p')
    [[ ${#needed[@]} -gt 0 ]] || die "readelf found no NEEDED entries"
    echo "NEEDED: ${needed[*]}"
    local lib
    for lib in "${needed[@]}"; do
        case "$lib" in
            libswift*|libFoundation*|lib_Foundation*|libdispatch*|libBlocksRuntime*|libicu*)
                die "$lib is linked dynamically: the Swift runtime must be static (--static-swift-stdlib)" ;;
        esac
    done
    # SwiftPM always links with -rpath $ORIGIN (the binary's own folder, harmless); any other
    # search path, such as the toolchain's, would mean a dependency outside the image.
    local runpath
    runpath="$(readelf -dW "$binary" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*: \[\(.*\)\]/\2/p')"
    echo "RUNPATH: ${runpath:-none}"
    if [[ -n "$runpath" && "$runpath" != "\$ORIGIN" ]]; then
        die "the binary searches libraries in '$runpath': only \$ORIGIN is expected"
    fi

    section "packages (runtime stage of $DOCKERFILE vs debian:bookworm-slim)"
    local install_list
    mapfile -t install_list < <(runtime_packages)
    [[ ${#install_list[@]} -gt 0 ]] || die "could not read the runtime stage's apt-get install list"
    echo "runtime stage '$(runtime_stage)' installs: ${install_list[*]}"

    local resolved path package failures=0
    resolved="$(ldd "$binary")"
    declare -A used=()
    for lib in "${needed[@]}"; do
        path="$(awk -v lib="$lib" '$1 == lib && $2 == "=>" { print $3 } $1 ~ "/" lib "$" { print $1 }' <<<"$resolved" | head -n 1)"
        [[ -n "$path" && "$path" != "not" ]] || { echo "  $lib: NOT FOUND on this machine"; failures=$((failures + 1)); continue; }
        if ! package="$(package_of_library "$path")"; then
            echo "  $lib ($path): no Debian package owns it"; failures=$((failures + 1)); continue
        fi
        local version_of
        version_of="$(dpkg-query -W -f '${Version}' "$package" 2>/dev/null || echo '?')"
        used[$package]=1
        if printf '%s\n' "${install_list[@]}" | grep -qx -- "$package"; then
            printf '  %-24s %-48s %s %s  [runtime stage installs it]\n' "$lib" "$path" "$package" "$version_of"
        elif printf '%s\n' "${BOOKWORM_SLIM_PACKAGES[@]}" | grep -qx -- "$package"; then
            printf '  %-24s %-48s %s %s  [in debian:bookworm-slim]\n' "$lib" "$path" "$package" "$version_of"
        else
            printf '  %-24s %-48s %s %s  MISSING from the runtime stage\n' "$lib" "$path" "$package" "$version_of"
            failures=$((failures + 1))
        fi
    done
    for package in "${install_list[@]}"; do
        if printf '%s\n' "${RUNTIME_DATA_PACKAGES[@]}" | grep -qx -- "$package"; then
            echo "  $package: data the binary reads (RUNTIME_DATA_PACKAGES), no library"
        elif [[ -z "${used[$package]:-}" ]]; then
            echo "  $package: installed by the runtime stage but no NEEDED library comes from it (only what the binary needs)"
            failures=$((failures + 1))
        elif printf '%s\n' "${BOOKWORM_SLIM_PACKAGES[@]}" | grep -qx -- "$package"; then
            echo "  note: $package is already in debian:bookworm-slim"
        fi
    done
    [[ $failures -eq 0 ]] || die "$failures problem(s) with the runtime stage's package list"

    section "size"
    if [[ "$bytes" -gt "$MAX_BINARY_BYTES" ]]; then
        die "the binary is $bytes bytes, over the $MAX_BINARY_BYTES-byte budget"
    fi
    echo "ok: $bytes bytes <= $MAX_BINARY_BYTES"

    section "result"
    echo "verify-runtime: PASS in $((SECONDS - started)) s: ${#needed[@]} NEEDED libraries, all provided by debian:bookworm-slim or the runtime stage (${install_list[*]})"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
