#!/usr/bin/env python3
"""End-to-end: three replicas on a Redis master watched by three sentinels; the master SIGKILLed
while writes flow (docs/replicas.md, "Redis Sentinel").

Every process is real and started here on free loopback ports: a redis-server master and one
replica of it (`--save '' --appendonly no`), three `redis-server --sentinel` (each with a writable
configuration file of its own; quorum 2, down-after-milliseconds 1000), and three
forge-push-token-server replicas with `--redis-url redis+sentinel://S1,S2,S3/mymaster`, each
with a subscriber. One writer thread per replica posts a new token every 20 ms. Then:

  - the lost-write case is forced: `CLIENT PAUSE 2500 WRITE` on the Redis replica, one more
    acknowledged write (the replica of Redis does not get it), then SIGKILL of the master;
  - every replica of ours writes again (a 200) within 1 s of the sentinels' `+switch-master`
    (heard by this test on a sentinel);
  - no write takes longer than 2.5 s; every answer is 200, or 503 with `store_unavailable`;
  - event ids only go up on every stream; after the writers stop, every replica and the new
    master hold one (version, token), and every change acknowledged after the kill went on from
    the lost write's version, which the promoted replica lacked (the write-back rule restored it);
  - /metrics shows the master change and the new master in use.

Then the same once more over `rediss+sentinel://`: every Redis and sentinel with `port 0`,
`tls-port`, `tls-replication yes` and a certificate made here with `openssl` for 127.0.0.1, the
replicas with `--redis-tls-ca-file`.

    python3 e2e/sentinel_test.py --server PATH [--only plain|tls]
"""
import argparse
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time

from e2e_support import (HOST, SENTINEL_FAILOVER_BOUND, EventStream, sentinels_ready, Failure, Server, check, log, main, request,
                         token_hex, wait_until)
from replicas_test import Redis, free_port, health, version_of, write

REPLICA_ARGS = ["--host", "127.0.0.1", "--port", "0", "--access-log", "off", "--heartbeat", "1"]
PREFIX = "forge-push-token"
MASTER = "mymaster"


