#!/usr/bin/env python3
"""End-to-end: what a replica trusts (docs/replicas.md, "What a replica trusts"; issue 27). Each
attack of the issue, run against the release binary with a real redis-server and real sentinels:

  (a) one PUBLISH on PREFIX:changes, in the scripts' format, with the highest version and with the
      next one: every replica's token and PREFIX:state stay as they were, writes go on, and the
      message is counted (kind="unconfirmed");
  (b) a Redis that announces `*2000000000` (then streams `:1`), `$999999999` (then streams
      bytes), or arrays of 64 nested 4 deep, on the subscription, through a proxy in front of a
      real Redis: the replica's peak RSS grows by less than 10 MB, it subscribes again at once,
      and it still writes;
  (c) three sentinels, a rogue one first, naming a fake Redis that answers ROLE with `master`:
      the replica uses the master the two honest sentinels name, and the fake never receives a
      connection (so never the master password); a flood of +switch-master from the rogue one
      naming the fake moves nothing, and makes at most a few log lines;
  (d) 20,000 garbage publishes make at most a few log lines, and all are counted;
  (e) the repairs docs/replicas.md gives, followed as written: a wrong token (POST /register),
      invalid_state (DEL the key), version_exhausted (stop every replica, DEL, start them);
  (f) the channel ACL docs/replicas.md gives, run as written: other clients get NOPERM;
  (g) 2,000 broken request lines make at most 10 libmicrohttpd log lines a second.

    python3 e2e/trust_test.py --server PATH
"""
import argparse
import os
import shlex
import socket
import subprocess
import threading
import time

from e2e_support import (HOST, Server, check, docs_sh_blocks, log, loopback_listener, main, metric,
                         token_hex, wait_until)
from probe_test import DroppingProxy
from replicas_test import PREFIX, REPLICA_ARGS, Redis, health, token_state, version_of, write
from sentinel_test import MASTER, Sentinel


def ignored(port, kind):
    return metric(port, 'forge_push_token_redis_ignored_messages_total{kind="%s"}' % kind) or 0


def replica(binary, url, extra=()):
    return Server(binary, REPLICA_ARGS + ["--redis-url", url, "--redis-key-prefix", PREFIX] + list(extra))


def connected(port):
    return health(port) == (200, {"status": "ok", "redis": "connected"})


