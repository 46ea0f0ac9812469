#!/usr/bin/env python3
"""End-to-end: the state file on a slow, a failing and a full file system (issue 42).

Each run puts `--state-file` on a file system that injects one fault, and prints which fault it
injected at which step of a save (StateFile.swift: the temporary file created, written, flushed
with fsync, renamed over the target, then the folder flushed):

  slow        a FUSE passthrough (e2e/faultfs.c) whose fsync of the temporary file takes 1.5 s;
              for the SIGTERM it then hangs (30 s), as a dying disk does, but interruptibly
              (faultfs sets libfuse's `intr`): a thread waiting on a disk hung in the kernel's uninterruptible wait
              holds its process's exit whatever the process does, so that case is out of reach
  create-eio  the same passthrough failing the temporary file's creation with EIO
  write-eio   ... its write with EIO
  fsync-eio   ... its fsync with EIO
  rename-eio  ... the rename with EIO
  fsyncdir-eio ... the folder's fsync with EIO: the rename has landed, so the refused state is on
              disk (in the page cache) although the write was answered 503
  full        a loop device (ext4, no reserved blocks) filled to its last block: ENOSPC

Every run, while the service runs on it:
  - before the fault a write is acknowledged (200); under it, writes of distinct tokens are sent
    one after another while GET /token and /healthz are read from another thread;
  - every request is answered within its promise: a read within 1 s, whatever the disk does; a
    write within 2 x the injected delay + 1 s on the slow disk, within 1 s on a failing or full
    one, where it is answered 503 state_not_saved; /healthz then says degraded;
  - GET /token stays the last acknowledged token under a failing or full disk;
  - mid-fault, with a write sent 0.2 s before, SIGTERM: the process exits 0 within N + 3 s
    (N = 0, no drain; 0.5 s more allowed for this shared machine's scheduling), and the stream,
    read to its end, carries no refused token;
  - the fault cleared, a restart serves the last acknowledged token (or, in fsyncdir-eio only, a
    token refused after it whose rename landed: printed), and the next write is acknowledged;
  - over the stream events of both processes, no id names two tokens.

Runs go in parallel, each with its own server on a free loopback port, mount and files. Needs root,
/dev/fuse, libfuse3 (`pkg-config fuse3`, `fusermount3`), `cc`, `losetup`, `mkfs.ext4` and `mount`:
e2e/run.sh installs the Debian packages; where any is missing the run fails, never skips. Mounts,
loop devices, faultfs processes and files are removed in `finally` blocks, whatever happened.

    python3 e2e/state_file_faults_test.py --server PATH [--only slow,full,...]
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback

from e2e_support import EventStream, Failure, Server, check, log, main, token_hex

BASE_ARGS = ["--host", "127.0.0.1", "--port", "0", "--access-log", "off"]
HERE = os.path.dirname(os.path.abspath(__file__))
SLOW_MS = 1500
HANG_MS = 30000
READ_PROMISE = 1.0
FAILED_WRITE_PROMISE = 1.0
STOP_PROMISE = 3.0 + 0.5

# name -> (what the run says it injects, faultfs control line or None for the full disk)
RUNS = {
    "slow": ("a 1.5 s delay at fsync (the temporary file's flush), then a 30 s hang", "fsync delay %d" % SLOW_MS),
    "create-eio": ("EIO at create (the temporary file made)", "create eio"),
    "write-eio": ("EIO at write (the temporary file written)", "write eio"),
    "fsync-eio": ("EIO at fsync (the temporary file flushed)", "fsync eio"),
    "rename-eio": ("EIO at rename (the temporary file renamed over the state file)", "rename eio"),
    "fsyncdir-eio": ("EIO at fsyncdir (the folder flushed after the rename)", "fsyncdir eio"),
    "full": ("ENOSPC: the loop device's ext4 filled to its last block", None),
}


_say_lock = threading.Lock()
_disks = []  # every FaultFS and FullDisk made, closed again at exit whatever happened
_disks_lock = threading.Lock()


def close_disks():
    with _disks_lock:
        disks = list(_disks)
        _disks.clear()
    for disk in disks:
        try:
            disk.close()
        except BaseException as error:
            log("cleanup of %s failed: %s" % (disk.mount, error))


atexit.register(close_disks)


def remember(disk):
    with _disks_lock:
        _disks.append(disk)


def forget(disk):
    with _disks_lock:
        if disk in _disks:
            _disks.remove(disk)


def run_command(argv, timeout=30, check_exit=True):
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if check_exit and result.returncode != 0:
        raise Failure("%s exited %d: %s" % (" ".join(argv), result.returncode, result.stdout.decode()[-500:]))
    return result


def require_tools():
    check(os.geteuid() == 0, "the state-file fault runs need root (mount, losetup, FUSE)")
    check(os.path.exists("/dev/fuse"), "no /dev/fuse: the FUSE runs cannot run on this machine")
    for tool in ("cc", "pkg-config", "fusermount3", "losetup", "mkfs.ext4", "mount", "umount"):
        check(shutil.which(tool), "%s is missing (e2e/run.sh installs it: fuse3 libfuse3-dev e2fsprogs mount)" % tool)
    check(run_command(["pkg-config", "--exists", "fuse3"], check_exit=False).returncode == 0,
          "pkg-config finds no fuse3 (libfuse3-dev)")


def build_faultfs(workdir):
    binary = os.path.join(workdir, "faultfs")
    flags = run_command(["pkg-config", "fuse3", "--cflags", "--libs"]).stdout.decode().split()
    run_command(["cc", "-O2", "-Wall", "-Werror", "-o", binary, os.path.join(HERE, "faultfs.c")] + flags, timeout=60)
    return binary


class FaultFS:
    """A faultfs mount over a backing folder; `inject(line)` and `clear()` set its control file."""

    def __init__(self, faultfs, root):
        self.backing = os.path.join(root, "backing")
        self.mount = os.path.join(root, "mnt")
        self.control = os.path.join(root, "control")
        self.log_path = os.path.join(root, "faultfs.log")
        os.makedirs(self.backing)
        os.makedirs(self.mount)
        self.clear()
        self.closed = False
        self.log_file = open(self.log_path, "wb")
        remember(self)
        self.proc = subprocess.Popen([faultfs, self.backing, self.control, self.mount, "-f"],
                                     stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=self.log_file)
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mount):
            check(self.proc.poll() is None, "faultfs exited %s: %s" % (self.proc.returncode, self.injections()))
            check(time.monotonic() < deadline, "faultfs did not mount within 10 s")
            time.sleep(0.02)

    def inject(self, line):
        with open(self.control, "w") as f:
            f.write(line + "\n")

    def clear(self):
        with open(self.control, "w"):
            pass

    def injections(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def close(self):
        if self.closed:
            return
        self.closed = True
        forget(self)
        self.clear()
        run_command(["fusermount3", "-u", "-z", self.mount], check_exit=False)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log_file.close()


class FullDisk:
    """An ext4 file system on a loop device, with no blocks reserved for root; `inject()` fills it
    to its last block, `clear()` frees the space."""

    def __init__(self, root):
        self.image = os.path.join(root, "disk.img")
        self.mount = os.path.join(root, "mnt")
        self.filler = os.path.join(self.mount, "filler")
        self.device = None
        self.closed = False
        os.makedirs(self.mount)
        remember(self)
        with open(self.image, "wb") as f:
            f.truncate(16 * 1024 * 1024)
        run_command(["mkfs.ext4", "-q", "-F", "-m", "0", self.image])
        self.device = run_command(["losetup", "--find", "--show", self.image]).stdout.decode().strip()
        run_command(["mount", "-t", "ext4", self.device, self.mount])

    def inject(self, line=None):
        block = b"\0" * 65536
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (65536, 4096, 1024):
                while True:
                    try:
                        os.write(fd, block[:size])
                    except OSError:
                        break
            try:
                os.fsync(fd)
            except OSError:
                pass
        finally:
            os.close(fd)
        check(os.statvfs(self.mount).f_bavail == 0, "the loop device is not full after the filler")

    def clear(self):
        if os.path.exists(self.filler):
            os.unlink(self.filler)
        os.sync()

    def injections(self):
        return ""

    def close(self):
        if self.closed:
            return
        self.closed = True
        forget(self)
        if os.path.ismount(self.mount):
            run_command(["umount", "-l", self.mount], check_exit=False)
        if self.device:
            run_command(["losetup", "-d", self.device], check_exit=False)


def timed(function, *args):
    started = time.monotonic()
    result = function(*args)
    return result, time.monotonic() - started


def one_run(name, binary, faultfs, workdir, report):
    what, line = RUNS[name]
    root = os.path.join(workdir, name)
    os.makedirs(root)
    def say(text):
        with _say_lock:  # one line at a time from the parallel runs
            log("[%s] %s" % (name, text))
    disk = FullDisk(root) if line is None else FaultFS(faultfs, root)
    server = again = None
    try:
        path = os.path.join(disk.mount, "state.json")
        server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=root).start()
        events = []
        stream = EventStream(server.port)
        events.append(stream.next_token_event())
        tokens = [token_hex(0x42, hash(name) & 0xFFFF, i) for i in range(12)]
        acknowledged = tokens[0]
        status, _, body = server.register(acknowledged)
        check(status == 200, "the write before the fault answered %s %r" % (status, body))
        events.append(stream.next_token_event())

        say("injecting %s, at step %s" % (what, "write (ENOSPC)" if line is None else line.split()[0]))
        disk.inject(line)
        slow = name == "slow"
        write_promise = 2 * SLOW_MS / 1000 + 1 if slow else FAILED_WRITE_PROMISE
        refused = []
        reads = {"count": 0, "worst": 0.0, "tokens": set(), "error": None}
        stop_reading = threading.Event()

        def read_loop():
            try:
                while not stop_reading.is_set():
                    (status, _, body), took = timed(server.request, "GET", "/token", None, None, 5)
                    reads["worst"] = max(reads["worst"], took)
                    reads["count"] += 1
                    check(status == 200, "GET /token answered %s" % status)
                    reads["tokens"].add(json.loads(body)["token"])
                    (status, _, _), took = timed(server.request, "GET", "/healthz", None, None, 5)
                    reads["worst"] = max(reads["worst"], took)
                    check(status == 200, "GET /healthz answered %s" % status)
                    # Pacing: the reader looks every 50 ms during the fault.
                    time.sleep(0.05)
            except BaseException as error:  # reported by the run
                reads["error"] = error

        reader = threading.Thread(target=read_loop, daemon=True)
        reader.start()
        for token in tokens[1:4]:
            (status, _, body), took = timed(server.register, token, 10)
            check(took <= write_promise, "a write took %.2f s, promised %.1f s" % (took, write_promise))
            if slow:
                check(status == 200, "a write to the slow disk answered %s %r" % (status, body))
                acknowledged = token
            else:
                check(status == 503 and json.loads(body).get("error") == "state_not_saved",
                      "a write under %s answered %s %r, expected 503 state_not_saved" % (what, status, body))
                refused.append(token)
                check(server.token() == acknowledged, "GET /token serves a refused write")
        stop_reading.set()
        reader.join(10)
        check(reads["error"] is None, "a read failed: %s" % reads["error"])
        check(reads["worst"] <= READ_PROMISE, "a read took %.2f s under the fault" % reads["worst"])
        check(not (reads["tokens"] & set(refused)), "GET /token served a refused token")
        if not slow:
            status, _, body = server.request("GET", "/healthz")
            check(json.loads(body) == {"status": "degraded", "reason": "state_not_saved"},
                  "healthz under the fault: %s %r" % (status, body))
        injected = disk.injections()
        check(line is None or ("faultfs: " + " ".join(line.split()[:2])) in injected,
              "faultfs never injected %r: the run tested nothing (%r)" % (line, injected[-300:]))
        say("%d writes answered within %.1f s (%s), %d reads within %.2f s at worst"
            % (3, write_promise, "200" if slow else "503 state_not_saved", reads["count"], reads["worst"]))

        # SIGTERM mid-fault, a write in flight (on the slow disk, one that hangs).
        if slow:
            disk.inject("fsync delay %d" % HANG_MS)
        in_flight = {}

        def last_write():
            try:
                in_flight["answer"] = server.register(tokens[4], 10)
            except Exception as error:  # a connection closed without an answer
                in_flight["error"] = error

        writer = threading.Thread(target=last_write, daemon=True)
        writer.start()
        # The last write reaches the server (it hangs in the fsync) before the SIGTERM.
        time.sleep(0.2)
        signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(STOP_PROMISE + 10)
        took = time.monotonic() - signalled
        if code is None:
            server.kill()
        check(code == 0 and took <= STOP_PROMISE,
              "SIGTERM mid-fault: exit %s after %.2f s, expected 0 within %.1f s; stderr: %s"
              % (code, took, STOP_PROMISE, server.stderr()[-800:]))
        writer.join(10)
        answer = in_flight.get("answer")
        check(answer is not None, "the write in flight at SIGTERM got no answer: %r" % in_flight.get("error"))
        if answer[0] == 200:
            acknowledged = tokens[4]
        else:
            refused.append(tokens[4])
        if slow:
            # The store gave the hung write up on its own (StateFileStore's stopWait), within the
            # service's wait for it.
            check("did not stop within" not in server.stderr(),
                  "the state file's store did not stop by itself: %s" % server.stderr()[-600:])
            # The process exited while its writer waited in the hung fsync: faultfs saw it go.
            deadline = time.monotonic() + 5
            while "faultfs: fsync interrupted" not in disk.injections():
                check(time.monotonic() < deadline, "the write in flight never waited in the hung fsync: %r"
                      % disk.injections()[-300:])
                time.sleep(0.02)
        say("SIGTERM mid-fault: exit 0 in %.2f s; the write in flight answered %s%s"
            % (took, answer[0], " (its fsync was still hung)" if slow else ""))
        while True:
            try:
                events.append(stream.next_token_event(timeout=5))
            except Failure as error:
                check("ended" in str(error), "the stream did not end: %s" % error)
                break
        streamed = [token for _, token in events]
        check(not (set(streamed) & set(refused)), "a refused write was streamed: %r" % events)

        disk.clear()
        again = Server(binary, BASE_ARGS + ["--state-file", path], workdir=root).start()
        served = again.token()
        landed = name == "fsyncdir-eio" and served in refused
        check(served == acknowledged or landed,
              "after the restart GET /token is %r, expected the last acknowledged %r" % (served, acknowledged))
        stream = EventStream(again.port)
        events.append(stream.next_token_event())
        status, _, body = again.register(tokens[5])
        check(status == 200, "the write after the restart answered %s %r" % (status, body))
        events.append(stream.next_token_event())
        check(events[-1][1] == tokens[5], "the event after the restart's write is %r" % (events[-1],))
        stream.close()
        check(again.stop() == 0, "the restarted server did not exit 0")
        named = {}
        for event_id, token in events:
            check(named.setdefault(event_id, token) == token,
                  "id %d names two tokens: %r" % (event_id, events))
        say("restart serves %s; the next write took id %d; %d events, no id names two tokens"
            % ("a refused token whose rename landed" if landed else "the last acknowledged token",
               events[-1][0], len(events)))
        report[name] = None
    except BaseException as error:
        report[name] = "%s: %s" % (type(error).__name__, error)
        say("FAILED: %s" % report[name])
        traceback.print_exc()
    finally:
        for process in (server, again):
            if process is not None:
                process.kill()
        try:
            disk.close()
        except BaseException as error:
            report[name] = report.get(name) or "cleanup failed: %s" % error


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--only", default=",".join(RUNS))
    args = parser.parse_args()
    names = [name for name in args.only.split(",") if name]
    for name in names:
        check(name in RUNS, "unknown run %r (runs: %s)" % (name, ", ".join(RUNS)))
    require_tools()
    workdir = tempfile.mkdtemp(prefix="e2e-state-faults-")
    try:
        faultfs = build_faultfs(workdir)
        report = {}
        threads = [threading.Thread(target=one_run, args=(name, args.server, faultfs, workdir, report), daemon=True)
                   for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(150)
        failed = {name: report.get(name, "did not finish") for name in names if report.get(name, "x") is not None}
        for name in names:
            log("%-13s %s" % (name, "ok" if name not in failed else "FAIL " + failed[name]))
        check(not failed, "%d of %d fault runs failed: %s" % (len(failed), len(names), ", ".join(failed)))
    finally:
        close_disks()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(run)
