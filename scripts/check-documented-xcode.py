#!/usr/bin/env python3
"""Fails when the library's documentation names an Xcode that .github/workflows/library.yml does not
build with (issue 46, point 7: the docs promise only what the workflow checks).

1. The workflow's Xcode versions are the `xcode:` values of its jobs' matrices (`xcode: "16.0"`, or
   a list `xcode: ["16.0", "26.1"]`), read as text: this runs where no YAML library is installed.
2. Every "Xcode N" or "Xcode N.M" in docs/library.md and in the DocC catalog
   (Sources/ForgePushToken/ForgePushToken.docc/*.md) must be one of them ("Xcode 16" counts as 16.0).
3. The check can fail: it is run once more on a page naming an Xcode the matrix lacks, which must be
   reported.

Usage, from the repository root: python3 scripts/check-documented-xcode.py
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github/workflows/library.yml"
PAGES = [ROOT / "docs/library.md", *sorted((ROOT / "Sources/ForgePushToken/ForgePushToken.docc").glob("*.md"))]
NAMED = re.compile(r"\bXcode[ \u00a0]+(\d+(?:\.\d+)*)")


def normal(version: str) -> str:
    """`16` and `16.0` are the same Xcode; `16.0.1` stays as it is."""
    return version if "." in version else version + ".0"


def matrix_versions(workflow: str) -> set[str]:
    versions: set[str] = set()
    for match in re.finditer(r"^\s*-?\s*xcode:\s*(.+?)\s*$", workflow, re.M):
        value = match.group(1)
        versions.update(normal(v) for v in re.findall(r"\d+(?:\.\d+)+|\d+", value))
    return versions


def unmatched(text: str, versions: set[str]) -> list[str]:
    return sorted({m.group(0) for m in NAMED.finditer(text) if normal(m.group(1)) not in versions})


def main() -> int:
    versions = matrix_versions(WORKFLOW.read_text(encoding="utf-8"))
    if not versions:
        print(f"check-documented-xcode: no `xcode:` matrix values in {WORKFLOW.relative_to(ROOT)}", file=sys.stderr)
        return 1
    problems = []
    for page in PAGES:
        for name in unmatched(page.read_text(encoding="utf-8"), versions):
            problems.append(f"{page.relative_to(ROOT)} names {name}, which the workflow's matrix lacks")
    # The check can fail.
    if not unmatched("Needs Xcode 1.0 or later.", versions):
        problems.append("a page naming Xcode 1.0 was not reported")
    if problems:
        for problem in problems:
            print(f"check-documented-xcode: {problem}", file=sys.stderr)
        return 1
    print(f"check-documented-xcode: every Xcode the library's pages name is in the workflow's matrix: {sorted(versions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