def rss_kb(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


# -- (a) --------------------------------------------------------------------------------------
def forged_publish(binary, redis):
    url = "redis://%s:%d" % (HOST, redis.port)
    servers = [replica(binary, url).start(), replica(binary, url).start()]
    try:
        ports = [s.port for s in servers]
        for port in ports:
            wait_until(lambda: connected(port), 10, what="replica connected")
        token = token_hex(0x7A, 1)
        status, _, _ = write(ports[0], token)
        check(status == 200, "the first write: %s" % status)
        wait_until(lambda: all(token_state(p)[2] == {"token": token} for p in ports), 5, what="both serve the token")
        before = redis.state()
        version = int(before["version"])
        for count, forged in enumerate(('{"version":9007199254740991,"token":"deadbeef"}',
                                        '{"version":%d,"token":"deadbeef"}' % (version + 1),
                                        '{"version":%d,"token":null}' % (version + 5)), start=1):
            check(redis.cli("PUBLISH", PREFIX + ":changes", forged) == "2", "both replicas subscribed")
            # The event that must come: each replica read the key and counted the message.
            for port in ports:
                wait_until(lambda: ignored(port, "unconfirmed") >= count, 5, what="the forged message counted")
                check(token_state(port)[2] == {"token": token}, "a forged message changed the token")
                check(version_of(port) == (version, token), "a forged message changed the version")
            check(redis.state() == before, "PREFIX:state changed: %r" % redis.state())
        # The periodic check (every 2 s) writes nothing back either: wait for two of them.
        calls = redis_calls(redis)
        wait_until(lambda: redis_calls(redis) >= calls + 4, 10, what="two periodic checks on each replica")
        check(redis.state() == before, "PREFIX:state written back: %r" % redis.state())
        second = token_hex(0x7A, 2)
        status, _, body = write(ports[1], second)
        check(status == 200, "a write after the forged messages: %s %r" % (status, body))
        wait_until(lambda: all(token_state(p)[2] == {"token": second} for p in ports), 5, what="the write served")
        check(all(health(p)[1]["redis"] == "connected" for p in ports), "a replica is not connected")
    finally:
        for server in servers:
            server.kill()
    log("(a) forged PUBLISH at 2^53 - 1, at version + 1 and with no token: tokens and %s:state unchanged, "
        "nothing written back, counted as unconfirmed, writes go on" % PREFIX)


def redis_calls(redis):
    calls = 0
    for line in redis.cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:") or line.startswith("cmdstat_eval:"):
            calls += int(line.split(":", 1)[1].split(",")[0].split("=")[1])
    return calls


# -- (b) --------------------------------------------------------------------------------------
class AttackingProxy(DroppingProxy):
    """probe_test's forwarding proxy in front of Redis (it drops nothing here). When armed, it
    drops every subscription connection, and the next subscription, once its SUBSCRIBE is
    confirmed, receives the attack instead of Redis' bytes: a header, then `filler` repeated until
    the client closes or `limit` bytes are sent."""

    def __init__(self, upstream_port):
        self.lock = threading.Lock()
        self.attack = None
        self.subscribers = []
        self.subscriptions = 0
        self.sent = 0
        self.done = threading.Event()
        super().__init__(upstream_port)

    def arm(self, header, filler, limit=120 * 1024 * 1024):
        with self.lock:
            self.attack = (header, filler, limit)
            self.done.clear()
            victims, self.subscribers = self.subscribers, []
        for sock in victims:
            self._shut(sock)

    def _to_server(self, client, upstream, state):
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if b"SUBSCRIBE" in data.upper() and not state["subscriber"]:
                    state["subscriber"] = True
                    with self.lock:
                        self.subscribers.append(client)
                        self.subscriptions += 1
                upstream.sendall(data)
        except OSError:
            pass
        self._shut(client, upstream)

    def _to_client(self, upstream, client, state):
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                client.sendall(data)
                if state["subscriber"] and b"subscribe" in data:
                    with self.lock:
                        attack, self.attack = self.attack, None
                    if attack:
                        self._send_attack(client, *attack)
                        break
        except OSError:
            pass
        self._shut(client, upstream)

    def _send_attack(self, client, header, filler, limit):
        chunk = filler * (1024 * 1024 // len(filler))
        sent = 0
        try:
            client.sendall(header)
            while sent < limit:
                client.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        self.sent = sent
        self.done.set()


def huge_replies(binary, redis):
    proxy = AttackingProxy(redis.port)
    server = replica(binary, "redis://%s:%d" % (HOST, proxy.port)).start()
    try:
        wait_until(lambda: connected(server.port), 10, what="replica connected through the proxy")
        for name, header, filler in (("*2000000000", b"*2000000000\r\n", b":1\r\n"),
                                     ("$999999999", b"$999999999\r\n", b"x" * 1024),
                                     # Arrays of 64 nested 4 deep: each bound alone allows 64^4.
                                     ("*64 nested 4 deep", b"*64\r\n*64\r\n*64\r\n", b"*64\r\n" + b":1\r\n" * 64)):
            before_oversized = ignored(server.port, "oversized")
            subscriptions = proxy.subscriptions
            baseline = rss_kb(server.pid)
            peak_before = rss_kb(server.pid, "VmHWM")
            peak = [baseline]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], rss_kb(server.pid))
                    # Pacing: the RSS sampler reads /proc every 5 ms.
                    time.sleep(0.005)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            proxy.arm(header, filler)
            check(proxy.done.wait(30), "%s: the attack did not end" % name)
            wait_until(lambda: ignored(server.port, "oversized") > before_oversized, 10,
                       what="%s counted as oversized" % name)
            wait_until(lambda: proxy.subscriptions > subscriptions + 1, 10, what="%s: subscribed again" % name)
            stop.set()
            sampler.join(2)
            grown = max(peak[0], rss_kb(server.pid, "VmHWM") if rss_kb(server.pid, "VmHWM") > peak_before else 0)
            grown_kb = grown - baseline
            check(grown_kb < 10 * 1024, "%s: RSS grew by %d kB (bound 10 MB)" % (name, grown_kb))
            check(proxy.sent < 8 * 1024 * 1024, "%s: the replica read %d bytes before refusing" % (name, proxy.sent))
            wait_until(lambda: connected(server.port), 10, what="%s: connected again" % name)
            status, _, _ = write(server.port, token_hex(0x9C, len(name)))
            check(status == 200, "%s: a write after the attack: %s" % (name, status))
            log("(b) %s on the subscription: refused after %d bytes sent, RSS %d -> peak %d kB (+%d kB), "
                "subscribed again, writes answer 200" % (name, proxy.sent, baseline, grown, grown_kb))
        check("a bulk string may hold at most 65536 bytes" in server.stderr()
              or "may hold at most" in server.stderr(), "no log line names the limit")
    finally:
        server.kill()
        proxy.close()


