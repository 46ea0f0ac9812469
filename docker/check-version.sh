#!/usr/bin/env bash
# docker/check-version.sh: fails unless the image's version label and the binary's `--version`
# come from the same number.
#
# The label is `ARG VERSION=…` at the top of docker/Dockerfile (a LABEL can only be filled from an
# ARG, never from something computed in a RUN); `--version` prints `serverVersion` from
# Sources/forge-push-token-server/Version.swift. This script compares the two literals, so a
# release that bumps one and not the other fails CI. (The Dockerfile's build stage also compares
# its ARG with what the freshly built binary prints, which catches `--build-arg VERSION=…`.)
#
# Usage, from anywhere: bash docker/check-version.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version_swift="$root/Sources/forge-push-token-server/Version.swift"
dockerfile="${FORGE_PUSH_TOKEN_DOCKERFILE:-$root/docker/Dockerfile}"

# Exactly one `let serverVersion = "X"` line.
mapfile -t swift_versions < <(sed -n 's/^[[:space:]]*let serverVersion = "\([^"]*\)"[[:space:]]*$/\1/p' "$version_swift")
if [[ ${#swift_versions[@]} -ne 1 || -z "${swift_versions[0]}" ]]; then
    echo "check-version: expected exactly one line 'let serverVersion = \"X\"' in $version_swift, found ${#swift_versions[@]}" >&2
    exit 1
fi

# Exactly one `ARG VERSION=X` (the global one; the stages re-declare it without a default).
mapfile -t docker_versions < <(sed -n 's/^ARG VERSION=\(.*\)$/\1/p' "$dockerfile" | sed 's/^"\(.*\)"$/\1/; s/[[:space:]]*$//')
if [[ ${#docker_versions[@]} -ne 1 || -z "${docker_versions[0]}" ]]; then
    echo "check-version: expected exactly one 'ARG VERSION=X' in $dockerfile, found ${#docker_versions[@]}" >&2
    exit 1
fi

swift_version="${swift_versions[0]}"
docker_version="${docker_versions[0]}"
if [[ "$swift_version" != "$docker_version" ]]; then
    echo "check-version: FAIL: Version.swift says $swift_version but docker/Dockerfile's ARG VERSION says $docker_version" >&2
    exit 1
fi
echo "check-version: ok: Version.swift and docker/Dockerfile both say $swift_version"
