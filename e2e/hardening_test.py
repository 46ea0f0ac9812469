#!/usr/bin/env python3
"""End-to-end: the hardening flags (bearer auth, HTTPS, CORS, connection/URL/header limits).

Each check is one function below and prints one TAP line (`ok N - ...` / `not ok N - ...` with the
reason as `# ...` lines); at the end `# N passed, N failed` and exit status 1 when any failed.
Servers run on free loopback ports (one per configuration, shared by the checks that need it) and
are all stopped at the end; the whole file takes about 20 s. Standard library only, plus the
`curl` and `openssl` command-line tools.

  auth     --auth-token / --auth-token-file / --auth-scope: 401 + WWW-Authenticate (RFC 6750),
           wrong tokens (same length, last byte), case-insensitive scheme, a refused POST changes
           nothing, ?access_token= for GET/HEAD under `all` (never for POST), /healthz open, the
           token never in the log or in a flag error, the non-loopback warning, exit 64 on bad flags
  tls      --tls-cert/--tls-key: https:// in the log, GET/POST/SSE over TLS with curl and Python's
           ssl, plain HTTP refused, --health-check[=live|ready] over TLS (status read, while
           serving and draining; another certificate refused), exit 64 for a missing key, exit 1
           for a bad certificate
  cors     --cors-origin: Access-Control-Allow-Origin + Vary for listed origins only, preflight
           204 / 403 origin_not_allowed, plain OPTIONS 204 + Allow, `*`
  limits   --max-url-bytes (414), --max-header-bytes (431), --max-connections,
           --max-connections-per-ip (127.0.0.2 as a second client address), --idle-timeout
           (event streams exempt), a slowloris attack against a normal client

    python3 e2e/hardening_test.py --server PATH [--only SUBSTRING[,SUBSTRING...]] [--verbose]
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

from e2e_support import check_list, run_tap_checks, HOST, EventStream, Failure, Server, check, token_hex, wait_until

REALM = 'Bearer realm="forge-push-token"'
INVALID = 'Bearer realm="forge-push-token", error="invalid_token"'
JSON_TYPE = "application/json; charset=utf-8"
ORIGIN = "https://app.example"
ORIGIN2 = "https://second.example:8443"
LISTEN_RE = re.compile(r"listening on (https?)://(\S+)")

# The secret of this run: random, in the allowed alphabet, with '+' and '/' (which need
# percent-encoding in a query) and the rarer '~' '.' '_' '-'.
CORE = os.urandom(16).hex()
TOKEN = "e2e." + CORE + "-_~+/Z"
FILE_CORE = os.urandom(16).hex()
FILE_TOKEN = "file" + FILE_CORE
WRONG_SAME_LENGTH = "e2e." + os.urandom(16).hex() + "-_~+/Z"
WRONG_LAST_BYTE = TOKEN[:-1] + "Y"
# Never to be seen in a log line: the real tokens and anything carrying most of them.
SECRETS = [TOKEN, CORE, CORE[:16], CORE[16:], FILE_TOKEN, FILE_CORE, WRONG_SAME_LENGTH[4:36]]

VERBOSE = False


def note(message):
    if VERBOSE:
        print("#   " + message, flush=True)


# -- servers ------------------------------------------------------------------------------------
class HServer(Server):
    """A Server that also understands `listening on https://`."""

    def __init__(self, binary, args=(), env=None, workdir=None, tls_ca=None):
        super().__init__(binary, args, env=env, workdir=workdir)
        self.tls_ca = tls_ca
        self.scheme = None

    def start(self, timeout=10):
        self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stderr()
            match = LISTEN_RE.search(text)
            if match:
                self.scheme = match.group(1)
                self.port = int(match.group(2).rsplit(":", 1)[1].rstrip("/"))
                return self
            if self.proc.poll() is not None:
                self._reap()
                raise Failure("server %s exited with %s before listening; stderr:\n%s"
                              % (" ".join(self.args), self.proc.returncode, text.split("\nusage:")[0][-2000:]))
            time.sleep(0.01)
        self.kill()
        raise Failure("server did not log 'listening on' within %.0f s; stderr:\n%s"
                      % (timeout, self.stderr()[-2000:]))

    def ssl_context(self):
        return ssl.create_default_context(cafile=self.tls_ca) if self.tls_ca else None

    def req(self, method, path, headers=None, body=None, timeout=5, source=None):
        return http_request(self.port, method, path, headers=headers, body=body, timeout=timeout,
                            context=self.ssl_context(), source=source)


class Response:
    def __init__(self, status, header_list, body):
        self.status = status
        self.header_list = header_list
        self.headers = {}
        for key, value in header_list:
            key = key.lower()
            self.headers[key] = value if key not in self.headers else self.headers[key] + ", " + value
        self.body = body

    def get(self, name):
        return self.headers.get(name.lower())

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise Failure("body is not JSON: %r" % self.body[:300])

    def __repr__(self):
        return "%s %r %r" % (self.status, self.header_list, self.body[:300])


def http_request(port, method, path, headers=None, body=None, timeout=5, context=None, source=None):
    source_address = (source, 0) if source else None
    if context is not None:
        conn = http.client.HTTPSConnection(HOST, port, timeout=timeout, context=context,
                                           source_address=source_address)
    else:
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout, source_address=source_address)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return Response(response.status, response.getheaders(), data)
    finally:
        conn.close()


class Stream(EventStream):
    """GET /token/stream of `server` over HTTP or HTTPS; `next_event()` gives (id as int, token)."""

    def __init__(self, server, path="/token/stream", headers=None, timeout=5):
        super().__init__(server.port, timeout=timeout, path=path, headers=headers, context=server.ssl_context())

    def next_event(self, timeout=5):
        event_id, _, data = super().next_event(timeout)
        return int(event_id if event_id is not None else "-1"), json.loads(data)["token"]


class Fixtures:
    """Servers started on first use, one per configuration, all stopped at the end."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.workdir = workdir
        self.servers = {}
        self.errors = {}
        self.all = []  # every HServer started, for the log scan
        self._cert = None

    def start(self, args, env=None, tls_ca=None):
        server = HServer(self.binary, args, env=env, workdir=self.workdir, tls_ca=tls_ca)
        self.all.append(server)
        return server.start()

    def get(self, name):
        if name in self.errors:
            raise Failure("server %r could not start earlier: %s" % (name, self.errors[name]))
        if name not in self.servers:
            try:
                self.servers[name] = self._make(name)
            except Failure as error:
                self.errors[name] = str(error)
                raise
        return self.servers[name]

    def _make(self, name):
        # `NAME_quiet`: the same with the access log off, which puts GET/HEAD /token on the
        # engine's allocation-free path where the engine allows it.
        quiet = name.endswith("_quiet")
        name = name[:-len("_quiet")] if quiet else name
        base = ["--host", HOST, "--port", "0", "--access-log", "off" if quiet else "on"]
        if name == "auth":
            return self.start(base + ["--auth-token", TOKEN, "--heartbeat", "1"])
        if name == "auth_all":
            return self.start(base + ["--auth-token", TOKEN, "--auth-scope", "all", "--log-level", "debug",
                                      "--cors-origin", ORIGIN])
        if name == "tls":
            cert, key = self.cert()
            return self.start(base + ["--tls-cert", cert, "--tls-key", key, "--auth-token", TOKEN,
                                      "--heartbeat", "1"], tls_ca=cert)
        if name == "cors":
            return self.start(base + ["--cors-origin", ORIGIN, "--cors-origin", ORIGIN2])
        if name == "cors_any":
            return self.start(base + ["--cors-origin", "*"])
        if name == "small_url":
            return self.start(base + ["--max-url-bytes", "100", "--max-header-bytes", "15184"])
        if name == "default":
            return self.start(base)
        if name == "text_log":
            # The flag wins over FORGE_PUSH_TOKEN_LOG_FORMAT, which e2e/run.sh sets to json.
            return self.start(base + ["--log-format", "text"])
        if name == "max_conn":
            return self.start(base + ["--max-connections", "20"])
        if name == "per_ip":
            return self.start(base + ["--max-connections-per-ip", "3"])
        if name == "idle":
            return self.start(base + ["--idle-timeout", "2", "--heartbeat", "1"])
        if name == "idle_slow_heartbeat":
            return self.start(base + ["--idle-timeout", "2", "--heartbeat", "5"])
        raise AssertionError(name)

    def cert(self):
        if self._cert is None:
            folder = os.path.join(self.workdir, "tls")
            os.makedirs(folder, exist_ok=True)
            cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
            result = subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                 "-addext", "subjectAltName=IP:127.0.0.1"],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
            check(result.returncode == 0, "openssl req failed: %r" % result.stderr[-500:])
            self._cert = (cert, key)
        return self._cert

    def stop_all(self):
        for server in self.all:
            try:
                server.stop()
            except Failure:
                pass
            server.kill()