# -- (c) --------------------------------------------------------------------------------------
def resp(value):
    if value is None:
        return b"*-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(resp(item) for item in value)
    data = value.encode() if isinstance(value, str) else value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def read_command(sock, buffer):
    """One RESP command array from `sock` (returns (args, rest)); None at the end."""
    while True:
        if buffer.startswith(b"*") and b"\r\n" in buffer:
            count_end = buffer.index(b"\r\n")
            count = int(buffer[1:count_end])
            position = count_end + 2
            args = []
            complete = True
            for _ in range(count):
                line_end = buffer.find(b"\r\n", position)
                if line_end < 0:
                    complete = False
                    break
                length = int(buffer[position + 1:line_end])
                if len(buffer) < line_end + 2 + length + 2:
                    complete = False
                    break
                args.append(buffer[line_end + 2:line_end + 2 + length])
                position = line_end + 2 + length + 2
            if complete:
                return args, buffer[position:]
        data = sock.recv(65536)
        if not data:
            return None
        buffer += data


class FakeServer:
    """A TCP server speaking RESP with `answer(args, sock)`; records every connection and command."""

    def __init__(self, answer):
        self.answer = answer
        self.listener, self.port = loopback_listener()
        self.connections = 0
        self.commands = []
        self.subscribers = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock):
        buffer = b""
        try:
            while True:
                got = read_command(sock, buffer)
                if got is None:
                    return
                args, buffer = got
                with self.lock:
                    self.commands.append([a.decode("utf-8", "replace") for a in args])
                sock.sendall(self.answer(args, sock, self))
        except (OSError, ValueError):
            return
        finally:
            sock.close()

    def close(self):
        self.listener.close()


