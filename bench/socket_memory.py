#!/usr/bin/env python3
"""The kernel's memory per event-stream connection (issue 44): /proc/slabinfo before and after N
subscribers of GET /token/stream on a fresh server, per connection.

    python3 bench/socket_memory.py --server .build/release/forge-push-token-server [-n 10000]

Needs root (/proc/slabinfo). Both ends of each loopback connection are counted (the client's
socket is the kernel's too), so about half of the TCP, sock_inode_cache, dentry and filp growth is
the server's; its epoll entries (eventpoll_epi) are all its own. A container's memory limit counts
this memory; VmRSS does not. Prints the growth per connection, in all and for the caches that grew
most, and the server's VmRSS. Loopback only; N sockets in this process (keep N under the file limit).
"""
import argparse
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_support import free_port  # noqa: E402  (the one definition of e2e/ and bench/)


def slab():
    sizes = {}
    with open("/proc/slabinfo") as f:
        for line in f.readlines()[2:]:
            fields = line.split()
            sizes[fields[0]] = int(fields[1]) * int(fields[3])  # active objects x object size
    return sizes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("-n", type=int, default=10000)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([args.server, "--port", str(port), "--access-log", "off",
                               "--max-subscribers", str(args.n + 100)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("the server did not start")
                time.sleep(0.05)
        time.sleep(0.5)
        before = slab()
        clients = []
        for _ in range(args.n):
            client = socket.create_connection(("127.0.0.1", port), timeout=30)
            client.sendall(b"GET /token/stream HTTP/1.1\r\nHost: bench\r\n\r\n")
            clients.append(client)
        for client in clients:
            data = b""
            while b"id: " not in data:
                chunk = client.recv(4096)
                if not chunk:
                    sys.exit("a stream ended before its first event")
                data += chunk
        time.sleep(1)
        after = slab()
        with open("/proc/%d/status" % server.pid) as f:
            rss = next(line.split()[1] for line in f if line.startswith("VmRSS"))
        growth = {name: after.get(name, 0) - before.get(name, 0) for name in after}
        total = sum(value for value in growth.values() if value > 0)
        print("N=%d: kernel slab growth %.0f bytes per connection (both ends); server VmRSS %s kB"
              % (args.n, total / args.n, rss))
        for name, value in sorted(growth.items(), key=lambda item: -item[1])[:8]:
            print("  %-24s %7.0f B per connection" % (name, value / args.n))
        for client in clients:
            client.close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
