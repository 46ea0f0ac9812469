"""Shared helpers of the end-to-end tests: start and stop the server, plain HTTP, SSE, checks.

Everything here is bounded: every wait has a deadline, every socket a timeout, and every server
process that a test starts is remembered by its PID and killed (SIGKILL) at exit if the test did
not stop it itself. Loopback only.
"""
import atexit
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"
LISTENING = "listening on http://"
# How long a test waits for a Redis Sentinel failover (seconds), once every sentinel knows the
# replica and the other sentinels. The sentinels of the tests and of docs/replicas.md use
# failover-timeout 5000; a failover that fails (an election whose votes split) is tried again
# after twice that (Redis's sentinel.conf, "failover-timeout"), so a failover ends about 3, 13,
# 23 or 33 s after the master goes. This covers three failed tries.
SENTINEL_FAILOVER_BOUND = 45


def sentinels_ready(sentinel_clis, master, replica_port):
    """Whether every sentinel (each a function running `redis-cli SENTINEL ...`-style commands and
    returning their output) lists the Redis replica at `replica_port` and the other sentinels. A
    sentinel that has not seen the replica when the master goes can never learn of it (it reads the
    replicas from the master's INFO); when it wins the election the failover aborts and is tried
    again after twice failover-timeout."""
    for cli in sentinel_clis:
        fields = cli("SENTINEL", "master", master).splitlines()
        if int(dict(zip(fields[::2], fields[1::2])).get("num-other-sentinels", "0")) < len(sentinel_clis) - 1:
            return False
        if str(replica_port) not in cli("SENTINEL", "replicas", master):
            return False
    return True


# e2e/run.sh runs a pass with E2E_LOG_FORMAT=json: every server then logs JSON lines
# (--log-format json through FORGE_PUSH_TOKEN_LOG_FORMAT), keeps its standard error in
# E2E_LOG_DIR, and every secret a test sends (device tokens, bearer tokens) is listed in
# E2E_LOG_DIR/secrets.txt; run.sh then checks every line with jq and that no secret was logged.
LOG_FORMAT = os.environ.get("E2E_LOG_FORMAT", "text")
LOG_DIR = os.environ.get("E2E_LOG_DIR") or None
_SLOG_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARN": "warning", "ERROR": "error"}


def remember_secret(value):
    """Lists `value` (a device token, a bearer token) among what no log line may hold."""
    if LOG_DIR and value and len(value) >= 8:
        with open(os.path.join(LOG_DIR, "secrets.txt"), "a") as f:
            f.write(value.strip() + "\n")


def text_log(raw):
    """The log `raw` as the text format writes it: a JSON line (--log-format json) becomes
    `<time> <level> <message>` again, an access line `<method> <path> <status> <n> bytes <n> us`,
    a fatal error its bare message; other lines stay as they are. Tests read either format."""
    out = []
    for line in raw.splitlines(True):
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if not isinstance(record, dict) or "msg" not in record:
            out.append(line)
            continue
        message = record["msg"]
        if "method" in record:
            message = "%s %s %s %s bytes %s us" % (record["method"], record["path"], record.get("status", "-"),
                                                  record["bytes"], record["duration_us"])
        if record.get("level") == "ERROR" and message.startswith("forge-push-token-server: "):
            out.append(message + "\n")
        else:
            out.append("%s %s %s\n" % (record.get("time"), _SLOG_LEVELS.get(record.get("level"), record.get("level")),
                                        message))
    return "".join(out)

_started = {}  # pid -> Popen, every server process not yet reaped
_started_lock = threading.Lock()


def _kill_leftovers():
    with _started_lock:
        procs = list(_started.values())
        _started.clear()
    for proc in procs:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _on_sigterm(signum, frame):
    # `timeout` (run.sh) sends SIGTERM: unwind through the finally blocks, then atexit kills.
    raise SystemExit("terminated by signal %d" % signum)


atexit.register(_kill_leftovers)
signal.signal(signal.SIGTERM, _on_sigterm)


class Failure(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def log(message):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), message), flush=True)


