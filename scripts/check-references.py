#!/usr/bin/env python3
"""Fails when a Markdown file named in the repository does not exist in it.

Checks, over the files git tracks:
  1. Every `NAME.md` named in Sources/ (code comments, DocC), docs/ and the README resolves: relative to the naming file's folder, relative to the repository root, or as a
     bare name (no `/`) that exactly one tracked file has.
  2. `../shared/` (the team's folder beside the checkout, not part of the product) is named only
     in docs/ and the README; those names are not resolved (a lone clone has no ../shared).
  3. Every relative link `[text](target)` in a tracked Markdown file resolves to a tracked file or folder
     (the `#fragment` is ignored; `http:`, `https:`, `mailto:` and bare `#fragment` links are
     not checked here).
  4. Every section a Swift file in Sources/ cites after a Markdown file, as in
     `(docs/architecture.md, "Locks")` (comment lines joined, so a name may wrap), is a heading of
     that file: its text, or the start of it (`"Draining"` for `## Draining a replica`).

Prints one line per problem, `FILE:LINE: what`, and exits 1 when there is one.

Usage: scripts/check-references.py  (from anywhere inside the checkout)
"""
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

ROOT = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                           text=True, cwd=Path(__file__).parent).stdout.strip())
SCANNED = ("Sources/", "docs/", "README.md")
SHARED_ALLOWED = ("docs/", "README.md")
# A Markdown file name: path characters ending in `.md`, not part of a longer word or URL.
MD_NAME = re.compile(r"(?<![\w./:-])((?:\.\.?/)*[\w][\w./-]*\.md)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], check=True, capture_output=True, cwd=ROOT).stdout
    return [name for name in out.decode().split("\0") if name]


def normalise(path: PurePosixPath):
    parts = []
    for part in path.parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def main() -> int:
    files = tracked()
    present = set(files)
    folders = {str(PurePosixPath(name).parent) for name in files}
    by_base = {}
    for name in files:
        by_base.setdefault(PurePosixPath(name).name, []).append(name)

    def resolves(name: str, naming: str) -> bool:
        here = PurePosixPath(naming).parent
        for candidate in (normalise(here / name), normalise(PurePosixPath(name))):
            if candidate is not None and (candidate in present or candidate in folders):
                return True
        return "/" not in name and len(by_base.get(name, [])) == 1

    problems = []
    for naming in files:
        scanned = naming.startswith(SCANNED)
        if not (scanned or naming.endswith(".md")) or (ROOT / naming).is_symlink():
            continue
        try:
            text = (ROOT / naming).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{naming}:{number}"
            if scanned and "../shared/" in line and not naming.startswith(SHARED_ALLOWED):
                problems.append(f"{where}: names ../shared/, which only docs/ and the README may name")
            for match in MD_NAME.finditer(line) if scanned else ():
                name = match.group(1)
                if name.startswith("../shared/") or "://" in line[max(0, match.start() - 80):match.start()]:
                    continue
                if not resolves(name, naming):
                    problems.append(f"{where}: names {name}, which is not in the repository")
            if naming.endswith(".md"):
                for match in LINK.finditer(line):
                    target = match.group(1).split("#", 1)[0]
                    if not target or re.match(r"^[a-z]+:", target) or target.startswith("../shared/"):
                        continue
                    resolved = normalise(PurePosixPath(naming).parent / target)
                    if resolved is None or not (resolved in present or resolved in folders):
                        problems.append(f"{where}: links to {match.group(1)}, which does not resolve")
    problems += cited_sections(files, resolves)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check-references: {len(problems)} problem(s)")
        return 1
    print("check-references: every named Markdown file and relative link resolves")
    return 0


CITATION = re.compile(r"([\w./-]+\.md)(?:\)|\]|`)?,\s+\"([^\"]{1,100})\"")


def headings(path: Path):
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if match:
            found.add(match.group(1))
    return found


def cited_sections(files, resolves):
    """Check 4: `(FILE.md, "Section")` in Sources/'s Swift comments names a heading of FILE.md."""
    problems = []
    cache = {}
    for naming in files:
        if not (naming.startswith("Sources/") and naming.endswith(".swift")):
            continue
        lines = (ROOT / naming).read_text(encoding="utf-8").splitlines()
        # The comment text, lines joined by a space, and where each line starts in it.
        joined, starts = "", []
        for line in lines:
            starts.append(len(joined))
            comment = re.match(r"^\s*//+\s?(.*)$", line)
            joined += (comment.group(1) if comment else "\u0000") + " "
        for match in CITATION.finditer(joined):
            name, section = match.group(1), " ".join(match.group(2).split())
            candidates = [c for c in (f"docs/{PurePosixPath(name).name}", name) if (ROOT / c).is_file()]
            if not candidates:
                continue  # check 1 reports a file that does not resolve
            target = candidates[0]
            if target not in cache:
                cache[target] = headings(ROOT / target)
            if not any(h == section or h.startswith(section) or h.replace("`", "").startswith(section)
                       for h in cache[target]):
                number = max(i for i, start in enumerate(starts) if start <= match.start()) + 1
                problems.append(f"{naming}:{number}: cites {target}, \"{section}\", which is no heading there")
    return problems


if __name__ == "__main__":
    sys.exit(main())
