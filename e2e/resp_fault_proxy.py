"""A RESP proxy that injects one fault into the traffic between a replica and a real redis-server
(issue 42's fault-injection suite, e2e/redis_faults_test.py).

It forwards every connection both ways, parsing the commands the client sends (RESP arrays) and
the frames Redis answers, so that it knows which reply answers which command (pub/sub `message`
frames are pushes, not replies). Armed with a step and a fault, it fires once, at the first
command of that step on any connection:

  steps:  AUTH (or HELLO), SELECT, SCRIPT LOAD, EVALSHA (a change), EVAL, state read (EVALSHA of
          the sync script: a check of PREFIX:state), PUBLISH, SUBSCRIBE, PING
  faults: stall      no byte passes on that connection, either way, for STALL_SECONDS
          reset      the command is not forwarded; the connection is reset (RST)
          error      the command is not forwarded; its reply is `-ERR injected fault`
          noscript   the command is not forwarded; its reply is `-NOSCRIPT ...` (EVALSHA only)
          truncated  the command is forwarded; half its reply is sent, then the connection is reset
          slow       the command is forwarded; its reply (and what follows it) waits SLOW_SECONDS
          refused    the connection is reset and the port refuses connections for REFUSED_SECONDS

`fired_at` and `ended_at` (time.monotonic()) say when the fault began and when bytes passed again;
`subscribed_at` lists when a SUBSCRIBE was confirmed through the proxy (the replica's
reconnects). Loopback only; every socket belongs to this process and is closed by `close()`.
"""
import collections
import hashlib
import socket
import struct
import threading
import time

from e2e_support import HOST, loopback_listener

STALL_SECONDS = 3.5
SLOW_SECONDS = 2.5
REFUSED_SECONDS = 3.0
STEPS = ("AUTH", "SELECT", "SCRIPT LOAD", "EVALSHA", "EVAL", "state read", "PUBLISH", "SUBSCRIBE", "PING")
FAULTS = ("stall", "reset", "error", "noscript", "truncated", "slow", "refused")


def frame_end(buffer, start):
    """The end of the RESP frame at `start`, or None when the buffer holds only part of it."""
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return None
    kind = buffer[start:start + 1]
    if kind in (b"+", b"-", b":", b"_", b",", b"#"):
        return line_end + 2
    length = int(buffer[start + 1:line_end])
    if kind in (b"$", b"!", b"="):
        if length < 0:
            return line_end + 2
        end = line_end + 2 + length + 2
        return end if end <= len(buffer) else None
    if kind in (b"*", b">", b"~", b"%"):
        position = line_end + 2
        for _ in range(max(length, 0) * (2 if kind == b"%" else 1)):
            position = frame_end(buffer, position)
            if position is None:
                return None
        return position
    raise ValueError("not RESP: %r" % buffer[start:start + 20])


def split_command(buffer):
    """(args, end) of the first whole command array in `buffer`, or None."""
    if not buffer.startswith(b"*"):
        if not buffer:
            return None
        raise ValueError("not a RESP command: %r" % buffer[:20])
    line_end = buffer.find(b"\r\n")
    if line_end < 0:
        return None
    count = int(buffer[1:line_end])
    position = line_end + 2
    args = []
    for _ in range(count):
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        length = int(buffer[position + 1:end])
        if len(buffer) < end + 2 + length + 2:
            return None
        args.append(buffer[end + 2:end + 2 + length])
        position = end + 2 + length + 2
    return args, position


def is_push(frame):
    return frame.startswith(b"*3\r\n$7\r\nmessage\r\n") or frame.startswith(b"*4\r\n$8\r\npmessage\r\n")