def rogue_sentinel(binary):
    master = Redis(extra=["--requirepass", "master-secret"]).start()
    sentinels = []
    fake_redis = FakeServer(lambda args, sock, me: resp([b"master", 0, []]) if args[0].upper() == b"ROLE"
                            else b"+OK\r\n")

    def sentinel_answer(args, sock, me):
        command = [a.decode().lower() for a in args]
        if command[:2] == ["sentinel", "get-master-addr-by-name"]:
            return resp([HOST, str(fake_redis.port)])
        if command[:2] == ["sentinel", "replicas"]:
            return resp([])
        if command[0] == "subscribe":
            with me.lock:
                me.subscribers.append(sock)
            return resp([b"subscribe", args[1], 1])
        if command[0] == "ping":
            return b"+PONG\r\n"
        return b"+OK\r\n"
    rogue = FakeServer(sentinel_answer)
    server = None
    replica_redis = Redis(extra=["--replicaof", HOST, str(master.port), "--masterauth", "master-secret",
                                 "--requirepass", "master-secret"]).start()
    try:
        sentinels = [Sentinel(master.port).start() for _ in range(2)]
        for sentinel in sentinels:
            sentinel.cli("SENTINEL", "SET", MASTER, "auth-pass", "master-secret")
        # The honest sentinels list the Redis replica before the service starts, so that the
        # majority's replica list holds it.
        wait_until(lambda: all(str(replica_redis.port) in s.cli("SENTINEL", "replicas", MASTER) for s in sentinels),
                   30, interval=0.2, what="the honest sentinels to list the Redis replica")
        url = "redis+sentinel://:master-secret@%s/%s" % (
            ",".join("%s:%d" % (HOST, port) for port in [rogue.port] + [s.port for s in sentinels]), MASTER)
        server = replica(binary, url).start()
        wait_until(lambda: connected(server.port), 15, what="the replica connected through the sentinels")
        address = 'forge_push_token_redis_master_info{address="%s:%d"}' % (HOST, master.port)
        check(metric(server.port, address) == 1, "the master in use is not the honest one")
        status, _, _ = write(server.port, token_hex(0x5E, 1))
        check(status == 200, "a write through the honest master: %s" % status)
        check(master.cli("-a", "master-secret", "--no-auth-warning", "HGET", PREFIX + ":state", "token")
              == token_hex(0x5E, 1), "the write is not on the honest master")
        check(fake_redis.connections == 0, "the fake Redis got %d connections (commands: %r)"
              % (fake_redis.connections, fake_redis.commands))
        # The rogue sentinel is the first in the URL, so the +switch-master watcher listens to it:
        # a flood naming the fake Redis makes the replica ask the majority, never move.
        wait_until(lambda: rogue.subscribers, 10, what="the watcher subscribed on the rogue sentinel")
        message = "%s %s %d %s %d" % (MASTER, HOST, master.port, HOST, fake_redis.port)
        frame = resp([b"message", b"+switch-master", message.encode()])
        for _ in range(1000):
            rogue.subscribers[0].sendall(frame)
        wait_until(lambda: ignored(server.port, "unvouched") >= 1000, 15, what="1,000 unvouched switches counted")
        foreign = resp([b"message", b"+switch-master", b"othermaster 1.2.3.4 1 5.6.7.8 2"])
        for _ in range(1000):
            rogue.subscribers[0].sendall(foreign)
        wait_until(lambda: ignored(server.port, "switch_master") >= 1000, 15, what="1,000 foreign switches counted")
        status, _, _ = write(server.port, token_hex(0x5E, 2))
        check(status == 200, "a write after the flood: %s" % status)
        # +switch-master naming the Redis replica, which the majority lists but which was not
        # promoted: the replica checks ROLE there first and stays on the master; writes go on.
        message = "%s %s %d %s %d" % (MASTER, HOST, master.port, HOST, replica_redis.port)
        frame = resp([b"message", b"+switch-master", message.encode()])
        before = ignored(server.port, "unvouched")
        refused = 0
        for index in range(100):
            if index % 5 == 0:
                rogue.subscribers[0].sendall(frame)
            status, _, _ = write(server.port, token_hex(0x5F, index + 1))
            refused += status != 200
            # Pacing: a hundred writes, 10 ms apart, among the rogue frames.
            time.sleep(0.01)
        wait_until(lambda: ignored(server.port, "unvouched") >= before + 20, 15,
                   what="20 switches to a replica that is not a master counted")
        check(refused == 0, "%d of 100 writes refused while a rogue sentinel announced a replica as master" % refused)
        check(metric(server.port, address) == 1, "the replica left the honest master for a replica")
        check(metric(server.port, address) == 1, "the replica moved off the honest master")
        check(fake_redis.connections == 0, "the fake Redis got a connection after the flood")
        lines = server.stderr()
        check(lines.count("no majority of the sentinels") <= 3,
              "%d log lines for 1,000 unvouched switches" % lines.count("no majority of the sentinels"))
        check(lines.count("that is not for master") <= 3,
              "%d log lines for 1,000 foreign switches" % lines.count("that is not for master"))
        check("master-secret" not in lines, "the master password was logged")
    finally:
        if server:
            server.kill()
        for sentinel in sentinels:
            sentinel.kill()
        replica_redis.kill()
        rogue.close()
        fake_redis.close()
        master.kill()
    log("(c) a rogue first sentinel naming a fake Redis: the honest majority's master used, the fake never "
        "connected to; 1,000 +switch-master naming it and 1,000 for another name counted, at most a few log lines; "
        "20 naming a listed replica that is not a master: no write refused")


