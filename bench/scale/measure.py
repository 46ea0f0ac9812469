#!/usr/bin/env python3
"""One scale run (bench/scale.sh, issue 32 §3): N subscribers spread over several servers by
several client processes, one publisher, the delay from each publish to each delivery on one clock.

    python3 bench/scale/measure.py --client bench/sse_fanout/sse_fanout --url http://127.0.0.1:A \
        --url http://127.0.0.1:B --url http://127.0.0.1:C --publish-url http://127.0.0.1:A \
        --server-pid PA --server-pid PB --server-pid PC [--redis-pid PR] -n 50000 -m 5 \
        --interval-ms 1000 --per-process 16000 --label ours --json out.json

1. Starts ceil(N / --per-process) client processes (`sse_fanout --listen-only`: the file limit is
   20,000 per process), each with its share of the N subscribers spread round-robin over every
   --url, and waits until each has written its ready file (every subscriber has its first event).
   The time to connect everyone is from the first client's start to the last one's ready file.
2. Reads each server's RSS (VmRSS, /proc/PID/status), before the clients start and once all are
   ready: per subscriber = growth / the subscribers it holds (N / servers).
3. Publishes M tokens, --interval-ms apart: each is POSTed to every --publish-url (the floor's
   three unconnected processes each get it; replicas share it through Redis, so one URL), on
   connections opened beforehand. The token is <40 hex run prefix><16 hex CLOCK_REALTIME ns taken
   just before the first POST is written><8 hex index>: every client process reads the publish
   time from the token, so all delays are on the one clock of this machine.
4. Waits for the clients, merges their per-delivery delays (read: the client's recvmsg; kernel:
   the kernel's receive timestamp, about when the server wrote), and prints p50/p99/max over all
   deliveries, the missed events (ready subscribers x publishes - deliveries), and, with
   --redis-pid, Redis's CPU seconds over the whole run.

Loopback only (the client refuses other addresses); every phase is bounded (--max-seconds).
Exit status 0, or 3 when a client did not get ready, a publish failed or an event was missed.
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

TICK = os.sysconf("SC_CLK_TCK")


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def percentile(sorted_values, q):
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def connect(url):
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, f"{parts.hostname}:{parts.port}"


def publish(urls, prefix, k):
    """POSTs one token to every URL; returns (statuses, ack ms of the slowest)."""
    conns = [connect(url) for url in urls]
    t_ns = time.time_ns()
    token = f"{prefix}{t_ns:016x}{k:08x}"
    for sock, host in conns:
        sock.sendall((f"POST /register HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
                      f"Content-Length: 64\r\nConnection: close\r\n\r\n{token}").encode())
    statuses = []
    for sock, _ in conns:
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        parts = data.split(b" ", 2)
        statuses.append(int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0)
        sock.close()
    return statuses, (time.time_ns() - t_ns) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", required=True)
    ap.add_argument("--url", action="append", required=True)
    ap.add_argument("--publish-url", action="append", required=True)
    ap.add_argument("--server-pid", action="append", type=int, default=[])
    ap.add_argument("--redis-pid", type=int)
    ap.add_argument("-n", type=int, default=50000)
    ap.add_argument("-m", type=int, default=5)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--per-process", type=int, default=16000)
    ap.add_argument("--ready-timeout", type=float, default=240)
    ap.add_argument("--drain-timeout", type=float, default=30)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--label", default="ours")
    ap.add_argument("--json")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="forge-push-token-scale.")
    prefix = os.urandom(20).hex()
    processes = math.ceil(args.n / args.per_process)
    shares = [args.n // processes + (1 if i < args.n % processes else 0) for i in range(processes)]
    rss_before = {pid: rss_kb(pid) for pid in args.server_pid}
    redis_cpu0 = cpu_seconds(args.redis_pid) if args.redis_pid else None
    t_run0 = time.monotonic()
    publish_window = args.m * args.interval_ms / 1000 + args.drain_timeout + 30
    clients = []
    t_start = time.monotonic()
    for i, share in enumerate(shares):
        cmd = [args.client, "--listen-only", "--run-prefix", prefix, "-n", str(share), "-m", str(args.m),
               "--ready-file", f"{work}/ready-{i}", "--raw", f"{work}/raw-{i}", "--json", f"{work}/client-{i}.json",
               "--ready-timeout", str(args.ready_timeout), "--settle-ms", "200",
               "--drain-timeout", str(args.ready_timeout + publish_window), "--max-seconds", str(args.max_seconds),
               "--label", f"{args.label}-{i}", "--quiet"]
        # Each process starts its round-robin at another server, so every server gets N / servers.
        urls = args.url[i % len(args.url):] + args.url[:i % len(args.url)]
        for url in urls:
            cmd += ["--url", url]
        clients.append(subprocess.Popen(cmd, stdout=open(f"{work}/client-{i}.out", "w"), stderr=subprocess.STDOUT))
    deadline = t_start + args.ready_timeout + 10
    while time.monotonic() < deadline:
        if all(os.path.exists(f"{work}/ready-{i}") for i in range(processes)):
            break
        if any(c.poll() is not None for c in clients):
            break
        time.sleep(0.05)
    connect_s = time.monotonic() - t_start
    ready = 0
    for i in range(processes):
        try:
            ready += int(open(f"{work}/ready-{i}").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    time.sleep(0.5)  # let the servers settle before reading RSS
    rss_connected = {pid: rss_kb(pid) for pid in args.server_pid}

    statuses, acks = [], []
    if ready == args.n:
        t0 = time.monotonic()
        for k in range(args.m):
            due = t0 + k * args.interval_ms / 1000
            time.sleep(max(0.0, due - time.monotonic()))
            s, ack = publish(args.publish_url, prefix, k)
            statuses.append(s)
            acks.append(round(ack, 2))
    else:
        for c in clients:
            c.kill()
    for c in clients:
        try:
            c.wait(timeout=args.drain_timeout + args.m * args.interval_ms / 1000 + 60)
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait()
    redis_cpu = (cpu_seconds(args.redis_pid) - redis_cpu0) if args.redis_pid else None
    wall = time.monotonic() - t_run0

    reads, kerns = [], []
    missed = 0
    for i in range(processes):
        try:
            for line in open(f"{work}/raw-{i}"):
                r, k = line.split()
                reads.append(float(r))
                if float(k) >= 0:
                    kerns.append(float(k))
            missed += json.load(open(f"{work}/client-{i}.json"))["missed"]
        except (OSError, ValueError, KeyError):
            missed += shares[i] * args.m
    reads.sort()
    kerns.sort()
    servers = max(1, len(args.server_pid))
    per_server = args.n / servers
    result = {
        "label": args.label, "n": args.n, "m": args.m, "interval_ms": args.interval_ms,
        "client_processes": processes, "servers": len(args.server_pid), "ready": ready,
        "connect_s": round(connect_s, 2),
        "publish_status": statuses, "post_ack_ms": acks,
        "deliveries": len(reads), "missed": missed if ready == args.n else args.n * args.m,
        "read_p50_ms": round(percentile(reads, 0.50), 3), "read_p99_ms": round(percentile(reads, 0.99), 3),
        "read_max_ms": round(reads[-1], 3) if reads else math.nan,
        "kern_p50_ms": round(percentile(kerns, 0.50), 3), "kern_p99_ms": round(percentile(kerns, 0.99), 3),
        "kern_max_ms": round(kerns[-1], 3) if kerns else math.nan,
        "rss_per_subscriber_kb": [round((rss_connected[p] - rss_before[p]) / per_server, 3) for p in args.server_pid],
        "rss_connected_kb": [rss_connected[p] for p in args.server_pid],
        "redis_cpu_s": round(redis_cpu, 3) if redis_cpu is not None else None,
        "redis_cpu_percent": round(100 * redis_cpu / wall, 2) if redis_cpu is not None else None,
        "wall_s": round(wall, 2),
    }
    print(f"{args.label}: N={args.n} over {len(args.url)} servers by {processes} clients, ready {ready} in "
          f"{connect_s:.2f} s; deliveries {len(reads)}, missed {result['missed']}; read p50 "
          f"{result['read_p50_ms']} p99 {result['read_p99_ms']} max {result['read_max_ms']} ms; kernel p50 "
          f"{result['kern_p50_ms']} p99 {result['kern_p99_ms']} max {result['kern_max_ms']} ms; RSS per "
          f"subscriber {result['rss_per_subscriber_kb']} kB; Redis CPU {result['redis_cpu_s']} s")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)
    ok = ready == args.n and result["missed"] == 0 and all(all(200 <= s < 300 for s in ss) for ss in statuses)
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
