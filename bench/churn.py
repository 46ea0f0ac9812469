#!/usr/bin/env python3
"""Churn test: subscribers coming and going and a burst of POSTs leave no file descriptor,
memory or subscriber behind, and the subscribers that stay see the changes in order (skipping
some when they fall behind, as the stream allows) and end on the current value.

Starts forge-push-token-server (a given binary) on a free loopback port with the access log off,
warms it up, and takes a baseline of the server's open file descriptors (/proc/PID/fd) and RSS
(VmRSS in /proc/PID/status). Then, while --stayers subscribers stay on GET /token/stream for the
whole run (their events parsed and checked: event `token`, ids strictly increasing, data valid
JSON {"token": hex|null}), it runs at once:

- --cycles event-stream connect/disconnect cycles from --threads threads, in four kinds taken in
  turn: read the first event then close (FIN, or RST if events arrived unread), read the first
  event then reset (SO_LINGER 0), send the request then close before reading, send the request
  then reset before reading;
- --posts POSTs from --threads threads over keep-alive connections: POST /register with random hex
  tokens in the three body forms (application/octet-stream, application/json, hex text or a
  `deviceToken=` form field), POST /fail (JSON, text, empty), and invalid bodies of both routes
  expecting 400. Every status, and every JSON answer's `token`, `changed` or `error`, must be as
  expected.

Afterwards it checks, and exits 1 with a message naming each failed check (0 when all pass):

- the server's file descriptors come back, within --settle seconds (the service releases a departed
  subscriber within 2 s), to exactly the baseline plus one per stayer;
- its RSS grew by at most --max-rss-growth-mb over the baseline;
- /metrics: the `forge_push_token_subscribers` gauge equals the stayers; the counters of accepted
  and rejected registrations, reported failures and token changes grew by exactly what the answers
  said (a `changed: true` answer is one change);
- every stayer's last event carries GET /token's value and the current version (= the changes
  counter, no state file), within a couple of seconds.

    python3 bench/churn.py --server .build/release/forge-push-token-server \
        [--cycles 2000] [--posts 20000] [--threads 4] [--stayers 20] [--timeout 90]

Loopback only, stdlib only; bounded in count (the options) and time (--timeout for the whole run;
10 to 25 s with the defaults on 2 cores).
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import resource
import selectors
import socket
import statistics
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import e2e_support as support  # noqa: E402  (the one server process helper of e2e/ and bench/)

HEX = re.compile(r"[0-9a-f]*")
STREAM_REQUEST = b"GET /token/stream HTTP/1.1\r\nHost: churn\r\nAccept: text/event-stream\r\n\r\n"


class Failures:
    """Failed checks, counted by kind, with the first few messages of each kind kept."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.examples = collections.defaultdict(list)

    def add(self, kind, message):
        with self.lock:
            self.counts[kind] += 1
            if len(self.examples[kind]) < 5:
                self.examples[kind].append(message)

    def __bool__(self):
        return bool(self.counts)

    def report(self):
        lines = []
        for kind, count in self.counts.items():
            lines.append("FAIL %s (%d)" % (kind, count))
            lines.extend("    " + m for m in self.examples[kind])
        return "\n".join(lines)


# --- the server process -------------------------------------------------------------------------

class Server(support.Server):
    """The server process (e2e/e2e_support.py's), with the churn's reading of its log."""

    def __init__(self, path, heartbeat, max_subscribers):
        super().__init__(path, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off",
                                "--heartbeat", str(heartbeat), "--max-subscribers", str(max_subscribers)])

    def wait_listening(self, seconds):
        try:
            self.start(timeout=seconds)
        except support.Failure as error:
            sys.exit("churn: %s" % error)

    def notable(self):
        """Warning and error lines of its log but POST /fail's own (expected) ones, by message."""
        lines = collections.Counter()
        for line in self.stderr().splitlines():
            if (" warning " in line or " error " in line) and "registration failed:" not in line:
                lines[line.split(" ", 1)[-1]] += 1
        return lines


