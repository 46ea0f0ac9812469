#!/usr/bin/env python3
"""Time from starting forge-push-token-server to its `listening on` log line.

Starts the given binary RUNS times on a free loopback port (`--port 0`, access log off, no state
file), measures the wall time from just before the process is spawned (fork + exec included) to
the moment its standard error carries the `listening on http://...` line, then stops it with
SIGTERM. Prints each time and the median; `--json FILE` appends one JSON object.

    python3 bench/startup.py --server PATH [--runs 5] [--json FILE]

Bounded: each start waits at most --timeout seconds (default 5) for the line.
"""
import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time


def one_start(server, timeout):
    started = time.monotonic()
    proc = subprocess.Popen([server, "--host", "127.0.0.1", "--port", "0", "--access-log", "off"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    buffered = b""
    elapsed = None
    try:
        deadline = started + timeout
        while elapsed is None and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            buffered += chunk
            if b"listening on http://" in buffered:
                elapsed = time.monotonic() - started
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if elapsed is None:
        sys.exit("no 'listening on' line within %.0f s; stderr: %r" % (timeout, buffered[-300:]))
    return elapsed * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=5)
    ap.add_argument("--json")
    ap.add_argument("--label", default="ours")
    args = ap.parse_args()
    times = [one_start(args.server, args.timeout) for _ in range(max(1, args.runs))]
    median = statistics.median(times)
    print("start to listening: median %.1f ms over %d starts (%s)"
          % (median, len(times), ", ".join("%.1f" % t for t in times)))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"label": args.label, "median_ms": round(median, 2),
                                "runs_ms": [round(t, 2) for t in times]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
