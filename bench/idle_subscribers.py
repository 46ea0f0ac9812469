#!/usr/bin/env python3
"""CPU cost of idle Server-Sent Events subscribers.

Starts forge-push-token-server (a given binary) on a free loopback port, connects N subscribers to
GET /token/stream, waits for each one's first event, then measures the server's CPU time (utime +
stime from /proc/PID/stat) over a window in which nothing is published. Prints the CPU use as a
percentage of one core, and exits 1 when it is over --max-percent.

    python3 bench/idle_subscribers.py --server .build/release/forge-push-token-server \
        [-n 1000] [--seconds 10] [--max-percent 2] [--json FILE] [--label NAME]

The window ends before the server's first heartbeat (--heartbeat, default 15 s, counted from the
server's start), so it measures the cost of idle subscribers *between* heartbeats; a warning is
printed when connecting took so long that the window would reach the heartbeat. `--json FILE`
appends one JSON object with the figures (bench/run.sh uses it).

Loopback only; bounded in count (N connections) and time (the window plus start-up).
"""
import json
import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import e2e_support as support  # noqa: E402  (the one server process helper of e2e/ and bench/)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--max-percent", type=float, default=2.0)
    ap.add_argument("--heartbeat", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--label", default="ours")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.n + 64)), hard))
    server = support.Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off",
                                          "--heartbeat", str(args.heartbeat),
                                          "--max-subscribers", str(args.n + 10)])
    server_started = time.time()
    server.start(timeout=20)
    subscribers = []
    try:
        subscribers = support.open_subscribers(server.port, args.n)
        connected = time.time() - server_started
        time.sleep(1)  # let every connection settle into its suspended state
        if time.time() + args.seconds > server_started + args.heartbeat:
            print("warning: the window reaches the first heartbeat (connecting took %.1f s)" % connected,
                  file=sys.stderr)
        before, started = server.cpu_seconds(), time.time()
        time.sleep(args.seconds)
        used, elapsed = server.cpu_seconds() - before, time.time() - started
        percent = 100 * used / elapsed
        print("idle subscribers: %d, window %.1f s, server CPU %.3f s = %.2f%% of one core (limit %.2f%%)"
              % (args.n, elapsed, used, percent, args.max_percent))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"label": args.label, "n": args.n, "window_s": round(elapsed, 2),
                                    "cpu_s": round(used, 4), "percent": round(percent, 3),
                                    "connect_s": round(connected, 2)}) + "\n")
        return 0 if percent <= args.max_percent else 1
    finally:
        for sock in subscribers:
            sock.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