# -- small helpers ------------------------------------------------------------------------------
def bearer(token=TOKEN, scheme="Bearer"):
    return {"Authorization": "%s %s" % (scheme, token)}


def form(hex_text):
    return hex_text.encode()


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def with_headers(*dicts):
    out = {}
    for d in dicts:
        out.update(d)
    return out


def metric(server, name, labels=None, headers=None, source=None):
    response = server.req("GET", "/metrics", headers=headers, source=source)
    check(response.status == 200, "GET /metrics answered %r" % response)
    text = response.body.decode()
    label_text = ""
    if labels:
        label_text = r"\{" + ",".join('%s="%s"' % (k, re.escape(v)) for k, v in labels.items()) + r"\}"
    match = re.search(r"^%s%s (\S+)$" % (re.escape(name), label_text), text, re.M)
    check(match, "no sample %s%s in /metrics:\n%s" % (name, labels or "", text[:3000]))
    return float(match.group(1))


def expect_401(response, what, invalid):
    check(response.status == 401, "%s answered %r, expected 401" % (what, response))
    check(response.get("content-type") == JSON_TYPE, "%s: 401 Content-Type %r" % (what, response.get("content-type")))
    body = response.json()
    check(body.get("error") == "unauthorized" and isinstance(body.get("message"), str) and body["message"],
          "%s: 401 body %r, expected {\"error\":\"unauthorized\",\"message\":…}" % (what, body))
    expected = INVALID if invalid else REALM
    check(response.get("www-authenticate") == expected,
          "%s: WWW-Authenticate %r, expected %r" % (what, response.get("www-authenticate"), expected))


def recv_all_until_close(sock, timeout):
    """Reads until EOF or reset; returns (bytes, seconds, how) with how in eof/reset/timeout."""
    sock.settimeout(timeout)
    started = time.monotonic()
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, time.monotonic() - started, "reset"
        except (TimeoutError, socket.timeout):
            return data, time.monotonic() - started, "timeout"
        if not chunk:
            return data, time.monotonic() - started, "eof"
        data += chunk


def raw_connect(port, source=None, timeout=5):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    if source:
        sock.bind((source, 0))
    sock.connect((HOST, port))
    return sock


