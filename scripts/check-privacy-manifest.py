#!/usr/bin/env python3
"""Checks the library's privacy manifest, Sources/ForgePushToken/Resources/PrivacyInfo.xcprivacy.

1. It parses as a property list (plistlib, the XML format Xcode writes) whose root is a dictionary.
2. Every key is one of Apple's documented privacy-manifest keys ("Privacy manifest files" and
   "Describing use of required reason API" in Apple's developer documentation), with the value type
   Apple gives it; every API category and reason code is one Apple lists.
3. It declares no tracking and no tracking domains, and no collected data (the app's upload closure
   sends the token; the library itself sends nothing).
4. Every required-reason API the library's sources call (Sources/ForgePushToken/*.swift, comments
   left out) is declared with at least one reason, and nothing is declared that the sources do not
   call.
5. Package.swift ships it as a resource of the ForgePushToken target.

Usage, from the repository root: python3 scripts/check-privacy-manifest.py
"""

import pathlib
import plistlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "Sources/ForgePushToken/Resources/PrivacyInfo.xcprivacy"

# Apple's documented top-level keys and their value types.
TOP_LEVEL = {
    "NSPrivacyTracking": bool,
    "NSPrivacyTrackingDomains": list,
    "NSPrivacyCollectedDataTypes": list,
    "NSPrivacyAccessedAPITypes": list,
}
# The keys of one NSPrivacyAccessedAPITypes entry.
API_ENTRY = {"NSPrivacyAccessedAPIType": str, "NSPrivacyAccessedAPITypeReasons": list}
# The required-reason API categories and their approved reason codes (Apple, "Describing use of
# required reason API").
REASONS = {
    "NSPrivacyAccessedAPICategoryFileTimestamp": {"DDA9.1", "C617.1", "3B52.1", "0A2A.1"},
    "NSPrivacyAccessedAPICategorySystemBootTime": {"35F9.1", "8FFB.1", "3D61.1"},
    "NSPrivacyAccessedAPICategoryDiskSpace": {"85F4.1", "E174.1", "7D9E.1", "B728.1"},
    "NSPrivacyAccessedAPICategoryActiveKeyboards": {"3EC4.1", "54BD.1"},
    "NSPrivacyAccessedAPICategoryUserDefaults": {"CA92.1", "1C8F.1", "C56D.1", "AC6B.1"},
}
# What in Swift source calls an API of each category (Apple's lists of APIs per category, the
# names a Swift file would spell).
CALLS = {
    "NSPrivacyAccessedAPICategoryFileTimestamp": r"\b(creationDate|modificationDate|fileModificationDate|"
    r"contentModificationDateKey|creationDateKey|getattrlist|getattrlistbulk|fgetattrlist|fstat|fstatat|lstat|"
    r"getattrlistat)\b",
    "NSPrivacyAccessedAPICategorySystemBootTime": r"\b(systemUptime|mach_absolute_time)\b",
    "NSPrivacyAccessedAPICategoryDiskSpace": r"\b(volumeAvailableCapacity\w*Key|volumeTotalCapacityKey|"
    r"systemFreeSize|systemSize|statfs|statvfs|fstatfs|fstatvfs|getattrlist)\b",
    "NSPrivacyAccessedAPICategoryActiveKeyboards": r"\bactiveInputModes\b",
    "NSPrivacyAccessedAPICategoryUserDefaults": r"\b(UserDefaults|NSUserDefaults)\b",
}


def strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in source.splitlines())


def main() -> int:
    problems = []
    try:
        with MANIFEST.open("rb") as f:
            manifest = plistlib.load(f)
    except Exception as error:  # noqa: BLE001 - any parse failure is the finding
        print(f"check-privacy-manifest: {MANIFEST.relative_to(ROOT)} is not a property list: {error}", file=sys.stderr)
        return 1
    if not isinstance(manifest, dict):
        print("check-privacy-manifest: the root is not a dictionary", file=sys.stderr)
        return 1
    for key, value in manifest.items():
        if key not in TOP_LEVEL:
            problems.append(f"{key}: not one of Apple's documented privacy-manifest keys")
        elif not isinstance(value, TOP_LEVEL[key]):
            problems.append(f"{key}: should be a {TOP_LEVEL[key].__name__}")
    for key in TOP_LEVEL:
        if key not in manifest:
            problems.append(f"{key}: missing")
    if manifest.get("NSPrivacyTracking") is not False:
        problems.append("NSPrivacyTracking: the library does not track; it must be false")
    if manifest.get("NSPrivacyTrackingDomains"):
        problems.append("NSPrivacyTrackingDomains: the library contacts no domain; it must be empty")
    if manifest.get("NSPrivacyCollectedDataTypes"):
        problems.append("NSPrivacyCollectedDataTypes: the library collects nothing itself; it must be empty")

    declared = {}
    for index, entry in enumerate(manifest.get("NSPrivacyAccessedAPITypes") or []):
        if not isinstance(entry, dict):
            problems.append(f"NSPrivacyAccessedAPITypes[{index}]: not a dictionary")
            continue
        for key, value in entry.items():
            if key not in API_ENTRY:
                problems.append(f"NSPrivacyAccessedAPITypes[{index}].{key}: not a documented key")
            elif not isinstance(value, API_ENTRY[key]):
                problems.append(f"NSPrivacyAccessedAPITypes[{index}].{key}: should be a {API_ENTRY[key].__name__}")
        category = entry.get("NSPrivacyAccessedAPIType")
        reasons = entry.get("NSPrivacyAccessedAPITypeReasons") or []
        if category not in REASONS:
            problems.append(f"NSPrivacyAccessedAPITypes[{index}]: unknown category {category!r}")
            continue
        if not reasons:
            problems.append(f"{category}: no reason given")
        for reason in reasons:
            if reason not in REASONS[category]:
                problems.append(f"{category}: {reason!r} is not one of Apple's reasons for it")
        declared[category] = reasons

    sources = "\n".join(strip_comments(p.read_text()) for p in sorted((ROOT / "Sources/ForgePushToken").glob("*.swift")))
    for category, pattern in CALLS.items():
        called = re.search(pattern, sources) is not None
        if called and category not in declared:
            problems.append(f"{category}: the library calls it ({re.search(pattern, sources).group(0)}) but does not declare it")
        if not called and category in declared:
            problems.append(f"{category}: declared, but the library does not call it")

    package = (ROOT / "Package.swift").read_text()
    if not re.search(r'name: "ForgePushToken",\s*resources: \[\.copy\("Resources/PrivacyInfo\.xcprivacy"\)\]', package):
        problems.append("Package.swift: PrivacyInfo.xcprivacy is not a resource of the ForgePushToken target")

    for problem in problems:
        print(f"check-privacy-manifest: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"check-privacy-manifest: {MANIFEST.relative_to(ROOT)} parses, uses only documented keys, "
          f"declares no tracking or collection, and declares {sorted(declared) or 'no'} required-reason APIs "
          "matching the library's calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
