#!/usr/bin/env python3
"""End-to-end: the HTTP framing that libmicrohttpd 0.9.75 lets through (issue 27 §6), against the
release binary over real loopback sockets, directly and through nginx configured as
docker/nginx/replicas.conf (docs/replicas.md) configures it.

Each check is one function below and prints one TAP line (`ok N - ...` / `not ok N - ...` with the
reason as `# ...` lines); at the end `# N passed, N failed` and exit status 1 when any failed.
Servers and nginx run on free loopback ports and are all stopped at the end. Standard library only.

  obs-fold  a header field folded over two lines (obs-fold) anywhere in the head, or holding a NUL
            byte, gets the service's JSON 400 and a close before anything is carried out: a
            folded Content-Length no longer smuggles a POST /register (the fix); nginx in front
            answers 400 too
  trailer   at the 8 KiB pool (--max-header-bytes 7008), a chunked POST /register whose trailer is
            too large is never carried out, run after run: a 9 KB trailer 40 times (libmicrohttpd's 431), and trailers of 6,000 to 9,200
            bytes, five times each: answered 200 exactly when carried out, and never carried out
            over --max-header-bytes with the head (the service's JSON 431 when its answer fits
            beside the trailer, else libmicrohttpd's 431 or a closed connection)
  limits    what libmicrohttpd decides before any callback, a documented limit each
            (docs/http-api.md), shown answered or refused by nginx in front: thousands of blank
            lines before a request line, and a tab in the request line
  expect    a request pipelined behind a bodiless `Expect: 100-continue` is answered, directly (the
            fix: the connection used to be closed after the first answer) and through nginx

    python3 e2e/http_framing_test.py --server PATH [--only SUBSTRING[,SUBSTRING...]] [--verbose]
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from e2e_support import check_list, run_tap_checks, HOST, Failure, Server, check, distinct_free_ports, wait_until

VERBOSE = False
HERE = os.path.dirname(os.path.abspath(__file__))


def note(message):
    if VERBOSE:
        print("#   " + message, flush=True)


# -- servers ------------------------------------------------------------------------------------
class Nginx:
    """nginx in front of one server, configured by docker/nginx/replicas.conf itself: included in
    an `http` block as the nginx image does, with its Docker-only parts replaced (the resolver of
    Docker's DNS, the replicas' service name, the port it listens on)."""

    def __init__(self, upstream_port, port):
        self.port = port
        self.dir = tempfile.mkdtemp(prefix="e2e-framing-nginx-")
        with open(os.path.join(HERE, "..", "docker", "nginx", "replicas.conf")) as f:
            text = f.read()
        for old, new in (("resolver 127.0.0.11 valid=5s ipv6=off;", ""),
                         ("listen 8080;", "listen %s:%d;" % (HOST, port)),
                         ("http://replica:8080", "http://%s:%d" % (HOST, upstream_port))):
            check(old in text, "docker/nginx/replicas.conf no longer holds %r" % old)
            text = text.replace(old, new)
        with open(os.path.join(self.dir, "replicas.conf"), "w") as f:
            f.write(text)
        user = "user root;\n" if os.geteuid() == 0 else ""
        self.conf = os.path.join(self.dir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write("""%sworker_processes 1;
pid %s/nginx.pid;
error_log %s/error.log warn;
daemon off;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %s/body; proxy_temp_path %s/proxy; fastcgi_temp_path %s/fastcgi;
  uwsgi_temp_path %s/uwsgi; scgi_temp_path %s/scgi;
  include %s/replicas.conf;
}
""" % ((user,) + (self.dir,) * 8))
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["nginx", "-p", self.dir, "-c", self.conf], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

        def up():
            try:
                status, _ = exchange(self.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                     timeout=1)
                return status == 200
            except OSError:
                return False
        wait_until(up, 5, what="nginx on port %d" % self.port)
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class Fixtures:
    """One server, and nginx in front of it, started on first use and stopped at the end."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.workdir = workdir
        self.server = None
        self.nginx = None

    def direct(self):
        if self.server is None:
            # The 8 KiB pool (--max-header-bytes 7008), whose room the trailer and blank-line
            # sizes below are chosen to fill; the default pool is 40 KiB.
            self.server = Server(self.binary, ["--host", HOST, "--port", "0", "--access-log", "off",
                                               "--max-header-bytes", "7008"], workdir=self.workdir)
            self.server.start()
        return self.server.port

    def proxied(self):
        if self.nginx is None:
            upstream = self.direct()
            self.nginx = Nginx(upstream, distinct_free_ports(1)[0]).start()
        return self.nginx.port

    def stop_all(self):
        if self.nginx:
            self.nginx.stop()
        if self.server:
            try:
                self.server.stop()
            except Failure:
                pass
            self.server.kill()


