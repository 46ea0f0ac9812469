#!/usr/bin/env python3
"""Memory per idle subscriber, and where it goes (issue 32 §2).

Starts forge-push-token-server (a given binary) on a free loopback port for each subscriber
count, connects N subscribers to GET /token/stream, waits for each one's first event, and
prints the server's RSS growth per subscriber: VmRSS, and its anonymous part (RssAnon), from
/proc/PID/status, 0.5 s after the last subscriber was ready, against the same reading before the
first connected (a fresh server for each count).

    python3 bench/subscriber_memory.py --server .build/release/forge-push-token-server \
        [-n 1000,5000,10000,18000] [--server-arg=--max-header-bytes=2048]... [--env NAME=VALUE]... \
        [--tls] [--keep-alive] [--breakdown N] [--json FILE] [--label NAME]

--tls serves over TLS (a self-signed certificate made with openssl for the run) and opens the
streams one after another with Python's ssl: TLS streams stay in libmicrohttpd, so each keeps its
connection's pool. --keep-alive opens idle keep-alive connections instead of streams: each sends
one `GET /token`, reads the whole answer and stays open (fewer than --idle-timeout's 60 s), which
is what an idle keep-alive connection costs (its pool, kept between two requests).

--breakdown N also runs N subscribers once under glibc's malloc tracer (LD_PRELOAD
libc_malloc_debug.so.0, MALLOC_TRACE; mtrace(3)) and prints the heap that the N streams hold
after their first event, per subscriber, by the caller of malloc/calloc/realloc: libmicrohttpd
(its per-connection memory pool, its connection struct), this binary (the Swift side: the
stream, the subscriber, their closures), others. Each allocation is counted as the chunk glibc
makes of it (request + 8 bytes of header, rounded up to 16, at least 32). What RSS holds beyond
the heap is what the streams touched elsewhere (thread stacks do not grow with them) or pages
the heap has touched around the chunks; socket buffers and epoll entries are kernel memory and
are not in RSS at all.

Loopback only; bounded in count (N connections) and time (--timeout per count).
"""
import argparse
import json
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import time
import collections

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_support import free_port  # noqa: E402  (the one definition of e2e/ and bench/)


def status(pid):
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0])
    return values


def make_certificate():
    """A self-signed certificate and key for 127.0.0.1 in a temporary folder: (cert, key)."""
    folder = tempfile.mkdtemp(prefix="forge-push-token-memory-tls.")
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def connect(port, context):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return context.wrap_socket(s, server_hostname="127.0.0.1") if context else s


