#!/usr/bin/env python3
"""Checks the module graph of docs/architecture.md ("Modules and what each may import") against the
code, and proves that the engine cannot name the token service's `Route` (issue 43).

1. The page's table (`| module | may import | holds |`) names every target of Package.swift that has
   a folder in Sources/ (and no other), and the package targets each one may import.
2. Package.swift gives each of those targets exactly the dependencies the table lists.
3. Every `import` (plain, `@testable`, inside `#if` or not) of a Swift file in Sources/<module>/ that
   names one of this package's targets is one the table allows (toolchain and platform modules,
   which are not targets, are not checked here).
4. With `--build-dir DIR` (a debug build's products, e.g. .build/debug), the engine is type-checked
   alone against only the module interfaces it may import (copied into an empty folder): its
   sources must compile, and the same sources with a probe file that names `Route` must fail with
   "cannot find type 'Route'": the engine cannot reach the token service's routes, even by
   importing it (`import TokenService` fails there too, which the probe also checks).

Exits 1 listing the problems.
"""
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs/architecture.md"
ENGINE = "MicroHTTPDServer"


def page_table():
    """module -> set of package targets it may import, from the page's table."""
    text = PAGE.read_text()
    section = text.split("## Modules and what each may import", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        match = re.match(r"^\|\s*`([\w-]+)`\s*\|([^|]*)\|", line)
        if match:
            table[match.group(1)] = set(re.findall(r"`([\w-]+)`", match.group(2)))
    return table


def package_targets():
    """target name -> set of its dependencies, from Package.swift's target declarations."""
    text = (ROOT / "Package.swift").read_text()
    targets = {}
    for match in re.finditer(r"\.(?:target|executableTarget|testTarget|systemLibrary)\(\s*name:\s*\"([\w-]+)\"", text):
        name = match.group(1)
        rest = text[match.end():]
        # The target's arguments end at the next target declaration.
        following = re.search(r"\.(?:target|executableTarget|testTarget|systemLibrary)\(", rest)
        body = rest[: following.start()] if following else rest
        deps = re.search(r"dependencies:\s*\[([^\]]*)\]", body)
        targets[name] = set(re.findall(r"\"([\w-]+)\"", deps.group(1))) if deps else set()
    return targets


def source_imports(module):
    """import name -> first 'file:line' that imports it, for the Swift files of Sources/<module>."""
    found = {}
    for path in sorted((ROOT / "Sources" / module).rglob("*.swift")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = re.match(r"^\s*(?:@testable\s+|@_exported\s+|(?:public|package|internal)\s+)?import\s+(?:\w+\s+)?([\w]+)", line)
            if match:
                found.setdefault(match.group(1), f"{path.relative_to(ROOT)}:{number}")
    return found


def probe(build_dir, allowed, problems):
    """Type-checks the engine against only `allowed`'s module interfaces, with and without a probe."""
    modules = Path(build_dir) / "Modules"
    if not modules.is_dir():
        modules = Path(build_dir)
    package = None
    for candidate in [Path(build_dir).parent / "debug.yaml", Path(build_dir) / ".." / "debug.yaml"]:
        if candidate.exists():
            found = re.search(r'-package-name","([^"]+)"', candidate.read_text())
            if found:
                package = found.group(1)
                break
    if package is None:
        problems.append(f"{build_dir}: no debug.yaml beside it to read the package name from (build first)")
        return
    with tempfile.TemporaryDirectory() as work:
        only = Path(work) / "Modules"
        only.mkdir()
        for name in allowed:
            module = modules / f"{name}.swiftmodule"
            if module.exists():
                (shutil.copytree if module.is_dir() else shutil.copy)(module, only / module.name)
        cflags = subprocess.run(["pkg-config", "--cflags", "libmicrohttpd"], capture_output=True, text=True).stdout.split()
        command = [
            "swiftc", "-typecheck", "-parse-as-library", "-swift-version", "6", "-module-name", ENGINE,
            "-package-name", package, "-I", str(only),
            "-enable-upcoming-feature", "ExistentialAny", "-enable-upcoming-feature", "MemberImportVisibility",
            "-module-cache-path", str(Path(work) / "cache"),
        ]
        for c_module in sorted(name for name in allowed if (ROOT / "Sources" / name / "module.modulemap").exists()):
            command += ["-Xcc", f"-fmodule-map-file={ROOT / 'Sources' / c_module / 'module.modulemap'}"]
        command += [flag for flag in cflags if flag.startswith("-I")]
        sources = [str(path) for path in sorted((ROOT / "Sources" / ENGINE).glob("*.swift"))]
        alone = subprocess.run(command + sources, capture_output=True, text=True)
        if alone.returncode != 0:
            problems.append(f"{ENGINE} does not type-check against only the modules it may import:\n"
                            + alone.stderr[-3000:])
            return
        for name, text, expected in [
            ("route", "let probe: Route? = nil\n", "cannot find type 'Route'"),
            ("import", "import TokenService\n", "no such module 'TokenService'"),
        ]:
            probe_file = Path(work) / f"probe_{name}.swift"
            probe_file.write_text(text)
            result = subprocess.run(command + sources + [str(probe_file)], capture_output=True, text=True)
            if result.returncode == 0:
                problems.append(f"{ENGINE} with a probe `{text.strip()}` compiled: the engine can reach the routes")
            elif expected not in result.stderr:
                problems.append(f"{ENGINE}'s probe `{text.strip()}` failed for another reason:\n" + result.stderr[-3000:])


def main():
    problems = []
    table = page_table()
    targets = package_targets()
    sources = {path.name for path in (ROOT / "Sources").iterdir() if path.is_dir()}
    in_sources = {name for name in targets if name in sources}
    for name in sorted(in_sources - table.keys()):
        problems.append(f"docs/architecture.md: the module table has no row for {name}")
    for name in sorted(table.keys() - in_sources):
        problems.append(f"docs/architecture.md: the module table names {name}, which is no target in Sources/")
    for name in sorted(in_sources & table.keys()):
        if targets[name] != table[name]:
            problems.append(f"Package.swift: {name} depends on {sorted(targets[name])}, "
                            f"the page's table says {sorted(table[name])}")
        for imported, where in sorted(source_imports(name).items()):
            if imported in targets and imported != name and imported not in table[name]:
                problems.append(f"{where}: {name} imports {imported}, which the page's table does not allow")
    if "--build-dir" in sys.argv:
        probe(sys.argv[sys.argv.index("--build-dir") + 1], table.get(ENGINE, set()), problems)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"check-module-graph: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    checked = "imports and Package.swift" + (", and the engine's probe" if "--build-dir" in sys.argv else "")
    print(f"check-module-graph: the page's graph of {len(table)} modules matches the {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