# -- (d) --------------------------------------------------------------------------------------
def log_flood(binary, redis):
    server = replica(binary, "redis://%s:%d" % (HOST, redis.port)).start()
    try:
        wait_until(lambda: connected(server.port), 10, what="replica connected")
        with socket.create_connection((HOST, redis.port), timeout=30) as sock:
            payload = b"".join(resp([b"PUBLISH", (PREFIX + ":changes").encode(), b"garbage"]) for _ in range(20000))
            sock.sendall(payload)
            received = b""
            while received.count(b"\r\n") < 20000:
                chunk = sock.recv(65536)  # each read bounded by the socket's 30 s
                check(chunk, "Redis closed the connection after %d replies" % received.count(b"\r\n"))
                received += chunk
        wait_until(lambda: ignored(server.port, "malformed") >= 20000, 20, what="20,000 garbage messages counted")
        lines = server.stderr().count("that this service did not write")
        check(1 <= lines <= 3, "%d log lines for 20,000 garbage messages" % lines)
        check(connected(server.port), "the replica is not connected after the flood")
    finally:
        server.kill()
    log("(d) 20,000 garbage publishes: all counted (kind=\"malformed\"), %d log line(s)" % lines)


# -- (e) --------------------------------------------------------------------------------------
def documented_repairs(binary, redis):
    url = "redis://%s:%d" % (HOST, redis.port)
    key = PREFIX + ":state"
    servers = [replica(binary, url).start(), replica(binary, url).start()]
    try:
        ports = [s.port for s in servers]
        for port in ports:
            wait_until(lambda: connected(port), 10, what="replica connected")
        # A wrong token: POST /register with the right one.
        status, _, _ = write(ports[0], token_hex(0xBAD, 1))
        right = token_hex(0x600D, 1)
        status, _, _ = write(ports[1], right)
        check(status == 200, "the repair write: %s" % status)
        wait_until(lambda: all(token_state(p)[2] == {"token": right} for p in ports), 5, what="the right token")
        # invalid_state: DEL the key; the replicas write their state back.
        redis.cli("DEL", key)
        redis.cli("SET", key, "garbage")
        for port in ports:
            wait_until(lambda: health(port)[1].get("redis") == "invalid_state", 10, what="invalid_state")
        redis.cli("DEL", key)
        for port in ports:
            wait_until(lambda: connected(port), 10, what="connected after DEL")
        wait_until(lambda: redis.state().get("token") == right, 5, what="the state written back")
        # version_exhausted: stop every replica, DEL the key, start them.
        redis.cli("HSET", key, "version", "9007199254740991")
        for port in ports:
            wait_until(lambda: health(port)[1].get("redis") == "version_exhausted", 10, what="version_exhausted")
        for server in servers:
            server.stop()
        redis.cli("DEL", key)
        servers = [replica(binary, url).start(), replica(binary, url).start()]
        ports = [s.port for s in servers]
        for port in ports:
            wait_until(lambda: connected(port), 10, what="connected after the restart")
        status, _, body = write(ports[0], right)
        check(status == 200, "a write after the version_exhausted repair: %s %r" % (status, body))
        check(redis.state() == {"version": "1", "token": right}, "state after the repair: %r" % redis.state())
    finally:
        for server in servers:
            server.kill()
        redis.cli("DEL", key)
    log("(e) docs/replicas.md's repairs as written: a wrong token, invalid_state (DEL), version_exhausted "
        "(stop every replica, DEL, start them)")