class Certificates:
    """A CA and a certificate it signs for 127.0.0.1, made with openssl in a temporary folder."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="e2e-sentinel-tls-")
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        run = lambda *args: subprocess.run(list(args), cwd=self.dir, check=True, capture_output=True)
        run("openssl", "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=e2e-ca",
            "-days", "2")
        run("openssl", "req", *key, "-keyout", "redis.key", "-out", "redis.csr", "-subj", "/CN=redis")
        with open(os.path.join(self.dir, "redis.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        run("openssl", "x509", "-req", "-in", "redis.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", "1",
            "-days", "2", "-extfile", "redis.ext", "-out", "redis.crt")
        self.ca = os.path.join(self.dir, "ca.crt")

    def server_settings(self):
        """The TLS settings of every Redis and sentinel, as (name, value) pairs."""
        return [("tls-cert-file", os.path.join(self.dir, "redis.crt")),
                ("tls-key-file", os.path.join(self.dir, "redis.key")),
                ("tls-ca-cert-file", self.ca), ("tls-auth-clients", "no"), ("tls-replication", "yes")]


def cli_arguments(port, certificates):
    base = ["redis-cli", "-h", HOST, "-p", str(port)]
    return base + (["--tls", "--cacert", certificates.ca] if certificates else [])


class TLSRedis(Redis):
    """A redis-server on its TLS port only (`port 0`), replicating over TLS."""

    def __init__(self, certificates, extra=()):
        super().__init__(extra=extra)
        self.certificates = certificates

    def start(self):
        settings = [item for name, value in self.certificates.server_settings() for item in ("--" + name, value)]
        self.proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", HOST,
                                      "--save", "", "--appendonly", "no"] + settings + self.extra,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.cli("PING") == "PONG", 5, what="TLS redis-server on port %d" % self.port)
        return self

    def cli(self, *args):
        out = subprocess.run(cli_arguments(self.port, self.certificates) + [str(a) for a in args],
                             capture_output=True, timeout=5, text=True)
        return out.stdout.strip()


class Sentinel:
    """A `redis-server --sentinel` with its own configuration file, stopped by its pid."""

    def __init__(self, master_port, certificates=None):
        self.port = free_port()
        self.certificates = certificates
        self.dir = tempfile.mkdtemp(prefix="e2e-sentinel-")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        ports = "port %d\n" % self.port
        if certificates:
            ports = "port 0\ntls-port %d\n" % self.port + "".join(
                "%s %s\n" % item for item in certificates.server_settings())
        with open(self.conf, "w") as f:
            f.write(ports + "bind %s\ndir %s\n" % (HOST, self.dir)
                    + "sentinel monitor %s %s %d 2\n" % (MASTER, HOST, master_port)
                    + "sentinel down-after-milliseconds %s 1000\n" % MASTER
                    + "sentinel failover-timeout %s 5000\n" % MASTER)
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["redis-server", self.conf, "--sentinel"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_until(lambda: self.cli("PING") == "PONG", 5, what="sentinel on port %d" % self.port)
        return self

    def cli(self, *args):
        out = subprocess.run(cli_arguments(self.port, self.certificates) + [str(a) for a in args],
                             capture_output=True, timeout=5, text=True)
        return out.stdout.strip()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


class SwitchListener(threading.Thread):
    """Subscribes to +switch-master on one sentinel; `switched_at` is the monotonic time the
    message arrived."""

    def __init__(self, port, certificates=None):
        super().__init__(daemon=True)
        self.sock = socket.create_connection((HOST, port), timeout=30)
        if certificates:
            context = ssl.create_default_context(cafile=certificates.ca)
            self.sock = context.wrap_socket(self.sock, server_hostname=HOST)
        self.sock.sendall(b"SUBSCRIBE +switch-master\r\n")
        self.switched_at = None
        self.message = None

    def run(self):
        buffer = b""
        try:
            while self.switched_at is None:
                data = self.sock.recv(4096)
                if not data:
                    return
                buffer += data
                if b"+switch-master\r\n$" in buffer and buffer.count(b"\r\n") >= 7 and b"message" in buffer:
                    self.switched_at = time.monotonic()
                    self.message = buffer.decode("utf-8", "replace")
        except OSError:
            return


def failover(binary, certificates=None):
    """The whole scenario; over TLS with `certificates`."""
    make = (lambda extra: TLSRedis(certificates, extra=extra)) if certificates else (lambda extra: Redis(extra=extra))
    # A folder of their own: a replica's full sync writes an RDB file into its working folder.
    master = make(["--dir", tempfile.mkdtemp(prefix="e2e-redis-")]).start()
    replica = make(["--dir", tempfile.mkdtemp(prefix="e2e-redis-"), "--replicaof", HOST, str(master.port)]).start()
    sentinels = [Sentinel(master.port, certificates).start() for _ in range(3)]
    scheme = "rediss+sentinel" if certificates else "redis+sentinel"
    tls_args = ["--redis-tls-ca-file", certificates.ca] if certificates else []
    servers = []
    try:
        # Every sentinel knows the Redis replica and the two other sentinels before the test starts.
        wait_until(lambda: sentinels_ready([sentinel.cli for sentinel in sentinels], MASTER, replica.port), 20,
                   interval=0.2, what="the sentinels to find the replica and each other")
        wait_until(lambda: "master_link_status:up" in replica.cli("INFO", "replication"), 10,
                   what="the Redis replica in sync")
        url = "%s://%s/%s" % (scheme, ",".join("%s:%d" % (HOST, s.port) for s in sentinels), MASTER)
        servers = [Server(binary, REPLICA_ARGS + ["--redis-url", url] + tls_args).start() for _ in range(3)]
        ports = [s.port for s in servers]
        wait_until(lambda: all(health(p) == (200, {"status": "ok", "redis": "connected"}) for p in ports), 10,
                   what="every replica connected through the sentinels")
        for port in ports:
            status, _, body = request(port, "GET", "/metrics")
            text = body.decode()
            check('forge_push_token_redis_master_info{address="%s:%d"} 1' % (HOST, master.port) in text,
                  "metrics do not name the master: %s" % text[-600:])
        log("%s: three replicas found master %d through three sentinels" % (scheme, master.port))

        streams = [EventStream(port, timeout=10) for port in ports]
        for stream in streams:
            check(stream.status == 200, "stream: %s" % stream.status)
        stream_ids = [[] for _ in streams]
        stream_stop = threading.Event()

        def follow(index):
            while not stream_stop.is_set():
                try:
                    event_id, _ = streams[index].next_token_event(timeout=2)
                    stream_ids[index].append(event_id)
                except Failure:
                    continue
                except Exception:
                    return

        followers = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(3)]
        for thread in followers:
            thread.start()

        results = [[] for _ in ports]  # (started, finished, status, body)
        stop = threading.Event()
        paused = threading.Event()

        def writer(index):
            n = 0
            while not stop.is_set():
                if paused.is_set():
                    # Pausing while the test holds the writers (paused), looking every 5 ms.
                    time.sleep(0.005)
                    continue
                n += 1
                started = time.monotonic()
                try:
                    status, _, body = write(ports[index], token_hex(0x5E00 + index, n), timeout=5)
                except OSError as error:
                    status, body = None, {"error": str(error)}
                results[index].append((started, time.monotonic(), status, body))
                # Pacing: about fifty writes a second per writer.
                time.sleep(0.02)

        writers = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(3)]
        for thread in writers:
            thread.start()
        # Load before the failover: the writers run for a second first.
        time.sleep(1)
        listener = SwitchListener(sentinels[0].port, certificates)
        listener.start()

        # The lost-write case: the Redis replica stops applying writes, one more write is
        # acknowledged by the master (the writers wait a moment, so that it is the last one and
        # its version is known), then the master dies while the writers go on.
        paused.set()
        time.sleep(0.1)
        check(replica.cli("CLIENT", "PAUSE", "2500", "WRITE") == "OK", "CLIENT PAUSE on the replica")
        pause_ends = time.monotonic() + 2.5
        lost_token = token_hex(0x1057, 1)
        status, _, body = write(ports[0], lost_token)
        check(status == 200 and body["changed"] is True, "the write before the kill: %s %r" % (status, body))
        lost = version_of(ports[0])
        check(lost[1] == lost_token, "replica 0 serves %r after writing %s" % (lost, lost_token))
        # Every replica applies the write before the master dies: the write-back can restore a
        # lost write only from the replicas that had applied it, and a replica that had not (the
        # kill a few ms after the answer, before its check read the state) may write first on the
        # promoted master and take the lost write's version (seen once in a full run).
        wait_until(lambda: all(version_of(p) == lost for p in ports), 5, what="every replica serving the lost write")
        master.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        paused.clear()
        on_replica = replica.state_of(PREFIX + ":state").get("version")
        check(on_replica is None or int(on_replica) < lost[0],
              "the Redis replica already has version %s >= %d: the lost-write case was not forced"
              % (on_replica, lost[0]))
        log("the Redis replica holds version %s, the last acknowledged write %d; master SIGKILLed"
            % (on_replica, lost[0]))

        # The sentinels' election may split and be retried (e2e_support.SENTINEL_FAILOVER_BOUND).
        wait_until(lambda: listener.switched_at is not None, SENTINEL_FAILOVER_BOUND, interval=0.05,
                   what="+switch-master")
        switched = listener.switched_at
        log("+switch-master %.2f s after the kill" % (switched - killed_at))
        # The promoted replica takes no write while its CLIENT PAUSE lasts: when the sentinels
        # fail over before it ends (down-after-milliseconds 1000 can beat a 2.5 s pause), the 1 s
        # bound runs from the pause's end (seen once in three runs: every replica wrote 1.20 s
        # after a +switch-master that came 1.36 s after the kill).
        writable = max(switched, pause_ends)
        deadline = writable + 3
        while time.monotonic() < deadline:
            if all(any(r[0] >= writable and r[2] == 200 for r in results[i]) for i in range(3)):
                break
            time.sleep(0.05)
        stop.set()
        for thread in writers:
            thread.join(10)
        delays = []
        for index, rows in enumerate(results):
            after = [r for r in rows if r[0] >= writable and r[2] == 200]
            check(after, "replica %d never wrote after +switch-master" % index)
            delays.append(after[0][1] - writable)
            for started, finished, status, body in rows:
                check(finished - started <= 2.5, "a write on replica %d took %.2f s" % (index, finished - started))
                check(status == 200 or (status == 503 and body and body.get("error") == "store_unavailable"),
                      "replica %d answered %s %r" % (index, status, body))
        check(max(delays) <= 1.0, "replicas wrote again %s s after +switch-master (or the pause's end; bound 1 s)"
              % ["%.2f" % d for d in delays])
        log("every replica wrote again within %.2f s of +switch-master (or the pause's end, %.2f s after it); "
            "%d writes, none over 2.5 s, all 200 or 503"
            % (max(delays), writable - switched, sum(len(r) for r in results)))

        # Every change acknowledged after the kill went on from the lost write's version: it was
        # written back to the promoted replica before (or by) the first of them.
        changed_after = sum(1 for rows in results for r in rows if r[0] >= killed_at and r[2] == 200
                            and r[3].get("changed") is True)
        final = wait_until(lambda: (lambda seen: seen if len(seen) == 1 else None)(set(version_of(p) for p in ports)),
                           10, what="the replicas agreeing").pop()
        check(final[0] >= lost[0] + changed_after,
              "the replicas hold %r: %d changes after the kill should have gone on from the lost write's version %d"
              % (final, changed_after, lost[0]))
        held = replica.state_of(PREFIX + ":state")
        check(held.get("version") == str(final[0]) and held.get("token") == final[1],
              "the new master holds %r, the replicas %r" % (held, final))
        texts = "".join(s.stderr() for s in servers)
        check("Redis had lost the state" in texts, "no replica wrote the lost state back")
        check("switched master %s" % MASTER in texts, "no replica heard +switch-master")
        stream_stop.set()
        for index, ids in enumerate(stream_ids):
            check(ids == sorted(ids) and len(ids) == len(set(ids)), "ids went back on stream %d: %s" % (index, ids))
        for port in ports:
            status, _, body = request(port, "GET", "/metrics")
            text = body.decode()
            check('forge_push_token_redis_master_info{address="%s:%d"} 1' % (HOST, replica.port) in text,
                  "metrics do not name the new master: %s" % text[-600:])
            check("forge_push_token_redis_master_changes_total 1" in text, "no master change counted")
        log("all replicas and the new master hold %r: the lost write (version %d) was written back and %d changes "
            "went on from it; ids only went up; /metrics names the new master" % (final, lost[0], changed_after))
        for stream in streams:
            stream.close()
    finally:
        for server in servers:
            server.kill()
        for sentinel in sentinels:
            sentinel.kill()
        master.kill()
        replica.kill()


def run(binary, only):
    if "plain" in only:
        failover(binary)
    if "tls" in only:
        failover(binary, Certificates())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--only", default="plain,tls")
    arguments = parser.parse_args()
    main(lambda: run(os.path.abspath(arguments.server), arguments.only.split(",")))
