#!/usr/bin/env python3
"""End-to-end: a subscription that stays connected and answers PING but hears nothing is found by
the delivery probe (docs/replicas.md, "A subscription that proves it delivers").

A redis-server, and in front of it a small TCP proxy written here: it forwards every connection
both ways, and while `drop` is set it removes Redis' `message` frames (RESP arrays whose first
element is "message") from the connections that sent SUBSCRIBE, forwarding everything else (the
subscribe confirmations, PONG). So PING keeps proving the connection while nothing is delivered.
A replica runs with `--redis-probe-interval 1` through the proxy. Then:

  - connected, with probes counted in forge_push_token_redis_probe_seconds;
  - drop on: /healthz says `not_delivering` within one probe interval plus 2 s (the bound is
    3.25 s here: 0.25 s for this test's 50 ms polling of /healthz and scheduling on a shared
    machine; the replica polls its subscription up to the probe's own deadlines, so it finds an
    unheard probe on time: 3.01-3.03 s in five runs), and a log line says the probe was not heard;
  - drop off: the replica is `connected` again, and a write through it answers 200.

    python3 e2e/probe_test.py --server PATH
"""
import argparse
import os
import socket
import threading
import time

from e2e_support import HOST, Server, check, log, loopback_listener, main, request, token_hex, wait_until
from replicas_test import Redis, health, write
from resp_fault_proxy import frame_end


def is_message(frame):
    return frame.startswith(b"*3\r\n$7\r\nmessage\r\n")


class DroppingProxy:
    """Forwards TCP to Redis; while `drop` is set, drops `message` frames on subscribers."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.listener, self.port = loopback_listener()
        self.drop = threading.Event()
        self.dropped = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((HOST, self.upstream_port))
            state = {"subscriber": False}
            threading.Thread(target=self._to_server, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._to_client, args=(upstream, client, state), daemon=True).start()

    def _to_server(self, client, upstream, state):
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if b"SUBSCRIBE" in data.upper():
                    state["subscriber"] = True
                upstream.sendall(data)
        except OSError:
            pass
        self._shut(client, upstream)

    def _to_client(self, upstream, client, state):
        buffer = b""
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if not state["subscriber"]:
                    client.sendall(data)
                    continue
                buffer += data
                out = b""
                position = 0
                while position < len(buffer):
                    end = frame_end(buffer, position)
                    if end is None:
                        break
                    frame = buffer[position:end]
                    if self.drop.is_set() and is_message(frame):
                        self.dropped += 1
                    else:
                        out += frame
                    position = end
                buffer = buffer[position:]
                if out:
                    client.sendall(out)
        except OSError:
            pass
        self._shut(client, upstream)

    @staticmethod
    def _shut(*socks):
        """Ends both directions of each socket, so that the other pump's read returns."""
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.listener.close()


def probe_count(port):
    _, _, body = request(port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("forge_push_token_redis_probe_seconds_count "):
            return int(line.split()[1])
    return None


def run(binary):
    redis = Redis().start()
    proxy = DroppingProxy(redis.port)
    server = None
    try:
        server = Server(binary, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off", "--redis-url",
                                 "redis://%s:%d" % (HOST, proxy.port), "--redis-probe-interval", "1"]).start()
        wait_until(lambda: health(server.port) == (200, {"status": "ok", "redis": "connected"}), 10,
                   what="the replica connected through the proxy")
        wait_until(lambda: (probe_count(server.port) or 0) >= 2, 5, what="two probes heard")
        log("connected through the proxy; %d probes heard" % probe_count(server.port))

        proxy.drop.set()
        started = time.monotonic()
        wait_until(lambda: health(server.port)[1].get("redis") == "not_delivering", 6, interval=0.05,
                   what="/healthz not_delivering")
        elapsed = time.monotonic() - started
        check(elapsed <= 3.25, "not_delivering after %.2f s (bound: the 1 s interval + 2 s + 0.25 s)" % elapsed)
        check(proxy.dropped > 0, "the proxy dropped no message")
        check(health(server.port)[0] == 200, "/healthz is not 200 while not delivering")
        check("did not hear this replica's probe" in server.stderr(), "no log line says the probe was not heard")
        log("message frames dropped (PING still answered): not_delivering after %.2f s" % elapsed)

        proxy.drop.clear()
        started = time.monotonic()
        wait_until(lambda: health(server.port) == (200, {"status": "ok", "redis": "connected"}), 6, interval=0.05,
                   what="connected again")
        status, _, body = write(server.port, token_hex(0x9B0B, 1))
        check(status == 200, "a write after recovery: %s %r" % (status, body))
        log("delivery restored: connected again after %.2f s, and a write answers 200" % (time.monotonic() - started))
    finally:
        if server:
            server.kill()
        proxy.close()
        redis.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    arguments = parser.parse_args()
    main(lambda: run(os.path.abspath(arguments.server)))
