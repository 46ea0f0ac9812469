#!/usr/bin/env python3
"""Fails unless every public symbol of a DocC archive is documented and curated.

Reads documentation-coverage.json, which `docc convert --experimental-documentation-coverage`
writes into the archive: one entry per symbol page, with `hasAbstract` (the symbol has a summary)
and `isCurated` (a topic group of the catalog lists it, rather than DocC's automatic grouping).
The module page itself is not curated anywhere and is left out.

Usage: check-docs-coverage.py PATH/TO/ForgePushToken.doccarchive
"""
import json
import sys
from pathlib import Path


def main() -> int:
    archive = Path(sys.argv[1])
    entries = json.loads((archive / "documentation-coverage.json").read_text())
    symbols = [e for e in entries if e["kind"].get("isSymbol") and e["kind"]["name"] != "Module"]
    if not symbols:
        print("check-docs-coverage: no symbols in the coverage data", file=sys.stderr)
        return 1
    missing = []
    for entry in sorted(symbols, key=lambda e: e["referencePath"]):
        path = entry["referencePath"].split("/documentation/", 1)[-1]
        if not entry["hasAbstract"]:
            missing.append(f"  not documented: {path}")
        if not entry["isCurated"]:
            missing.append(f"  not curated in a topic group: {path}")
    if missing:
        print("check-docs-coverage: DocC coverage is below 100 %:", file=sys.stderr)
        print("\n".join(missing), file=sys.stderr)
        return 1
    print(f"check-docs-coverage: all {len(symbols)} public symbols documented and curated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
