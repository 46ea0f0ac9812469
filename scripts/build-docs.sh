#!/usr/bin/env bash
# Builds the DocC documentation of the ForgePushToken library with the toolchain's own docc, and
# fails on any DocC warning (a broken link, an unknown symbol) or on any public symbol that is
# not documented or not curated in a topic group of the catalog.
#   1. symbol graphs of the public API: swift build -Xswiftc -emit-symbol-graph, in a scratch
#      folder of its own (.build/docs/scratch), so the main build's flags are untouched;
#   2. docc convert Sources/ForgePushToken/ForgePushToken.docc --warnings-as-errors
#      --experimental-documentation-coverage, into .build/docs/ForgePushToken.doccarchive;
#   3. from the archive's documentation-coverage.json: every public symbol has an abstract;
#      from its render data: every public symbol is curated (its page's hierarchy passes
#      through a topic group, not only DocC's automatic "Topics").
# Read the result with: docc preview (see docs/library.md, "Reading the DocC documentation").
set -euo pipefail
cd "$(dirname "$0")/.."
out=.build/docs
graphs="$out/symbol-graphs"
archive="$out/ForgePushToken.doccarchive"
rm -rf "$archive"
mkdir -p "$graphs"

# The compiler writes the graphs when it compiles the module; an up-to-date build writes nothing,
# so the graphs of the last build are kept, and rebuilt from scratch if they are missing.
[ -f "$graphs/ForgePushToken.symbols.json" ] || rm -rf "$out/scratch"
swift build --target ForgePushToken --scratch-path "$out/scratch" \
  -Xswiftc -warnings-as-errors \
  -Xswiftc -emit-symbol-graph -Xswiftc -emit-symbol-graph-dir -Xswiftc "$PWD/$graphs" \
  -Xswiftc -symbol-graph-minimum-access-level -Xswiftc public \
  -Xswiftc -symbol-graph-skip-synthesized-members -Xswiftc -symbol-graph-skip-inherited-docs
# Only the library's own graph (and its extensions of other modules, if any).
find "$graphs" -name '*.symbols.json' ! -name 'ForgePushToken*' -delete

docc convert Sources/ForgePushToken/ForgePushToken.docc \
  --additional-symbol-graph-dir "$graphs" \
  --fallback-display-name ForgePushToken \
  --fallback-bundle-identifier ForgePushToken \
  --output-path "$archive" \
  --warnings-as-errors \
  --experimental-documentation-coverage --coverage-summary-level brief

python3 scripts/check-docs-coverage.py "$archive"