def start(binary, n, extra, env_extra, context=None):
    port = free_port()
    env = dict(os.environ, **env_extra)
    proc = subprocess.Popen([binary, "--port", str(port), "--access-log", "off", "--max-subscribers", str(n + 100)]
                            + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with connect(port, context) as s:
                s.sendall(b"POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 64\r\n"
                          b"Connection: close\r\n\r\n" + os.urandom(32).hex().encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the server did not start")


def subscribe(port, n, timeout):
    """Opens n streams and reads each one's first event; returns the open sockets."""
    request = f"GET /token/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    socks, pending, ready = [], 0, 0
    deadline = time.monotonic() + timeout
    opened = 0
    while ready < n:
        while opened < n and pending < 256:
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            sel.register(s, selectors.EVENT_WRITE, [b"", False])
            socks.append(s)
            opened += 1
            pending += 1
        if time.monotonic() > deadline:
            raise SystemExit(f"only {ready} of {n} subscribers got their first event")
        for key, mask in sel.select(0.1):
            s, state = key.fileobj, key.data
            if mask & selectors.EVENT_WRITE and not state[1]:
                s.send(request)
                state[1] = True
                sel.modify(s, selectors.EVENT_READ, state)
                continue
            data = s.recv(4096)
            if not data:
                raise SystemExit("a stream closed before its first event")
            state[0] += data
            if b"data:" in state[0] and state[0].rstrip(b"\r\n").endswith(b"}") or b"}\n\n" in state[0] \
                    or b"}\r\n\r\n" in state[0]:
                sel.unregister(s)
                pending -= 1
                ready += 1
    return socks


def open_one_by_one(port, n, timeout, context, keep_alive):
    """Opens n streams (or, with keep_alive, n connections that each had one GET /token answered)
    one after another with blocking sockets; returns the open sockets."""
    if keep_alive:
        request, done = b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"}"
    else:
        request, done = b"GET /token/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n", b"}\n\n"
    deadline = time.monotonic() + timeout
    socks = []
    for _ in range(n):
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(socks)} of {n} connections were ready in time")
        s = connect(port, context)
        s.sendall(request)
        data = b""
        while done not in data:
            more = s.recv(4096)
            if not more:
                raise SystemExit("a connection closed before its answer")
            data += more
        socks.append(s)
    return socks


def measure(binary, n, extra, env_extra, timeout, context=None, keep_alive=False):
    proc, port = start(binary, n, extra, env_extra, context)
    try:
        time.sleep(0.3)
        before = status(proc.pid)
        t0 = time.monotonic()
        if context is not None or keep_alive:
            socks = open_one_by_one(port, n, timeout, context, keep_alive)
        else:
            socks = subscribe(port, n, timeout)
        connect_s = time.monotonic() - t0
        time.sleep(0.5)
        after = status(proc.pid)
        for s in socks:
            s.close()
        return {"n": n, "connect_s": round(connect_s, 2),
                "rss_before_kb": before["VmRSS"], "rss_after_kb": after["VmRSS"],
                "rss_per_subscriber_kb": round((after["VmRSS"] - before["VmRSS"]) / n, 3),
                "anon_per_subscriber_kb": round((after["RssAnon"] - before["RssAnon"]) / n, 3)}, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


LINE = re.compile(r"^@ (\S+?)(?::\(([^)]*)\))?\[(0x[0-9a-f]+)\] ([-+<>]) (0x[0-9a-f]+)(?: (0x[0-9a-f]+))?")


def chunk(size):
    return max(32, (size + 8 + 15) & ~15)


def breakdown(binary, n, extra, env_extra, timeout):
    """Live heap per subscriber by caller, from an mtrace(3) log of one run."""
    trace = tempfile.NamedTemporaryFile(prefix="forge-push-token-mtrace.", delete=False).name
    # The tracer starts only when the program calls mtrace(3): a preloaded constructor does.
    shim_dir = tempfile.mkdtemp(prefix="forge-push-token-mtrace-shim.")
    with open(f"{shim_dir}/start.c", "w") as f:
        f.write("#include <mcheck.h>\n__attribute__((constructor)) static void start(void) { mtrace(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", f"{shim_dir}/start.so", f"{shim_dir}/start.c"], check=True)
    env = dict(env_extra, LD_PRELOAD=f"libc_malloc_debug.so.0 {shim_dir}/start.so", MALLOC_TRACE=trace)
    proc, port = start(binary, n, extra, env)
    try:
        time.sleep(0.3)
        mark = os.path.getsize(trace)
        socks = subscribe(port, n, timeout)
        time.sleep(0.5)
        end = os.path.getsize(trace)
        live = {}
        with open(trace, "rb") as f:
            data = f.read(end).decode("utf-8", "replace")
        offset = 0
        at_mark = None
        for line in data.splitlines(keepends=True):
            if at_mark is None and offset >= mark:
                at_mark = {k: v for k, v in live.items()}
            offset += len(line.encode("utf-8", "replace"))
            m = LINE.match(line)
            if not m:
                continue
            module, function, caller, op, address, size = m.groups()
            if op == "+":
                live[address] = (int(size, 16), module, function, caller)
            elif op == "-":
                live.pop(address, None)
            elif op in "<>":  # realloc: "<" the old block, ">" the new one
                if op == "<":
                    live.pop(address, None)
                else:
                    live[address] = (int(size, 16), module, function, caller)
        at_mark = at_mark if at_mark is not None else live
        for s in socks:
            s.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    grown = collections.Counter()
    counts = collections.Counter()
    for address, (size, module, function, caller) in live.items():
        if address in at_mark:
            continue
        key = (os.path.basename(module), function or caller)
        grown[key] += chunk(size)
        counts[key] += 1
    os.unlink(trace)
    for name in os.listdir(shim_dir):
        os.unlink(os.path.join(shim_dir, name))
    os.rmdir(shim_dir)
    # Name the binary's callers (statically linked Swift code) with addr2line where it can.
    rows = []
    for (module, where), total in grown.most_common(25):
        rows.append({"module": module, "caller": where, "bytes_per_subscriber": round(total / n, 1),
                     "allocations_per_subscriber": round(counts[(module, where)] / n, 2)})
    names = [r["caller"] for r in rows if r["caller"].startswith("0x") and r["module"] == os.path.basename(binary)]
    if names:
        try:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", binary] + names, capture_output=True, text=True,
                                 timeout=60).stdout.splitlines()
            symbols = dict(zip(names, out[0::2]))
            for r in rows:
                r["caller"] = symbols.get(r["caller"], r["caller"])
        except (OSError, subprocess.SubprocessError):
            pass
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("-n", default="1000,5000,10000,18000")
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--breakdown", type=int)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json")
    ap.add_argument("--label", default="ours")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--keep-alive", action="store_true")
    args = ap.parse_args()
    context = None
    if args.tls:
        import ssl
        cert, key = make_certificate()
        args.server_arg += ["--tls-cert", cert, "--tls-key", key]
        context = ssl.create_default_context(cafile=cert)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env_extra = dict(e.split("=", 1) for e in args.env)
    results = []
    for n in [int(x) for x in args.n.split(",") if x]:
        r, _ = measure(args.server, n, args.server_arg, env_extra, args.timeout, context, args.keep_alive)
        r.update(label=args.label, server_args=args.server_arg, env=args.env, tls=args.tls, keep_alive=args.keep_alive)
        results.append(r)
        what = "keep-alive connection" if args.keep_alive else "subscriber"
        print(f"{args.label} N={n}: RSS per {what} {r['rss_per_subscriber_kb']:.2f} kB "
              f"(anonymous {r['anon_per_subscriber_kb']:.2f} kB), connected in {r['connect_s']} s", flush=True)
    rows = None
    if args.breakdown:
        rows = breakdown(args.server, args.breakdown, args.server_arg, env_extra, args.timeout)
        print(f"heap held per subscriber after its first event, N={args.breakdown}, by caller (mtrace):")
        for r in rows:
            print(f"  {r['bytes_per_subscriber']:8.1f} B  {r['allocations_per_subscriber']:5.2f} allocations  "
                  f"{r['module']}: {r['caller'][:100]}")
        print(f"  {sum(r['bytes_per_subscriber'] for r in rows):8.1f} B  in all")
    if args.json:
        with open(args.json, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
            if rows is not None:
                f.write(json.dumps({"label": args.label, "breakdown_n": args.breakdown, "breakdown": rows}) + "\n")


if __name__ == "__main__":
    main()
