#!/usr/bin/env python3
"""End-to-end: faults injected between replicas and a real redis-server (issue 42).

Each run starts its own redis-server (`--requirepass`, so that AUTH is sent) and two replicas, A
and B, each behind its own RESP proxy (e2e/resp_fault_proxy.py), all on free loopback ports. With
writes from four clients (two per replica, every write a new token) and an open event stream on
each replica, both proxies are armed with one fault at one step; a step sent only when a
connection is made (AUTH, SELECT, SCRIPT LOAD, SUBSCRIBE) is reached by resetting the replica's
connections once, and EVAL by `SCRIPT FLUSH` (the next EVALSHA answers NOSCRIPT). A is watched
through the fault; B gets SIGTERM 0.2 s after its fault fired. After each run:

  - every write was answered within 2 s of its arrival by the server's own access line (plus
    0.25 s for this machine's scheduling) and within 3 s of being sent by its client;
    a write in flight when B was signalled got an answer too; A's /healthz and GET /token, asked
    every 100 ms, answered within 1 s together (reads never wait for Redis);
  - no replica whose /healthz says ok served a token older than the one Redis held 0.5 s before,
    later than 1 s after its subscription was confirmed again or 5 s after the fault ended
    (the proxy passes bytes again);
  - no id names two values: every SSE id and token of every stream, and every state read from
    Redis, map each version to one token (a write's answer names no id: its token is unique to
    it, so its id is the one under which streams and Redis show that token);
  - B exited 0 within N + 3 s of its SIGTERM (N = its --drain-seconds, 1).

Two more runs hold issue 42's findings: `noscript-batch` (finding 1: a batch answered NOSCRIPT
whose first EVAL retry is reset; the writes behind it are answered and the replica keeps reading
PREFIX:state) and `hung-queue` (finding 3: Redis stopped with SIGSTOP and writes queued from three
clients: each is answered within 2 s of being sent). TLS and Sentinel runs are not in: the proxy
speaks plain RESP, and the commands it faults are the same code on a TLS connection and on a
master the sentinels named (e2e/tls_docs_test.py, sentinel_test.py and trust_test.py fault those
paths). NOSCRIPT is injected at EVALSHA and the state read only: no other command is answered so.

Runs go in parallel (--jobs, default 6), each on its own ports; each prints which fault it
injected at which step. The whole suite fails, never skips.

    python3 e2e/redis_faults_test.py --server PATH [--jobs N] [--only NAME,...] [--list]
"""
import argparse
import concurrent.futures
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from e2e_support import HOST, EventStream, Failure, Server, check, log, request, wait_until
from replicas_test import Redis
from resp_fault_proxy import FAULTS, STEPS, FaultProxy

PASSWORD = "e2e-fault-password"
PREFIX = "faults"
DRAIN_SECONDS = 1
# A write's promise is 2 s from its body completing: the server's own access line (`duration_us`,
# arrival to completion) must show at most 2 s plus 0.25 s for the answering thread's scheduling
# (this machine's load average runs past 10 while other work builds), and the client, which also
# counts its connect and the kernel's queues, at most 2 s plus 1 s.
SERVER_WRITE_BOUND = 2.0 + 0.25
WRITE_BOUND = 2.0 + 1.0
# Reads never wait for Redis (docs/replicas.md, "When something fails"): /healthz and GET /token
# together within 1 s, on a machine running six runs at once.
READ_BOUND = 1.0
CONNECT_STEPS = ("AUTH", "SELECT", "SCRIPT LOAD", "SUBSCRIBE")


def runs():
    """Every run's name: STEP/FAULT (NOSCRIPT only where Redis can answer it), then the findings."""
    names = []
    for step, fault in itertools.product(STEPS, FAULTS):
        if fault == "noscript" and step not in ("EVALSHA", "state read"):
            continue
        names.append("%s/%s" % (step, fault))
    return names + ["noscript-batch", "hung-queue"]


