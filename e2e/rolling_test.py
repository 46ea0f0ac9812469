#!/usr/bin/env python3
"""A rolling deploy, proven (../shared/spec/deploy.md, last section; docs/operations.md, "Deploying
and upgrading").

Three replicas (`--drain-seconds 5`) on one redis-server behind nginx configured exactly as
docs/replicas.md writes it (its `nginx` block, with this run's ports and folder), 1,000
subscribers through nginx that behave as a browser's EventSource does (they reconnect after the
`retry:` they were sent, with `Last-Event-ID`), and a writer through nginx every 50 ms. Each
replica in turn is taken out of nginx (marked `down`, nginx reloaded), paused, sent SIGTERM,
drained, started again on its port, and put back once `/readyz` says it is ready; then the next.
Last, one replica is stopped while nginx still sends to it (a load balancer that has not
noticed): its drain serves on, and nginx passes its later refusals on to the others.

It asserts what the spec promises:
- every write answered 200, none 5xx (nginx passes a refusal on to the next replica), and none
  lost: the final version is the first one plus the writes answered 200 (each a new token), and
  the final token is the last one written;
- every subscriber's event ids strictly increase across its reconnects, and every subscriber holds
  the final version within 5 s of the last write;
- in no 1-second window do more than 2 x S / N + 50 subscribers reconnect (S the streams of the
  replica that stops, N its --drain-seconds).
It prints its numbers: writes, refused, ids gone back, the slowest subscriber to the final
version, the peak reconnects per second against the bound.

    python3 e2e/rolling_test.py --server PATH [--subscribers N] [--drain-seconds N]
"""
import argparse
import errno
import heapq
import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from e2e_support import HOST, Failure, Server, check, log, main, metric, request, token_hex, wait_until
from replicas_test import Redis, free_port

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "replicas.md")
PREFIX = "rolling"


