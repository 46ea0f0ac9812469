#!/usr/bin/env python3
"""Fails when a second definition appears of something issue 31 (point 5) made single.

Each rule below names one thing the code must define once, a pattern that finds its
definitions in the Swift files of Sources/ (comment lines, `//` and `///`, are not read), and
where the one definition lives. A rule fails when the pattern matches anywhere else, or more
often than allowed. The rules:

  maxTokenBytes           `static let maxTokenBytes` once, in TokenState.swift.
  version-exhausted text  one `let` of it (TokenState.versionExhausted) and no other wording.
  histogram               one `struct Histogram`, in ServerSupport.
  Prometheus text         `# HELP` / `# TYPE` written only by PrometheusText (see EXCEPTIONS).
  JSON string escaper     `\\u2028` written only by JSONText; `JSONEncoder` only in JSONBody.swift
                          (the owner's body encoder) and the app library's ServerRecord.swift.
  Redis timing defaults   each of the link's timings given a number once, in RedisLinkStateMachine.
  CLI flags               no flag name (`--port`, `"port"`) outside CommandLineFlag.swift in
                          Sources/forge-push-token-server.
  strerror                `strerror(` called once (systemErrorText).
  time                    ContinuousClock only: no `DispatchTime...uptimeNanoseconds`, no
                          `clock_gettime(CLOCK_MONOTONIC`; one monotonicSeconds() (RedisConnection.swift)
                          reads it as the Double seconds the Redis state machine is handed.
  log-rate limiter        one `struct ...Log...Limiter` (LogRateLimiter, in ServerSupport).
  Duration units          a `Duration`'s attoseconds divided into units only in ServerSupport's
                          DurationUnits.swift (the state file's two waits excepted, EXCEPTIONS).
  server log level        one `enum ...LogLevel` outside the app library (ServerLogLevel), and no
                          server module names PushTokenManager.LogLevel (issue 31, point 6).
  free_port               one `def free_port`, in e2e/e2e_support.py; a shell script's
                          `free_port()` only calls it (`e2e_support.py free-port`).

Prints one line per problem, `FILE:LINE: what`, and exits 1 when there is one.

Usage: scripts/check-single-definitions.py  (from anywhere inside the checkout)
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                           text=True, cwd=Path(__file__).parent).stdout.strip())

# Files allowed to hold a match besides the one definition, each with the reason.
EXCEPTIONS: dict[str, set[str]] = {
    # The state file's group commit is being reworked as a state machine (issue 43's fifth point);
    # its two waits move to DurationUnits with it.
    "Duration units": {"Sources/ForgePushTokenOwner/StateFileStore.swift"},
}


def swift_files():
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "Sources"],
                         check=True, capture_output=True, cwd=ROOT).stdout
    return sorted(name for name in out.decode().split("\0") if name.endswith(".swift") and (ROOT / name).exists())


def code_lines(name):
    for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
        if not line.lstrip().startswith("//"):
            yield number, line


def flag_names():
    text = (ROOT / "Sources/forge-push-token-server/CommandLineFlag.swift").read_text()
    names = []
    for match in re.finditer(r'^\s*case (\w+)(?: = "([a-z-]+)")?\s*$', text, re.M):
        names.append(match.group(2) or match.group(1))
    return names


def main():
    problems = []
    files = swift_files()

    def rule(what, pattern, home, limit=1, where=lambda name: True):
        """`pattern` may match only in files whose path ends in one of `home`, at most `limit` times."""
        found = []
        allowed = EXCEPTIONS.get(what, set())
        for name in files:
            if not where(name):
                continue
            for number, line in code_lines(name):
                if re.search(pattern, line):
                    found.append((name, number))
        homes = (home,) if isinstance(home, str) else home
        inside = [hit for hit in found if hit[0].endswith(homes)]
        outside = [hit for hit in found if not hit[0].endswith(homes) and hit[0] not in allowed]
        for name, number in outside:
            problems.append(f"{name}:{number}: a second definition of the {what} (the one is in {' or '.join(homes)})")
        if len(inside) > limit:
            for name, number in inside[limit:]:
                problems.append(f"{name}:{number}: the {what} is defined more than {limit} time(s) here")
        if not inside:
            problems.append(f"{homes[0]}: the {what} is not defined there any more (update this check)")

    rule("maxTokenBytes", r"\blet maxTokenBytes\b", "Sources/ForgePushTokenOwner/TokenState.swift")
    rule("version-exhausted text", r"\blet \w*[Ee]xhaust\w*(\s*:\s*String)?\s*=\s*$|\blet \w*[Ee]xhaust\w*(\s*:\s*String)?\s*=\s*\"",
         "Sources/ForgePushTokenOwner/TokenState.swift")
    rule("version-exhausted text", r"\"[^\"]*(largest one|last one the store)",
         "Sources/ForgePushTokenOwner/TokenState.swift")
    rule("histogram", r"\b(struct|class|enum) \w*Histogram\b", "Sources/ServerSupport/PrometheusText.swift")
    rule("Prometheus text", r"# (HELP|TYPE)\b", "Sources/ServerSupport/PrometheusText.swift")
    rule("JSON string escaper", r"\\u2028|\\u\{2028\}|0x2028|\bjsonEscape|func escapeJSON",
         "Sources/ServerSupport/JSONText.swift", limit=3,
         where=lambda name: not name.endswith("ServerLog.swift"))
    rule("JSON encoder", r"\bJSONEncoder\(", ("Sources/ServerSupport/JSONBody.swift",
                                              "Sources/ForgePushToken/ServerRecord.swift"), limit=2)
    for timing in ("heartbeatInterval", "heartbeatTimeout", "checkInterval", "refreshInterval", "probeInterval",
                   "probeTimeout"):
        rule(f"Redis timing default {timing}", rf"\b(var|let) {timing}\s*(:\s*Double)?\s*=\s*[0-9]",
             "Sources/RedisTokenStore/RedisLinkStateMachine.swift")
    rule("log-rate limiter", r"\b(struct|class|enum) \w*Log\w*Limiter\b", "Sources/ServerSupport/LogRateLimiter.swift")
    rule("Duration units", r"attoseconds\s*/|\.components\.attoseconds", "Sources/ServerSupport/DurationUnits.swift",
         limit=4)
    rule("strerror wrapper", r"(?<![\w])strerror\(", "Sources/ServerSupport/SystemErrorText.swift")

    # CLI flags: the names live in CommandLineFlag.swift only.
    server = "Sources/forge-push-token-server/"
    names = flag_names()
    if len(names) < 30:
        problems.append(f"{server}CommandLineFlag.swift: found only {len(names)} flags (update this check)")
    flag_pattern = re.compile(r"--(" + "|".join(map(re.escape, names)) + r")(?![\w-])|\"("
                              + "|".join(map(re.escape, (n for n in names if "-" in n))) + r")\"")
    for name in files:
        if not name.startswith(server) or name.endswith("CommandLineFlag.swift"):
            continue
        for number, line in code_lines(name):
            if flag_pattern.search(line):
                problems.append(f"{name}:{number}: a command-line flag named outside CommandLineFlag.swift")

    # Time: ContinuousClock, and one reading in Double seconds for the Redis store's state machine.
    for name in files:
        for number, line in code_lines(name):
            if re.search(r"clock_gettime\(\s*CLOCK_MONOTONIC", line):
                problems.append(f"{name}:{number}: time is kept with ContinuousClock, not clock_gettime")
    rule("Double-seconds reading of the clock", r"\bfunc monotonicSeconds\b",
         "Sources/RedisTokenStore/RedisConnection.swift")
    for name in files:
        for number, line in code_lines(name):
            if "uptimeNanoseconds" in line:
                problems.append(f"{name}:{number}: time is kept with ContinuousClock, not DispatchTime "
                                "(DispatchTime only as a Dispatch wait's deadline)")

    # The server's modules log at ServerLogLevel, not at the app library's level.
    for name in files:
        if name.startswith("Sources/ForgePushToken/"):
            continue
        for number, line in code_lines(name):
            if "PushTokenManager.LogLevel" in line:
                problems.append(f"{name}:{number}: the service logs at ServerLogLevel (ServerSupport), "
                                "not at the app library's PushTokenManager.LogLevel")
    rule("server log level", r"\benum \w*LogLevel\b", "Sources/ServerSupport/ServerLogLevel.swift",
         where=lambda name: not name.startswith("Sources/ForgePushToken/"))

    # The scripts' free loopback port: one Python definition, which the shell scripts call.
    home = "e2e/e2e_support.py"
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "e2e", "bench",
                          "scripts", "docker", "fuzz"], check=True, capture_output=True, cwd=ROOT).stdout
    for name in sorted(set(out.decode().split("\0"))):
        if not name.endswith((".py", ".sh")) or not (ROOT / name).exists():
            continue
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if re.match(r"\s*def free_port\b", line) and name != home:
                problems.append(f"{name}:{number}: a second definition of free_port (the one is in {home})")
            shell = re.match(r"\s*free_port\s*\(\)\s*\{(.*)", line)
            if shell and "e2e_support.py\" free-port" not in shell.group(1):
                problems.append(f"{name}:{number}: a shell free_port of its own (call {home} free-port)")

    for problem in problems:
        print(problem)
    if problems:
        print(f"check-single-definitions: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check-single-definitions: every name of issue 31 point 5 has one definition")
    return 0


if __name__ == "__main__":
    sys.exit(main())
