#!/usr/bin/env python3
"""Time from Redis coming back to every subscriber on every replica having the change made meanwhile.

Starts a redis-server (no persistence) and --replicas (3) replicas of SERVER on free loopback
ports, opens --subscribers (200) streams on each replica, then --runs (3) times: SIGKILL Redis,
waits until every replica reports it (/healthz degraded), starts Redis again empty on the same
port, and at the instant it answers PING (t0) makes a change in Redis the way another replica's
write does (the state hash at a higher version, and the change message published). Measures
t0 -> the last subscriber on any replica receiving that change. Prints one JSON line per run and
the median; exit 1 when a run took over --limit seconds (10) or missed a subscriber.

    python3 bench/redis_recovery.py --server .build/release/forge-push-token-server
"""
import argparse
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_support import free_port  # noqa: E402  (the one definition of e2e/ and bench/)

HOST = "127.0.0.1"


def http(port, method, path, body=b"", timeout=3):
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Type: application/octet-stream\r\n"
                  b"Connection: close\r\n\r\n%s" % (method.encode(), path.encode(), len(body), body))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def resp(port, *args, timeout=2):
    """One Redis command over a fresh connection; returns the raw reply bytes."""
    payload = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in
                                                 (x if isinstance(x, bytes) else str(x).encode() for x in args))
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(65536)


def start_redis(port):
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if resp(port, "PING", timeout=0.2).startswith(b"+PONG"):
                return proc, time.monotonic()
        except OSError:
            pass
        time.sleep(0.001)
    raise SystemExit("redis-server did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limit", type=float, default=10)
    options = parser.parse_args()
    redis_port = free_port()
    redis, _ = start_redis(redis_port)
    replicas = []
    try:
        for _ in range(options.replicas):
            port = free_port()
            proc = subprocess.Popen([options.server, "--port", str(port), "--access-log", "off", "--redis-url",
                                     "redis://%s:%d/0" % (HOST, redis_port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            replicas.append((proc, port))
        for _, port in replicas:
            deadline = time.monotonic() + 10
            while True:
                try:
                    if http(port, "GET", "/healthz")[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("a replica did not become healthy")
                time.sleep(0.02)
        selector = selectors.DefaultSelector()
        streams = []
        for _, port in replicas:
            for _ in range(options.subscribers):
                s = socket.create_connection((HOST, port))
                s.sendall(b"GET /token/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
                s.setblocking(False)
                streams.append(s)
                selector.register(s, selectors.EVENT_READ, len(streams) - 1)
        buffers = [b""] * len(streams)
        results = []
        for run in range(options.runs):
            token = ("%08x" % (0xFEED0000 + run)) * 8
            redis.send_signal(signal.SIGKILL)
            redis.wait(5)
            for _, port in replicas:
                deadline = time.monotonic() + 5
                while b"degraded" not in http(port, "GET", "/healthz")[1]:
                    if time.monotonic() > deadline:
                        raise SystemExit("a replica did not notice Redis going away")
                    time.sleep(0.02)
            buffers = [b""] * len(streams)
            seen = [False] * len(streams)
            redis, t0 = start_redis(redis_port)
            # The change made meanwhile, as another replica's write makes it: a version far above
            # any replica's (the replicas write theirs back only when the key is missing or lower).
            version = 1_000_000 * (run + 1)
            resp(redis_port, "HSET", "forge-push-token:state", "version", version, "token", token)
            resp(redis_port, "PUBLISH", "forge-push-token:changes",
                 json.dumps({"version": version, "token": token}, separators=(",", ":")))
            needle = token.encode()
            remaining = len(streams)
            last = None
            deadline = t0 + options.limit
            while remaining and time.monotonic() < deadline:
                for key, _ in selector.select(0.05):
                    index = key.data
                    try:
                        data = key.fileobj.recv(65536)
                    except BlockingIOError:
                        continue
                    buffers[index] = (buffers[index] + data)[-4096:]
                    if not seen[index] and needle in buffers[index]:
                        seen[index] = True
                        remaining -= 1
                        last = time.monotonic()
            result = {"run": run + 1, "subscribers": len(streams), "missed": remaining,
                      "seconds": None if last is None else round(last - t0, 3)}
            print(json.dumps(result), flush=True)
            results.append(result)
        times = [r["seconds"] for r in results if r["seconds"] is not None]
        median = statistics.median(times) if times else None
        print(json.dumps({"median_seconds": median, "runs": len(results)}))
        ok = all(r["missed"] == 0 for r in results) and all(t <= options.limit for t in times)
        sys.exit(0 if ok else 1)
    finally:
        for proc, _ in replicas:
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
        redis.send_signal(signal.SIGKILL)
        redis.wait(5)


if __name__ == "__main__":
    main()