def wait_until(predicate, timeout, interval=0.02, what="condition"):
    """Polls `predicate` until it returns a truthy value or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Failure("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(interval)


class Server:
    """One forge-push-token-server process; standard error goes to a file (never a full pipe)."""

    def __init__(self, binary, args=(), env=None, workdir=None, cwd=None):
        """`cwd`: the process's working directory (the test's own when None)."""
        self.binary = binary
        self.args = list(args)
        self.env = env
        self.cwd = cwd
        self.workdir = workdir or tempfile.mkdtemp(prefix="e2e-server-")
        self.proc = None
        self.port = None
        self.stderr_path = None
        self.started_at = None

    # -- lifecycle --------------------------------------------------------------------------
    def spawn(self):
        """Starts the process without waiting for it to listen."""
        # A server whose test names its own --log-format keeps its log out of the pass's JSON check.
        chosen = any(arg == "--log-format" or arg.startswith("--log-format=") for arg in self.args)
        fd, self.stderr_path = tempfile.mkstemp(prefix="stderr-", suffix=".log",
                                                dir=(LOG_DIR if not chosen else None) or self.workdir)
        os.close(fd)
        environment = dict(os.environ)
        for key in list(environment):
            if key.startswith("FORGE_PUSH_TOKEN_"):
                del environment[key]
        if LOG_FORMAT != "text":
            environment["FORGE_PUSH_TOKEN_LOG_FORMAT"] = LOG_FORMAT
        if self.env:
            environment.update(self.env)
            remember_secret(self.env.get("FORGE_PUSH_TOKEN_AUTH_TOKEN"))
        for flag, value in zip(self.args, self.args[1:]):
            if flag == "--auth-token":
                remember_secret(value)
        for arg in self.args:
            if arg.startswith("--auth-token="):
                remember_secret(arg.split("=", 1)[1])
        self.started_at = time.time()
        with open(self.stderr_path, "wb") as err:
            # Absolute, so that a relative path still names the binary from another `cwd`.
            binary = os.path.abspath(self.binary) if self.cwd and os.sep in self.binary else self.binary
            self.proc = subprocess.Popen([binary] + self.args, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err, env=environment, cwd=self.cwd)
        with _started_lock:
            _started[self.proc.pid] = self.proc
        return self

    def start(self, timeout=10):
        """Starts the process and waits for `listening on http://HOST:PORT`; sets `port`."""
        self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stderr()
            if LISTENING in text:
                line = text[text.index(LISTENING) + len(LISTENING):].split()[0]
                self.port = int(line.rsplit(":", 1)[1].rstrip("/"))
                return self
            if self.proc.poll() is not None:
                self._reap()
                raise Failure("server exited with %s before listening; stderr:\n%s"
                              % (self.proc.returncode, text[-2000:]))
            time.sleep(0.01)
        self.kill()
        raise Failure("server did not log '%s' within %.0f s; stderr:\n%s"
                      % (LISTENING, timeout, self.stderr()[-2000:]))

    def stderr(self):
        """Standard error so far, in the text format whatever --log-format (see `text_log`)."""
        return text_log(self.raw_stderr())

    def raw_stderr(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def wait(self, timeout):
        """Waits for the process to exit; returns its exit code or None on timeout."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reap()
        return code

    def stop(self, timeout=8):
        """SIGTERM, then waits; SIGKILL when it does not exit in time. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            self._reap()
            return None if self.proc is None else self.proc.returncode
        os.kill(self.proc.pid, signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.kill()
            raise Failure("server did not exit within %.0f s of SIGTERM" % timeout)
        return code

    def kill(self):
        """SIGKILL (the crash test's kill, or the last resort)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._reap()

    def _reap(self):
        if self.proc is not None and self.proc.poll() is not None:
            with _started_lock:
                _started.pop(self.proc.pid, None)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # -- what /proc says of the process (bench/ uses these too) ------------------------------
    def fds(self):
        """Open file descriptors."""
        return len(os.listdir("/proc/%d/fd" % self.proc.pid))

    def rss_kb(self):
        """Resident set size in kB."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self):
        """User plus system CPU time so far, in seconds."""
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    # -- HTTP -------------------------------------------------------------------------------
    def request(self, method, path, body=None, headers=None, timeout=5):
        return request(self.port, method, path, body=body, headers=headers, timeout=timeout)

    def register(self, token_hex, timeout=5):
        return self.request("POST", "/register", body=token_hex.encode(),
                            headers={"Content-Type": "application/x-www-form-urlencoded"},
                            timeout=timeout)

    def fail(self, message="no valid aps-environment entitlement", timeout=5):
        return self.request("POST", "/fail", body=message.encode(),
                            headers={"Content-Type": "text/plain"}, timeout=timeout)

    def token(self):
        status, _, body = self.request("GET", "/token")
        check(status == 200, "GET /token answered %s: %r" % (status, body))
        return json.loads(body)["token"]


def request(port, method, path, body=None, headers=None, timeout=5):
    """One request on a fresh connection: (status, headers as a lower-case dict, body bytes)."""
    if LOG_DIR:
        if method == "POST" and path.startswith("/register") and body:
            remember_secret(body.decode("utf-8", "replace"))
        authorization = (headers or {}).get("Authorization", "")
        if authorization.startswith("Bearer "):
            remember_secret(authorization[len("Bearer "):])
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def metric_value(text, series):
    """The value of `series` (a metric's name with its labels, as the exposition writes them) in
    the text of a /metrics answer, or None when it has no such line."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def metric(port, series, headers=None, timeout=5):
    """The value of `series` in the /metrics of the service on `port` (None without it)."""
    status, _, body = request(port, "GET", "/metrics", headers=headers, timeout=timeout)
    check(status == 200, "GET /metrics answered %s: %r" % (status, body[:200]))
    return metric_value(body.decode(), series)


def streams_ended_settles(port, reason, expected, headers=None, timeout=5):
    """Waits until `forge_push_token_streams_ended_total{reason=...}` reads `expected`; returns it.

    The service counts a stream's end when libmicrohttpd frees the stream's response, which is
    just after it sent the final chunk: a client that has read every end can ask /metrics a
    moment before the last one is counted. A count over `expected` fails at once, one that stays
    under it fails after `timeout` seconds, naming every reason's count.
    """
    series = 'forge_push_token_streams_ended_total{reason="%s"}' % reason
    deadline = time.monotonic() + timeout
    while True:
        status, _, body = request(port, "GET", "/metrics", headers=headers)
        check(status == 200, "GET /metrics answered %s" % status)
        text = body.decode()
        lines = [line for line in text.splitlines() if line.startswith("forge_push_token_streams_ended_total{")]
        value = metric_value(text, series)
        check(value is not None and value <= expected, "%s is %s, over %s: %s" % (series, value, expected, lines))
        if value == expected:
            return value
        check(time.monotonic() < deadline, "%s is %s, not %s, %.0f s after the streams ended: %s"
              % (series, value, expected, timeout, lines))
        time.sleep(0.02)


class EventStream:
    """A `GET /token/stream` subscriber: `next_event()` returns (id, event, data) tuples."""

    def __init__(self, port, timeout=5, last_event_id=None, path="/token/stream", headers=None, context=None):
        """`context`: an ssl.SSLContext for HTTPS, else plain HTTP. `comments` counts the comment
        lines (heartbeats) skipped so far."""
        if context is not None:
            self.conn = http.client.HTTPSConnection(HOST, port, timeout=timeout, context=context)
        else:
            self.conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        all_headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            all_headers["Last-Event-ID"] = str(last_event_id)
        all_headers.update(headers or {})
        self.conn.request("GET", path, headers=all_headers)
        self.sock = self.conn.sock  # http.client drops conn.sock when the response will close
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        self.comments = 0
        self.body = self.response.read() if self.status != 200 else None

    def next_event(self, timeout=5):
        """The next event (comments and `retry:` skipped); raises Failure on timeout or end."""
        self.sock.settimeout(timeout)
        fields = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                raw = self.response.readline()
            except (TimeoutError, OSError, http.client.HTTPException) as error:
                raise Failure("no event within %.1f s (%s)" % (timeout, error))
            if not raw:
                raise Failure("the event stream ended")
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if "data" in fields or "event" in fields:
                    return fields.get("id"), fields.get("event"), fields.get("data")
                fields = {}
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data" and "data" in fields:
                fields["data"] += "\n" + value
            else:
                fields[name] = value
        raise Failure("no complete event within %.1f s" % timeout)

    def next_token_event(self, timeout=5):
        """(id as int, token) of the next `token` event."""
        event_id, name, data = self.next_event(timeout)
        check(name == "token", "expected a 'token' event, got %r" % name)
        check(event_id is not None and event_id.isdigit(), "event without a numeric id: %r" % event_id)
        return int(event_id), json.loads(data)["token"]

    def close(self):
        try:
            self.sock.shutdown(2)
        except OSError:
            pass
        self.response.close()
        self.conn.close()
        self.sock.close()


STREAM_REQUEST = b"GET /token/stream HTTP/1.1\r\nHost: e2e\r\nAccept: text/event-stream\r\n\r\n"


def open_subscribers(port, count, timeout=10, version="HTTP/1.1"):
    """`count` raw `GET /token/stream` sockets, each read up to its first event (for loads of
    thousands, where an `EventStream` each would cost too much). `version` "HTTP/1.0" asks for a
    stream libmicrohttpd keeps (a plain HTTP/1.1 one is detached). The caller closes them."""
    request = STREAM_REQUEST.replace(b"HTTP/1.1", version.encode(), 1)
    subscribers = []
    try:
        for _ in range(count):
            sock = socket.create_connection((HOST, port), timeout=timeout)
            subscribers.append(sock)
            sock.sendall(request)
        deadline = time.monotonic() + 60  # heartbeats alone would keep the reads going forever
        for sock in subscribers:
            data = b""
            while b"data:" not in data:
                check(time.monotonic() < deadline, "a subscriber's first event did not come within 60 s")
                chunk = sock.recv(4096)
                if not chunk:
                    raise Failure("a subscriber was closed before its first event")
                data += chunk
    except BaseException:
        for sock in subscribers:
            sock.close()
        raise
    return subscribers


def token_hex(*parts):
    """A distinct 32-byte token (64 lower-case hex digits) made from small integers."""
    text = "".join("%08x" % (p & 0xFFFFFFFF) for p in parts)
    return (text + "a1b2c3d4e5f60718" * 8)[:64]


def main(run):
    """Runs `run()`; prints PASS/FAIL; exits 0 or 1. Any exception is a failure."""
    name = os.path.basename(sys.argv[0])
    started = time.monotonic()
    try:
        run()
    except Failure as error:
        log("FAIL %s: %s" % (name, error))
        _kill_leftovers()
        sys.exit(1)
    except BaseException as error:  # includes SystemExit from SIGTERM and KeyboardInterrupt
        import traceback
        traceback.print_exc()
        log("FAIL %s: %s: %s" % (name, type(error).__name__, error))
        _kill_leftovers()
        sys.exit(1)
    log("PASS %s in %.1f s" % (name, time.monotonic() - started))
    _kill_leftovers()
    sys.exit(0)


def run_tap_checks(checks, prefix, make_fixtures, tools=(), keep=None):
    """Runs named checks as a TAP stream, the runner of the files with many small checks
    (hardening_test.py, http_edges_test.py): parses `--server PATH`, `--only a,b` (substrings of
    a check's description or function name) and `--verbose`; makes the fixtures with
    `make_fixtures(binary, workdir)` (an object with `stop_all()`) and hands them and the verbose
    flag to `keep(fixtures, verbose)`; runs each selected `(description, function)` of `checks`
    (`ok N`/`not ok N` with the failure or traceback); stops every server and removes the work
    folder. `tools` must be on PATH, or the run bails out. Returns the exit code: 1 when a check
    failed."""
    import argparse
    import shutil
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--only", default="", help="comma-separated substrings of check names")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    binary = os.path.abspath(args.server)
    for tool in tools:
        if shutil.which(tool) is None:
            print("Bail out! %s is not installed" % tool, flush=True)
            return 1
    selected = [(d, f) for d, f in checks
                if not args.only or any(part in d or part in f.__name__ for part in args.only.split(","))]
    workdir = tempfile.mkdtemp(prefix=prefix)
    fixtures = make_fixtures(binary, workdir)
    if keep is not None:
        keep(fixtures, args.verbose)

    def finish():
        fixtures.stop_all()
        _kill_leftovers()
        shutil.rmtree(workdir, ignore_errors=True)
    return run_selected_as_tap(selected, finish)


def run_selected_as_tap(selected, finish):
    """Runs each `(description, function)` of `selected` as a TAP stream (`1..N`, then `ok N` or
    `not ok N` with the failure's message or the traceback, and a closing `# P passed, F failed`
    line), calls `finish()` whatever happens, and returns the exit code: 1 when a check failed.
    The one loop of run_tap_checks and docker/podman/engine_test.py."""
    import traceback
    started = time.monotonic()
    passed = failed = 0
    print("1..%d" % len(selected), flush=True)
    try:
        for number, (description, function) in enumerate(selected, 1):
            t0 = time.monotonic()
            try:
                function()
            except Failure as error:
                failed += 1
                print("not ok %d - %s (%.1f s)" % (number, description, time.monotonic() - t0))
                for line in str(error).splitlines() or [""]:
                    print("#   " + line)
            except Exception:
                failed += 1
                print("not ok %d - %s (%.1f s)" % (number, description, time.monotonic() - t0))
                for line in traceback.format_exc().splitlines():
                    print("#   " + line)
            else:
                passed += 1
                print("ok %d - %s (%.1f s)" % (number, description, time.monotonic() - t0))
            sys.stdout.flush()
    finally:
        finish()
    print("# %d passed, %d failed in %.1f s" % (passed, failed, time.monotonic() - started), flush=True)
    return 1 if failed else 0


def health_of(port):
    """`GET /healthz` of the service on `port` as (status, parsed JSON), or (None, {}) while it
    does not answer (the docs tests poll it while the processes of a docs block start)."""
    try:
        status, _, body = request(port, "GET", "/healthz", timeout=2)
        return status, json.loads(body)
    except (OSError, ValueError):
        return None, {}


def loopback_listener(backlog=64):
    """A TCP socket listening on a free loopback port (SO_REUSEADDR), and the port: the fake
    servers and proxies of the e2e tests."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, 0))
    listener.listen(backlog)
    return listener, listener.getsockname()[1]


def free_port():
    """A free loopback port (bound to port 0, read, released): the one definition for e2e/ and
    bench/ (bench's shell scripts call `python3 e2e/e2e_support.py free-port`). For several that
    must differ from each other, `distinct_free_ports`."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def distinct_free_ports(count):
    """`count` distinct free loopback ports: every socket stays bound until all are chosen (a port
    released at once may be handed out again)."""
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((HOST, 0))
        held.append(sock)
    ports = [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()
    return ports


def docs_block_folder(binary, prefix):
    """A temporary folder to run a docs block in, and the environment for it: `binary` first on
    PATH as `forge-push-token-server` (a symlink in the folder's bin/) and no state file inherited
    from the caller. Returns (folder, env)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    bin_dir = os.path.join(folder, "bin")
    os.mkdir(bin_dir)
    os.symlink(binary, os.path.join(bin_dir, "forge-push-token-server"))
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("FORGE_PUSH_TOKEN_STATE_FILE", None)
    return folder, env


def docs_sh_blocks(page, heading, until=None):
    """The ```sh blocks of docs/`page` from `heading` to `until` (or the end of the page), the
    commands the docs tests run as written."""
    import re
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", page),
                encoding="utf-8").read()
    start = text.index(heading)
    end = text.index(until, start) if until else len(text)
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.S)


def check_list():
    """The named checks of a TAP file and the decorator that adds to them:
    `CHECKS, test = check_list()`, then `@test("description")` above each check function; the list
    goes to `run_tap_checks`."""
    checks = []

    def test(description):
        def register(function):
            checks.append((description, function))
            return function
        return register
    return checks, test


if __name__ == "__main__":
    # For shell scripts (bench/replicas.sh, bench/scale.sh): `python3 e2e/e2e_support.py free-port`.
    if sys.argv[1:] == ["free-port"]:
        print(free_port())
    else:
        sys.exit("usage: e2e_support.py free-port")
