#!/usr/bin/env python3
"""CPU cost of one GET /metrics scrape with many event-stream subscribers connected.

Starts forge-push-token-server (a given binary) on a free loopback port, connects N subscribers to
GET /token/stream and waits for each one's first event, then measures the server's CPU time
(utime + stime from /proc/PID/stat, the same figure as process_cpu_seconds_total):

  1. over an idle window of --idle-seconds (nothing asked of the server: its baseline);
  2. over K scrapes of GET /metrics on one keep-alive connection, one after the other.

The cost of a scrape is (CPU of the scrapes - the baseline rate x their wall time) / K, in ms of the
server's CPU. Each scrape is checked: 200, the subscriber gauge equal to N, the process series
present. Exits 1 when the cost is over --max-ms (issue 13: under 5 ms with 10,000 subscribers).

    python3 bench/scrape_cost.py --server .build/release/forge-push-token-server \
        [-n 10000] [-k 200] [--max-ms 5] [--json FILE]

Loopback only; bounded in count (N + 1 connections, K requests) and time.
"""
import argparse
import http.client
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import e2e_support as support  # noqa: E402  (the one server process helper of e2e/ and bench/)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("-n", type=int, default=10000, help="subscribers connected (default 10000)")
    ap.add_argument("-k", type=int, default=200, help="scrapes measured (default 200)")
    ap.add_argument("--idle-seconds", type=float, default=2.0)
    ap.add_argument("--max-ms", type=float, default=5.0)
    ap.add_argument("--json")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < args.n + 64:
        sys.exit("the open-file hard limit %d is too low for %d subscribers" % (hard, args.n))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, args.n + 64) if hard == resource.RLIM_INFINITY
                                                else min(hard, max(soft, args.n + 64)), hard))
    # No heartbeat within the run, no access log: the scrapes are all the server does.
    server = support.Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off",
                                          "--heartbeat", "3600", "--max-subscribers", str(args.n + 10)])
    server.start(timeout=20)
    port = server.port
    subscribers = []
    try:
        started = time.time()
        subscribers = support.open_subscribers(port, args.n)
        print("%d subscribers connected in %.1f s" % (args.n, time.time() - started))
        time.sleep(1)

        before = server.cpu_seconds()
        time.sleep(args.idle_seconds)
        idle_rate = (server.cpu_seconds() - before) / args.idle_seconds

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        latencies = []
        size = 0
        wall0 = time.monotonic()
        cpu0 = server.cpu_seconds()
        for _ in range(args.k):
            t0 = time.monotonic()
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            body = response.read()
            latencies.append(time.monotonic() - t0)
            if response.status != 200:
                sys.exit("GET /metrics answered %d" % response.status)
            size = len(body)
        cpu1 = server.cpu_seconds()
        wall = time.monotonic() - wall0
        conn.close()
        text = body.decode()
        gauge = [line for line in text.splitlines() if line.startswith("forge_push_token_subscribers ")]
        if gauge != ["forge_push_token_subscribers %d" % args.n]:
            sys.exit("the subscriber gauge is %r, expected %d" % (gauge, args.n))
        fds = [line for line in text.splitlines() if line.startswith("process_open_fds ")]
        if not fds or int(fds[0].split()[1]) < args.n:
            sys.exit("process_open_fds %r does not count the %d subscribers' sockets" % (fds, args.n))

        cost_ms = max(0.0, (cpu1 - cpu0) - idle_rate * wall) / args.k * 1000
        latencies.sort()
        result = {
            "subscribers": args.n, "scrapes": args.k, "bytes": size,
            "cpu_ms_per_scrape": round(cost_ms, 3), "idle_cpu_percent": round(idle_rate * 100, 2),
            "latency_p50_ms": round(statistics.median(latencies) * 1000, 3),
            "latency_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
            "max_ms": args.max_ms,
        }
        print("GET /metrics with %d subscribers: %.2f ms of server CPU per scrape (%d scrapes, %d bytes each), "
              "latency p50 %.2f ms p99 %.2f ms; idle %.2f%% of a core"
              % (args.n, cost_ms, args.k, size, result["latency_p50_ms"], result["latency_p99_ms"],
                 result["idle_cpu_percent"]))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
        if cost_ms > args.max_ms:
            print("FAIL: over %.1f ms per scrape" % args.max_ms)
            return 1
        print("ok: under %.1f ms per scrape" % args.max_ms)
        return 0
    finally:
        for sock in subscribers:
            sock.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