# -- raw HTTP -----------------------------------------------------------------------------------
def exchange(port, data, timeout=3):
    """Sends `data` on a new connection and reads until the server closes it. Returns (status of
    the first answer or None, the bytes read)."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            received += chunk
    finally:
        sock.close()
    if received.startswith(b"HTTP/1.") and len(received.split(b" ", 2)) >= 2:
        return int(received.split(b" ", 2)[1]), received
    return None, received


def final_statuses(received):
    """The status of every answer in `received` (an answer's status line follows the body before
    it directly), `100 Continue` left out."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", received) if code != b"100"]


def current_token(port):
    status, data = exchange(port, b"GET /token HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check(status == 200, "GET /token answered %r" % data[:200])
    return json.loads(data.partition(b"\r\n\r\n")[2])["token"]


def register(port, hex_text):
    status, data = exchange(port, b"POST /register HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(hex_text), hex_text.encode()))
    check(status == 200, "POST /register %s answered %r" % (hex_text, data[:200]))


def smuggled_register(hex_text):
    body = hex_text.encode()
    return (b"POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def is_json_error(data, code):
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return b"application/json" in head and json.loads(body)["error"] == code
    except (ValueError, KeyError, TypeError):
        return False


# -- checks -------------------------------------------------------------------------------------
CHECKS, test = check_list()


def folded_heads(smuggled):
    """Heads with obs-fold or a NUL byte, each with `smuggled` behind it (what a proxy in front that
    read the fold differently could take as a second request)."""
    return [
        ("a folded Content-Length on POST /fail", b"POST /fail HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n %d\r\n\r\n"
         % len(smuggled) + smuggled),
        ("a fold in the first field", b"GET /token HTTP/1.1\r\nX-A: a\r\n b\r\nHost: x\r\n\r\n" + smuggled),
        ("a fold by a tab in a middle field",
         b"GET /token HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\nX-B: c\r\n\r\n" + smuggled),
        ("a fold in the last field", b"GET /token HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n" + smuggled),
        ("a fold of blanks only", b"GET /token HTTP/1.1\r\nHost: x\r\nX-A: a\r\n   \r\n\r\n" + smuggled),
        ("a fold with bare LF line ends", b"GET /token HTTP/1.1\nHost: x\nX-A: a\n b\n\n" + smuggled),
        ("a NUL byte in a value", b"GET /token HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\x00junk\r\n\r\n"
         + smuggled),
    ]


@test("obs-fold: a folded header field (first, middle or last, folded Content-Length) or a NUL byte in a value "
      "gets the service's JSON 400 and a close; the request smuggled behind it is never carried out")
def obs_fold_direct():
    port = FIX.direct()
    register(port, "5a000001")
    for what, data in folded_heads(smuggled_register("5a0000ff")):
        status, received = exchange(port, data)
        head = received.partition(b"\r\n\r\n")[0]
        check(status == 400 and is_json_error(received, "invalid_request"),
              "%s: answered %r, expected the service's JSON 400" % (what, received[:300]))
        check(b"connection: close" in head.lower(), "%s: no Connection: close: %r" % (what, head))
        check(len(final_statuses(received)) == 1, "%s: more than one answer: %r" % (what, received[:600]))
        check(current_token(port) == "5a000001", "%s: the smuggled POST /register was carried out" % what)
        note("%s: 400" % what)
    # Well-framed heads are still served: bare LF line ends, blanks around values, empty values.
    for data in (b"GET /token HTTP/1.1\nHost: x\nX-A:  a  \nX-B:\nConnection: close\n\n",
                 b"GET /token?x=1 HTTP/1.1\r\nHost: x\r\nCookie: a=b; c=d\r\nX-E:\r\nX-B: \t \r\n"
                 b"Connection: close\r\n\r\n"):
        status, received = exchange(port, data)
        check(status == 200, "a well-framed head %r answered %r" % (data, received[:300]))


@test("obs-fold: through nginx (docker/nginx/replicas.conf) each folded head is refused too, and nothing is "
      "carried out")
def obs_fold_nginx():
    port = FIX.proxied()
    register(FIX.direct(), "5a000002")
    for what, data in folded_heads(smuggled_register("5a0000fe")):
        status, received = exchange(port, data)
        check(status == 400, "%s through nginx: answered %r, expected 400" % (what, received[:300]))
        check(current_token(port) == "5a000002", "%s through nginx: the smuggled POST /register was carried out"
              % what)


def chunked_register(hex_text, trailer_bytes):
    """A chunked POST /register of `hex_text` whose trailer is one field of `trailer_bytes` bytes
    (its line, CRLF included), or none for 0."""
    trailer = b""
    if trailer_bytes:
        trailer = b"X-Trailer: " + b"t" * (trailer_bytes - len(b"X-Trailer: \r\n")) + b"\r\n"
    return (b"POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n"
            % (len(hex_text), hex_text.encode(), trailer))


def trailer_outcome(port, number, trailer_bytes):
    """One chunked POST /register with a trailer of `trailer_bytes`: (status or None, carried out,
    the answer's bytes)."""
    register(port, "5b000000")
    hex_text = "5b%06x" % number
    status, received = exchange(port, chunked_register(hex_text, trailer_bytes))
    return status, current_token(port) == hex_text, received


@test("trailer: a chunked POST /register with a 9 KB trailer is refused 431 and never carried out, 40 times "
      "in a row")
def trailer_9kb_repeated():
    port = FIX.direct()
    for run in range(40):
        status, applied, received = trailer_outcome(port, run + 1, 9 * 1024)
        check(not applied, "run %d: a 9 KB trailer was carried out (answered %r)" % (run + 1, received[:200]))
        check(status == 431, "run %d: a 9 KB trailer answered %r, expected 431" % (run + 1, received[:200]))


@test("trailer: trailers of 6,000 to 9,200 bytes in steps of 50, five times each: answered 200 exactly when "
      "carried out; from 7,000 bytes (over --max-header-bytes with the head) never carried out (JSON 431, "
      "libmicrohttpd's 431, or a close); one of 100 bytes is carried out and answered 200")
def trailer_sizes_consistent():
    port = FIX.direct()
    problems = []
    tally = {}
    number = 1000
    for size in range(6000, 9201, 50):
        for _ in range(5):
            number += 1
            status, applied, received = trailer_outcome(port, number, size)
            kind = "none" if status is None else "%d%s" % (status, " json" if is_json_error(
                received, "header_fields_too_large") else "")
            tally.setdefault(size, {}).setdefault((kind, applied), 0)
            tally[size][(kind, applied)] += 1
            if applied != (status == 200):
                problems.append("%d bytes: answered %s, %s"
                                % (size, kind, "carried out" if applied else "not carried out"))
            elif size >= 7000 and (applied or status not in (None, 431)):
                problems.append("%d bytes: answered %s" % (size, kind))
    for size, kinds in sorted(tally.items()):
        note("%d: %s" % (size, ", ".join("%s%s x%d" % (k, " carried out" if a else "", n)
                                           for (k, a), n in sorted(kinds.items()))))
    check(not problems, "%d problems:\n%s" % (len(problems), "\n".join(problems[:20])))
    for _ in range(3):
        number += 1
        status, applied, received = trailer_outcome(port, number, 100)
        check(status == 200 and applied, "a 100-byte trailer: answered %r, carried out %s" % (received[:200], applied))


# ---- documented limits, through nginx ----
def answers_direct_and_proxied(data):
    """`data` sent directly and through nginx: the final statuses each got."""
    direct = final_statuses(exchange(FIX.direct(), data)[1])
    proxied = final_statuses(exchange(FIX.proxied(), data)[1])
    return direct, proxied


@test("limits: blank lines before a request line: nginx in front answers two GETs pipelined behind 4,000 of them, "
      "and answers 200 a POST /register behind 3,900 of them, which it carries out")
def limit_blank_lines():
    pair = (b"GET /token HTTP/1.1\r\nHost: x\r\n\r\n\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    direct, proxied = answers_direct_and_proxied(b"\r\n" * 4000 + pair)
    note("4,000 blank lines before two GETs: direct %r, through nginx %r" % (direct, proxied))
    check(proxied == [200, 200], "through nginx: answers %r, expected two 200s" % proxied)
    # Directly, 3,900 blank lines leave no room in the pool for the answer: libmicrohttpd skips
    # them before any callback, and the write is carried out unanswered (docs/http-api.md).
    register(FIX.direct(), "5e000001")
    data = (b"\r\n" * 3900 + b"POST /register HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 8\r\n\r\n5e0000ff")
    status, received = exchange(FIX.proxied(), data)
    token = current_token(FIX.direct())
    note("3,900 blank lines before POST /register through nginx: %r, token %s" % (status, token))
    check(status == 200 and token == "5e0000ff", "through nginx: answered %r, token %s" % (received[:200], token))


@test("limits: a tab in the request line (after the method, before the version): nginx in front answers 400 "
      "and carries nothing out")
def limit_tab_request_line():
    register(FIX.direct(), "5c000001")
    body = b"5c0000ff"
    for line in (b"POST\t/register HTTP/1.1", b"POST /register\tHTTP/1.1", b"POST\t/register\tHTTP/1.1"):
        data = (line + b"\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n"
                b"Content-Length: 8\r\n\r\n" + body)
        direct, proxied = answers_direct_and_proxied(data)
        note("%r: direct %r, through nginx %r" % (line, direct, proxied))
        check(proxied and proxied[0] == 400, "%r through nginx: answers %r, expected 400" % (line, proxied))
        check(current_token(FIX.direct()) == "5c000001", "%r: carried out" % line)


@test("expect: a request pipelined behind a bodiless POST /fail with Expect: 100-continue is answered too, "
      "directly (the connection stays open) and through nginx")
def expect_continue_pipelined():
    # libmicrohttpd sends 100 Continue and, with the bytes behind it buffered, calls the handler
    # where no answer can be queued; answering in the first call instead closed the connection on
    # the request behind it. The service now ignores that call and answers at the end.
    data = (b"POST /fail HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n"
            b"GET /token HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    for name, port in (("directly", FIX.direct()), ("through nginx", FIX.proxied())):
        register(FIX.direct(), "5d000001")
        received = exchange(port, data)[1]
        statuses = final_statuses(received)
        note("Expect: 100-continue pipelined, %s: %r" % (name, statuses))
        check(statuses == [200, 200], "%s: answers %r, expected two 200s: %r" % (name, statuses, received[:600]))
        check(received.rstrip().endswith(b'{"token":null}'), "%s: the GET behind it did not see the cleared token: %r"
              % (name, received[-200:]))
        check(current_token(FIX.direct()) is None, "POST /fail %s did not clear the token" % name)


# -- runner -------------------------------------------------------------------------------------
FIX = None


def run():
    def keep(fixtures, verbose):
        global FIX, VERBOSE
        FIX, VERBOSE = fixtures, verbose
    return run_tap_checks(CHECKS, "e2e-http-framing-", Fixtures, tools=("nginx",), keep=keep)


if __name__ == "__main__":
    sys.exit(run())
