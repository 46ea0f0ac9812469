#!/usr/bin/env python3
"""End-to-end: what an attacker found at the edges of HTTP (issue 21, points 2 to 5), against the
release binary over real loopback sockets.

Each check is one function below and prints one TAP line (`ok N - ...` / `not ok N - ...` with the
reason as `# ...` lines); at the end `# N passed, N failed` and exit status 1 when any failed.
Servers run on free loopback ports (one per configuration, shared by the checks that need it) and
are all stopped at the end. Standard library only.

  head     every request head from 3,500 to 8,200 bytes (steps of 10; the padding in a Cookie or
           an X-Filler field) to GET /token, POST /register, POST /fail and GET /token/stream gets
           an answer, or changed nothing (§2)
  deadline --header-timeout: a head or body trickled a line at a time gets 408 and is closed
           within the deadline, also on a kept-alive connection; an idle kept-alive connection and
           an event stream are not cut; counted in forge_push_token_request_timeouts_total (§3)
  pipeline 100 pipelined GET /token answered in under 100 ms; a client that pipelined 20,000 and
           stopped reading is closed within --idle-timeout of its last byte (§4)
  framing  a bare CR in a header line, Transfer-Encoding on HTTP/1.0 and a request line with two
           spaces get 400 and a closed connection (a request smuggled behind them is never
           carried out), Expect: 200-ok gets 417 (§5)

    python3 e2e/http_edges_test.py --server PATH [--only SUBSTRING[,SUBSTRING...]] [--verbose]
"""
import json
import socket
import sys
import threading
import time

from e2e_support import check_list, run_tap_checks, HOST, EventStream, Failure, Server, check, metric_value

VERBOSE = False


def note(message):
    if VERBOSE:
        print("#   " + message, flush=True)


