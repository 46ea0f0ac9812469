#!/usr/bin/env python3
"""Read and write tokens, and their reload, against the release binary over real sockets
(issue 28; docs/operations.md, "Read and write tokens" and "Rotating tokens").

1. Start-up refusals: exit 64 naming the file, the line and the reason, never the token (a
   15-character token, a 65th token, a directory, a missing file, CRLF accepted, a read-token
   file alone, a token file with --auth-token).
2. Roles with curl: a read token reads GET /token, the stream and /metrics and gets 403
   insufficient_scope (with the RFC 6750 challenge) on both writes, which change nothing; no
   token is 401; /healthz is open.
3. A Kubernetes-like Secret volume (files linked through `..data`, updated by swapping that link,
   no signal): the new tokens are in force within the poll, the old ones refused.
4. A reload (SIGHUP) during 1,000 open streams, 300 of them admitted by a read token the reload
   removes: those 300 end cleanly (the chunked body's last chunk) within 1 s of the reload, the
   other 700 stay open and get the next event.
5. Failed reloads (a short token, a vanished file, a directory): one error line each, the failed
   count, and the old sets still enforced (refused without a token, the old token accepted).
6. As PID 1 of its own PID namespace (unshare(1), as in a container), SIGHUP reloads and SIGTERM
   stops the service.

    credentials_test.py --server PATH
"""
import argparse
import datetime
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from e2e_support import (HOST, Failure, Server, check, log, main, remember_secret, request,
                         streams_ended_settles, token_hex, wait_until)


def new_token(prefix):
    token = prefix + "-" + secrets.token_hex(16)
    remember_secret(token)
    return token


class SecretVolume:
    """A folder laid out as the kubelet lays out a Secret volume: each file is a link to
    `..data/NAME`, `..data` a link to a timestamped folder; an update writes a new folder and swaps
    `..data` with one rename, so a reader sees the old files or the new ones, never a mix."""

    def __init__(self, root, files):
        self.root = root
        self.count = 0
        self.current = None
        self.update(files)
        for name in files:
            os.symlink(os.path.join("..data", name), os.path.join(root, name))

    def path(self, name):
        return os.path.join(self.root, name)

    def update(self, files):
        self.count += 1
        stamp = "..2026_12_02_23_00_00.%06d" % self.count
        folder = os.path.join(self.root, stamp)
        os.mkdir(folder)
        for name, text in files.items():
            if text is None:
                continue
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        link = os.path.join(self.root, "..data_tmp")
        os.symlink(stamp, link)
        os.rename(link, os.path.join(self.root, "..data"))
        if self.current:
            shutil.rmtree(os.path.join(self.root, self.current))
        self.current = stamp


def bearer(token):
    return {"Authorization": "Bearer " + token}


def metrics(server, token):
    status, _, body = request(server.port, "GET", "/metrics", headers=bearer(token))
    check(status == 200, "GET /metrics with a read token: %s %r" % (status, body[:200]))
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def reloads(server, token, result):
    return metrics(server, token).get('forge_push_token_credentials_reloads_total{result="%s"}' % result, -1)


def log_time(line):
    """The UTC time of a text log line (`2026-12-02T23:04:05.678Z info ...`), as a Unix time."""
    stamp = line.split(" ", 1)[0].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def reload_lines(server, needle):
    return [line for line in server.stderr().splitlines() if needle in line]


def curl(*args):
    """curl's status line (`%{http_code}`), headers and body for one request."""
    out = subprocess.run(["curl", "-sS", "--max-time", "5", "-D", "-", *args], capture_output=True, timeout=10)
    return out.stdout.decode("utf-8", "replace")