def channel_acl(binary):
    """The ACL of "What a replica trusts", as written: the replicas log in as `forge`; any other
    client (the default user here) gets NOPERM on the channels."""
    redis = Redis().start()
    server = None
    try:
        blocks = docs_sh_blocks("replicas.md", "## What a replica trusts", until="Repairs")
        check(blocks, "no sh block in docs/replicas.md, \"What a replica trusts\"")
        for line in "".join(blocks).splitlines():
            command = line.split("  #", 1)[0].strip()
            if command.startswith("redis-cli "):
                out = subprocess.run(["redis-cli", "-h", HOST, "-p", str(redis.port)]
                                     + shlex.split(command)[1:], capture_output=True, text=True, timeout=5)
                check(out.stdout.strip() == "OK", "%s: %r" % (command, out.stdout + out.stderr))
        out = redis.cli("PUBLISH", "forge-push-token:changes", '{"version":1,"token":"aa"}')
        check("NOPERM" in out, "another client may still publish on the channel: %r" % out)
        url = "redis://forge:PASSWORD@%s:%d" % (HOST, redis.port)
        server = Server(binary, REPLICA_ARGS + ["--redis-url", url]).start()
        wait_until(lambda: connected(server.port), 10, what="a replica logged in as forge")
        status, _, _ = write(server.port, token_hex(0xAC1, 1))
        check(status == 200, "a write as forge: %s" % status)
    finally:
        if server:
            server.kill()
        redis.kill()
    log("(f) the channel ACL of docs/replicas.md as written: other clients get NOPERM on PUBLISH, the "
        "replicas (user forge) write")


def http_log_flood(binary):
    """libmicrohttpd's warnings, which any client causes, are limited to 10 a second."""
    server = Server(binary, REPLICA_ARGS).start()
    try:
        for _ in range(2000):
            with socket.create_connection((HOST, server.port), timeout=5) as sock:
                sock.sendall(b"GARBAGE\x01 / HTTP/9.9\r\n\r\n")
                try:
                    sock.recv(4096)
                except OSError:
                    pass
        lines = server.stderr().count("libmicrohttpd:")
        check(lines <= 40, "%d libmicrohttpd log lines for 2,000 broken requests" % lines)

        # The next warning that is written says how many were left out before it (the event that
        # must come: one more broken request, in a later second).
        def one_more_says_how_many():
            with socket.create_connection((HOST, server.port), timeout=5) as sock:
                sock.sendall(b"GARBAGE\x01 / HTTP/9.9\r\n\r\n")
                try:
                    sock.recv(4096)
                except OSError:
                    pass
            return "left out before this one" in server.stderr()
        wait_until(one_more_says_how_many, 10, interval=0.2, what="a line saying how many warnings were left out")
    finally:
        server.kill()
    log("(g) 2,000 broken request lines: %d libmicrohttpd log lines (at most 10 a second)" % lines)


def run(binary):
    http_log_flood(binary)
    channel_acl(binary)
    redis = Redis().start()
    try:
        forged_publish(binary, redis)
        huge_replies(binary, redis)
        log_flood(binary, redis)
        documented_repairs(binary, redis)
    finally:
        redis.kill()
    rogue_sentinel(binary)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    arguments = parser.parse_args()
    main(lambda: run(os.path.abspath(arguments.server)))