class RedisClient:
    """A plain RESP client to the real Redis (never through a proxy), for reading the state."""

    def __init__(self, port):
        self.sock = socket.create_connection((HOST, port), timeout=3)
        self.buffer = b""
        self.lock = threading.Lock()  # the sampler and the run's own commands share the socket
        check(self.command("AUTH", PASSWORD) == "OK", "AUTH to the test's Redis")

    def command(self, *args):
        data = b"*%d\r\n" % len(args) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a), a) for a in (str(x).encode() for x in args))
        with self.lock:
            self.sock.sendall(data)
            return self._reply()

    def _line(self):
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("Redis closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return Failure("Redis error: %s" % rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            length = int(rest)
            if length < 0:
                return None
            while len(self.buffer) < length + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise OSError("Redis closed the connection")
                self.buffer += chunk
            value, self.buffer = self.buffer[:length], self.buffer[length + 2:]
            return value.decode()
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        raise OSError("not RESP: %r" % line)

    def state(self):
        items = self.command("HGETALL", PREFIX + ":state")
        fields = dict(zip(items[0::2], items[1::2]))
        if "version" not in fields:
            return None
        return int(fields["version"]), fields.get("token")

    def close(self):
        self.sock.close()


class Run:
    """One run: Redis, two proxies, two replicas, clients, streams, a sampler; then the checks."""

    def __init__(self, binary, name):
        self.binary = binary
        self.name = name
        self.lock = threading.Lock()
        self.writes = []         # (replica, sent, answered or None, status or error)
        self.ids = {}            # version -> set of tokens
        self.samples = []        # (time, version) read from Redis
        self.stale = []          # violations of the staleness rule
        self.slow_reads = []     # reads of A over READ_BOUND, or failed
        self.stop_clients = {"A": threading.Event(), "B": threading.Event()}
        self.done = threading.Event()
        self.counter = itertools.count(1)
        self.threads = []
        self.notes = []

    # -- parts ---------------------------------------------------------------------------------
    def start(self):
        self.redis = Redis(extra=["--requirepass", PASSWORD]).start()
        self.proxies = {"A": FaultProxy(self.redis.port), "B": FaultProxy(self.redis.port)}
        self.replicas = {}
        for name, proxy in self.proxies.items():
            self.replicas[name] = Server(self.binary, [
                "--host", HOST, "--port", "0", "--access-log", "on", "--heartbeat", "1",
                "--redis-url", "redis://:%s@%s:%d" % (PASSWORD, HOST, proxy.port), "--redis-key-prefix", PREFIX,
                "--redis-probe-interval", "1", "--drain-seconds", str(DRAIN_SECONDS)]).start()
        for name, server in self.replicas.items():
            wait_until(lambda: self.health(server.port) == "ok", 15, interval=0.05,
                       what="replica %s connected to Redis" % name)
        self.client = RedisClient(self.redis.port)

    def health(self, port):
        try:
            status, _, body = request(port, "GET", "/healthz", timeout=2)
            fields = json.loads(body)
            return fields.get("status") if status == 200 else "http %d" % status
        except (OSError, ValueError) as error:
            return "error %s" % error

    def token(self, port):
        status, _, body = request(port, "GET", "/token", timeout=2)
        return json.loads(body)["token"] if status == 200 else None

    def spawn(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def write(self, replica, token, record=True):
        """One POST /register; records (replica, sent, answered, status or error)."""
        port = self.replicas[replica].port
        sent = time.monotonic()
        try:
            status, _, body = request(port, "POST", "/register", body=token.encode(),
                                      headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=10)
            answered = time.monotonic()
            if status != 200:
                try:
                    status = "%d %s" % (status, json.loads(body).get("error"))
                except ValueError:
                    status = "%d" % status
            outcome = (replica, sent, answered, status)
        except OSError as error:
            outcome = (replica, sent, None, "%s: %s" % (type(error).__name__, error))
        if record:
            with self.lock:
                self.writes.append(outcome)
        return outcome

    def new_token(self):
        return "%08x" % next(self.counter) + "%056x" % (hash(self.name) & ((1 << 224) - 1))

    def client_loop(self, replica):
        while not self.stop_clients[replica].is_set() and not self.done.is_set():
            self.write(replica, self.new_token())
            # Pacing: about ten writes a second per client, for the whole scenario.
            time.sleep(0.1)

    def stream_loop(self, replica):
        """Collects every (id, token) of one replica's stream; reopens it when it ends."""
        while not self.done.is_set() and self.replicas[replica].alive():
            try:
                stream = EventStream(self.replicas[replica].port, timeout=5)
                while not self.done.is_set():
                    event_id, _, data = stream.next_event(timeout=3)
                    if event_id is not None and data:
                        self.saw(int(event_id), json.loads(data)["token"])
            except (Failure, OSError, ValueError):
                # Pacing a reconnection after a broken stream (the replica may be restarting).
                time.sleep(0.1)

    def saw(self, version, token):
        with self.lock:
            self.ids.setdefault(version, set()).add(token)

    def sampler(self):
        """Every 100 ms: Redis' state, then A's /healthz and /token, judged by the staleness rule."""
        tokens = {}
        while not self.done.is_set():
            try:
                state = self.client.state()
            except OSError:
                state = None
            # Redis held `state` at this moment at the latest (the reply is in): a time taken before
            # the read could be long before it on a loaded machine, and would accuse A wrongly.
            now = time.monotonic()
            if state is not None:
                self.saw(*state)
                with self.lock:
                    self.samples.append((now, state[0]))
                    for version, values in self.ids.items():
                        for value in values:
                            tokens[value] = version
            port = self.replicas["A"].port
            asked = time.monotonic()
            health = self.health(port)
            try:
                served = self.token(port)
            except (OSError, ValueError) as error:
                served = None
                self.slow_reads.append("%.2f s: GET /token failed: %s" % (asked - self.t0, error))
            at = time.monotonic()
            if at - asked > READ_BOUND:
                self.slow_reads.append("%.2f s: GET /healthz and GET /token took %.2f s" % (asked - self.t0, at - asked))
            # A served `served` at some moment after `asked`: stale if Redis held a newer version
            # 0.5 s before that moment, and judged at `asked`, the earliest it can be.
            if health == "ok" and served is not None and served in tokens:
                with self.lock:
                    newer = [v for t, v in self.samples if t <= asked - 0.5 and v > tokens[served]]
                if newer and not self.allowed(asked):
                    self.stale.append("%.2f s: A served version %d while Redis held %d 0.5 s before"
                                      % (asked - self.t0, tokens[served], max(newer)))
            # Pacing: the sampler compares a read with Redis every 100 ms.
            time.sleep(0.1)

    def allowed(self, at):
        """Whether a healthy replica A may serve a stale token at `at` (during the fault, and up
        to 1 s after its subscription is confirmed again or 5 s after the fault ended)."""
        proxy = self.proxies["A"]
        if self.window_start is None or at < self.window_start:
            return False
        if proxy.ended_at is None:
            return True
        limit = proxy.ended_at + 5
        again = [t for t in proxy.subscribed_at if t >= (proxy.fired_at or self.window_start)]
        if again:
            limit = min(limit, max(again[-1], proxy.ended_at) + 1)
        return at <= limit

    # -- the fault runs ------------------------------------------------------------------------
    def run(self):
        self.t0 = time.monotonic()
        self.window_start = None
        self.start()
        for replica in ("A", "B"):
            self.spawn(self.stream_loop, replica)
            for _ in range(2):
                self.spawn(self.client_loop, replica)
        self.spawn(self.sampler)
        # Load before the fault: the scenario's writes and streams run for 1.5 s first.
        time.sleep(1.5)
        if self.name == "noscript-batch":
            self.noscript_batch()
        elif self.name == "hung-queue":
            self.hung_queue()
        else:
            self.fault_run()
        self.done.set()
        for thread in self.threads:
            thread.join(15)
        self.verify()

    def fault_run(self):
        step, fault = self.name.split("/")
        self.window_start = time.monotonic()
        for proxy in self.proxies.values():
            proxy.arm(step, fault)
        if step in CONNECT_STEPS:
            for proxy in self.proxies.values():
                proxy.kick()
        if step == "EVAL":
            check(self.client.command("SCRIPT", "FLUSH") == "OK", "SCRIPT FLUSH")
        a, b = self.proxies["A"], self.proxies["B"]
        def fired():
            # Both replicas share one Redis: the first to send EVAL loads the scripts again when it
            # reconnects, and the other may never see NOSCRIPT. Flush again until both fired.
            if step == "EVAL" and (a.fired_at is None or b.fired_at is None):
                now = time.monotonic()
                if now - self.flushed > 0.3:
                    self.flushed = now
                    self.client.command("SCRIPT", "FLUSH")
            return a.fired_at is not None and b.fired_at is not None
        self.flushed = time.monotonic()
        try:
            wait_until(fired, 10, interval=0.01, what="the fault to fire")
        except Failure:
            raise Failure("the fault did not fire at %s on both replicas within 10 s (A: %s, steps passed "
                          "while armed %s; B: %s, steps %s; %d writes)" % (
                              step, a.fired, sorted(set(a.seen_armed)), b.fired, sorted(set(b.seen_armed)),
                              len(self.writes)))
        self.signal_b(b.fired_at + 0.2)
        wait_until(lambda: a.ended_at is not None, 10, what="the fault on A to end")
        self.notes.append("A: %s at %s on its %s, +%.2f s after arming, over after %.2f s"
                          % (fault, step, a.fired[2], a.fired_at - self.window_start, a.ended_at - a.fired_at))
        self.notes.append("B: %s at %s on its %s, SIGTERM 0.2 s later" % (fault, step, b.fired[2]))
        # Writes go on until 5 s after the fault ended plus 1 s, then A must agree with Redis.
        time.sleep(max(0, a.ended_at + 6 - time.monotonic()))
        self.stop_clients["A"].set()
        self.converged()

    def signal_b(self, at):
        """SIGTERM to B at `at`; it must exit 0 within DRAIN_SECONDS + 3 s."""
        time.sleep(max(0, at - time.monotonic()))
        server = self.replicas["B"]
        self.stop_clients["B"].set()
        signalled = self.b_signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(DRAIN_SECONDS + 3 + 2)
        took = time.monotonic() - signalled
        if code is None:
            server.kill()
        self.b_exit = (code, took)

    def converged(self):
        """A ends on the state Redis holds, and says ok."""
        def same():
            state = self.client.state()
            return state is not None and self.health(self.replicas["A"].port) == "ok" \
                and self.token(self.replicas["A"].port) == state[1]
        wait_until(same, 5, interval=0.05, what="A serving what Redis holds after the fault")

    def noscript_batch(self):
        """Finding 1: the replies to one EVALSHA are held while more writes and a check queue
        behind it; the script cache is flushed; the EVAL retry of the next batch is reset."""
        self.window_start = time.monotonic()
        self.stop_clients["A"].set()
        self.stop_clients["B"].set()
        # The clients' last writes (0.1 s apart) end before the fault is armed.
        time.sleep(0.5)
        a = self.proxies["A"]
        a.arm("EVALSHA", "slow", slow_seconds=1.2)
        first = self.spawn(self.write, "A", self.new_token())
        wait_until(lambda: a.fired_at is not None, 5, interval=0.005, what="the held EVALSHA")
        time.sleep(0.2)  # it reached Redis: its reply is held in the proxy
        check(self.client.command("SCRIPT", "FLUSH") == "OK", "SCRIPT FLUSH")
        behind = [self.spawn(self.write, "A", self.new_token()) for _ in range(3)]
        # A stream whose Last-Event-ID is above A's version asks for a check of PREFIX:state.
        version = self.client.state()[0]
        ahead = threading.Thread(target=lambda: self._ahead_stream(version + 1000), daemon=True)
        ahead.start()
        a.ended_at = None
        a.fired_at = None
        a.arm("EVAL", "reset")
        wait_until(lambda: a.fired_at is not None, 8, interval=0.01, what="the EVAL retry to be reset")
        a.fired = ("NOSCRIPT then EVAL", "reset", a.fired[2])
        self.notes.append("A: a batch answered NOSCRIPT (SCRIPT FLUSH), its EVAL retry reset")
        for thread in [first] + behind:
            thread.join(12)
        # A keeps reading PREFIX:state: a write through B reaches A's GET /token.
        token = self.new_token()
        _, _, _, status = self.write("B", token)
        check(status == 200, "a write through B after the fault answered %s" % status)
        try:
            wait_until(lambda: self.token(self.replicas["A"].port) == token, 5, interval=0.05,
                       what="A learning B's write after the batch")
        except Failure as error:
            self.stale.append(str(error))
        self.b_exit = None

    def _ahead_stream(self, last_event_id):
        try:
            EventStream(self.replicas["A"].port, timeout=3, last_event_id=last_event_id).close()
        except (Failure, OSError):
            pass

    def hung_queue(self):
        """Finding 3: Redis stopped (SIGSTOP), writes from three clients queued 0.2 s apart: each
        is answered within 2 s of being sent."""
        self.stop_clients["A"].set()
        self.stop_clients["B"].set()
        # The clients' last writes (0.1 s apart) end before Redis is stopped.
        time.sleep(0.5)
        self.window_start = time.monotonic()
        self.redis.signal(signal.SIGSTOP)
        try:
            writers = []
            for n in range(6):
                writers.append(self.spawn(self.write, "A", self.new_token()))
                # The writes are queued 0.2 s apart (the scenario: each answered within 2 s of its own send).
                time.sleep(0.2)
            for thread in writers:
                thread.join(12)
        finally:
            self.redis.signal(signal.SIGCONT)
        self.proxies["A"].fired = ("SIGSTOP", "hung Redis", "server")
        self.proxies["A"].ended_at = time.monotonic()
        self.notes.append("A: Redis stopped with SIGSTOP under 6 queued writes")
        self.converged()
        self.b_exit = None

    # -- the checks ----------------------------------------------------------------------------
    def verify(self):
        problems = []
        late = [w for w in self.writes if w[2] is None or w[2] - w[1] > WRITE_BOUND]
        for replica, sent, answered, status in late[:5]:
            if answered is None:
                problems.append("a write to %s sent at %.2f s got no answer (%s)" % (replica, sent - self.t0, status))
            else:
                problems.append("a write to %s sent at %.2f s was answered %s after %.2f s"
                                % (replica, sent - self.t0, status, answered - sent))
        if len(late) > 5:
            problems.append("... %d late or unanswered writes in all" % len(late))
        for replica, server in self.replicas.items():
            lines = re.findall(r"POST /register (\d+) \d+ bytes (\d+) us", server.stderr())
            answered = [w for w in self.writes if w[0] == replica and w[2] is not None]
            if len(lines) < len(answered):
                problems.append("%s logged %d writes, its clients had %d answers" % (replica, len(lines), len(answered)))
            slow = sorted(int(us) / 1e6 for _, us in lines if int(us) / 1e6 > SERVER_WRITE_BOUND)
            if slow:
                problems.append("%s answered %d writes later than %.2f s after their arrival (its access log): "
                                "the slowest in %.2f s" % (replica, len(slow), SERVER_WRITE_BOUND, slow[-1]))
        problems += self.stale[:5]
        problems += self.slow_reads[:3]
        doubles = {v: sorted(t) for v, t in self.ids.items() if len(t) > 1}
        if doubles:
            problems.append("ids naming two values: %r" % dict(list(doubles.items())[:3]))
        if self.b_exit is not None:
            code, took = self.b_exit
            problems.append("(B signalled at %.2f s, exit %s after %.2f s)" % (self.b_signalled - self.t0, code, took)) \
                if problems else None
            if code != 0 or took > DRAIN_SECONDS + 3:
                problems.append("B signalled mid-fault: exit %s after %.1f s (wanted 0 within %d s)"
                                % (code, took, DRAIN_SECONDS + 3))
        statuses = {}
        for w in self.writes:
            statuses[w[3]] = statuses.get(w[3], 0) + 1
        self.summary = "%d writes %s, %d ids" % (len(self.writes), statuses, len(self.ids))
        if self.b_exit is not None:
            self.summary += ", B exit %s in %.1f s" % self.b_exit
        if problems:
            raise Failure("; ".join(problems))

    def close(self):
        self.done.set()
        for server in self.replicas.values() if hasattr(self, "replicas") else ():
            server.kill()
        for proxy in self.proxies.values() if hasattr(self, "proxies") else ():
            proxy.close()
        if hasattr(self, "redis"):
            try:
                self.redis.signal(signal.SIGCONT)
            except (OSError, AttributeError):
                pass
            self.redis.kill()


def one(binary, name):
    """Runs one fault run in this process; prints one line; exit status 0 when it passed."""
    run = Run(binary, name)
    started = time.monotonic()
    passed = False
    try:
        run.run()
        passed = True
        for note in run.notes:
            log("[%s] %s" % (name, note))
        log("[%s] PASS in %.1f s: %s" % (name, time.monotonic() - started, run.summary))
        return 0
    except BaseException as error:  # a Failure, or anything unexpected: the run failed
        for note in run.notes:
            log("[%s] %s" % (name, note))
        for replica, server in getattr(run, "replicas", {}).items():
            lines = [line for line in server.stderr().splitlines() if " /register " not in line
                     and " /token" not in line and " /healthz" not in line]
            for line in lines[-12:]:
                log("[%s] %s's log: %s" % (name, replica, line))
        log("[%s] FAIL in %.1f s: %s: %s" % (name, time.monotonic() - started, type(error).__name__, error))
        return 1
    finally:
        run.close()
        if passed:
            for server in getattr(run, "replicas", {}).values():
                shutil.rmtree(server.workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("FAULT_JOBS", "6")))
    parser.add_argument("--only", default="")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print("\n".join(runs()))
        return 0
    if args.run:
        return one(args.server, args.run)
    for tool in ("redis-server",):
        if subprocess.run(["sh", "-c", "command -v " + tool], capture_output=True).returncode != 0:
            log("FAIL: %s is not installed" % tool)
            return 1
    selected = [name for name in args.only.split(",") if name] or runs()
    unknown = [name for name in selected if name not in runs()]
    if unknown:
        log("FAIL: unknown runs %s" % unknown)
        return 64
    started = time.monotonic()
    failed = []

    def child(name):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--server", args.server, "--run", name],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
        sys.stdout.write(proc.stdout.decode("utf-8", "replace"))
        sys.stdout.flush()
        return name, proc.returncode

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, code in pool.map(child, selected):
            if code != 0:
                failed.append(name)
    passed = len(selected) - len(failed)
    log("%d fault runs in %.0f s with %d in parallel" % (len(selected), time.monotonic() - started, args.jobs))
    if failed:
        log("failed runs: %s" % ", ".join(failed))
    print("%d passed, %d failed" % (passed, len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