class DocsNginx:
    """nginx with the `nginx` block of docs/replicas.md as written, its replicas' ports, listening
    port and folder replaced by this run's; `take_out`/`put_back` mark a replica `down` and reload."""

    def __init__(self, replica_ports, replace=()):
        """`replace`: (old, new) pairs applied to the block (bench/roll.py raises the connection
        limits for 10,000 subscribers)."""
        text = open(DOCS, encoding="utf-8").read()
        block = re.search(r"```nginx\n(.*?)```", text[text.index("replicas-nginx.conf"):], re.S).group(1)
        for old, new in replace:
            check(old in block, "docs/replicas.md's nginx block has no %r" % old)
            block = block.replace(old, new)
        self.dir = tempfile.mkdtemp(prefix="e2e-rolling-nginx-")
        self.port = free_port()
        self.replica_ports = list(replica_ports)
        documented = re.findall(r"server 127\.0\.0\.1:(\d+)", block)
        check(len(documented) == 3, "docs/replicas.md's nginx block has %d upstream servers, not 3" % len(documented))
        check("non_idempotent" in block, "docs/replicas.md's nginx block does not retry writes (non_idempotent)")
        block = block.replace("/tmp/fpt-replicas", self.dir)
        block = re.sub(r"listen 127\.0\.0\.1:\d+;", "listen %s:%d;" % (HOST, self.port), block)
        for documented_port, port in zip(documented, self.replica_ports):
            block = block.replace("server 127.0.0.1:%s " % documented_port, "server 127.0.0.1:@%d " % port)
        self.template = block.replace("127.0.0.1:@", "127.0.0.1:")
        self.conf = os.path.join(self.dir, "nginx.conf")
        self.down = set()
        self.proc = None

    def write(self):
        text = self.template
        for port in self.down:
            text = re.sub(r"(server 127\.0\.0\.1:%d [^;]*);" % port, r"\1 down;", text)
        with open(self.conf, "w") as f:
            f.write(text)

    def start(self):
        self.write()
        out = subprocess.run(["nginx", "-t", "-p", self.dir, "-c", self.conf], capture_output=True, text=True,
                             timeout=10)
        check(out.returncode == 0, "nginx -t on docs/replicas.md's configuration: %s" % out.stderr)
        self.proc = subprocess.Popen(["nginx", "-p", self.dir, "-c", self.conf, "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up():
            try:
                return request(self.port, "GET", "/livez", timeout=1)[0] == 200
            except OSError:
                return False
        wait_until(up, 5, what="nginx on port %d" % self.port)
        return self

    def reload(self):
        self.write()
        os.kill(self.proc.pid, signal.SIGHUP)
        # The master re-reads the file and starts new workers; old workers keep their connections
        # (the streams of the replica leaving) until those end.
        # nginx's master starts new workers after SIGHUP; no event to wait for from outside.
        time.sleep(0.3)

    def take_out(self, port):
        self.down.add(port)
        self.reload()

    def put_back(self, port):
        self.down.discard(port)
        self.reload()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class Subscriber:
    """One EventSource-like client: a non-blocking socket, an HTTP/1.1 chunked parser and an SSE
    parser; it reconnects after its `retry:` with `Last-Event-ID`."""

    __slots__ = ("index", "sock", "state", "buffer", "chunk_left", "events", "retry", "last_id", "ids_back",
                 "final_at", "connects", "ends", "broken")

    def __init__(self, index):
        self.index = index
        self.sock = None
        self.state = "idle"
        self.buffer = b""
        self.chunk_left = None
        self.events = b""
        self.retry = 3000
        self.last_id = None
        self.ids_back = 0
        self.final_at = None
        self.connects = []
        self.ends = 0
        self.broken = 0


class Subscribers:
    """Every subscriber, driven by one thread: `run()` until `stop` is set."""

    def __init__(self, port, count):
        self.port = port
        self.subs = [Subscriber(i) for i in range(count)]
        self.selector = selectors.DefaultSelector()
        self.timers = []  # (when, index): reconnects due
        self.stop = threading.Event()
        self.final = None  # (version, token) the subscribers must reach
        self.lock = threading.Lock()
        self.errors = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def connect(self, sub, now):
        """Opens the stream as a browser does: the TCP connect does not block the other
        subscribers (a loop that waits on one connect at a time cannot reconnect thousands at
        once), and a connect that fails is retried after `retry:` like any other lost stream."""
        sub.connects.append(now)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sub.sock, sub.state, sub.buffer, sub.chunk_left, sub.events = sock, "connecting", b"", None, b""
        self.selector.register(sock, selectors.EVENT_WRITE, sub)
        code = sock.connect_ex((HOST, self.port))
        if code not in (0, errno.EINPROGRESS):
            self.errors.append("subscriber %d: connect: %s" % (sub.index, os.strerror(code)))
            self.ended(sub, now, clean=False)

    def connected_socket(self, sub, now):
        """The connect finished: sends the request head (a few dozen bytes: one send fits)."""
        code = sub.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code != 0:
            self.errors.append("subscriber %d: connect: %s" % (sub.index, os.strerror(code)))
            return self.ended(sub, now, clean=False)
        request_text = "GET /token/stream HTTP/1.1\r\nHost: e2e\r\nAccept: text/event-stream\r\n"
        if sub.last_id is not None:
            request_text += "Last-Event-ID: %d\r\n" % sub.last_id
        data = (request_text + "\r\n").encode()
        try:
            sent = sub.sock.send(data)
        except OSError as error:
            self.errors.append("subscriber %d: send: %r" % (sub.index, error))
            return self.ended(sub, now, clean=False)
        if sent != len(data):
            self.errors.append("subscriber %d: the request head was sent in part" % sub.index)
            return self.ended(sub, now, clean=False)
        sub.state = "head"
        self.selector.modify(sub.sock, selectors.EVENT_READ, sub)

    def ended(self, sub, now, clean):
        self.selector.unregister(sub.sock)
        sub.sock.close()
        sub.sock = None
        sub.state = "waiting"
        if clean:
            sub.ends += 1
        else:
            sub.broken += 1
        heapq.heappush(self.timers, (now + sub.retry / 1000.0, sub.index))

    def feed_events(self, sub, data, now):
        sub.events += data
        while b"\n\n" in sub.events:
            block, sub.events = sub.events.split(b"\n\n", 1)
            event_id, token = None, None
            for line in block.split(b"\n"):
                if line.startswith(b"retry: "):
                    sub.retry = int(line[7:])
                elif line.startswith(b"id: "):
                    event_id = int(line[4:])
                elif line.startswith(b"data: "):
                    token = json.loads(line[6:])["token"]
            if event_id is None:
                continue
            if sub.last_id is not None and event_id <= sub.last_id:
                sub.ids_back += 1
            sub.last_id = event_id
            final = self.final
            if final is not None and sub.final_at is None and event_id >= final[0]:
                if event_id == final[0] and token != final[1]:
                    self.errors.append("subscriber %d got id %d with %r, not the final token" % (sub.index, event_id, token))
                sub.final_at = now

    def readable(self, sub, now):
        if sub.state == "connecting":
            return self.connected_socket(sub, now)
        try:
            data = sub.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            return self.ended(sub, now, clean=False)
        sub.buffer += data
        if sub.state == "head":
            if b"\r\n\r\n" not in sub.buffer:
                return
            head, sub.buffer = sub.buffer.split(b"\r\n\r\n", 1)
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                self.errors.append("subscriber %d: GET /token/stream answered %d" % (sub.index, status))
                return self.ended(sub, now, clean=False)
            sub.state = "body"
        while True:
            if sub.chunk_left is None:
                if b"\r\n" not in sub.buffer:
                    return
                line, sub.buffer = sub.buffer.split(b"\r\n", 1)
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    return self.ended(sub, now, clean=True)  # the chunked terminator: a clean end
                sub.chunk_left = size + 2
            if len(sub.buffer) < sub.chunk_left:
                return
            payload, sub.buffer = sub.buffer[:sub.chunk_left - 2], sub.buffer[sub.chunk_left:]
            sub.chunk_left = None
            self.feed_events(sub, payload, now)

    def run(self):
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                while self.timers and self.timers[0][0] <= now:
                    _, index = heapq.heappop(self.timers)
                    self.connect(self.subs[index], now)
                timeout = 0.05 if not self.timers else max(0.0, min(0.05, self.timers[0][0] - now))
                for key, _ in self.selector.select(timeout=timeout):
                    self.readable(key.data, time.monotonic())
        except Exception as error:
            self.errors.append("subscriber loop: %r" % error)

    def open_all(self):
        now = time.monotonic()
        for sub in self.subs:
            heapq.heappush(self.timers, (now, sub.index))
        self.thread.start()

    def connected(self):
        return sum(1 for s in self.subs if s.state == "body")

    def states(self):
        """How many subscribers are in each state, and the first errors (for a failure's message)."""
        counts = {}
        for s in self.subs:
            counts[s.state] = counts.get(s.state, 0) + 1
        return "states %s, timers due %d, errors %d: %s" % (counts, len(self.timers), len(self.errors), self.errors[:5])

    def close(self):
        self.stop.set()
        self.thread.join(10)
        for sub in self.subs:
            if sub.sock is not None:
                sub.sock.close()


class Writer:
    """A POST /register through nginx every `interval` seconds (50 ms), each a new token; records
    every answer."""

    def __init__(self, port, interval=0.05):
        self.port = port
        self.interval = interval
        self.answers = []  # (status, token, body)
        self.latencies = []  # seconds per write, in order
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.sequence = 0

    def write_one(self):
        self.sequence += 1
        token = token_hex(29, 3, self.sequence)
        conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
        began = time.monotonic()
        try:
            conn.request("POST", "/register", body=token.encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            response = conn.getresponse()
            answer = (response.status, token, response.read())
        except OSError as error:
            answer = (None, token, repr(error).encode())
        finally:
            conn.close()
        self.answers.append(answer)
        self.latencies.append(time.monotonic() - began)
        return answer

    def run(self):
        next_at = time.monotonic()
        while not self.stop.is_set():
            self.write_one()
            next_at += self.interval
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self):
        self.stop.set()
        self.thread.join(15)


def peak_per_second(times):
    """The most of `times` (sorted) inside any 1-second window, and where it starts."""
    most, low, at = 0, 0, None
    for high in range(len(times)):
        while times[high] - times[low] >= 1.0:
            low += 1
        if high - low + 1 > most:
            most, at = high - low + 1, times[low]
    return most, at


def wait_subscribers(subscribers, predicate, timeout, what):
    """`wait_until`, and on a timeout the subscribers' states and first errors in the failure."""
    try:
        wait_until(predicate, timeout, what=what)
    except Failure as failure:
        raise Failure("%s (%s)" % (failure, subscribers.states()))


def rolling_deploy(binary, count, drain, roll=True, nginx_replace=(), connect_timeout=30, unnoticed=False,
                   reconnect_timeout=None, write_interval=0.05):
    """Three replicas (`--drain-seconds drain`) behind the documented nginx, `count` subscribers
    and a writer every 50 ms; with `roll`, each replica rolled in turn, else the same time with no
    roll; with `unnoticed` too, one replica is then stopped while nginx still sends to it;
    `reconnect_timeout`: how long every subscriber may take to be back on a stream after the roll
    (default 15 s + 1 s per 1,000 subscribers); `write_interval`: seconds between writes. Returns the numbers (see `run` and bench/roll.py)."""
    for tool in ("redis-server", "nginx"):
        check(shutil.which(tool), "%s is not installed (apt-get install redis-server nginx)" % tool)
    redis = Redis().start()
    ports = [free_port() for _ in range(3)]
    while len(set(ports)) < 3:
        ports = [free_port() for _ in range(3)]
    args = ["--host", HOST, "--access-log", "off", "--drain-seconds", str(drain), "--redis-url",
            "redis://%s:%d/0" % (HOST, redis.port), "--redis-key-prefix", PREFIX]
    replicas = {}
    nginx = subscribers = writer = None

    def start_replica(port):
        server = Server(binary, args + ["--port", str(port)]).start()
        wait_until(lambda: request(port, "GET", "/readyz", timeout=2)[0] == 200, 10, what="replica %d ready" % port)
        return server
    try:
        for port in ports:
            replicas[port] = start_replica(port)
        nginx = DocsNginx(ports, nginx_replace).start()
        status, _, _ = request(nginx.port, "POST", "/register", body=token_hex(29, 3, 0).encode(),
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        check(status == 200, "the first write through nginx answered %s" % status)
        subscribers = Subscribers(nginx.port, count)
        subscribers.open_all()
        wait_subscribers(subscribers, lambda: subscribers.connected() == count, connect_timeout,
                         "%d subscribers connected through nginx" % count)
        started = time.monotonic()
        first_version = min(s.last_id for s in subscribers.subs)
        log("%d subscribers through nginx at version %d; %s" % (
            count, first_version,
            ", ".join("replica %d: %d" % (p, metric(p, "forge_push_token_subscribers")) for p in ports)))
        writer = Writer(nginx.port, write_interval)
        writer.thread.start()
        rolls = []
        for port in ports:
            if not roll:
                time.sleep(1.0 + drain + 1.5)  # as long as a roll takes, with nothing rolled
                continue
            streams = int(metric(port, "forge_push_token_subscribers"))
            nginx.take_out(port)
            time.sleep(1.0)  # the pause (Kubernetes' preStop): the load balancer has let go
            signalled = time.monotonic()
            code = replicas[port].stop(timeout=drain + 5)
            stopped = time.monotonic() - signalled
            check(code == 0, "replica %d exited %s" % (port, code))
            replicas[port] = start_replica(port)
            nginx.put_back(port)
            rolls.append((port, streams, signalled, stopped))
            log("replica %d: %d streams, drained and exited in %.2f s after SIGTERM, back and ready %.2f s after it"
                % (port, streams, stopped, time.monotonic() - signalled))
        if roll and unnoticed:
            # A load balancer that has not noticed: SIGTERM while nginx still sends to the replica.
            # Its drain keeps serving; once it stops, nginx passes its refusals on to the others.
            port = ports[0]
            writes_before = len(writer.answers)
            signalled = time.monotonic()
            code = replicas[port].stop(timeout=drain + 5)
            check(code == 0, "replica %d exited %s" % (port, code))
            replicas[port] = start_replica(port)
            log("replica %d stopped while still in nginx: drained and back in %.2f s under %d writes"
                % (port, time.monotonic() - signalled, len(writer.answers) - writes_before))
        rolled = time.monotonic()
        # Every subscriber back on a stream (a client waits out its retry: of up to 5 s).
        wait_subscribers(subscribers, lambda: subscribers.connected() == count,
                         reconnect_timeout or 15 + count / 1000,
                         "every subscriber connected again after the roll")
        all_back = time.monotonic() - rolled
        writer.close()
        during = list(writer.latencies)
        # The last write, and every subscriber holding it within 5 s.
        status, token, _ = writer.write_one()
        check(status == 200, "the last write answered %s" % status)
        last_write = time.monotonic()
        # The final version: what a new stream through nginx starts with.
        conn = socket.create_connection((HOST, nginx.port), timeout=5)
        try:
            conn.sendall(b"GET /token/stream HTTP/1.1\r\nHost: e2e\r\n\r\n")
            data = b""
            deadline = time.monotonic() + 30  # heartbeats alone would keep the reads going forever
            while not re.search(rb"id: \d+\n", data):
                check(time.monotonic() < deadline, "a new stream after the last write: no event within 30 s")
                chunk = conn.recv(65536)
                check(chunk, "a new stream after the last write ended before its first event")
                data += chunk
            final_version = int(re.search(rb"id: (\d+)\n", data).group(1))
            check(token.encode() in data, "a new stream after the last write does not carry its token")
        finally:
            conn.close()
        subscribers.final = (final_version, token)
        for sub in subscribers.subs:  # those that already have it
            if sub.last_id is not None and sub.last_id >= final_version and sub.final_at is None:
                sub.final_at = last_write
        wait_subscribers(subscribers, lambda: all(s.final_at is not None for s in subscribers.subs), 10,
                         "every subscriber holding the final version")
        subscribers.close()
        answers = writer.answers
        reconnects = sorted(t for s in subscribers.subs for t in s.connects[1:])
        peaks = []
        for port, streams, signalled, stopped in rolls:
            window = [t for t in reconnects if signalled <= t < signalled + stopped + 6]
            peaks.append((port, streams, peak_per_second(window)[0], 2 * streams / drain + 50 if drain else None))
        ordered = sorted(during)
        return {
            "drain": drain, "subscribers": count, "rolled": roll, "seconds": rolled - started,
            "all_back": all_back,
            "writes": len(answers), "refused": [a for a in answers if a[0] != 200],
            "five_xx": [a for a in answers if a[0] is not None and a[0] >= 500],
            "changed": sum(1 for a in answers if a[0] == 200 and b'"changed":true' in a[2]),
            "first_version": first_version, "final_version": final_version,
            "ids_back": sum(s.ids_back for s in subscribers.subs),
            "broken": sum(s.broken for s in subscribers.subs),
            "slowest": max(s.final_at for s in subscribers.subs) - last_write,
            "reconnects": len(reconnects), "peak": peak_per_second(reconnects)[0], "peaks": peaks,
            "write_p50": ordered[len(ordered) // 2] if ordered else None,
            "write_p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else None,
            "errors": subscribers.errors,
            "ended_without_reconnect": [s.index for s in subscribers.subs if len(s.connects) > 1 and s.ends + s.broken == 0],
        }
    finally:
        if writer:
            writer.close()
        if subscribers:
            subscribers.close()
        if nginx:
            nginx.stop()
        for server in replicas.values():
            server.kill()
        redis.kill()


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--drain-seconds", type=int, default=5)
    options = parser.parse_args()
    drain = options.drain_seconds
    r = rolling_deploy(os.path.abspath(options.server), options.subscribers, drain, unnoticed=True)
    log("rolling deploy of 3 replicas (--drain-seconds %d) under %d subscribers and %d writes in %.1f s: "
        "writes refused %d (5xx %d), ids gone back %d, streams broken %d, slowest subscriber to the final "
        "version %.0f ms after the last write, reconnects %d, peak reconnects per second %d (per replica: %s); "
        "write p50 %.1f ms, p99 %.1f ms"
        % (drain, r["subscribers"], r["writes"], r["seconds"], len(r["refused"]), len(r["five_xx"]), r["ids_back"],
           r["broken"], r["slowest"] * 1000, r["reconnects"], r["peak"],
           "; ".join("%d streams -> peak %d/s, bound %.0f" % (s, p, b) for _, s, p, b in r["peaks"]),
           r["write_p50"] * 1000, r["write_p99"] * 1000))
    check(not r["errors"], "subscribers: %s" % r["errors"][:5])
    check(not r["refused"], "%d writes not answered 200: %s" % (len(r["refused"]), r["refused"][:3]))
    check(r["changed"] == r["writes"], "%d of %d writes answered changed" % (r["changed"], r["writes"]))
    # No write lost: each write answered 200 (a new token each) made one version, the last included.
    check(r["final_version"] == r["first_version"] + r["writes"],
          "final version %d, expected %d + %d writes" % (r["final_version"], r["first_version"], r["writes"]))
    check(r["ids_back"] == 0, "%d event ids went back or repeated across reconnects" % r["ids_back"])
    check(r["broken"] == 0, "%d streams closed without the chunked terminator" % r["broken"])
    check(r["slowest"] <= 5.0, "the slowest subscriber held the final version %.2f s after the last write" % r["slowest"])
    for port, streams, peak, bound in r["peaks"]:
        check(peak <= bound, "replica %d's roll: %d reconnects in one second, over 2 x %d / %d + 50 = %.0f"
              % (port, peak, streams, drain, bound))
    check(not r["ended_without_reconnect"], "subscribers reconnected without their stream ending: %s"
          % r["ended_without_reconnect"][:5])


if __name__ == "__main__":
    main(run)