# -- servers ------------------------------------------------------------------------------------
class Fixtures:
    """Servers started on first use, one per configuration, all stopped at the end."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.workdir = workdir
        self.servers = {}
        self.all = []

    def get(self, name, args=()):
        if name not in self.servers:
            server = Server(self.binary, ["--host", HOST, "--port", "0"] + list(args), workdir=self.workdir)
            self.all.append(server)
            self.servers[name] = server.start()
        return self.servers[name]

    def stop_all(self):
        for server in self.all:
            try:
                server.stop()
            except Failure:
                pass
            server.kill()


# -- raw HTTP -----------------------------------------------------------------------------------
def raw_connect(port, timeout=5):
    sock = socket.create_connection((HOST, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head_of(method, path, fields, size=None, pad="X-Filler"):
    """A request head (request line, `fields`, blank line); with `size`, a `pad` field is added
    so that the head is exactly `size` bytes."""
    lines = ["%s %s HTTP/1.1" % (method, path)] + ["%s: %s" % field for field in fields]
    if size is not None:
        used = sum(len(line) + 2 for line in lines) + 2
        prefix = pad + ": " + ("c=" if pad == "Cookie" else "")
        filler = size - used - len(prefix) - 2
        check(filler >= 1, "a %d-byte head is too short for its fields" % size)
        lines.append(prefix + "x" * filler)
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    check(size is None or len(head) == size, "built a %d-byte head, not %r" % (len(head), size))
    return head


def exchange(port, data, timeout=3, until_headers=False):
    """Sends `data` on a new connection and reads until the server closes it (or, with
    `until_headers`, until the answer's header block is complete). Returns (status or None, the
    bytes read)."""
    sock = raw_connect(port, timeout)
    received = b""
    try:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            except socket.timeout:
                break
            if not chunk:
                break
            received += chunk
            if until_headers and b"\r\n\r\n" in received:
                break
    finally:
        sock.close()
    if received.startswith(b"HTTP/1.") and len(received.split(b" ", 2)) >= 2:
        return int(received.split(b" ", 2)[1]), received
    return None, received


def current_token(port):
    status, data = exchange(port, head_of("GET", "/token", [("Host", HOST), ("Connection", "close")]))
    check(status == 200, "GET /token answered %r" % data[:200])
    return json.loads(data.partition(b"\r\n\r\n")[2])["token"]


def register(port, hex_text, size=None, pad="X-Filler"):
    body = hex_text.encode()
    fields = [("Host", HOST), ("Connection", "close"), ("Content-Type", "application/x-www-form-urlencoded"),
              ("Content-Length", str(len(body)))]
    return exchange(port, head_of("POST", "/register", fields, size, pad) + body)


def fail(port, size=None, pad="X-Filler"):
    fields = [("Host", HOST), ("Connection", "close"), ("Content-Length", "0")]
    return exchange(port, head_of("POST", "/fail", fields, size, pad))


def is_json_error(data, code):
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return b"application/json" in head and json.loads(body)["error"] == code
    except (ValueError, KeyError, TypeError):
        return False


# -- checks -------------------------------------------------------------------------------------
CHECKS, test = check_list()


HEAD_SIZES = range(3500, 8201, 10)


@test("head: at the 8 KiB pool (--max-header-bytes 7008), heads of 3,500 to 8,200 bytes (Cookie or X-Filler) to "
      "GET /token, POST /register, POST /fail, GET /token/stream: no write is carried out unanswered, no stream is "
      "left open")
def head_sizes_answered_or_unchanged():
    s = FIX.get("pool_8k", ["--max-header-bytes", "7008"])
    port = s.port
    problems = []
    tally = {}

    def count(what, status, data):
        kind = "none" if status is None else "%d%s" % (status, " json" if b"application/json" in data else "")
        tally.setdefault(what, {}).setdefault(kind, 0)
        tally[what][kind] += 1

    for pad in ("Cookie", "X-Filler"):
        for size in HEAD_SIZES:
            what = "%s %d" % (pad, size)
            # GET /token: reads change nothing; an answer is all we ask (any status).
            status, data = exchange(port, head_of("GET", "/token", [("Host", HOST), ("Connection", "close")],
                                                  size, pad))
            count("GET /token", status, data)
            # POST /register of a new token: answered, or the token is unchanged.
            before = current_token(port)
            hex_text = "%08x" % (0x10000000 + size * 4 + (pad == "Cookie"))
            status, data = register(port, hex_text, size, pad)
            count("POST /register", status, data)
            after = current_token(port)
            if status is None and after != before:
                problems.append("POST /register with %s: carried out (%s -> %s) and never answered"
                                % (what, before, after))
            if status is not None and status != 200 and after != before:
                problems.append("POST /register with %s: answered %d yet changed the token" % (what, status))
            if status == 200 and after != hex_text:
                problems.append("POST /register with %s: answered 200 but the token is %s" % (what, after))
            # POST /fail with a token set: answered, or the token is still set.
            if after is None:
                check(register(port, "%08x" % (0x20000000 + size))[0] == 200, "a plain register failed")
            status, data = fail(port, size, pad)
            count("POST /fail", status, data)
            token = current_token(port)
            if status is None and token is None:
                problems.append("POST /fail with %s: carried out and never answered" % what)
            if status is not None and status != 200 and token is None:
                problems.append("POST /fail with %s: answered %d yet cleared the token" % (what, status))
            # The stream: its head (200 text/event-stream) or a refusal.
            status, data = exchange(port, head_of("GET", "/token/stream", [("Host", HOST)], size, pad),
                                    until_headers=True)
            count("GET /token/stream", status, data)
            if len(problems) > 20:
                break
    for what, kinds in sorted(tally.items()):
        note("%s: %s" % (what, ", ".join("%s x%d" % item for item in sorted(kinds.items()))))
    check(not problems, "%d problems:\n%s" % (len(problems), "\n".join(problems[:20])))
    check(exchange(port, head_of("GET", "/healthz", [("Host", HOST), ("Connection", "close")]))[0] == 200,
          "the server does not answer /healthz afterwards")
    # No stream, answered or not, is left counted.
    status, data = exchange(port, head_of("GET", "/metrics", [("Host", HOST), ("Connection", "close")]))
    lines = [line for line in data.decode().splitlines() if line.startswith("forge_push_token_subscribers ")]
    check(lines and float(lines[0].split()[1]) == 0, "subscribers left open: %r" % lines)


def post_heads_answered_or_unchanged(port, sizes, limit, first_token):
    """POST /register heads of each of `sizes` bytes (Cookie or X-Filler padded): none carried out
    unanswered or refused yet carried out, and every X-Filler head within `limit`
    (--max-header-bytes: the head plus five records of 48 bytes) served."""
    problems = []
    served = 0
    for pad in ("Cookie", "X-Filler"):
        for size in sizes:
            before = current_token(port)
            hex_text = "%08x" % (first_token + size * 4 + (pad == "Cookie"))
            status, data = register(port, hex_text, size, pad)
            after = current_token(port)
            if status is None and after != before:
                problems.append("%s %d: carried out (%s -> %s) and never answered" % (pad, size, before, after))
            if status is not None and status != 200 and after != before:
                problems.append("%s %d: answered %d yet changed the token" % (pad, size, status))
            if status == 200:
                served += 1
            if pad == "X-Filler" and size + 5 * 48 <= limit and status != 200:
                problems.append("%s %d: within --max-header-bytes yet answered %r" % (pad, size, data[:120]))
    note("served %d" % served)
    check(served > 0, "nothing was served")
    check(not problems, "%d problems:\n%s" % (len(problems), "\n".join(problems[:20])))


@test("head: with --max-header-bytes 15184 (the largest pool of 128-byte growth steps), POST /register heads of "
      "11,000 to 16,500 bytes are answered or change nothing, and those within the limit are served")
def head_sizes_largest_pool():
    s = FIX.get("largest_pool", ["--max-header-bytes", "15184"])
    post_heads_answered_or_unchanged(s.port, range(11000, 16501, 50), 15184, 0x60000000)


@test("head: at the default pool (40 KiB, --max-header-bytes 36320), where libmicrohttpd grows its read buffer by an "
      "eighth of the free space, POST /register heads of 19,000 to 41,500 bytes are answered or change nothing, and "
      "those within the limit are served")
def head_sizes_default_pool():
    post_heads_answered_or_unchanged(FIX.get("default").port, range(19000, 41501, 100), 36320, 0x70000000)


@test("head: a head over --max-header-bytes that fits in the pool gets the service's own JSON 431 before "
      "anything is carried out")
def head_over_budget_json_431():
    s = FIX.get("pool_8k", ["--max-header-bytes", "7008"])
    before = current_token(s.port)
    for size in (7100, 7200, 7300):
        status, data = register(s.port, "%08x" % (0x30000000 + size), size)
        check(status == 431 and is_json_error(data, "header_fields_too_large"),
              "a %d-byte head answered %r, expected a JSON 431" % (size, data[:300]))
    check(current_token(s.port) == before, "a refused POST changed the token")
    # Under the budget: served.
    status, data = register(s.port, "%08x" % 0x30006000, 6000)
    check(status == 200, "a 6,000-byte head answered %r" % data[:300])


# ---- §3: --header-timeout ----
DEADLINE_ARGS = ["--header-timeout", "2", "--idle-timeout", "8", "--heartbeat", "1"]


def metric(port, series):
    status, data = exchange(port, head_of("GET", "/metrics", [("Host", HOST), ("Connection", "close")]))
    check(status == 200, "GET /metrics answered %r" % data[:200])
    value = metric_value(data.decode(), series)
    check(value is not None, "no series %s in /metrics" % series)
    return value


def trickle(sock, first, pieces, interval, stop):
    """Sends `first`, then one of `pieces` every `interval` seconds until `stop` is set or the
    server stops taking them."""
    try:
        sock.sendall(first)
        for piece in pieces:
            if stop.wait(interval):
                return
            sock.sendall(piece)
    except OSError:
        pass


def read_until_closed(sock, timeout):
    """Everything the server sends until it closes the connection: (bytes, seconds, 'eof' |
    'reset' | 'open')."""
    started = time.monotonic()
    data = b""
    sock.settimeout(0.2)
    while time.monotonic() - started < timeout:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data, time.monotonic() - started, "reset"
        if not chunk:
            return data, time.monotonic() - started, "eof"
        data += chunk
    return data, time.monotonic() - started, "open"


def expect_408(data, how, elapsed, low, high, what):
    check(how in ("eof", "reset"), "%s: still open after %.1f s (got %r)" % (what, elapsed, data[:200]))
    check(data.startswith(b"HTTP/1.1 408 ") and is_json_error(data, "request_timeout"),
          "%s: expected a JSON 408 before the close, got %r" % (what, data[:300]))
    check(low <= elapsed <= high, "%s: closed after %.2f s, expected %.1f to %.1f s" % (what, elapsed, low, high))


@test("deadline: a head trickled one header line every 0.5 s gets a JSON 408 and is closed after --header-timeout 2")
def deadline_slow_head():
    s = FIX.get("deadline", DEADLINE_ARGS)
    before = metric(s.port, 'forge_push_token_request_timeouts_total{phase="head"}')
    fds = s.fds()
    sock = raw_connect(s.port)
    stop = threading.Event()
    sender = threading.Thread(target=trickle, daemon=True, args=(
        sock, b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n", [b"X-Slow-%d: v\r\n" % i for i in range(40)], 0.5, stop))
    try:
        sender.start()
        data, elapsed, how = read_until_closed(sock, 8)
        # 408 at 2 s (the loop looks every 0.25 s), closed one linger (1 s) later.
        expect_408(data, how, elapsed, 1.9, 4.5, "a trickled head")
        note("trickled head: 408 and %s after %.2f s" % (how, elapsed))
        # The server closes its socket one linger (1 s) later, though the client keeps sending.
        deadline = time.monotonic() + 3
        while s.fds() > fds and time.monotonic() < deadline:
            time.sleep(0.05)
        check(s.fds() <= fds, "the server still holds the connection 3 s after its 408 (%d fds, %d before)"
              % (s.fds(), fds))
        note("server closed it %.2f s after the 408" % (time.monotonic() - deadline + 3))
    finally:
        stop.set()
        sock.close()
    check(metric(s.port, 'forge_push_token_request_timeouts_total{phase="head"}') == before + 1,
          "request_timeouts_total{phase=\"head\"} did not go up by one")


@test("deadline: a body trickled one byte every 0.5 s gets a JSON 408, is closed, and changes nothing")
def deadline_slow_body():
    s = FIX.get("deadline", DEADLINE_ARGS)
    before = metric(s.port, 'forge_push_token_request_timeouts_total{phase="body"}')
    token = current_token(s.port)
    body = b"ab" * 32
    sock = raw_connect(s.port)
    stop = threading.Event()
    head = ("POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            "Content-Length: %d\r\n\r\n" % len(body)).encode()
    sender = threading.Thread(target=trickle, daemon=True, args=(
        sock, head + body[:4], [body[i:i + 1] for i in range(4, len(body))], 0.5, stop))
    try:
        sender.start()
        data, elapsed, how = read_until_closed(sock, 8)
        expect_408(data, how, elapsed, 1.9, 4.5, "a trickled body")
        note("trickled body: 408 and %s after %.2f s" % (how, elapsed))
    finally:
        stop.set()
        sock.close()
    check(current_token(s.port) == token, "a body cut off by the deadline changed the token")
    check(metric(s.port, 'forge_push_token_request_timeouts_total{phase="body"}') == before + 1,
          "request_timeouts_total{phase=\"body\"} did not go up by one")


@test("deadline: on a kept-alive connection the next head trickled gets a 408 within two deadlines; "
      "one idle past the deadline still serves its next request")
def deadline_keep_alive():
    s = FIX.get("deadline", DEADLINE_ARGS)
    request = b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    # Idle 4.5 s (over --header-timeout 2 plus a look, under --idle-timeout 8), then a request: served, on each of
    # 20 connections (an idle connection used to get a 408 about half the time: the last bytes of
    # the answered request, rounded by the kernel's receive clock, read as the next request's).
    socks = [raw_connect(s.port) for _ in range(20)]
    try:
        for sock in socks:
            sock.sendall(request)
            status, data = read_one(sock)
            check(status == 200, "first request answered %r" % data[:200])
        # The real-clock contract above: idle past --header-timeout and a look, under --idle-timeout.
        time.sleep(4.5)
        for number, sock in enumerate(socks):
            sock.sendall(request)
            status, data = read_one(sock)
            check(status == 200, "connection %d: a request after 4.5 s idle answered %r" % (number, data[:200]))
    finally:
        for sock in socks:
            sock.close()
    # A trickled second head: 408 within 2 s + one look (1 s) + the loop's tick, then closed.
    sock = raw_connect(s.port)
    stop = threading.Event()
    try:
        sock.sendall(request)
        status, data = read_one(sock)
        check(status == 200, "first request answered %r" % data[:200])
        started = time.monotonic()
        sender = threading.Thread(target=trickle, daemon=True, args=(
            sock, b"GET /token HTTP/1.1\r\n", [b"X-Slow-%d: v\r\n" % i for i in range(40)], 0.5, stop))
        sender.start()
        data, elapsed, how = read_until_closed(sock, 10)
        expect_408(data, how, elapsed, 1.9, 5.5, "a trickled second head")
        note("trickled second head: 408 and %s after %.2f s" % (how, time.monotonic() - started))
    finally:
        stop.set()
        sock.close()


@test("deadline: an event stream open for 4 s (twice --header-timeout) keeps its heartbeats and gets the next event")
def deadline_stream_exempt():
    s = FIX.get("deadline", DEADLINE_ARGS)
    stream = EventStream(s.port)
    try:
        check(stream.status == 200, "stream answered %s" % stream.status)
        stream.next_event()
        # Open 4 s, twice --header-timeout (real clock): the deadline does not apply to an answered stream.
        time.sleep(4)
        hex_text = "%08x" % 0x40000408
        status, data = register(s.port, hex_text)
        check(status == 200, "register answered %r" % data[:200])
        event_id, _, payload = stream.next_event()
        check(json.loads(payload)["token"] == hex_text, "the stream got %r" % payload)
        check(stream.comments >= 3, "only %d heartbeats in 4 s with --heartbeat 1" % stream.comments)
    finally:
        stream.conn.close()


# ---- §4: pipelining ----
def read_answers(sock, count, timeout=10):
    """Reads `count` answers with Content-Length from `sock`; returns their statuses."""
    sock.settimeout(timeout)
    buffer = b""
    statuses = []
    while len(statuses) < count:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(1 << 20)
            check(chunk, "the connection closed after %d of %d answers" % (len(statuses), count))
            buffer += chunk
            continue
        head = buffer[:end]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(buffer) < end + 4 + length:
            chunk = sock.recv(1 << 20)
            check(chunk, "the connection closed inside answer %d" % (len(statuses) + 1))
            buffer += chunk
            continue
        statuses.append(int(head.split(b" ", 2)[1]))
        buffer = buffer[end + 4 + length:]
    return statuses


@test("pipeline: 100 pipelined GET /token on one connection are all answered in under 100 ms")
def pipeline_hundred():
    s = FIX.get("default")
    request = b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sock = raw_connect(s.port)
    try:
        sock.sendall(request)
        check(read_answers(sock, 1) == [200], "a single request failed")
        best = None
        for _ in range(3):  # the best of three, as the machine is shared
            started = time.monotonic()
            sock.sendall(request * 100)
            statuses = read_answers(sock, 100)
            elapsed = time.monotonic() - started
            check(statuses == [200] * 100, "statuses: %r" % sorted(set(statuses)))
            best = elapsed if best is None else min(best, elapsed)
        note("100 pipelined: %.1f ms (best of 3)" % (best * 1000))
        check(best < 0.1, "100 pipelined requests took %.0f ms, expected under 100" % (best * 1000))
    finally:
        sock.close()


@test("pipeline: a client that pipelines 20,000 GET /token and stops reading is closed within --idle-timeout 3 "
      "of the last byte it sent")
def pipeline_dead_client():
    s = FIX.get("idle3", ["--idle-timeout", "3"])
    fds = s.fds()
    sock = raw_connect(s.port)
    try:
        sock.setblocking(False)
        data = b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 20000
        sent = 0
        last_sent = time.monotonic()
        give_up = time.monotonic() + 5
        while sent < len(data) and time.monotonic() < give_up:
            try:
                sent += sock.send(data[sent:sent + 65536])
                last_sent = time.monotonic()
            except BlockingIOError:
                time.sleep(0.005)
        note("sent %d of %d bytes" % (sent, len(data)))
        # Never read: the server must notice that nothing moves and close within its idle timeout.
        deadline = last_sent + 3 + 2.5
        while s.fds() > fds and time.monotonic() < deadline:
            time.sleep(0.05)
        check(s.fds() <= fds, "the connection is still open %.1f s after the client's last byte (%d fds, %d before)"
              % (time.monotonic() - last_sent, s.fds(), fds))
        note("closed %.2f s after the client's last byte" % (time.monotonic() - last_sent))
    finally:
        sock.close()


# ---- §5: lenient framing ----
def smuggled_register(hex_text):
    body = hex_text.encode()
    return (b"POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def expect_refused_and_closed(port, data, status, what, ours=True):
    """Sends `data`: exactly one answer with `status` and `Connection: close` (the service's own
    JSON one unless not `ours`), then the close."""
    got, received = exchange(port, data)
    check(got == status, "%s: answered %r, expected %d" % (what, received[:300], status))
    head, _, rest = received.partition(b"\r\n\r\n")
    check(b"connection: close" in head.lower(), "%s: no Connection: close: %r" % (what, head))
    check(not ours or b"application/json" in head, "%s: not the service's JSON answer: %r" % (what, head))
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    check(len(rest) == length, "%s: more than one answer: %r" % (what, rest[:300]))


@test("framing: a bare CR inside a header line gets 400 and a close; the request behind it is not carried out")
def framing_bare_cr():
    s = FIX.get("default")
    token = current_token(s.port)
    smuggled = smuggled_register("%08x" % 0x50000001)
    head = b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\rContent-Length: %d\r\n\r\n" % len(smuggled)
    expect_refused_and_closed(s.port, head + smuggled, 400, "bare CR in Host")
    head = b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\rc\r\n\r\n"
    expect_refused_and_closed(s.port, head + smuggled, 400, "bare CR in a value")
    check(current_token(s.port) == token, "the smuggled POST /register was carried out")


@test("framing: Transfer-Encoding: chunked on HTTP/1.0 gets 400 and a close; nothing is carried out")
def framing_chunked_http10():
    s = FIX.get("default")
    token = current_token(s.port)
    data = (b"POST /register HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n8\r\n50000002\r\n0\r\n\r\n")
    expect_refused_and_closed(s.port, data, 400, "chunked on HTTP/1.0")
    check(current_token(s.port) == token, "a chunked HTTP/1.0 POST /register was carried out")


@test("framing: Expect: 200-ok gets 417 expectation_failed (GET and POST, nothing carried out); 100-continue still works")
def framing_expect():
    s = FIX.get("default")
    token = current_token(s.port)
    expect_refused_and_closed(s.port, b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 200-ok\r\n\r\n", 417,
                              "GET with Expect: 200-ok")
    body = b"50000003"
    data = (b"POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Expect: 200-ok\r\nContent-Length: 8\r\n\r\n") + body
    got, received = exchange(s.port, data)
    check(got == 417 and is_json_error(received, "expectation_failed"), "POST with Expect: 200-ok: %r" % received[:300])
    check(current_token(s.port) == token, "a POST with Expect: 200-ok was carried out")
    data = (b"POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Expect: 100-Continue\r\nConnection: close\r\nContent-Length: 8\r\n\r\n") + body
    got, received = exchange(s.port, data)
    check(received.startswith(b"HTTP/1.1 100 Continue") and b"HTTP/1.1 200" in received,
          "Expect: 100-continue answered %r" % received[:300])
    check(current_token(s.port) == body.decode(), "POST with Expect: 100-continue did not register")


@test("framing: a request without a body that asks for 100-continue, with more bytes behind it, is answered "
      "(and a write carried out only then)")
def framing_expect_continue_without_body():
    # Attack finding: libmicrohttpd sent 100 Continue to a bodiless request and, with bytes already
    # buffered, called again where no answer could be queued: POST /fail cleared the token unanswered.
    s = FIX.get("default")
    pipelined = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    for method, path, trailing in (("POST", "/fail", b"\r\n"), ("POST", "/fail", pipelined),
                                   ("POST", "/register", pipelined), ("GET", "/token", pipelined),
                                   ("OPTIONS", "/token", pipelined), ("GET", "/nope", pipelined)):
        status, _ = register(s.port, "5000000a")
        check(status == 200, "setting the token answered %r" % status)
        head = ("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n"
                % (method, path)).encode()
        _, received = exchange(s.port, head + trailing, timeout=3)
        statuses = [int(line.split(b" ")[1]) for line in received.split(b"\r\n")
                    if line.startswith(b"HTTP/1.1 ") and len(line.split(b" ")) > 1]
        final = [code for code in statuses if code != 100]
        check(final, "%s %s with Expect: 100-continue and no body got no answer: %r" % (method, path, received[:300]))
        token = current_token(s.port)
        if method == "POST" and path == "/fail":
            check(final[0] == 200 and token is None, "POST /fail answered %r, token now %r" % (final, token))
        elif path == "/register":
            check(final[0] == 400 and token == "5000000a", "an empty POST /register answered %r, token %r"
                  % (final, token))
        else:
            check(token == "5000000a", "%s %s changed the token to %r" % (method, path, token))


@test("framing: a request line with two spaces (before or after the target) or a space after the version gets 400, "
      "not 404; bare LF line ends are still served")
def framing_request_line():
    s = FIX.get("default")
    for line in (b"GET  /token  HTTP/1.1", b"GET /token  HTTP/1.1", b"GET  /token HTTP/1.1", b"GET /to\x7fken HTTP/1.1"):
        expect_refused_and_closed(s.port, line + b"\r\nHost: 127.0.0.1\r\n\r\n", 400, repr(line))
    # A space after the version: libmicrohttpd refuses it itself (its own 400 page).
    expect_refused_and_closed(s.port, b"GET /token HTTP/1.1 \r\nHost: 127.0.0.1\r\n\r\n", 400,
                              "a space after the version", ours=False)
    got, received = exchange(s.port, b"GET /token HTTP/1.1\nHost: 127.0.0.1\nConnection: close\n\n")
    check(got == 200, "bare LF line ends answered %r" % received[:300])
    got, received = exchange(s.port, b"GET /token?a=+ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    check(got == 200, "a query ending in + answered %r" % received[:300])


def read_one(sock, timeout=5):
    """One answer with Content-Length from a kept-alive socket: (status, bytes)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(head.split(b" ", 2)[1]), head + b"\r\n\r\n" + rest


# -- runner -------------------------------------------------------------------------------------
FIX = None


def run():
    def keep(fixtures, verbose):
        global FIX, VERBOSE
        FIX, VERBOSE = fixtures, verbose
    return run_tap_checks(CHECKS, "e2e-http-edges-", Fixtures, tools=(), keep=keep)


if __name__ == "__main__":
    sys.exit(run())