def get(port, path):
    """One GET on its own connection, closed before returning: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


def metrics(port):
    status, _, body = get(port, "/metrics")
    if status != 200:
        raise RuntimeError("GET /metrics answered %d" % status)
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def current_token(port):
    status, _, body = get(port, "/token")
    if status != 200:
        raise RuntimeError("GET /token answered %d" % status)
    return json.loads(body)["token"]


def wait_stable_fds(server, seconds=3.0, quiet=0.5):
    """The fd count once it has not changed for `quiet` seconds (or after `seconds`)."""
    end = time.time() + seconds
    last, since = server.fds(), time.time()
    while time.time() < end:
        time.sleep(0.05)
        now = server.fds()
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            break
    return last


# --- event streams ------------------------------------------------------------------------------

# The usual event, matched at once; anything else goes through the general block parser.
EVENT = re.compile(rb'id: (\d+)\nevent: token\ndata: \{"token":(null|"[0-9a-f]+")\}\n\n')


def parse_block(block):
    """(id, token) of one event block (without its empty line), None for a block that dispatches
    nothing (comments, `retry:`); raises ValueError for anything else."""
    fields = []
    for line in block.decode("utf-8").split("\n"):
        if line.startswith(":") or not line:
            continue
        name, _, value = line.partition(":")
        fields.append((name, value[1:] if value.startswith(" ") else value))
    names = [n for n, _ in fields]
    if "data" not in names:
        if set(names) <= {"retry"}:
            return None
        raise ValueError("block without data: %r" % block[:200])
    f = dict(fields)
    if names.count("data") != 1 or names.count("id") != 1 or f.get("event") != "token":
        raise ValueError("not one token event: %r" % block[:200])
    if not f["id"].isdigit():
        raise ValueError("id is not a version: %r" % f["id"])
    data = json.loads(f["data"])  # ValueError when it is not JSON
    if not isinstance(data, dict) or set(data) != {"token"}:
        raise ValueError("data is not {\"token\": ...}: %r" % f["data"])
    token = data["token"]
    if token is not None and (not isinstance(token, str) or not token or len(token) % 2
                              or not HEX.fullmatch(token)):
        raise ValueError("token is not lowercase hex: %r" % f["data"])
    return int(f["id"]), token


class StreamReader:
    """A GET /token/stream response read from a plain socket: status and headers, the chunked body
    decoded, and token events taken off at each empty line. Lines end with LF (http-api.md)."""

    def __init__(self, sock):
        self.sock = sock
        self.raw = b""   # received, not yet dechunked
        self.body = b""  # dechunked, not yet parsed
        self.status = None
        self.headers = {}
        self.chunked = False
        self.ended = False  # the last chunk, or the end of the connection, was seen

    def recv(self):
        """Reads what the socket has (blocking for it); False at the end of the connection."""
        data = self.sock.recv(262144)
        if not data:
            self.ended = True
            return False
        self.raw += data
        if self.status is not None:
            self._dechunk()
        return True

    def read_head(self):
        while b"\r\n\r\n" not in self.raw:
            if not self.recv():
                raise EOFError("connection closed before the response headers")
        head, self.raw = self.raw.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self._dechunk()

    def _dechunk(self):
        raw = self.raw
        if not self.chunked:
            self.body += raw
            self.raw = b""
            return
        pos, pieces = 0, [self.body]
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(raw[pos:eol].split(b";")[0], 16)
            if size == 0:
                self.ended = True
                pos = len(raw)
                break
            end = eol + 2 + size
            if len(raw) < end + 2:
                break
            if raw[end:end + 2] != b"\r\n":
                raise ValueError("malformed chunk at %r" % raw[pos:pos + 40])
            pieces.append(raw[eol + 2:end])
            pos = end + 2
        self.body = b"".join(pieces)
        self.raw = raw[pos:]

    def take_events(self):
        """The token events complete in the buffer, as (id, token) pairs; raises ValueError for a
        block that is not one."""
        body, pos, events = self.body, 0, []
        match = EVENT.match
        while True:
            m = match(body, pos)
            if m:
                token = m.group(2)
                events.append((int(m.group(1)), None if token == b"null" else token[1:-1].decode()))
                pos = m.end()
                continue
            end = body.find(b"\n\n", pos)
            if end < 0:
                break
            event = parse_block(body[pos:end])
            if event is not None:
                events.append(event)
            pos = end + 2
        self.body = body[pos:]
        return events

    def first_events(self):
        """Blocks until the first event; returns the events taken (one or more)."""
        while True:
            events = self.take_events()
            if events:
                return events
            if self.ended or not self.recv():
                raise EOFError("the stream ended before its first event")


class Stayer:
    """One subscriber that stays for the whole run (read by the Stayers thread)."""

    def __init__(self, index, port):
        self.index = index
        self.events = 0
        self.last_id = -1
        self.last_token = None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(STREAM_REQUEST)
        self.reader = StreamReader(self.sock)
        self.reader.read_head()
        ctype = self.reader.headers.get("content-type", "")
        if self.reader.status != 200 or not ctype.startswith("text/event-stream"):
            raise ValueError("stayer %d: answered %d %s" % (index, self.reader.status, ctype))
        self.take(self.reader.first_events())
        self.sock.setblocking(False)

    def take(self, events):
        for eid, token in events:
            if eid <= self.last_id:
                raise ValueError("id %d after %d" % (eid, self.last_id))
            self.events += 1
            self.last_id, self.last_token = eid, token


class Stayers:
    """The stayers, all read by one thread: a pause between rounds lets events gather in the
    sockets, so that each read takes many (loopback buffers are large; the stream conflates only
    when a subscriber cannot keep up)."""

    def __init__(self, port, count, failures):
        self.failures = failures
        self.all = [Stayer(i, port) for i in range(count)]
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        live = {s.sock.fileno(): s for s in self.all}
        with selectors.DefaultSelector() as sel:
            for s in self.all:
                sel.register(s.sock, selectors.EVENT_READ, s)
            while live and not self.stopping.is_set():
                for key, _ in sel.select(0.2):
                    s = key.data
                    try:
                        with self.lock:
                            try:
                                if not s.reader.recv():
                                    raise EOFError("the stream ended")
                            except BlockingIOError:
                                continue
                            s.take(s.reader.take_events())
                    except (OSError, EOFError, ValueError) as e:
                        self.failures.add("stayer stream", "stayer %d: %s: %s" % (s.index, type(e).__name__, e))
                        sel.unregister(s.sock)
                        del live[s.sock.fileno()]
                self.stopping.wait(0.01)

    def states(self):
        with self.lock:
            return [(s.last_id, s.last_token) for s in self.all]

    def stop(self):
        self.stopping.set()
        self.thread.join(5)
        for s in self.all:
            s.sock.close()


CYCLE_KINDS = ("event+close", "event+reset", "early close", "early reset")


def cycle_worker(port, numbers, deadline, done, failures):
    """Event-stream connect/disconnect cycles; `done` counts them by kind."""
    for i in numbers:
        if time.time() > deadline:
            failures.add("timeout", "cycles stopped at the deadline")
            return
        kind = CYCLE_KINDS[i % len(CYCLE_KINDS)]
        sock = None
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(STREAM_REQUEST)
            if kind.startswith("event"):
                reader = StreamReader(sock)
                reader.read_head()
                if reader.status != 200:
                    raise ValueError("answered %d" % reader.status)
                reader.first_events()
            if kind.endswith("reset"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            sock = None
            done[kind] += 1  # one writer per Counter: each worker has its own
        except (OSError, EOFError, ValueError) as e:
            failures.add("cycle", "cycle %d (%s): %s: %s" % (i, kind, type(e).__name__, e))
        finally:
            if sock is not None:
                sock.close()


# --- POSTs --------------------------------------------------------------------------------------

def post_case(rng):
    """(label, path, body, headers, expected status, expected token or error code)."""
    r = rng.random()
    n = rng.choice((32, 32, 32, 8, 1, 100, 256))  # token bytes; 32 is an APNs token
    raw = rng.randbytes(n)
    hexs = raw.hex()
    if r < 0.22:
        return ("register octet", "/register", raw, {"Content-Type": "application/octet-stream"}, 200, hexs)
    if r < 0.42:
        shown = hexs.upper() if rng.random() < 0.3 else hexs
        return ("register json", "/register", json.dumps({"deviceToken": shown}).encode(),
                {"Content-Type": "application/json; charset=utf-8"}, 200, hexs)
    if r < 0.58:
        shown = hexs.upper() if rng.random() < 0.3 else hexs
        return ("register hex", "/register", (" \n" + shown + "\r\n").encode(),
                {"Content-Type": "text/plain"}, 200, hexs)
    if r < 0.64:
        return ("register form", "/register", ("deviceToken=" + hexs).encode(),
                {"Content-Type": "application/x-www-form-urlencoded"}, 200, hexs)
    if r < 0.70:
        body = json.dumps({"message": "no network", "domain": "NSCocoaErrorDomain", "code": 3010}).encode()
        return ("fail json", "/fail", body, {"Content-Type": "application/json"}, 200, None)
    if r < 0.74:
        return ("fail text", "/fail", b"no valid aps-environment", {"Content-Type": "text/plain"}, 200, None)
    if r < 0.76:
        return ("fail empty", "/fail", b"", {}, 200, None)
    bad_register = [
        (b"", {"Content-Type": "application/octet-stream"}),
        (rng.randbytes(257), {"Content-Type": "application/octet-stream"}),
        (b"", {"Content-Type": "text/plain"}),
        (hexs.encode() + b"a", {"Content-Type": "text/plain"}),  # odd length
        (b"zz" + hexs.encode(), {"Content-Type": "text/plain"}),  # not hex
        (b"ab" * 257, {"Content-Type": "text/plain"}),  # 514 digits, too long
        (b"{\"deviceToken\":", {"Content-Type": "application/json"}),  # malformed JSON
        (b"{\"token\":\"" + hexs.encode() + b"\"}", {"Content-Type": "application/json"}),  # no field
        (b"deviceToken=xyz", {"Content-Type": "application/x-www-form-urlencoded"}),
    ]
    bad_fail = [
        (b"{\"message\":", {"Content-Type": "application/json"}),
        (b"{}", {"Content-Type": "application/json"}),
        (b"[\"no network\"]", {"Content-Type": "application/json"}),
        (b"{\"message\":\"x\",\"code\":\"3010\"}", {"Content-Type": "application/json"}),
        (b"\xff\xfe not UTF-8", {"Content-Type": "text/plain"}),
    ]
    if r < 0.90:
        body, headers = rng.choice(bad_register)
        return ("register invalid", "/register", body, headers, 400, "invalid_token")
    body, headers = rng.choice(bad_fail)
    return ("fail invalid", "/fail", body, headers, 400, "invalid_request")


def post_worker(port, count, seed, deadline, tally, failures):
    """`count` POSTs over one keep-alive connection (reopened only if the server closes it)."""
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for _ in range(count):
            if time.time() > deadline:
                failures.add("timeout", "POSTs stopped at the deadline")
                return
            label, path, body, headers, want, expect = post_case(rng)
            try:
                conn.request("POST", path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                if r.will_close:
                    tally["reconnects"] += 1
                    conn.close()
            except (OSError, http.client.HTTPException) as e:
                failures.add("post", "%s: %s: %s" % (label, type(e).__name__, e))
                conn.close()
                continue
            tally["posts"] += 1
            try:
                answer = json.loads(data)
            except ValueError:
                answer = None
            problem = None
            if r.status != want:
                problem = "status %d, expected %d" % (r.status, want)
            elif not isinstance(answer, dict):
                problem = "body is not a JSON object"
            elif want == 400:
                if answer.get("error") != expect:
                    problem = "error %r, expected %r" % (answer.get("error"), expect)
            elif answer.get("token") != expect or not isinstance(answer.get("changed"), bool):
                problem = "token %r changed %r, expected token %r" % (
                    answer.get("token"), answer.get("changed"), expect)
            if problem:
                failures.add("post answer", "%s %s (%d bytes): %s; body %r"
                             % (label, path, len(body), problem, data[:200]))
                continue
            tally[label] += 1
            if want == 200:
                tally["register accepted" if path == "/register" else "fail accepted"] += 1
                tally["changed"] += answer["changed"]
            elif path == "/register":
                tally["register rejected"] += 1
    finally:
        conn.close()


# --- the run ------------------------------------------------------------------------------------

def warm_up(port):
    """A few requests of every kind on a few connections, and a couple of streams."""
    for i in range(8):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for method, path, body, headers in (
                ("GET", "/healthz", None, {}), ("GET", "/token", None, {}),
                ("POST", "/register", os.urandom(32), {"Content-Type": "application/octet-stream"}),
                ("POST", "/register", b"zz", {"Content-Type": "text/plain"}),
                ("POST", "/fail", b"warm-up", {"Content-Type": "text/plain"}),
                ("GET", "/metrics", None, {}), ("GET", "/nope", None, {})):
            conn.request(method, path, body=body, headers=headers)
            conn.getresponse().read()
        conn.close()
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(STREAM_REQUEST)
        reader = StreamReader(sock)
        reader.read_head()
        reader.first_events()
        sock.close()
    # Let the warm-up's subscribers be released before the baseline.
    end = time.time() + 5
    while metrics(port).get("forge_push_token_subscribers") != 0 and time.time() < end:
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="the forge-push-token-server binary")
    ap.add_argument("--cycles", type=int, default=2000, help="stream connect/disconnect cycles (2000)")
    ap.add_argument("--posts", type=int, default=20000, help="POSTs (20000)")
    ap.add_argument("--threads", type=int, default=4, help="threads for the cycles, and as many for the POSTs (4)")
    ap.add_argument("--stayers", type=int, default=20, help="subscribers that stay for the whole run (20)")
    ap.add_argument("--timeout", type=float, default=90, help="seconds for the whole run (90)")
    ap.add_argument("--settle", type=float, default=5, help="seconds to wait for fds to come back (5)")
    ap.add_argument("--max-rss-growth-mb", type=float, default=5, help="allowed RSS growth in MB (5)")
    ap.add_argument("--heartbeat", type=int, default=2, help="the server's --heartbeat, seconds (2)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the POST mix (default: random)")
    args = ap.parse_args()
    if min(args.cycles, args.posts, args.stayers) < 0 or args.threads < 1:
        ap.error("counts must be >= 0 and --threads >= 1")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    started = time.time()
    # The churn must be over with room left for the checks after it.
    churn_deadline = started + max(5.0, args.timeout - args.settle - 8)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.stayers + 2 * args.threads + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want), hard))

    failures = Failures()
    server = Server(args.server, args.heartbeat, args.stayers + args.cycles + 100)
    stayers = None
    try:
        server.wait_listening(20)
        port = server.port
        warm_up(port)
        fds_base = wait_stable_fds(server)
        rss_base = server.rss_kb()
        m0 = metrics(port)

        stayers = Stayers(port, args.stayers, failures)
        fds_stayers = wait_stable_fds(server)
        print("churn: server pid %d on 127.0.0.1:%d (heartbeat %d s), seed %d"
              % (server.pid, port, args.heartbeat, seed))
        print("baseline: %d fds, RSS %d kB; with %d stayers: %d fds"
              % (fds_base, rss_base, args.stayers, fds_stayers))
        if fds_stayers != fds_base + args.stayers:
            failures.add("fds", "with %d stayers the server has %d fds, expected %d + %d"
                         % (args.stayers, fds_stayers, fds_base, args.stayers))
        if failures:
            raise SystemExit(1)

        # The churn: cycles and POSTs at once, while the stayers listen.
        cycle_done = [collections.Counter() for _ in range(args.threads)]
        tallies = [collections.Counter() for _ in range(args.threads)]
        workers = []
        for t in range(args.threads):
            numbers = range(t, args.cycles, args.threads)
            workers.append(threading.Thread(target=cycle_worker, name="cycles-%d" % t,
                                            args=(port, numbers, churn_deadline, cycle_done[t], failures)))
            count = args.posts // args.threads + (1 if t < args.posts % args.threads else 0)
            workers.append(threading.Thread(target=post_worker,
                                            args=(port, count, seed + t, churn_deadline, tallies[t], failures)))
        churn_started = time.time()
        cpu_server0, cpu_self0 = server.cpu_seconds(), time.process_time()
        for w in workers:
            w.start()
        cycles_seconds = 0.0
        for w in workers:
            w.join(max(0.1, churn_deadline + 15 - time.time()))
            if w.is_alive():
                failures.add("timeout", "a worker thread did not finish")
            elif w.name.startswith("cycles"):
                cycles_seconds = max(cycles_seconds, time.time() - churn_started)
        churn_seconds = time.time() - churn_started
        cpu_server, cpu_self = server.cpu_seconds() - cpu_server0, time.process_time() - cpu_self0
        cycles = sum(cycle_done, collections.Counter())
        tally = sum(tallies, collections.Counter())
        if not server.alive():
            raise RuntimeError("the server exited with status %s during the churn" % server.proc.returncode)
        rss_peak = server.rss_kb()

        # File descriptors: back to the baseline plus the stayers, within --settle seconds.
        expected_fds = fds_base + args.stayers
        settle_end = time.time() + args.settle
        fds_after = server.fds()
        while fds_after != expected_fds and time.time() < settle_end:
            time.sleep(0.05)
            fds_after = server.fds()
        settled_in = args.settle - max(0.0, settle_end - time.time())
        if fds_after != expected_fds:
            failures.add("fds", "%d fds %.1f s after the churn, expected %d (baseline %d + %d stayers)"
                         % (fds_after, args.settle, expected_fds, fds_base, args.stayers))
        rss_after = server.rss_kb()
        growth_kb = rss_after - rss_base
        if growth_kb > args.max_rss_growth_mb * 1024:
            failures.add("rss", "RSS grew by %d kB (%d -> %d kB), over %g MB"
                         % (growth_kb, rss_base, rss_after, args.max_rss_growth_mb))

        # Metrics: the subscriber gauge, and counters that must agree with the answers.
        end = time.time() + 3
        m1 = metrics(port)
        while m1.get("forge_push_token_subscribers") != args.stayers and time.time() < end:
            time.sleep(0.1)
            m1 = metrics(port)
        gauge = m1.get("forge_push_token_subscribers", -1)  # -1: no such metric
        if gauge != args.stayers:
            failures.add("metrics", "forge_push_token_subscribers is %g, expected %d stayers" % (gauge, args.stayers))

        def delta(name):
            return m1.get(name, 0) - m0.get(name, 0)
        for name, want in (("forge_push_token_registrations_accepted_total", tally["register accepted"]),
                           ("forge_push_token_registrations_rejected_total", tally["register rejected"]),
                           ("forge_push_token_failures_reported_total", tally["fail accepted"]),
                           ("forge_push_token_token_changes_total", tally["changed"])):
            if delta(name) != want:
                failures.add("metrics", "%s grew by %d, the answers say %d" % (name, delta(name), want))

        # Every stayer's last event: GET /token's value, at the current version.
        token = current_token(port)
        version = int(m1.get("forge_push_token_token_changes_total", -1))
        end = time.time() + 3
        while time.time() < end and any(st != (version, token) for st in stayers.states()):
            time.sleep(0.05)
        for index, st in enumerate(stayers.states()):
            if st != (version, token):
                failures.add("stayer last event", "stayer %d: last event id %d token %r, expected id %d token %r"
                             % ((index,) + st + (version, token)))

        # Figures.
        counts = [s.events for s in stayers.all]
        posts = tally["posts"]
        print("cycles: %d of %d in %.1f s (%s)"
              % (sum(cycles.values()), args.cycles, cycles_seconds,
                 ", ".join("%s %d" % (k, cycles[k]) for k in CYCLE_KINDS)))
        print("POSTs: %d of %d in %.1f s = %.0f/s (%s); %d changes, %d reconnects"
              % (posts, args.posts, churn_seconds, posts / churn_seconds if churn_seconds else 0,
                 ", ".join("%s %d" % (k, tally[k]) for k in sorted(tally)
                           if k.startswith(("register ", "fail ")) and not k.endswith(("accepted", "rejected"))),
                 tally["changed"], tally["reconnects"]))
        print("CPU during the churn: server %.1f s, this script %.1f s" % (cpu_server, cpu_self))
        print("fds: baseline %d, with stayers %d, after %d (expected %d, %s %.2f s)"
              % (fds_base, fds_stayers, fds_after, expected_fds,
                 "reached in" if fds_after == expected_fds else "NOT reached in", settled_in))
        print("RSS: baseline %d kB, end of churn %d kB, after %d kB, growth %+d kB (limit %d kB)"
              % (rss_base, rss_peak, rss_after, growth_kb, args.max_rss_growth_mb * 1024))
        print("subscribers gauge: %d; version %d, token %s; events skipped (conflated) %d"
              % (gauge, version, token if token is None or len(token) <= 20 else token[:16] + "...",
                 delta("forge_push_token_events_skipped_total")))
        if counts:
            print("stayer events: min %d, median %d, max %d of %d changes: %s"
                  % (min(counts), statistics.median(counts), max(counts), tally["changed"],
                     " ".join(map(str, counts))))
        notable = server.notable()
        if notable:
            print("server log: %d warning/error lines besides POST /fail's:" % sum(notable.values()))
            for message, count in notable.most_common(5):
                print("  %6d  %s" % (count, message))
    except SystemExit:
        pass
    except (OSError, RuntimeError, ValueError, http.client.HTTPException) as e:
        failures.add("run", "%s: %s" % (type(e).__name__, e))
    finally:
        if stayers:
            stayers.stop()
        server.stop()
    elapsed = time.time() - started
    if elapsed > args.timeout:
        failures.add("timeout", "the run took %.1f s, over --timeout %g s" % (elapsed, args.timeout))
    if failures:
        print(failures.report(), file=sys.stderr)
        print("churn: FAILED after %.1f s" % elapsed, file=sys.stderr)
        return 1
    print("churn: ok in %.1f s" % elapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