def read_response(sock, timeout=5):
    """One HTTP/1.1 response with Content-Length from a raw socket: (status, headers, body)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise Failure("connection closed before a full response header: %r" % data[:300])
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise Failure("connection closed inside a body")
        rest += chunk
    return status, headers, rest[:length]


def get_on(sock, path="/token"):
    sock.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path).encode())
    return read_response(sock)


def try_refused(port, source=None):
    """Connects and sends a request. 'refused' when the server closes without a byte of answer
    within 1 s, else 'served' (with the status)."""
    sock = raw_connect(port, source=source)
    try:
        started = time.monotonic()
        try:
            sock.sendall(b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return "refused", None, time.monotonic() - started
        data, elapsed, how = recv_all_until_close(sock, 1.0)
        if data.startswith(b"HTTP/1.1 "):
            return "served", int(data.split()[1]), elapsed
        if data:
            return "served", data[:60], elapsed
        return ("refused" if how in ("eof", "reset") else "hung"), None, elapsed
    finally:
        sock.close()


def run_cmd(args, timeout=5, env=None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_PUSH_TOKEN_")}
    environment.update(env or {})
    started = time.monotonic()
    try:
        result = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                env=environment)
    except subprocess.TimeoutExpired as error:
        raise Failure("%s still ran after %s s (stderr so far %r)" % (args, timeout, error.stderr))
    return result.returncode, result.stdout.decode("utf-8", "replace"), \
        result.stderr.decode("utf-8", "replace"), time.monotonic() - started


def curl(server, *args, timeout=10):
    cert, _ = FIX.cert()
    return run_cmd(["curl", "-sS", "--cacert", cert, "--max-time", "8"] + list(args), timeout=timeout)


# -- checks -------------------------------------------------------------------------------------
CHECKS, test = check_list()


# ---- auth, scope writes ----
@test("auth: POST /register and POST /fail without Authorization get 401 unauthorized + WWW-Authenticate")
def auth_missing():
    s = FIX.get("auth")
    expect_401(s.req("POST", "/register", headers=FORM, body=form(token_hex(1))), "POST /register, no auth", False)
    expect_401(s.req("POST", "/fail", headers={"Content-Type": "text/plain"}, body=b"x"), "POST /fail, no auth", False)
    expect_401(s.req("POST", "/fail"), "POST /fail, no auth, no body", False)


@test("auth: wrong tokens (other, same length, last byte, prefix, longer, empty) get 401 invalid_token")
def auth_wrong():
    s = FIX.get("auth")
    check(len(WRONG_SAME_LENGTH) == len(TOKEN) and len(WRONG_LAST_BYTE) == len(TOKEN), "internal: lengths")
    cases = {"other": "someothertoken", "same length": WRONG_SAME_LENGTH, "last byte": WRONG_LAST_BYTE,
             "prefix": TOKEN[:-1], "longer": TOKEN + "A", "padded '='": TOKEN + "=",
             "other case": TOKEN.swapcase()}
    for name, wrong in cases.items():
        for path in ("/register", "/fail"):
            r = s.req("POST", path, headers=with_headers(FORM, bearer(wrong)), body=form(token_hex(2)))
            expect_401(r, "POST %s with the %s token" % (path, name), True)
    # No credentials of the Bearer scheme: 401, invalid_token optional (RFC 6750 §3.1).
    for label, value in (("Basic", "Basic " + TOKEN), ("no scheme", TOKEN), ("empty Bearer", "Bearer"),
                         ("Bearer and spaces", "Bearer   ")):
        r = s.req("POST", "/register", headers=with_headers(FORM, {"Authorization": value}), body=form(token_hex(3)))
        check(r.status == 401, "POST /register with Authorization %s answered %r" % (label, r))
        check((r.get("www-authenticate") or "").startswith(REALM),
              "%s: WWW-Authenticate %r" % (label, r.get("www-authenticate")))


@test("auth: the scheme is case-insensitive (bearer, BEARER, BeArEr) and the right token is accepted")
def auth_scheme_case():
    s = FIX.get("auth")
    for i, scheme in enumerate(("Bearer", "bearer", "BEARER", "BeArEr")):
        hex_text = token_hex(0xCA5E, i)
        r = s.req("POST", "/register", headers=with_headers(FORM, bearer(scheme=scheme)), body=form(hex_text))
        check(r.status == 200, "POST /register with '%s <token>' answered %r" % (scheme, r))
        check(r.json() == {"token": hex_text, "changed": True}, "body %r" % r.body)
    r = s.req("POST", "/fail", headers=with_headers({"Content-Type": "text/plain"}, bearer(scheme="bearer")), body=b"e")
    check(r.status == 200 and r.json() == {"token": None, "changed": True}, "authorized POST /fail: %r" % r)


@test("auth: a refused POST changes nothing (GET /token, no stream event, unauthorized counter grows)")
def auth_refused_changes_nothing():
    s = FIX.get("auth")
    a = token_hex(0xA11)
    check(s.req("POST", "/register", headers=with_headers(FORM, bearer()), body=form(a)).status == 200,
          "authorized register A failed")
    before = metric(s, "forge_push_token_unauthorized_requests_total")
    stream = Stream(s)
    try:
        check(stream.status == 200, "GET /token/stream without auth (scope writes) answered %s" % stream.status)
        version, token = stream.next_event()
        check(token == a, "first event %r, expected A" % token)
        refused = [
            ("POST", "/register", with_headers(FORM), form(token_hex(0xB0))),
            ("POST", "/register", with_headers(FORM, bearer(WRONG_LAST_BYTE)), form(token_hex(0xB1))),
            ("POST", "/register?access_token=" + urllib.parse.quote(TOKEN, safe=""), FORM, form(token_hex(0xB2))),
            ("POST", "/fail", {"Content-Type": "text/plain"}, b"refused"),
            ("POST", "/fail", with_headers({"Content-Type": "text/plain"}, bearer(WRONG_SAME_LENGTH)), b"refused"),
        ]
        for method, path, headers, body in refused:
            r = s.req(method, path, headers=headers, body=body)
            check(r.status == 401, "%s %s answered %r, expected 401" % (method, path.split("?")[0], r))
        check(s.token() == a, "GET /token after refused POSTs is %r, expected A" % s.token())
        after = metric(s, "forge_push_token_unauthorized_requests_total")
        check(after - before == len(refused), "unauthorized_requests_total went %g -> %g, expected +%d"
              % (before, after, len(refused)))
        # The next event the subscriber sees is the next authorized change, with the next id.
        c = token_hex(0xC11)
        check(s.req("POST", "/register", headers=with_headers(FORM, bearer()), body=form(c)).status == 200,
              "authorized register C failed")
        event = stream.next_event(timeout=4)
        check(event == (version + 1, c), "after the refused POSTs the next event is %r, expected %r"
              % (event, (version + 1, c)))
        note("unauthorized_requests_total %g -> %g; next event %r" % (before, after, event))
    finally:
        stream.close()


@test("auth: under --auth-scope writes every read stays open (/token, HEAD, /token/stream, /metrics, /, /healthz)")
def auth_reads_open():
    s = FIX.get("auth")
    for method, path in (("GET", "/token"), ("HEAD", "/token"), ("GET", "/metrics"), ("GET", "/"),
                         ("GET", "/healthz"), ("HEAD", "/healthz")):
        r = s.req(method, path)
        check(r.status == 200, "%s %s without auth answered %r" % (method, path, r))
    stream = Stream(s)
    try:
        check(stream.status == 200, "GET /token/stream without auth answered %s" % stream.status)
        stream.next_event()
    finally:
        stream.close()


# ---- auth, scope all ----
@test("auth all: GET/HEAD /token, /token/stream, /metrics, / need the token (401 without, 200 with Bearer)")
def auth_all_reads():
    for name in ("auth_all", "auth_all_quiet"):
        auth_all_reads_on(FIX.get(name))


def auth_all_reads_on(s):
    for method, path in (("GET", "/token"), ("HEAD", "/token"), ("GET", "/token/stream"), ("GET", "/metrics"),
                         ("GET", "/"), ("HEAD", "/")):
        if path == "/token/stream":
            stream = Stream(s)
            try:
                check(stream.status == 401, "GET /token/stream without auth answered %s" % stream.status)
                check(stream.headers.get("www-authenticate") == REALM, "stream 401 WWW-Authenticate %r"
                      % stream.headers.get("www-authenticate"))
            finally:
                stream.close()
            stream = Stream(s, headers=bearer())
            try:
                check(stream.status == 200, "GET /token/stream with Bearer answered %s" % stream.status)
                stream.next_event()
            finally:
                stream.close()
            continue
        r = s.req(method, path)
        check(r.status == 401, "%s %s without auth answered %r" % (method, path, r))
        check(r.get("www-authenticate") == REALM, "%s %s: WWW-Authenticate %r" % (method, path, r.get("www-authenticate")))
        if method == "GET":
            expect_401(r, "%s %s" % (method, path), False)
        r = s.req(method, path, headers=bearer(WRONG_SAME_LENGTH))
        check(r.status == 401 and r.get("www-authenticate") == INVALID,
              "%s %s with a wrong token answered %r" % (method, path, r))
        r = s.req(method, path, headers=bearer(scheme="bearer"))
        check(r.status == 200, "%s %s with the token answered %r" % (method, path, r))


@test("auth all: GET/HEAD take ?access_token= (percent-encoded), a wrong one gets invalid_token")
def auth_all_query():
    for name in ("auth_all", "auth_all_quiet"):
        auth_all_query_on(FIX.get(name))


def auth_all_query_on(s):
    q = "access_token=" + urllib.parse.quote(TOKEN, safe="")
    for method, path in (("GET", "/token"), ("HEAD", "/token"), ("GET", "/metrics"), ("GET", "/"),
                         ("GET", "/token?x=1&" + q.replace("access_token", "y") + "&")):
        full = path + ("&" if "?" in path else "?") + q
        r = s.req(method, full)
        check(r.status == 200, "%s %s?access_token=<token> answered %r" % (method, path.split("?")[0], r))
    stream = Stream(s, path="/token/stream?" + q)
    try:
        check(stream.status == 200, "GET /token/stream?access_token=<token> answered %s" % stream.status)
        stream.next_event()
    finally:
        stream.close()
    for wrong in (WRONG_LAST_BYTE, WRONG_SAME_LENGTH):
        r = s.req("GET", "/token?access_token=" + urllib.parse.quote(wrong, safe=""))
        expect_401(r, "GET /token?access_token=<wrong>", True)


@test("auth all: POST does not take ?access_token= (401, nothing changes); Bearer works")
def auth_all_post_query():
    s = FIX.get("auth_all")
    current = s.req("GET", "/token", headers=bearer()).json()["token"]
    q = "?access_token=" + urllib.parse.quote(TOKEN, safe="")
    r = s.req("POST", "/register" + q, headers=FORM, body=form(token_hex(0xD1)))
    expect_401(r, "POST /register?access_token=<token>", False)
    r = s.req("POST", "/fail" + q, headers={"Content-Type": "text/plain"}, body=b"x")
    expect_401(r, "POST /fail?access_token=<token>", False)
    check(s.req("GET", "/token", headers=bearer()).json()["token"] == current, "a refused POST changed the token")
    hex_text = token_hex(0xD2)
    r = s.req("POST", "/register", headers=with_headers(FORM, bearer()), body=form(hex_text))
    check(r.status == 200 and r.json()["token"] == hex_text, "POST /register with Bearer answered %r" % r)


@test("auth all: /healthz stays open (GET, HEAD, also with a wrong token)")
def auth_all_healthz():
    s = FIX.get("auth_all")
    for method in ("GET", "HEAD"):
        for headers in (None, bearer(WRONG_SAME_LENGTH)):
            r = s.req(method, "/healthz", headers=headers)
            check(r.status == 200, "%s /healthz (%s) answered %r" % (method, "wrong token" if headers else "no auth", r))
    check(s.req("GET", "/healthz").json() == {"status": "ok"}, "healthz body")


@test("auth all: a CORS preflight needs no token; a 401 to a listed origin carries Access-Control-Allow-Origin")
def auth_all_cors():
    s = FIX.get("auth_all")
    r = s.req("OPTIONS", "/token", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET",
                                            "Access-Control-Request-Headers": "authorization"})
    check(r.status == 204, "preflight under --auth-scope all answered %r" % r)
    allowed = [h.strip().lower() for h in (r.get("access-control-allow-headers") or "").split(",")]
    check("authorization" in allowed, "preflight Access-Control-Allow-Headers %r lacks Authorization"
          % r.get("access-control-allow-headers"))
    r = s.req("GET", "/token", headers={"Origin": ORIGIN})
    check(r.status == 401 and r.get("access-control-allow-origin") == ORIGIN,
          "401 to a listed origin: %r" % r)
    exposed = (r.get("access-control-expose-headers") or "").lower()
    check("www-authenticate" in exposed, "the 401 does not expose WWW-Authenticate: %r" % exposed)


# ---- auth, configuration ----
@test("auth: --auth-token-file (trailing LF, CRLF, spaces) and FORGE_PUSH_TOKEN_AUTH_TOKEN work")
def auth_token_file():
    problems = []
    for i, content in enumerate((FILE_TOKEN + "\n", FILE_TOKEN, "  " + FILE_TOKEN + "\t \n\n",
                                 FILE_TOKEN + "\r\n")):
        shown = content.replace(FILE_TOKEN, "<token>")
        path = os.path.join(FIX.workdir, "token-%d" % i)
        with open(path, "w", newline="") as f:
            f.write(content)
        try:
            s = FIX.start(["--host", HOST, "--port", "0", "--auth-token-file", path])
        except Failure as error:
            problems.append("a token file holding %r: %s" % (shown, str(error).splitlines()[:3]))
            continue
        try:
            hex_text = token_hex(0xF11E, i)
            r = s.req("POST", "/register", headers=with_headers(FORM, bearer(FILE_TOKEN)), body=form(hex_text))
            check(r.status == 200, "file %r: POST with the file's token answered %r" % (shown, r))
            expect_401(s.req("POST", "/register", headers=with_headers(FORM, bearer(FILE_TOKEN + "x")),
                             body=form(hex_text)), "file %r: a longer token" % shown, True)
        finally:
            s.stop()
    s = FIX.start(["--host", HOST, "--port", "0"], env={"FORGE_PUSH_TOKEN_AUTH_TOKEN": TOKEN})
    try:
        expect_401(s.req("POST", "/fail"), "FORGE_PUSH_TOKEN_AUTH_TOKEN: POST /fail without auth", False)
        check(s.req("POST", "/fail", headers=bearer()).status == 200, "FORGE_PUSH_TOKEN_AUTH_TOKEN: with the token")
    finally:
        s.stop()
    check(not problems, "\n".join(problems))


@test("auth: bad auth flags exit 64 with a message that never holds the token")
def auth_bad_flags():
    base = [FIX.binary, "--host", HOST, "--port", "0"]
    spaced = "sp4ce" + CORE[:12] + " secret" + CORE[12:24]
    bad_file = os.path.join(FIX.workdir, "bad-token")
    with open(bad_file, "w") as f:
        f.write(spaced + "\n")
    empty_file = os.path.join(FIX.workdir, "empty-token")
    open(empty_file, "w").close()
    cases = [
        ("token with a space", ["--auth-token", spaced], [spaced, CORE[:12], CORE[12:24]]),
        ("token with '$'", ["--auth-token", TOKEN + "$"], SECRETS),
        ("token with a non-ASCII letter", ["--auth-token", TOKEN + "\u00e9"], SECRETS),
        ("empty token", ["--auth-token", ""], []),
        ("--auth-scope all without a token", ["--auth-scope", "all"], []),
        ("--auth-scope bogus", ["--auth-scope", "bogus", "--auth-token", TOKEN], SECRETS),
        ("both --auth-token and --auth-token-file", ["--auth-token", TOKEN, "--auth-token-file", bad_file], SECRETS),
        ("unreadable file (missing)", ["--auth-token-file", os.path.join(FIX.workdir, "missing")], []),
        ("unreadable file (a folder)", ["--auth-token-file", FIX.workdir], []),
        ("file holding a token with a space", ["--auth-token-file", bad_file], [spaced, CORE[:12], CORE[12:24]]),
        ("empty file", ["--auth-token-file", empty_file], []),
    ]
    for name, args, secrets in cases:
        code, out, err, elapsed = run_cmd(base + args, timeout=5)
        check(code == 64, "%s: exit %s, expected 64; stderr %r" % (name, code, err[:400]))
        message = err.split("\nusage:")[0].strip()
        check(message and "listening" not in err, "%s: no message before the usage: %r" % (name, err[:400]))
        check("unknown" not in message.lower(), "%s: the flag is not known: %r" % (name, message))
        for secret in secrets:
            check(secret not in err and secret not in out, "%s: the token (%r) is in the output: %r"
                  % (name, secret, err[:400]))
        note("%s: exit 64: %s" % (name, message.splitlines()[0]))


@test("auth: a non-loopback --host (0.0.0.0, ::) without a token logs a warning; with one it does not")
def auth_non_loopback_warning():
    for host in ("0.0.0.0", "::"):
        s = FIX.start(["--host", host, "--port", "0"])
        try:
            # No wait: the startup warnings are written before the `listening` line start() waited for.
            lines = [line for line in s.stderr().splitlines() if " warning " in line and "auth" in line]
            check(lines, "--host %s without --auth-token logged no warning; stderr %r" % (host, s.stderr()))
            note("%s: %s" % (host, lines[0]))
        finally:
            s.stop()
    s = FIX.start(["--host", "0.0.0.0", "--port", "0", "--auth-token", TOKEN])
    try:
        # No wait: the startup warnings are written before the `listening` line start() waited for.
        check("without --auth-token" not in s.stderr(), "warning about a missing token although one is set: %r"
              % s.stderr())
    finally:
        s.stop()
    s = FIX.start(["--host", HOST, "--port", "0"])
    try:
        check(" warning " not in s.stderr(), "loopback without a token logged a warning: %r" % s.stderr())
    finally:
        s.stop()


# ---- TLS ----
@test("tls: the log says listening on https://127.0.0.1:PORT; curl --cacert GET /token works")
def tls_get():
    s = FIX.get("tls")
    check(s.scheme == "https" and ("listening on https://%s:%d" % (HOST, s.port)) in s.stderr(),
          "log: %r" % s.stderr())
    code, out, err, _ = curl(s, "-i", "https://%s:%d/token" % (HOST, s.port))
    check(code == 0, "curl https GET /token failed (%s): %s" % (code, err))
    check(out.startswith("HTTP/1.1 200") and out.rstrip().endswith("}"), "curl output %r" % out)
    body = json.loads(out.split("\r\n\r\n", 1)[1])
    check("token" in body, "GET /token over TLS: %r" % body)
    r = s.req("GET", "/healthz")
    check(r.status == 200 and r.json() == {"status": "ok"}, "Python ssl GET /healthz: %r" % r)


@test("tls: POST /register over TLS (curl, Bearer) and the SSE stream (curl and Python ssl) get it")
def tls_post_and_stream():
    s = FIX.get("tls")
    url = "https://%s:%d" % (HOST, s.port)
    stream = Stream(s)
    try:
        check(stream.status == 200, "GET /token/stream over TLS answered %s" % stream.status)
        version, _ = stream.next_event()
        hex_text = token_hex(0x7150)
        code, out, err, _ = curl(s, "-H", "Authorization: Bearer " + TOKEN, "--data-binary", hex_text,
                                 url + "/register")
        check(code == 0 and json.loads(out) == {"token": hex_text, "changed": True},
              "curl POST /register over TLS: %s %r %r" % (code, out, err))
        code, out, err, _ = curl(s, "-d", token_hex(0x7151), url + "/register")
        check(code == 0 and json.loads(out).get("error") == "unauthorized",
              "curl POST /register over TLS without auth: %s %r" % (code, out))
        check(stream.next_event() == (version + 1, hex_text), "the TLS stream did not get the change")
        # curl -N: the first event of a fresh stream is the current value.
        code, out, err, _ = run_cmd(["curl", "-sSN", "--cacert", FIX.cert()[0], "--max-time", "1.5",
                                     url + "/token/stream"], timeout=6)
        check(code == 28 and "event: token" in out and hex_text in out,
              "curl -N /token/stream over TLS: exit %s (28 = stopped by --max-time), output %r" % (code, out))
        started = time.monotonic()
        comments_before = stream.comments
        while stream.comments == comments_before and time.monotonic() - started < 3:
            stream.sock.settimeout(3)
            line = stream.response.readline()
            if line.startswith(b":"):
                stream.comments += 1
        check(stream.comments > comments_before, "no heartbeat comment on the TLS stream within 3 s")
    finally:
        stream.close()


def browser_cookie(size=8192, pairs=200):
    """One Cookie field value of exactly `size` bytes in `pairs` name=value pairs joined by "; "."""
    values = size - 2 * (pairs - 1) - 5 * pairs
    return "; ".join("c%03d=%s" % (i, "v" * (values // pairs + (i < values % pairs))) for i in range(pairs))


@test("tls: an EventSource request with 8 KiB of cookies in 200 pairs and a browser's fields gets 200 and "
      "events over TLS (issue 44: the default pool is 40 KiB)")
def tls_stream_with_cookies():
    s = FIX.get("tls")
    cookie = browser_cookie()
    check(len(cookie) == 8192, "the cookie is %d bytes" % len(cookie))
    headers = {
        "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
                      "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
        "Accept-Language": "en-GB,en-US;q=0.9,en;q=0.8", "Cache-Control": "no-cache",
        "Origin": "https://forge.example.com", "Referer": "https://forge.example.com/projects/settings/tokens",
        "Last-Event-ID": "0", "Sec-Fetch-Dest": "empty", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-site",
        "Cookie": cookie,
    }
    stream = Stream(s, headers=headers)
    try:
        check(stream.status == 200, "GET /token/stream with 8 KiB of cookies over TLS answered %s" % stream.status)
        version, _ = stream.next_event()
        hex_text = token_hex(0x7152)
        r = s.req("POST", "/register", headers=dict(FORM, Authorization="Bearer " + TOKEN), body=form(hex_text))
        check(r.status == 200, "POST /register over TLS: %r" % r)
        check(stream.next_event() == (version + 1, hex_text), "the TLS stream with cookies did not get the change")
    finally:
        stream.close()


@test("tls: plain HTTP to the TLS port gets no HTTP answer, and the server keeps serving TLS")
def tls_plain_http():
    s = FIX.get("tls")
    sock = raw_connect(s.port)
    try:
        sock.sendall(b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data, elapsed, how = recv_all_until_close(sock, 3)
    finally:
        sock.close()
    check(not data.startswith(b"HTTP/"), "plain HTTP on the TLS port got an HTTP answer: %r" % data[:200])
    check(how in ("eof", "reset"), "plain HTTP on the TLS port: the connection stayed open %.1f s (%r)" % (elapsed, data))
    code, out, err, _ = run_cmd(["curl", "-sS", "--max-time", "3", "http://%s:%d/token" % (HOST, s.port)])
    check(code != 0 and '"token"' not in out, "curl http:// on the TLS port: exit %s, %r" % (code, out))
    check(s.req("GET", "/token").status == 200, "TLS no longer works after plain HTTP")


@test("tls: --health-check, =live and =ready read the status over TLS (0 on 200, 1 on 503 draining), "
      "refuse another certificate, and leave no handshake warning in the log")
def tls_health_check():
    cert, key = FIX.cert()
    s = FIX.start(["--host", HOST, "--port", "0", "--tls-cert", cert, "--tls-key", key, "--drain-seconds", "60"],
                  tls_ca=cert)

    def health_check(probe, certificate=cert, certificate_key=key):
        flag = "--health-check" + ("=" + probe if probe else "")
        code, out, err, _ = run_cmd([FIX.binary, flag, "--host", HOST, "--port", str(s.port),
                                     "--tls-cert", certificate, "--tls-key", certificate_key], timeout=10)
        return code

    serving = {probe: health_check(probe) for probe in ("", "live", "ready")}
    check(serving == {"": 0, "live": 0, "ready": 0}, "serving: exit codes %r, expected 0" % serving)
    other_cert, other_key = os.path.join(FIX.workdir, "tls", "other-cert.pem"), os.path.join(FIX.workdir, "tls", "other-key2.pem")
    code, _, err, _ = run_cmd(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                               "-nodes", "-keyout", other_key, "-out", other_cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                               "-addext", "subjectAltName=IP:127.0.0.1"], timeout=20)
    check(code == 0, "openssl req: %s" % err)
    code = health_check("", other_cert, other_key)
    check(code == 1, "--health-check with another certificate than the server's exited %s, expected 1" % code)
    os.kill(s.proc.pid, signal.SIGTERM)
    wait_until(lambda: s.req("GET", "/readyz").status == 503, 10, what="/readyz 503 after SIGTERM")
    draining = {probe: health_check(probe) for probe in ("", "live", "ready")}
    check(draining == {"": 1, "live": 0, "ready": 1},
          "draining: exit codes %r, expected --health-check 1, =live 0, =ready 1" % draining)
    text = s.stderr()
    check("GET /readyz 503" in text and "GET /livez 200" in text, "the checks are not in the access log: %r" % text[-1500:])
    check("handshake" not in text and "libmicrohttpd" not in text,
          "the checks left libmicrohttpd warnings: %r" % [l for l in text.splitlines() if "libmicrohttpd" in l])
    os.kill(s.proc.pid, signal.SIGTERM)  # the second ends the drain at once
    check(s.wait(10) == 0, "the service did not exit 0 after a second SIGTERM")


@test("tls: a missing key exits 64; garbage or mismatched certificate/key exits 1 with a clear message")
def tls_bad_files():
    cert, key = FIX.cert()
    garbage = os.path.join(FIX.workdir, "tls", "garbage.pem")
    with open(garbage, "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    plain = os.path.join(FIX.workdir, "tls", "text.pem")
    with open(plain, "w") as f:
        f.write("this is not PEM\n")
    other_key = os.path.join(FIX.workdir, "tls", "other-key.pem")
    code, _, err, _ = run_cmd(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt",
                               "ec_paramgen_curve:prime256v1", "-out", other_key], timeout=20)
    check(code == 0, "openssl genpkey: %s" % err)
    base = [FIX.binary, "--host", HOST, "--port", "0"]
    for name, args in (("missing key file", ["--tls-cert", cert, "--tls-key", os.path.join(FIX.workdir, "nokey.pem")]),
                       ("missing cert file", ["--tls-cert", os.path.join(FIX.workdir, "nocert.pem"), "--tls-key", key]),
                       ("--tls-cert without --tls-key", ["--tls-cert", cert]),
                       ("--tls-key without --tls-cert", ["--tls-key", key])):
        code, _, err, elapsed = run_cmd(base + args)
        check(code == 64, "%s: exit %s, expected 64: %r" % (name, code, err[:300]))
        note("%s: %s" % (name, err.splitlines()[0] if err else ""))
    for name, args in (("garbage certificate", ["--tls-cert", garbage, "--tls-key", key]),
                       ("text as certificate", ["--tls-cert", plain, "--tls-key", key]),
                       ("key not matching the certificate", ["--tls-cert", cert, "--tls-key", other_key])):
        code, _, err, elapsed = run_cmd(base + args)
        check(code == 1, "%s: exit %s, expected 1: %r" % (name, code, err[:500]))
        check("listening on" not in err, "%s: it listened first: %r" % (name, err))
        check(re.search(r"certificate|TLS|HTTPS", err), "%s: no clear message: %r" % (name, err))
        check(elapsed < 3, "%s: took %.1f s to exit" % (name, elapsed))
        note("%s: %s" % (name, [l for l in err.splitlines() if "forge-push-token-server:" in l][:1]))


# ---- CORS ----
@test("cors: GET /token and /token/stream with a listed Origin carry Access-Control-Allow-Origin + Vary: Origin")
def cors_allowed():
    for name in ("cors", "cors_quiet"):
        cors_allowed_on(FIX.get(name))


def cors_allowed_on(s):
    for origin in (ORIGIN, ORIGIN2):
        r = s.req("GET", "/token", headers={"Origin": origin})
        check(r.status == 200, "GET /token with Origin answered %r" % r)
        check(r.get("access-control-allow-origin") == origin, "GET /token, Origin %s: ACAO %r" % (origin, r.get("access-control-allow-origin")))
        vary = [v.strip().lower() for v in (r.get("vary") or "").split(",")]
        check("origin" in vary, "GET /token, Origin %s: Vary %r" % (origin, r.get("vary")))
    stream = Stream(s, headers={"Origin": ORIGIN})
    try:
        check(stream.status == 200, "stream with Origin answered %s" % stream.status)
        check(stream.headers.get("access-control-allow-origin") == ORIGIN,
              "stream ACAO %r" % stream.headers.get("access-control-allow-origin"))
        check("origin" in (stream.headers.get("vary") or "").lower(), "stream Vary %r" % stream.headers.get("vary"))
        stream.next_event()
    finally:
        stream.close()


@test("cors: other origins (look-alikes, other scheme/port, null) get no Access-Control-Allow-Origin")
def cors_other():
    for name in ("cors", "cors_quiet"):
        cors_other_on(FIX.get(name))


def cors_other_on(s):
    for origin in ("https://evil.example", "https://app.example.evil.example", "http://app.example",
                   "https://app.example:444", "https://second.example", "null", "https://app.exampl"):
        r = s.req("GET", "/token", headers={"Origin": origin})
        check(r.status == 200, "GET /token with Origin %s answered %r" % (origin, r))
        check(not any(k.startswith("access-control-") for k in r.headers),
              "Origin %s got CORS fields: %r" % (origin, r.header_list))
    stream = Stream(s, headers={"Origin": "https://evil.example"})
    try:
        check("access-control-allow-origin" not in stream.headers, "stream for another origin: %r" % stream.headers)
    finally:
        stream.close()


@test("cors: preflight OPTIONS -> 204 with Access-Control-Allow-* for a listed origin, 403 origin_not_allowed otherwise")
def cors_preflight():
    s = FIX.get("cors")
    for path, method, req_headers, expect_methods in (
            ("/token", "GET", "last-event-id", {"GET", "HEAD"}),
            ("/token/stream", "GET", None, {"GET"}),
            ("/register", "POST", "authorization, content-type", {"POST"}),
            ("/fail", "POST", "Content-Type", {"POST"})):
        headers = {"Origin": ORIGIN, "Access-Control-Request-Method": method}
        if req_headers:
            headers["Access-Control-Request-Headers"] = req_headers
        r = s.req("OPTIONS", path, headers=headers)
        check(r.status == 204 and r.body == b"", "preflight %s %s answered %r" % (method, path, r))
        check(r.get("access-control-allow-origin") == ORIGIN, "preflight %s ACAO %r" % (path, r.get("access-control-allow-origin")))
        methods = {m.strip() for m in (r.get("access-control-allow-methods") or "").split(",")}
        check(expect_methods <= methods, "preflight %s Allow-Methods %r" % (path, r.get("access-control-allow-methods")))
        allowed = {h.strip().lower() for h in (r.get("access-control-allow-headers") or "").split(",")}
        for h in (req_headers or "").split(","):
            if h.strip():
                check(h.strip().lower() in allowed, "preflight %s does not allow header %s: %r"
                      % (path, h.strip(), r.get("access-control-allow-headers")))
        check("origin" in (r.get("vary") or "").lower(), "preflight %s Vary %r" % (path, r.get("vary")))
    for origin in ("https://evil.example", "null", 'https://q"uo\\te.example', "https://</script>.example"):
        r = s.req("OPTIONS", "/register", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        check(r.status == 403, "preflight from %s answered %r, expected 403" % (origin, r))
        check(r.get("content-type") == JSON_TYPE and r.json().get("error") == "origin_not_allowed",
              "403 body %r" % r.body)
        check(r.get("access-control-allow-origin") is None, "403 carries ACAO %r" % r.get("access-control-allow-origin"))


@test("cors: error answers (400, 404, 405, 413) to a listed origin carry Access-Control-Allow-Origin too")
def cors_errors():
    s = FIX.get("cors")
    for method, path, body, expected in (("POST", "/register", b"zz", 400), ("GET", "/nope", None, 404),
                                         ("PUT", "/token", b"", 405), ("POST", "/register", b"a" * 5000, 413)):
        headers = with_headers(FORM, {"Origin": ORIGIN})
        r = s.req(method, path, headers=headers, body=body)
        check(r.status == expected, "%s %s answered %r, expected %d" % (method, path, r, expected))
        check(r.get("access-control-allow-origin") == ORIGIN, "%d to a listed origin: ACAO %r"
              % (expected, r.get("access-control-allow-origin")))


@test("cors: an Origin in other case is allowed and answered in the configured spelling, never the request's")
def cors_configured_spelling():
    # Issue 21: HTTPS://APP.EXAMPLE used to be echoed as sent.
    s = FIX.get("cors")
    for sent in ("HTTPS://APP.EXAMPLE", "https://App.Example", "HTTPS://SECOND.EXAMPLE:8443"):
        r = s.req("GET", "/token", headers={"Origin": sent})
        expected = ORIGIN if "APP" in sent.upper() and ":8443" not in sent else ORIGIN2
        check(r.status == 200 and r.get("access-control-allow-origin") == expected,
              "Origin %s: answered %s with ACAO %r, expected %r"
              % (sent, r.status, r.get("access-control-allow-origin"), expected))


@test("log: the text log writes bidirectional and line-separator characters as \\u{...}, never raw")
def text_log_escapes_spoofing_characters():
    # Issue 21: a POST /fail message with U+202E (right-to-left override) or U+2028 (line
    # separator) was written raw to the text log, where it can change what a terminal shows.
    s = FIX.get("text_log")
    message = "revoked \u202egnp.exe \u2028forged line \u2066x\u2069 \u200fend"
    r = s.req("POST", "/fail", headers={"Content-Type": "text/plain; charset=utf-8"},
              body=message.encode("utf-8"))
    check(r.status == 200, "POST /fail answered %r" % r)
    wait_until(lambda: "gnp.exe" in s.stderr(), 5, what="the log line of the failure")
    line = next(l for l in s.stderr().splitlines() if "gnp.exe" in l)
    for raw, escaped in (("\u202e", "\\u{202e}"), ("\u2028", "\\u{2028}"), ("\u2066", "\\u{2066}"),
                         ("\u2069", "\\u{2069}"), ("\u200f", "\\u{200f}")):
        check(raw not in line, "the text log holds U+%04X raw: %r" % (ord(raw), line))
        check(escaped in line, "the text log does not show %s: %r" % (escaped, line))


@test("cors: plain OPTIONS -> 204 with Allow (same list as the 405's), Origin-less and nothing CORS")
def cors_plain_options():
    s = FIX.get("cors")
    for path, wrong_method in (("/token", "DELETE"), ("/token/stream", "POST"), ("/register", "GET"),
                               ("/fail", "PUT"), ("/healthz", "POST"), ("/metrics", "POST")):
        r = s.req("OPTIONS", path)
        check(r.status == 204 and r.body == b"", "OPTIONS %s answered %r" % (path, r))
        allow = {m.strip() for m in (r.get("allow") or "").split(",")}
        check("OPTIONS" in allow, "OPTIONS %s Allow %r" % (path, r.get("allow")))
        check(not any(k.startswith("access-control-") for k in r.headers), "plain OPTIONS has CORS fields: %r" % r)
        r405 = s.req(wrong_method, path, body=b"" if wrong_method in ("POST", "PUT") else None)
        check(r405.status == 405, "%s %s answered %r" % (wrong_method, path, r405))
        check({m.strip() for m in r405.get("allow").split(",")} == allow,
              "%s: OPTIONS Allow %r but 405 Allow %r" % (path, r.get("allow"), r405.get("allow")))


@test("cors: --cors-origin '*' gives '*' to any origin (GET, stream, preflight)")
def cors_any():
    for name in ("cors_any", "cors_any_quiet"):
        cors_any_on(FIX.get(name))


def cors_any_on(s):
    for origin in (ORIGIN, "https://whatever.example", "null"):
        r = s.req("GET", "/token", headers={"Origin": origin})
        check(r.get("access-control-allow-origin") == "*", "Origin %s: ACAO %r" % (origin, r.get("access-control-allow-origin")))
    r = s.req("OPTIONS", "/register", headers={"Origin": "https://x.example", "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": "authorization,content-type"})
    check(r.status == 204 and r.get("access-control-allow-origin") == "*", "preflight with *: %r" % r)
    check("authorization" in (r.get("access-control-allow-headers") or "").lower(), "preflight with *: %r" % r)
    stream = Stream(s, headers={"Origin": "https://x.example"})
    try:
        check(stream.headers.get("access-control-allow-origin") == "*", "stream ACAO %r" % stream.headers)
    finally:
        stream.close()
    r = s.req("GET", "/token")
    check(r.status == 200, "GET /token without Origin: %r" % r)


@test("cors: FORGE_PUSH_TOKEN_CORS_ORIGIN takes a comma-separated list")
def cors_env():
    s = FIX.start(["--host", HOST, "--port", "0"], env={"FORGE_PUSH_TOKEN_CORS_ORIGIN": ORIGIN + "," + ORIGIN2})
    try:
        for origin in (ORIGIN, ORIGIN2):
            r = s.req("GET", "/token", headers={"Origin": origin})
            check(r.get("access-control-allow-origin") == origin, "env list, Origin %s: %r" % (origin, r))
        r = s.req("GET", "/token", headers={"Origin": "https://evil.example"})
        check(r.get("access-control-allow-origin") is None, "env list, other origin: %r" % r)
    finally:
        s.stop()


# ---- limits ----
@test("limits: --max-url-bytes 100: a 100-byte target is served, 101 bytes get 414 uri_too_long (JSON)")
def limit_url():
    for name in ("small_url", "small_url_quiet"):
        limit_url_on(FIX.get(name), name)
    d = FIX.get("default")  # --max-url-bytes 2048
    for size, expected in ((2048, 200), (2049, 414)):
        r = d.req("GET", "/token?" + "q" * (size - len("/token?")))
        check(r.status == expected, "default limit: a %d-byte target answered %r, expected %d" % (size, r, expected))


def limit_url_on(s, name):
    for size, expected in ((100, 200), (101, 414), (3000, 414)):
        target = "/token?" + "q" * (size - len("/token?"))
        check(len(target) == size, "internal")
        r = s.req("GET", target)
        check(r.status == expected, "%s: GET of a %d-byte target answered %r, expected %d" % (name, size, r, expected))
        if expected == 414:
            check(r.get("content-type") == JSON_TYPE and r.json().get("error") == "uri_too_long",
                  "414 body %r" % r.body)
    r = s.req("POST", "/register?" + "q" * 200, headers=FORM, body=form(token_hex(0x414)))
    check(r.status == 414, "POST with a long target answered %r" % r)
    check(s.token() != token_hex(0x414), "a 414 POST changed the token")
    check(s.req("GET", "/healthz").status == 200, "the server does not answer after 414s")
    for method in ("GET", "HEAD"):
        r = s.req(method, "/token?" + "q" * 120)
        check(r.status == 414, "%s: %s /token with a long query answered %r" % (name, method, r))


@test("limits: a header block over --max-header-bytes gets 431 (default 36320 and 15184); under it is served")
def limit_headers():
    d = FIX.get("default")
    for name, size, expected in (("default", 5000, 200), ("default", 30000, 200), ("default", 37000, 431)):
        r = d.req("GET", "/token", headers={"X-Filler": "a" * size})
        check(r.status == expected, "%s: a %d-byte header answered %r, expected %d" % (name, size, r, expected))
    # ~34 KB in many small fields: over the records' half of the pool (19,440 bytes, 48 a field).
    many = {"X-Filler-%03d" % i: "b" * 60 for i in range(420)}
    r = d.req("GET", "/token", headers=many)
    check(r.status == 431, "420 fields of 60 bytes answered %r, expected 431" % r)
    big = FIX.get("small_url")  # --max-header-bytes 15184
    for size, expected in ((12000, 200), (17000, 431)):
        r = big.req("GET", "/token", headers={"X-Filler": "a" * size})
        check(r.status == expected, "--max-header-bytes 15184: a %d-byte header answered %r" % (size, r))
    check(d.req("GET", "/healthz").status == 200, "server not answering after 431s")


@test("limits: --max-connections 20: the 21st connection (streams counted) is closed at once; after closing some, new ones work; counted")
def limit_connections():
    s = FIX.get("max_conn")
    held, streams = [], []
    try:
        for _ in range(15):
            sock = raw_connect(s.port)
            held.append(sock)
            status, _, _ = get_on(sock)
            check(status == 200, "held connection %d: %s" % (len(held), status))
        for _ in range(5):
            stream = Stream(s)
            streams.append(stream)
            check(stream.status == 200, "held stream: %s" % stream.status)
            stream.next_event()
        outcome, detail, elapsed = try_refused(s.port)
        check(outcome == "refused", "the 21st connection was %s (%r) after %.2f s, expected closed without an answer"
              % (outcome, detail, elapsed))
        check(elapsed < 1, "the 21st connection was closed only after %.2f s" % elapsed)
        extra = 1
        # The 20 held still work.
        check(get_on(held[0])[0] == 200, "a held connection stopped working")
        for sock in held[:5]:
            sock.close()
        held = held[5:]
        deadline = time.monotonic() + 3
        while True:
            outcome, detail, elapsed = try_refused(s.port)
            if outcome == "served":
                break
            check(outcome == "refused", "after closing 5: %s" % outcome)
            extra += 1
            check(time.monotonic() < deadline, "no connection served within 3 s of closing 5 of 20")
            time.sleep(0.05)
        check(detail == 200, "after closing 5 the new connection got %r" % detail)
        refused = metric(s, "forge_push_token_connections_refused_total", {"limit": "total"})
        check(refused == extra, "connections_refused_total{limit=\"total\"} is %g, this test saw %d refused"
              % (refused, extra))
        check(metric(s, "forge_push_token_connections_refused_total", {"limit": "per_ip"}) == 0, "per_ip counted")
        note("refused %d; metric %g" % (extra, refused))
    finally:
        for sock in held:
            sock.close()
        for stream in streams:
            stream.close()


@test("limits: --max-connections-per-ip 3: a 4th from 127.0.0.1 is closed, 127.0.0.2 and 127.0.0.3 are served; counted")
def limit_per_ip():
    s = FIX.get("per_ip")
    held = []
    try:
        for _ in range(3):
            sock = raw_connect(s.port)
            held.append(sock)
            check(get_on(sock)[0] == 200, "held connection from 127.0.0.1")
        outcome, detail, elapsed = try_refused(s.port)
        check(outcome == "refused" and elapsed < 1, "4th connection from 127.0.0.1: %s %r after %.2f s"
              % (outcome, detail, elapsed))
        refused = 1
        # Not 127.0.0.2, which holds three below: a served connection's slot is given back only when
        # libmicrohttpd cleans it up, a moment after the client saw its close.
        for source in ("127.0.0.3", "127.0.0.5"):
            outcome, detail, _ = try_refused(s.port, source=source)
            check(outcome == "served" and detail == 200, "a connection from %s was %s (%r)" % (source, outcome, detail))
        others = [raw_connect(s.port, source="127.0.0.2") for _ in range(3)]
        held.extend(others)
        for sock in others:
            check(get_on(sock)[0] == 200, "held connection from 127.0.0.2")
        outcome, _, _ = try_refused(s.port, source="127.0.0.2")
        check(outcome == "refused", "4th connection from 127.0.0.2 was %s" % outcome)
        refused += 1
        held.pop(0).close()
        deadline = time.monotonic() + 3
        while True:
            outcome, detail, _ = try_refused(s.port)
            if outcome == "served":
                break
            refused += 1
            check(time.monotonic() < deadline, "127.0.0.1 not served again within 3 s of closing one")
            time.sleep(0.05)
        value = metric(s, "forge_push_token_connections_refused_total", {"limit": "per_ip"}, source="127.0.0.4")
        check(value == refused, "connections_refused_total{limit=\"per_ip\"} is %g, this test saw %d" % (value, refused))
        check(metric(s, "forge_push_token_connections_refused_total", {"limit": "total"}, source="127.0.0.4") == 0,
              "total counted")
    finally:
        for sock in held:
            sock.close()


@test("limits: --idle-timeout 2 closes idle keep-alive, silent, mid-header and mid-body connections after ~2 s; a stream stays open")
def limit_idle():
    s = FIX.get("idle")
    results = {}

    def idle_keepalive():
        sock = raw_connect(s.port)
        try:
            check(get_on(sock)[0] == 200, "GET /token")
            results["keep-alive"] = recv_all_until_close(sock, 6)
        finally:
            sock.close()

    def silent():
        sock = raw_connect(s.port)
        try:
            results["silent"] = recv_all_until_close(sock, 6)
        finally:
            sock.close()

    def stalled():
        sock = raw_connect(s.port)
        try:
            sock.sendall(b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Sl")
            results["stalled"] = recv_all_until_close(sock, 6)
        finally:
            sock.close()

    def stalled_body():
        sock = raw_connect(s.port)
        try:
            sock.sendall(b"POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 64\r\n\r\n0123")
            results["stalled body"] = recv_all_until_close(sock, 6)
        finally:
            sock.close()

    stream = Stream(s)
    try:
        version, _ = stream.next_event()
        threads = [threading.Thread(target=f, daemon=True) for f in (idle_keepalive, silent, stalled, stalled_body)]
        for t in threads:
            t.start()
        time.sleep(4.5)  # the stream, read by nobody meanwhile, is idle more than twice the timeout
        for t in threads:
            t.join(5)
        for name in ("keep-alive", "silent", "stalled", "stalled body"):
            check(name in results, "%s connection: no result" % name)
            data, elapsed, how = results[name]
            check(how in ("eof", "reset"), "%s connection still open after %.1f s" % (name, elapsed))
            check(1.5 <= elapsed <= 4.0, "%s connection closed after %.2f s, expected ~2" % (name, elapsed))
            note("%s: %s after %.2f s (%r)" % (name, how, elapsed, data[:40]))
        hex_text = token_hex(0x1D1E)
        check(s.register(hex_text)[0] == 200, "register")
        event = stream.next_event()
        check(event == (version + 1, hex_text), "the idle stream got %r" % (event,))
        check(stream.comments >= 3, "only %d heartbeats in 4.5 s with --heartbeat 1" % stream.comments)
    finally:
        stream.close()


@test("limits: with --idle-timeout 2 --heartbeat 5 a stream silent for 4 s (no byte either way) stays open")
def limit_idle_stream_exempt():
    s = FIX.get("idle_slow_heartbeat")
    stream = Stream(s)
    try:
        version, _ = stream.next_event()
        # A stream silent for 4 s, past --idle-timeout 2 and before --heartbeat 5: the idle-timeout contract.
        time.sleep(4)
        hex_text = token_hex(0x1D1F)
        check(s.register(hex_text)[0] == 200, "register")
        event = stream.next_event(timeout=3)
        check(event == (version + 1, hex_text), "the stream got %r" % (event,))
    finally:
        stream.close()


@test("limits: slowloris (100 connections, one header byte a second, 5 s; 20 more with slow bodies) does not delay GET /token (< 1 s each)")
def limit_slowloris():
    s = FIX.get("default")
    attackers = []
    body_attackers = []
    stop = threading.Event()
    state = {"sent": 0, "dead": 0}

    def attack():
        for second in range(6):
            if stop.is_set():
                return
            for sock in attackers:
                try:
                    sock.sendall(b"X-Slow-Loris: "[second % 14:second % 14 + 1])
                    state["sent"] += 1
                except OSError:
                    state["dead"] += 1
            for sock in body_attackers:
                try:
                    sock.sendall(b"a")
                except OSError:
                    state["dead"] += 1
            stop.wait(1)

    try:
        for _ in range(100):
            sock = raw_connect(s.port)
            sock.sendall(b"GET /token HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            attackers.append(sock)
        for _ in range(20):
            sock = raw_connect(s.port)
            sock.sendall(b"POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                         b"Content-Length: 4000\r\n\r\n")
            body_attackers.append(sock)
        thread = threading.Thread(target=attack, daemon=True)
        thread.start()
        times = []
        started = time.monotonic()
        while time.monotonic() - started < 5.5:
            t0 = time.monotonic()
            try:
                r = s.req("GET", "/token", timeout=3)
            except OSError as error:
                raise Failure("GET /token during the attack failed after %.2f s: %s" % (time.monotonic() - t0, error))
            elapsed = time.monotonic() - t0
            check(r.status == 200, "GET /token during the attack answered %r" % r)
            times.append(elapsed)
            check(elapsed < 1, "GET /token during the attack took %.2f s (try %d)" % (elapsed, len(times)))
            # Pacing: a GET every 200 ms during the attack.
            time.sleep(0.2)
        stop.set()
        thread.join(3)
        check(len(times) >= 15, "only %d requests during the attack" % len(times))
        check(state["sent"] >= 400 and state["dead"] == 0, "the attack sent only %d header bytes (%d send errors)"
              % (state["sent"], state["dead"]))
        note("%d GETs during the attack, slowest %.3f s; attack bytes %d, send errors %d"
             % (len(times), max(times), state["sent"], state["dead"]))
    finally:
        stop.set()
        for sock in attackers + body_attackers:
            sock.close()


# ---- last: the log ----
@test("signals: SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored; an open stream goes on; SIGTERM exits 0")
def signals_ignored():
    server = HServer(FIX.binary, ["--host", HOST, "--port", "0", "--heartbeat", "1"], workdir=FIX.workdir).start()
    FIX.all.append(server)
    sock = raw_connect(server.port)
    sock.sendall(b"GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    first = sock.recv(4096)
    check(b"200 OK" in first, "the stream did not open: %r" % first[:200])
    for name in ("SIGHUP", "SIGUSR1", "SIGUSR2"):
        server.proc.send_signal(getattr(signal, name))
    wait_until(lambda: all("received %s" % name in server.stderr() for name in ("SIGHUP", "SIGUSR1", "SIGUSR2")), 5,
               what="a log line for each ignored signal")
    check(server.proc.poll() is None, "the service ended on a signal it should ignore (exit %s)" % server.proc.returncode)
    check(server.req("GET", "/healthz").status == 200, "GET /healthz after the signals")
    check(server.req("POST", "/register", headers=FORM, body=form(token_hex(7))).status == 200, "POST after the signals")
    seen = b""
    deadline = time.monotonic() + 3
    while b"id: 1" not in seen and time.monotonic() < deadline:
        seen += sock.recv(4096)
    check(b"id: 1" in seen, "the open stream did not get the change after the signals: %r" % seen[-300:])
    server.proc.send_signal(signal.SIGTERM)
    code = server.wait(5)
    check(code == 0, "after SIGTERM the service exited with %s" % code)
    sock.close()


@test("open-file limit: with ulimit -n 128 the connection limit is lowered (warning) and surplus clients are closed, not left hanging")
def limit_file_descriptors():
    prlimit = shutil.which("prlimit")
    check(prlimit is not None, "prlimit (util-linux) is not installed")
    server = HServer(prlimit, ["--nofile=128:128", FIX.binary, "--host", HOST, "--port", "0", "--access-log", "off"],
                     workdir=FIX.workdir).start()
    FIX.all.append(server)
    check("is over what the open-file limit (128) allows" in server.stderr(), "no warning: %r" % server.stderr()[-500:])
    held, refused = [], 0
    try:
        for _ in range(120):
            sock = raw_connect(server.port)
            sock.sendall(b"GET /token HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(2)
            try:
                data = sock.recv(4096)
            except socket.timeout:
                raise Failure("a client over the limit was left hanging (no answer, no close within 2 s)")
            except ConnectionResetError:
                data = b""  # closed on accept, before the request was read: a reset
            if data.startswith(b"HTTP/1.1 200"):
                held.append(sock)
            else:
                check(data == b"", "unexpected answer %r" % data[:100])
                refused += 1
                sock.close()
        check(refused > 0 and len(held) <= 128 - 64, "held %d, refused %d" % (len(held), refused))
    finally:
        for sock in held:
            sock.close()
    # The closed sockets' slots come back as libmicrohttpd cleans each connection up.
    wait_until(lambda: try_refused(server.port)[0] == "served", 5, what="a connection served after the surplus closed")
    started = time.monotonic()
    check(server.req("GET", "/token").status == 200, "GET /token after the surplus was refused")
    check(time.monotonic() - started < 1, "GET /token took %.2f s" % (time.monotonic() - started))
    note("held %d, refused %d" % (len(held), refused))
    server.proc.send_signal(signal.SIGTERM)
    server.wait(5)


@test("auth: no server log (stderr, access log on) ever held the token, a near-miss of it, or ?access_token=")
def auth_log_clean():
    check(FIX.all, "no server was started")
    scanned = 0
    for server in FIX.all:
        text = server.stderr()
        scanned += len(text)
        for secret in SECRETS:
            check(secret not in text, "server %s logged %r:\n%s" % (" ".join(server.args[:6]), secret,
                                                                    [l for l in text.splitlines() if secret in l][:3]))
        leaks = [l for l in text.splitlines() if re.search(r"access_token=(?!TOKEN\b)", l)]
        check(not leaks, "a log line holds access_token=…: %r" % leaks[:3])
    check(any("/register 401" in s.stderr() for s in FIX.all), "no access-log line of a 401: was the log on?")
    note("scanned %d bytes of %d servers' logs" % (scanned, len(FIX.all)))


# -- runner -------------------------------------------------------------------------------------
FIX = None


def run():
    def keep(fixtures, verbose):
        global FIX, VERBOSE
        FIX, VERBOSE = fixtures, verbose
    return run_tap_checks(CHECKS, "e2e-hardening-", Fixtures, tools=("curl", "openssl"), keep=keep)


if __name__ == "__main__":
    sys.exit(run())