class _Link:
    """One proxied connection: the client's socket, Redis', and the replies it waits for."""

    def __init__(self, proxy, client, upstream):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.expect = collections.deque()  # each: ["fwd", fault or None, step] or ["inject", bytes, step]
        self.lock = threading.Lock()        # the deque and every send to the client
        self.gate = threading.Event()       # cleared while stalled
        self.gate.set()
        self.role = "connection"
        self.dead = False

    def start(self):
        threading.Thread(target=self._to_server, daemon=True).start()
        threading.Thread(target=self._to_client, daemon=True).start()

    def reset(self):
        """Ends the connection with a TCP reset towards the client, and closes Redis' side."""
        if self.dead:
            return
        self.dead = True
        try:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
        self.gate.set()

    def _send_client(self, data):
        self.gate.wait()
        if not self.dead:
            self.client.sendall(data)

    def _flush_injected(self):
        """Sends the injected replies at the head of the queue (the lock held)."""
        while self.expect and self.expect[0][0] == "inject":
            self._send_client(self.expect.popleft()[1])

    def _step(self, args):
        name = args[0].upper()
        if name in (b"AUTH", b"HELLO"):
            return "AUTH"
        if name == b"SELECT":
            return "SELECT"
        if name == b"SCRIPT" and len(args) > 2 and args[1].upper() == b"LOAD":
            self.role = "writer"
            self.proxy.loaded(args[2])
            return "SCRIPT LOAD"
        if name == b"EVALSHA":
            self.role = "writer"
            return "state read" if args[1].lower() == self.proxy.sync_sha else "EVALSHA"
        if name == b"EVAL":
            self.role = "writer"
            return "EVAL"
        if name == b"PUBLISH":
            self.role = "writer"
            return "PUBLISH"
        if name == b"SUBSCRIBE":
            self.role = "subscription"
            return "SUBSCRIBE"
        if name == b"PING":
            return "PING"
        return name.decode("ascii", "replace")

    def _to_server(self):
        buffer = b""
        try:
            while not self.dead:
                data = self.client.recv(65536)
                if not data:
                    break
                buffer += data
                while True:
                    parsed = split_command(buffer)
                    if parsed is None:
                        break
                    args, end = parsed
                    raw, buffer = buffer[:end], buffer[end:]
                    step = self._step(args)
                    replies = max(len(args) - 1, 1) if step == "SUBSCRIBE" else 1
                    fault = self.proxy.take(step, self)
                    if fault in ("reset", "refused"):
                        self.reset()
                        if fault == "refused":
                            self.proxy.refuse(REFUSED_SECONDS)
                        else:
                            self.proxy.ended()
                        return
                    if fault in ("error", "noscript"):
                        reply = (b"-ERR injected fault\r\n" if fault == "error"
                                 else b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
                        with self.lock:
                            self.expect.append(["inject", reply, step])
                            self._flush_injected()
                        self.proxy.ended()
                        continue
                    if fault == "stall":
                        self.gate.clear()

                        def reopen():
                            self.gate.set()
                            self.proxy.ended()
                        threading.Timer(STALL_SECONDS, reopen).start()
                    with self.lock:
                        for _ in range(replies):
                            self.expect.append(["fwd", fault if fault in ("truncated", "slow") else None, step])
                    self.gate.wait()
                    if self.dead:
                        return
                    self.upstream.sendall(raw)
        except (OSError, ValueError):
            pass
        self.reset()

    def _to_client(self):
        buffer = b""
        try:
            while not self.dead:
                data = self.upstream.recv(65536)
                if not data:
                    break
                buffer += data
                position = 0
                while position < len(buffer):
                    end = frame_end(buffer, position)
                    if end is None:
                        break
                    frame = buffer[position:end]
                    position = end
                    if is_push(frame):
                        with self.lock:
                            self._send_client(frame)
                        continue
                    with self.lock:
                        self._flush_injected()
                        entry = self.expect.popleft() if self.expect else ["fwd", None, "?"]
                    if entry[2] == "SUBSCRIBE":
                        self.proxy.subscribed_at.append(time.monotonic())
                    if entry[1] == "truncated":
                        with self.lock:
                            self._send_client(frame[:max(1, len(frame) // 2)])
                        # The half frame reaches the client before the reset (the fault: a reply cut mid-way).
                        time.sleep(0.05)
                        self.reset()
                        self.proxy.ended()
                        return
                    if entry[1] == "slow":
                        # The fault itself: the reply held for the scenario's slow_seconds.
                        time.sleep(self.proxy.slow_seconds)
                        self.proxy.ended()
                    with self.lock:
                        self._send_client(frame)
                        self._flush_injected()
                buffer = buffer[position:]
        except (OSError, ValueError):
            pass
        self.reset()


class FaultProxy:
    """Forwards TCP to the redis-server on `upstream_port`; injects the armed fault once."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.listener, self.port = loopback_listener()
        self.listener.settimeout(0.1)
        self.lock = threading.Lock()
        self.links = []
        self.armed = None          # (step, fault) until it fires
        self.slow_seconds = SLOW_SECONDS
        self.seen_armed = []       # the steps that passed while a fault was armed (for a failure)
        self.fired = None          # (step, fault, role) once fired
        self.fired_at = None
        self.ended_at = None
        self.subscribed_at = []
        self.sync_sha = None
        self._loads = []
        self._refused_until = 0.0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def loaded(self, source):
        """A SCRIPT LOAD passed: the second script of a connection is the sync script."""
        with self.lock:
            self._loads.append(hashlib.sha1(source).hexdigest().encode())
            if self.sync_sha is None and len(self._loads) >= 2:
                self.sync_sha = self._loads[1]

    def arm(self, step, fault, slow_seconds=SLOW_SECONDS):
        """Arms `fault` at the next `step`; a `slow` reply waits `slow_seconds`."""
        with self.lock:
            self.armed = (step, fault)
            self.slow_seconds = slow_seconds

    def take(self, step, link):
        """The fault to inject at this command, or None (each armed fault fires once)."""
        with self.lock:
            if self.armed is not None:
                self.seen_armed.append(step)
            if self.armed is None or self.armed[0] != step:
                return None
            fault = self.armed[1]
            self.armed = None
            self.fired = (step, fault, link.role)
            self.fired_at = time.monotonic()
            return fault

    def ended(self):
        """The fault is over: bytes pass again."""
        self.ended_at = time.monotonic()

    def kick(self):
        """Resets every connection (the replica connects again, sending AUTH, SELECT, ...)."""
        with self.lock:
            links = list(self.links)
        for link in links:
            link.reset()

    def refuse(self, seconds):
        """Closes the listening socket for `seconds`: connects are refused (ECONNREFUSED)."""
        with self.lock:
            self._refused_until = time.monotonic() + seconds

    def _accept(self):
        while not self.closed:
            if time.monotonic() < self._refused_until:
                if self.listener is not None:
                    self.listener.close()
                    self.listener = None
                # Pacing: refusing connections until _refused_until, looking every 20 ms.
                time.sleep(0.02)
                continue
            if self.listener is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((HOST, self.port))
                listener.listen(128)
                listener.settimeout(0.1)
                self.listener = listener
                self.ended()
            try:
                client, _ = self.listener.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                if self.closed:
                    return
                continue
            client.settimeout(None)
            try:
                upstream = socket.create_connection((HOST, self.upstream_port), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            link = _Link(self, client, upstream)
            with self.lock:
                self.links = [live for live in self.links if not live.dead] + [link]
            link.start()

    def close(self):
        self.closed = True
        self.kick()
        if self.listener is not None:
            self.listener.close()
