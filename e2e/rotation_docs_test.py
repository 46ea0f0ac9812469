#!/usr/bin/env python3
"""The token rotation of docs/operations.md, "Rotating tokens", run as written (issue 28).

The four ```sh blocks of that section (steps 1, 2, 4 and 5; step 3 is the clients' own move) run
with bash against the release binary, with only `/etc/forge-push-token` and port 8080 replaced by
a temporary folder and a free port. Throughout, clients write with the write token they were
given (the old one, then from step 3 the new one), read with a read token, and keep event streams
open; the test fails on any refused request that carried a valid token. Streams of a client that
was never moved (still on the old token) must end within 1 s of step 5's reload, and the old token
is refused afterwards. Each block prints nothing (no curl error while a step waits for the reload)
and leaves the shell's working directory and umask as they were (its `cd` and `umask 077` in a
subshell).

    rotation_docs_test.py --server PATH
"""
import argparse
import datetime
import os
import secrets
import shutil
import subprocess
import threading
import time

from e2e_support import (Server, check, docs_block_folder, docs_sh_blocks, log, main, remember_secret, request,
                         streams_ended_settles, token_hex, wait_until)
from credentials_test import EndWatcher, open_streams


def log_time(line):
    return datetime.datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


class Client(threading.Thread):
    """Sends one kind of request in a loop with the token `token()` gives at that moment, and
    keeps every answer that is not 200."""

    def __init__(self, port, method, path, token):
        super().__init__(daemon=True)
        self.port, self.method, self.path, self.token = port, method, path, token
        self.stopping = threading.Event()
        self.sent = 0
        self.refused = []

    def run(self):
        n = 0
        while not self.stopping.is_set():
            token = self.token()
            body = token_hex(0x2877, n).encode() if self.method == "POST" else None
            headers = {"Authorization": "Bearer " + token}
            if body:
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            status, _, answer = request(self.port, self.method, self.path, body=body, headers=headers)
            self.sent += 1
            if status != 200:
                self.refused.append((status, answer[:200], token == self.token()))
            n += 1
            # Pacing: about a hundred writes a second during the rotation.
            time.sleep(0.01)


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    binary = parser.parse_args().server
    blocks = docs_sh_blocks("operations.md", "## Rotating tokens", "## Metrics")
    check(len(blocks) == 4, "docs/operations.md 'Rotating tokens' has %d sh blocks, not 4 (steps 1, 2, 4, 5)"
          % len(blocks))
    folder, env = docs_block_folder(binary, "e2e-rotation-docs-")
    etc = os.path.join(folder, "etc")
    os.mkdir(etc, 0o700)
    old, read = secrets.token_hex(32), secrets.token_hex(32)
    for value in (old, read):
        remember_secret(value)
    with open(os.path.join(etc, "write-tokens"), "w") as f:
        f.write(old + "\n")
    with open(os.path.join(etc, "read-tokens"), "w") as f:
        f.write(read + "\n")
    server = Server(binary, ["--port", "0", "--write-token-file", os.path.join(etc, "write-tokens"),
                             "--read-token-file", os.path.join(etc, "read-tokens")]).start()
    current = {"write": old}
    writer = Client(server.port, "POST", "/register", lambda: current["write"])
    reader = Client(server.port, "GET", "/token", lambda: read)
    stragglers = open_streams(server.port, old, 20)  # a client nobody moves
    readers = open_streams(server.port, read, 20)
    watcher = EndWatcher(stragglers + readers)

    umask = os.umask(0o022)
    os.umask(umask)  # the umask the blocks' shells start with

    def step(number, block):
        script = block.replace("/etc/forge-push-token", etc).replace("8080", str(server.port))
        # What the block leaves in the reader's shell: its working directory and umask.
        script += '\nprintf "after: %s %s\\n" "$(umask)" "$PWD"\n'
        sent = writer.sent
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=folder, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None:
            watcher.poll(0.05)
        out = proc.stdout.read().decode("utf-8", "replace")
        check(proc.returncode == 0, "step %d exited %s: %s" % (number, proc.returncode, out[-800:]))
        lines = out.splitlines()
        check(lines[-1:] == ["after: %04o %s" % (umask, os.path.realpath(folder))] and len(lines) == 1,
              "step %d printed %r: a block must print nothing (no curl error while it waits) and leave the"
              " shell's umask %04o and folder %s as they were" % (number, out[-800:], umask, folder))
        wait_until(lambda: writer.sent > sent, 5, what="a write during step %d" % number)
        check(not writer.refused and not reader.refused, "step %d: valid requests refused: %r %r"
              % (number, writer.refused[:3], reader.refused[:3]))
        log("step %d ran as written (%d writes so far, none refused)" % (number, writer.sent))

    try:
        writer.start()
        reader.start()
        step(1, blocks[0])
        new = open(os.path.join(etc, "new-token")).read().strip()
        remember_secret(new)
        check(len(new) == 64 and new != old, "step 1 made no new token")
        step(2, blocks[1])
        current["write"] = new  # 3. the clients move to the new token
        moved = writer.sent
        wait_until(lambda: writer.sent > moved + 5, 5, what="writes with the new token")
        log("step 3: the writer moved to the new token")
        step(4, blocks[2])
        check(not os.path.exists(os.path.join(etc, "new-token")), "step 4 left new-token behind")
        with open(os.path.join(etc, "write-tokens")) as f:
            check(f.read().split() == [new], "after step 4 the file does not hold only the new token")
        step(5, blocks[3])
        watcher.run_until(lambda: all(sock in watcher.ended for sock in stragglers), 5,
                          "the streams on the old token ended")
        # The reload logs its line after it has ended the streams: the client can see the ends first.
        ended_line = "20 event streams with a removed token ended"
        wait_until(lambda: ended_line in server.stderr(), 5, what="the reload's log line")
        reloads = [line for line in server.stderr().splitlines() if "credentials reloaded" in line]
        last = [line for line in reloads if ended_line in line]
        check(len(last) == 1, "no reload ended the 20 old-token streams: %s" % reloads)
        latest = max(watcher.ended[sock] for sock in stragglers) - log_time(last[0])
        check(latest <= 1.0, "the old token's streams ended %.3f s after the reload" % latest)
        check(not any(sock in watcher.ended for sock in readers), "a read-token stream ended")
        streams_ended_settles(server.port, "revoked", 20, headers={"Authorization": "Bearer " + read})
        log("step 5: the 20 streams left on the old token ended within %.3f s of the reload; the 20 read "
            "streams stay" % latest)
    finally:
        writer.stopping.set()
        reader.stopping.set()
        writer.join(10)
        reader.join(10)
        for sock in stragglers + readers:
            sock.close()
    try:
        check(writer.sent > 20 and reader.sent > 20, "too few requests: %d writes, %d reads"
              % (writer.sent, reader.sent))
        check(not writer.refused and not reader.refused, "valid requests were refused: writes %r, reads %r"
              % (writer.refused[:3], reader.refused[:3]))
        log("%d writes and %d reads throughout, not one refused" % (writer.sent, reader.sent))
        status, _, _ = request(server.port, "POST", "/fail", headers={"Authorization": "Bearer " + old})
        check(status == 401, "the old token after the rotation: %s" % status)
        status, _, _ = request(server.port, "POST", "/fail", headers={"Authorization": "Bearer " + new})
        check(status == 200, "the new token after the rotation: %s" % status)
        log("after the rotation the old token is refused (401) and the new one writes")
    finally:
        code = server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    check(code == 0, "the server exited %s" % code)


if __name__ == "__main__":
    main(run)