# -- 1. start-up -----------------------------------------------------------------------------------
def start_refusals(binary, folder):
    w = new_token("w")
    fifteen = secrets.token_hex(8)[:15]
    remember_secret(fifteen)
    many = "\n".join(new_token("t%02d" % i) for i in range(65)) + "\n"
    files = {
        "crlf": "# writers\r\n%s\r\n\r\n" % w,
        "short": "# one short token\n%s\n%s\n" % (w, fifteen),
        "sixteen": fifteen + "x\n",
        "many": many,
        "good": w + "\n",
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w", newline="") as f:
            f.write(text)
    os.mkdir(os.path.join(folder, "directory"))
    path = lambda name: os.path.join(folder, name)  # noqa: E731

    def refused(args, needles, secrets_shown=(w, fifteen)):
        proc = subprocess.run([binary, "--port", "0", *args], capture_output=True, timeout=10,
                              env={k: v for k, v in os.environ.items() if not k.startswith("FORGE_PUSH_TOKEN_")})
        err = proc.stderr.decode("utf-8", "replace")
        check(proc.returncode == 64, "%s: exit %s, not 64; stderr %r" % (args, proc.returncode, err[:300]))
        for needle in needles:
            check(needle in err, "%s: %r is not in stderr %r" % (args, needle, err[:400]))
        for secret in secrets_shown:
            check(secret not in err, "%s: a token is in stderr" % (args,))
        return err

    refused(["--write-token-file", path("short")],
            ["--write-token-file %s: line 3: the token has 15 characters" % path("short")])
    refused(["--write-token-file", path("good"), "--read-token-file", path("many")],
            ["--read-token-file %s: line 65: one token more than the 64" % path("many")])
    refused(["--write-token-file", path("directory")], ["cannot read %s: not a regular file" % path("directory")])
    refused(["--write-token-file", path("missing")], ["cannot read %s: No such file or directory" % path("missing")])
    refused(["--read-token-file", path("good")], ["--read-token-file needs --write-token-file"])
    refused(["--write-token-file", path("good"), "--auth-token", w], ["excludes --auth-token"])
    log("start-up: exit 64 naming the file, the line and the reason for a 15-character token, a 65th "
        "token, a directory, a missing file; a read file alone; a token file with --auth-token")
    # CRLF line ends and a 16-character token start.
    for name in ("crlf", "sixteen"):
        server = Server(binary, ["--port", "0", "--write-token-file", path(name)]).start()
        try:
            token = w if name == "crlf" else fifteen + "x"
            status, _, _ = request(server.port, "POST", "/fail", headers=bearer(token))
            check(status == 200, "%s: the file's token could not write: %s" % (name, status))
        finally:
            server.stop()
    log("a CRLF file and a 16-character token start, and their token writes")


# -- 2. roles with curl ----------------------------------------------------------------------------
def roles(server, read, write):
    url = "http://%s:%d" % (HOST, server.port)
    device = token_hex(0x2801)
    out = curl("-X", "POST", "-H", "Authorization: Bearer " + write, "--data", device, url + "/register")
    check(out.startswith("HTTP/1.1 200"), "a write token's POST /register: %r" % out[:200])
    for path in ("/register", "/fail"):
        out = curl("-X", "POST", "-H", "Authorization: Bearer " + read, "--data", token_hex(0x2802), url + path)
        check(out.startswith("HTTP/1.1 403"), "a read token's POST %s: %r" % (path, out[:300]))
        check('WWW-Authenticate: Bearer realm="forge-push-token", error="insufficient_scope"' in out,
              "no insufficient_scope challenge: %r" % out[:400])
        check('"error":"insufficient_scope"' in out, "no insufficient_scope code: %r" % out[-300:])
    out = curl("-H", "Authorization: Bearer " + read, url + "/token")
    check(out.startswith("HTTP/1.1 200") and device in out, "a read token's GET /token: %r" % out[-300:])
    out = curl(url + "/token?access_token=" + read)
    check(out.startswith("HTTP/1.1 200") and device in out, "GET /token?access_token=READ: %r" % out[-300:])
    out = curl("-N", "--max-time", "1", url + "/token/stream?access_token=" + read)
    check("HTTP/1.1 200" in out and "event: token" in out and device in out,
          "a read token's stream: %r" % out[-300:])
    out = curl("-H", "Authorization: Bearer " + read, url + "/metrics")
    check(out.startswith("HTTP/1.1 200") and "forge_push_token_forbidden_requests_total 2" in out,
          "a read token's /metrics: %r" % out[:200])
    check('forge_push_token_credentials_tokens{role="read"} 2' in out and 'forge_push_token_credentials_tokens{role="write"} 1' in out, "the tokens gauges: %r" % out)
    for path in ("/token", "/metrics", "/token/stream"):
        out = curl(url + path)
        check(out.startswith("HTTP/1.1 401"), "GET %s without a token: %r" % (path, out[:200]))
    out = curl(url + "/healthz")
    check(out.startswith("HTTP/1.1 200"), "/healthz needs no token: %r" % out[:200])
    status, _, body = request(server.port, "GET", "/token", headers=bearer(read))
    check(device.encode() in body, "a refused write changed the token: %r" % body)
    log("curl: a read token reads /token, the stream and /metrics, gets 403 insufficient_scope with the "
        "RFC 6750 challenge on both writes (nothing changes); no token is 401; /healthz is open")


# -- streams on raw sockets ------------------------------------------------------------------------
TERMINATOR = b"\r\n0\r\n\r\n"


def open_streams(port, token, count):
    """`count` `GET /token/stream?access_token=TOKEN` sockets, each read up to its first event."""
    socks = []
    request_bytes = ("GET /token/stream?access_token=%s HTTP/1.1\r\nHost: e2e\r\nAccept: text/event-stream\r\n\r\n"
                     % token).encode()
    try:
        for _ in range(count):
            sock = socket.create_connection((HOST, port), timeout=10)
            socks.append(sock)
            sock.sendall(request_bytes)
        deadline = time.monotonic() + 60  # heartbeats alone would keep the reads going forever
        for sock in socks:
            data = b""
            while b"data:" not in data:
                check(time.monotonic() < deadline, "a stream's first event did not come within 60 s")
                chunk = sock.recv(4096)
                if not chunk:
                    raise Failure("a stream was closed before its first event: %r" % data[:200])
                data += chunk
            check(data.startswith(b"HTTP/1.1 200"), "a stream was refused: %r" % data[:200])
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


class EndWatcher:
    """Reads every socket of a set without blocking and notes when each one's chunked body ends
    (its last chunk) or its connection closes; counts the events each received."""

    def __init__(self, socks):
        self.selector = selectors.DefaultSelector()
        self.tail = {}
        self.ended = {}
        self.events = {}
        for sock in socks:
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            # A stream is read past its first event's `data:` line: what came before ends a chunk.
            self.tail[sock] = b"\r\n"
            self.events[sock] = 0

    def poll(self, timeout):
        for key, _ in self.selector.select(timeout):
            sock = key.fileobj
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            now = time.time()
            if not data:
                self.ended.setdefault(sock, now)
                self.selector.unregister(sock)
                continue
            self.events[sock] += data.count(b"event: token")
            tail = self.tail[sock] + data
            if tail.endswith(TERMINATOR):
                self.ended.setdefault(sock, now)
            self.tail[sock] = tail[-16:]

    def run_until(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise Failure("not within %.1f s: %s" % (timeout, what))
            self.poll(0.05)


def revoke_during_streams(server, volume, files, read_kept, read_removed, write):
    removed = open_streams(server.port, read_removed, 300)
    kept = open_streams(server.port, read_kept, 700)
    log("1,000 streams open: 300 with the read token to be removed, 700 with one that stays")
    try:
        watcher = EndWatcher(removed + kept)
        watcher.poll(0.1)
        check(not watcher.ended, "streams ended before the reload")
        files["read-tokens"] = read_kept + "\n"
        volume.update(files)
        before = len(reload_lines(server, "credentials reloaded"))
        os.kill(server.pid, signal.SIGHUP)
        watcher.run_until(lambda: all(sock in watcher.ended for sock in removed), 10,
                          "the 300 streams with the removed token ended")
        # The reload logs its line after it has ended the streams: the client can see the ends first.
        lines = wait_until(lambda: len(reload_lines(server, "credentials reloaded")) > before
                           and reload_lines(server, "credentials reloaded"), 5, what="the reload's log line")
        reloaded_at = log_time(lines[before])
        check("300 event streams with a removed token ended" in lines[before], "the reload line: %r" % lines[before])
        latest = max(watcher.ended[sock] for sock in removed)
        check(latest - reloaded_at <= 1.0,
              "the last revoked stream ended %.3f s after the reload, over 1 s" % (latest - reloaded_at))
        check(not any(sock in watcher.ended for sock in kept), "a stream whose token stays was ended")
        log("SIGHUP: the 300 streams of the removed token ended cleanly within %.3f s of the reload; the 700 "
            "others stay open" % (latest - reloaded_at))
        status, _, _ = request(server.port, "POST", "/register", body=token_hex(0x2803).encode(), headers=bearer(write))
        check(status == 200, "a write after the reload: %s" % status)
        watcher.run_until(lambda: all(watcher.events[sock] >= 1 for sock in kept), 10,
                          "the 700 kept streams got the next event")
        check(not any(sock in watcher.ended for sock in kept), "a kept stream ended")
        log("the 700 kept streams all got the next event")
        status, _, _ = request(server.port, "GET", "/token", headers=bearer(read_removed))
        check(status == 401, "the removed read token still reads: %s" % status)
        streams_ended_settles(server.port, "revoked", 300, headers=bearer(read_kept))
        log("forge_push_token_streams_ended_total{reason=\"revoked\"} is 300")
    finally:
        for sock in removed + kept:
            sock.close()


def kubernetes_swap(server, volume, files, read, old_write, new_write):
    ok = reloads(server, read, "ok")
    files["write-tokens"] = "# rotated\n%s\n" % new_write
    volume.update(files)
    wait_until(lambda: reloads(server, read, "ok") > ok, 5, interval=0.1, what="the ..data swap reloaded")
    status, _, _ = request(server.port, "POST", "/fail", headers=bearer(new_write))
    check(status == 200, "the new write token after the swap: %s" % status)
    status, _, _ = request(server.port, "POST", "/fail", headers=bearer(old_write))
    check(status == 401, "the old write token after the swap: %s" % status)
    log("a ..data swap with no signal reloaded the files: the new write token writes, the old one is 401")


def failed_reloads(server, volume, files, read, write):
    def enforced(what):
        status, _, _ = request(server.port, "GET", "/token")
        check(status == 401, "%s: a read without a token is %s, not 401" % (what, status))
        status, _, _ = request(server.port, "GET", "/token", headers=bearer(read))
        check(status == 200, "%s: the old read token is %s" % (what, status))
        status, _, _ = request(server.port, "POST", "/fail", headers=bearer(write))
        check(status == 200, "%s: the old write token is %s" % (what, status))

    cases = [
        ("a short token", dict(files, **{"read-tokens": read + "\nshort-token\n"}),
         "--read-token-file %s: line 2: the token has 11 characters" % volume.path("read-tokens")),
        ("a vanished file", dict(files, **{"read-tokens": None}),
         "cannot read %s: No such file or directory" % volume.path("read-tokens")),
    ]
    for what, broken, needle in cases:
        failed = reloads(server, read, "failed")
        errors = len(reload_lines(server, "credentials reload failed"))
        volume.update(broken)
        wait_until(lambda: reloads(server, read, "failed") == failed + 1, 5, interval=0.1,
                   what="%s: a failed reload counted" % what)
        lines = reload_lines(server, "credentials reload failed")
        check(len(lines) == errors + 1, "%s: %d error lines, not one" % (what, len(lines) - errors))
        check(needle in lines[-1], "%s: %r is not in %r" % (what, needle, lines[-1]))
        check(read not in lines[-1] and write not in lines[-1], "a token is in the error line")
        enforced(what)
        log("failed reload (%s): one error line, counted, the old tokens still enforced" % what)
    # Replaced by a directory: the path now leads to a folder, which the poll notices.
    os.unlink(volume.path("read-tokens"))
    os.mkdir(volume.path("read-tokens"))
    failed = reloads(server, read, "failed")
    wait_until(lambda: reloads(server, read, "failed") == failed + 1, 5, interval=0.1,
               what="a directory: a failed reload counted")
    check("not a regular file" in reload_lines(server, "credentials reload failed")[-1], "the directory's error line")
    enforced("a directory")
    time.sleep(2.5)  # two more polls: a file that stays broken is not logged or counted again
    check(reloads(server, read, "failed") == failed + 1, "a directory that stayed was counted again")
    log("failed reload (the file replaced by a directory): one error line, counted once, the old tokens still "
        "enforced")
    os.rmdir(volume.path("read-tokens"))
    os.symlink(os.path.join("..data", "read-tokens"), volume.path("read-tokens"))
    ok = reloads(server, read, "ok")
    volume.update(files)
    wait_until(lambda: reloads(server, read, "ok") > ok, 5, interval=0.1, what="the repaired files reloaded")


def pid_one_sighup(binary, workdir):
    """As PID 1 of its own PID namespace (as the image's exec-form ENTRYPOINT runs it in a
    container, where signals without a handler are dropped), SIGHUP still reloads the files and
    SIGTERM still stops it: the service waits for both with sigwait rather than relying on default
    dispositions. Needs unshare(1) and the right to make a PID namespace (root); skipped otherwise."""
    path = os.path.join(workdir, "pid1-write-tokens")
    first, second = new_token("pid1-a"), new_token("pid1-b")
    with open(path, "w") as f:
        f.write(first + "\n")
    port_sock = socket.socket()
    port_sock.bind((HOST, 0))
    port = port_sock.getsockname()[1]
    port_sock.close()
    log_path = os.path.join(workdir, "pid1.log")
    with open(log_path, "wb") as err:
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", binary, "--port", str(port),
                                 "--write-token-file", path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, env={k: v for k, v in os.environ.items()
                                                 if not k.startswith("FORGE_PUSH_TOKEN_")})
    try:
        def child():
            try:
                with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
                    pids = f.read().split()
            except OSError:
                return None
            return int(pids[0]) if pids else None

        def text():
            with open(log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        try:
            wait_until(lambda: "listening on" in text() or proc.poll() is not None, 10, what="the PID 1 server")
        except Failure:
            raise Failure("the server under unshare did not start: %r" % text()[-500:])
        if proc.poll() is not None:
            log("SKIPPED: no PID namespace here (unshare exited %s: %s)" % (proc.returncode, text()[-200:].strip()))
            return
        pid = child()
        with open("/proc/%d/status" % pid) as f:
            nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
        check(nspid[-1] == "1", "the server is not PID 1 of its namespace: NSpid %s" % nspid)
        with open(path + ".next", "w") as f:
            f.write(second + "\n")
        os.rename(path + ".next", path)
        os.kill(pid, signal.SIGHUP)
        wait_until(lambda: "credentials reloaded" in text(), 5, what="the reload of PID 1 after SIGHUP")
        status, _, _ = request(port, "POST", "/fail", headers=bearer(second))
        check(status == 200, "PID 1: the new token after SIGHUP: %s" % status)
        os.kill(pid, signal.SIGTERM)
        code = proc.wait(10)
        check("received SIGTERM, shutting down" in text() and code == 0,
              "PID 1 did not stop cleanly on SIGTERM (exit %s): %r" % (code, text()[-400:]))
        log("as PID 1 of a PID namespace (a container's ENTRYPOINT), SIGHUP reloads the token file and SIGTERM "
            "stops the service")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    binary = parser.parse_args().server
    workdir = tempfile.mkdtemp(prefix="e2e-credentials-")
    try:
        start_refusals(binary, os.path.join(workdir))
        pid_one_sighup(binary, workdir)
        root = os.path.join(workdir, "secret")
        os.mkdir(root)
        write, read_a, read_b = new_token("write"), new_token("read-a"), new_token("read-b")
        files = {"write-tokens": write + "\n", "read-tokens": "%s\n%s\n" % (read_a, read_b)}
        volume = SecretVolume(root, files)
        server = Server(binary, ["--port", "0", "--write-token-file", volume.path("write-tokens"),
                                 "--read-token-file", volume.path("read-tokens")]).start()
        try:
            roles(server, read_a, write)
            revoke_during_streams(server, volume, files, read_kept=read_b, read_removed=read_a, write=write)
            new_write = new_token("write-new")
            kubernetes_swap(server, volume, files, read_b, write, new_write)
            failed_reloads(server, volume, files, read_b, new_write)
            check(server.alive(), "the server died")
        finally:
            code = server.stop()
            check(code == 0, "the server exited %s" % code)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(run)
