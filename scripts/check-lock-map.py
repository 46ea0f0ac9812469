#!/usr/bin/env python3
"""Fails when docs/architecture.md's lock list leaves out a lock of Sources/ (issue 31).

Every lock in the Swift sources is a `Locked` (Sources/ForgePushToken/Locked.swift), or a
`PerThreadLocked` (Sources/ServerSupport/PerThreadLocked.swift: one `Locked` per thread's
shard). This finds each one declared, `let NAME = Locked(...)`, `let NAME: Locked<...>` or the
same with `PerThreadLocked` (comment lines are not read), with the type it is declared in, and requires the section "Locks, in the only order they
nest" of docs/architecture.md to name it:
  - a stored property as `Type.name`, or, in a table row or list that names several of one type,
    on a line holding both `Type.` and `.name`;
  - a lock local to a function (indented deeper than the type's members) on a line holding
    `Type.` and its name.
It also fails on any other lock primitive in Sources/ (a `pthread_mutex_t`, `Mutex<`, `NSLock`,
`os_unfair_lock`) outside Locked.swift, and on a lock the page names as `Type.name` that no longer
exists (a renamed or removed lock left in the page's table), written in full or, after the
first in a row, as `.name`.

Prints one line per problem, `FILE:LINE: what`, and exits 1 when there is one.

Usage: scripts/check-lock-map.py  (from anywhere inside the checkout)
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
HOME = "Sources/ForgePushToken/Locked.swift"

TYPE = re.compile(r"^(\s*)(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|fileprivate|private|final|open)\s+)*"
                  r"(class|struct|enum|actor|extension)\s+(\w+)")
LOCK = re.compile(r"^(\s*).*\b(?:let|var)\s+(\w+)\s*(?::\s*(?:PerThread)?Locked<|=\s*(?:PerThread)?Locked(?:<[^=]*>)?\s*[({])")
OTHER = re.compile(r"\bpthread_mutex_t\b|\bMutex<|\bNSLock\b|\bos_unfair_lock\b")


def section():
    text = PAGE.read_text()
    start = text.index("## Locks, in the only order they nest")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def locks():
    """(file, line, type, name, local) for every `Locked` declared in Sources."""
    found = []
    for path in sorted((ROOT / "Sources").rglob("*.swift")):
        name = str(path.relative_to(ROOT))
        if name == HOME:
            continue
        types = []  # (indent, type name)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.lstrip()
            if stripped.startswith("//"):
                continue
            indent = len(line) - len(stripped)
            if stripped.startswith("}") and types and types[-1][0] == indent:
                types.pop()  # the end of the innermost type
                continue
            declared = TYPE.match(line)
            if declared:
                types = [(i, t) for i, t in types if i < indent]
                types.append((indent, declared.group(3)))
                continue
            if OTHER.search(line):
                found.append((name, number, None, stripped, False))
            lock = LOCK.match(line)
            if lock and types:
                type_indent, owner = types[-1]
                found.append((name, number, owner, lock.group(2), indent > type_indent + 4))
    return found


def main():
    page = section()
    lines = page.splitlines()
    problems = []
    declared = set()
    for name, number, owner, lock, local in locks():
        if owner is None:
            problems.append(f"{name}:{number}: a lock that is not a Locked: {lock}")
            continue
        declared.add((owner, lock))
        if local:
            named = any(f"{owner}." in line and lock in line for line in lines)
        else:
            named = f"`{owner}.{lock}`" in page or any(
                f"`{owner}." in line and f".{lock}`" in line for line in lines)
        if not named:
            problems.append(f"{name}:{number}: `{owner}.{lock}` is not in docs/architecture.md's lock list")
    rows = "\n".join(line for line in lines if line.startswith("| `"))
    named = set(re.findall(r"`([A-Z]\w+)\.([a-z]\w*)`", rows))
    # A row that names several locks of one type writes the later ones as `.name`.
    for line in rows.splitlines():
        owners = set(re.findall(r"`([A-Z]\w+)\.[a-z]\w*`", line))
        if len(owners) == 1:
            named |= {(next(iter(owners)), lock) for lock in re.findall(r"`\.([a-z]\w*)`", line)}
    for owner, lock in sorted(named):
        if (owner, lock) not in declared and any(o == owner for o, _ in declared):
            problems.append(f"docs/architecture.md: `{owner}.{lock}` names no lock of {owner} (renamed or removed?)")
    for problem in problems:
        print(problem)
    if problems:
        print(f"check-lock-map: {len(problems)} problem(s)")
        return 1
    print(f"check-lock-map: the page names all {len(declared)} locks of Sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
