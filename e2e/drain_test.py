#!/usr/bin/env python3
"""The drain of a stopping service against the release binary (docs/operations.md, "Deploying
and upgrading"; ../shared/spec/deploy.md, "Draining").

1. `--drain-seconds 10` with 2,000 event streams: on SIGTERM every stream ends cleanly (the
   chunked terminator), spread as the spec says, measured from each stream's own end time: the
   k-th end (in time order) inside the k-th slot of N/S seconds, at most max(1, ceil(2 S 0.1 / N))
   ends in any 100 ms, none before the signal, the last within N. Meanwhile the service is still
   served: /readyz and /healthz answer 503 draining, /livez 200, `--health-check=ready` fails
   while `--health-check=live` passes, a write and a read answer 200, /metrics says draining 1,
   and a new stream gets 200, `retry:`, its event and the end. A SIGHUP mid-window changes
   nothing. The process exits 0 within N + 3 s.
2. A second SIGTERM during a 60 s drain ends every remaining stream at once.
3. A drain with no streams still lasts its window (issue 42 finding 6): with `--drain-seconds 3`
   writes sent 0.25 s and 2.5 s after SIGTERM are served (/readyz says 503), and the process exits
   0 between N and N + 3 s; a second SIGTERM ends a 600 s one at once.
4. Out-of-range flags exit 64.
6. A stop with writes in flight to a hung Redis (a real redis-server stopped by SIGSTOP, issue 42
   finding 2): with `--drain-seconds` 0 and 1, six writes sent before SIGTERM are each answered (a 503,
   never a hang or a closed connection) and the process exits 0 within N + 3 s, where
   libmicrohttpd used to abort the process, which then wedged for over 30 s.
7. A crash ends the process quickly (issue 42), under the backtracer settings of docker/Dockerfile
   (`SWIFT_BACKTRACE`, with this toolchain's swift-backtrace-static): a deliberate fatal error on a
   worker thread (`FPT_TEST_CRASH_ON_SIGUSR2=1` and SIGUSR2, a test-only switch) while the main
   thread waits for signals, and again while a drain is under way, prints the backtrace and the
   process is gone within 5 s, killed by the fatal error's signal. Every thread alive just before
   the crash leaves SIGUSR1, SIGUSR2 or SIGPROF open: the runtime's crash handler pauses each
   thread with the first of them /proc says it leaves open (the swift repository's
   stdlib/public/runtime/CrashHandlerLinux.cpp, `signal_for_suspend`); a thread being created,
   all signals blocked for an instant, is waited for. The handler's "failed to suspend thread N"
   warning is counted, not failed on: it names a thread caught in glibc's pthread_create at the
   crash (the new thread, or its creator, has every signal blocked for that instant; the crash's
   own Dispatch work starts a worker), and the handler's next pass pauses it.
5. `--max-stream-age 60` (run beside the others): 200 streams each end cleanly between 30 and 60 s
   (plus the pacing) after they opened, at spread-out moments, counted as `age`, and no 100 ms
   slice holds more than max(1, ceil(2 S 0.1 / (A / 2))) = 2 of their ends (issue 42 finding 5:
   the once-a-second sweep ended about 7 at once).

Prints its numbers. Usage: e2e/drain_test.py --server PATH
"""
import argparse
import multiprocessing
import os
import re
import shutil
import threading
import selectors
import signal
import socket
import struct
import subprocess
import time

from e2e_support import (HOST, EventStream, Server, check, free_port, log, main, metric_value, open_subscribers,
                         request, streams_ended_settles, token_hex, wait_until)

TERMINATOR = b"\r\n0\r\n\r\n"
# Linux's SO_TIMESTAMPNS (asm-generic/socket.h; Python's socket module does not name it): each
# received segment carries the kernel's CLOCK_REALTIME of its arrival, so an end is timed when it
# reached this machine's socket, not when this (possibly descheduled) process got to read it.
SO_TIMESTAMPNS = 35


def bound_per_100ms(streams, seconds):
    """max(1, ceil(2 x S x 0.1 / N)), the spec's bound."""
    return max(1, -(-2 * streams // (10 * seconds)))


def busiest_100ms(times):
    """The most of the sorted `times` inside any 100 ms slice."""
    most, low = 0, 0
    for high in range(len(times)):
        while times[high] - times[low] >= 0.1:
            low += 1
        most = max(most, high - low + 1)
    return most


def watch_ends(sockets, deadline):
    """Reads every socket until it ends; returns ({socket index: when its clean end arrived, on
    the monotonic clock}, [indices that closed without the terminator])."""
    selector = selectors.DefaultSelector()
    tails = {}
    offset = time.monotonic() - time.time()  # kernel arrival times are wall-clock
    for index, sock in enumerate(sockets):
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)
        tails[index] = b"\r\n"  # open_subscribers read up to the end of a chunk
    ended, broken = {}, []
    while len(ended) + len(broken) < len(sockets) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.05):
            index = key.data
            now = time.monotonic()
            try:
                chunk, ancillary, _, _ = key.fileobj.recvmsg(65536, socket.CMSG_SPACE(16))
            except BlockingIOError:
                continue
            except OSError:
                chunk, ancillary = b"", []
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                    seconds, nanoseconds = struct.unpack("qq", data[:16])
                    now = seconds + nanoseconds / 1e9 + offset
            if chunk:
                tails[index] = (tails[index] + chunk)[-16:]
                if not tails[index].endswith(TERMINATOR):
                    continue
                ended[index] = now
            else:
                broken.append(index)
            selector.unregister(key.fileobj)
    selector.close()
    return ended, broken


def read_stream_to_end(port, timeout=5):
    """A new `GET /token/stream` read to its end: (status, body text, ended cleanly)."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    try:
        sock.sendall(b"GET /token/stream HTTP/1.1\r\nHost: e2e\r\nAccept: text/event-stream\r\n\r\n")
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(TERMINATOR) and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None
        return status, body.decode("utf-8", "replace"), data.endswith(TERMINATOR)
    finally:
        sock.close()


def health_check(binary, port, probe):
    """`--health-check=PROBE` of the service on `port`: its exit code."""
    return subprocess.run([binary, "--health-check=" + probe, "--port", str(port)], env={"PATH": "/usr/bin:/bin"},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode


def during_the_window(binary, port, pid, pipe):
    """What a draining service still does, asked during the window from a child process (so that
    the parent, which timestamps every stream's end, is never held up by it)."""
    results = {}
    try:
        # A second into the window (10 s; real clock), not at its edge: what a draining service answers.
        time.sleep(1.0)
        status, _, body = request(port, "GET", "/readyz")
        results["readyz"] = (status, body)
        status, _, body = request(port, "GET", "/healthz")
        results["healthz"] = (status, body)
        status, _, body = request(port, "GET", "/livez")
        results["livez"] = (status, body)
        results["check_live"] = health_check(binary, port, "live")
        results["check_ready"] = health_check(binary, port, "ready")
        status, _, _ = request(port, "POST", "/register", body=token_hex(29, 2).encode(),
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        results["write"] = status
        status, _, body = request(port, "GET", "/token")
        results["read"] = (status, body)
        results["new_stream"] = read_stream_to_end(port)
        status, _, body = request(port, "GET", "/metrics")
        text = body.decode()
        results["metrics"] = (status, metric_value(text, "forge_push_token_draining"),
                              metric_value(text, 'forge_push_token_streams_ended_total{reason="drain"}'))
        # Some 3 s into the window, while streams are still being ended: the SIGHUP must change nothing.
        time.sleep(2.0)
        os.kill(pid, signal.SIGHUP)  # changes nothing about the drain
        results["sighup_at"] = time.monotonic()
    except Exception as error:  # reported by the parent
        results["error"] = repr(error)
    pipe.send(results)  # synchronous, unlike a multiprocessing.Queue's feeder thread
    pipe.close()
    # Not through the parent's exit handlers, which would kill the servers it started.
    os._exit(0)


def spread(binary):
    streams, seconds = 2000, 10
    server = Server(binary, ["--port", "0", "--drain-seconds", str(seconds), "--max-subscribers", "3000",
                             "--access-log", "off"]).start()
    try:
        status, _, _ = server.register(token_hex(29, 1))
        check(status == 200, "the first write answered %s" % status)
        sockets = open_subscribers(server.port, streams, timeout=20)
        log("%d subscribers open" % streams)
        receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
        helper = multiprocessing.get_context("fork").Process(target=during_the_window,
                                                             args=(binary, server.port, server.pid, sender))
        signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        helper.start()
        ended, broken = watch_ends(sockets, signalled + seconds + 5)
        results = receiver.recv() if receiver.poll(30) else {"error": "the helper process gave no results"}
        helper.join(10)
        code = server.wait(timeout=max(1.0, signalled + seconds + 4 - time.monotonic()))
        exited = time.monotonic() - signalled
        for sock in sockets:
            sock.close()
        check("error" not in results, "during the window: %s" % results.get("error"))
        check(not broken, "%d streams closed without the chunked terminator" % len(broken))
        check(len(ended) == streams, "%d of %d streams ended within N + 5 s" % (len(ended), streams))
        times = sorted(t - signalled for t in ended.values())
        slot = seconds / streams
        # The k-th end inside the k-th slot, measured from the signal: never early (the server's
        # window starts after the signal is sent), late by no more than the signal's delivery, a
        # thread's wake-up and this reader's loop (250 ms).
        early = [k for k, t in enumerate(times) if t < k * slot - 0.005]
        late = [k for k, t in enumerate(times) if t > (k + 1) * slot + 0.25]
        busiest = busiest_100ms(times)
        bound = bound_per_100ms(streams, seconds)
        per_second = [sum(1 for t in times if s <= t < s + 1) for s in range(seconds + 1)]
        log("drain of %d streams over %d s: first end %.3f s, last %.3f s after SIGTERM; busiest 100 ms %d"
            " (bound %d); per second %s; ends before their slot %d, after it + 250 ms %d; exit %s after %.2f s"
            % (streams, seconds, times[0], times[-1], busiest, bound, per_second, len(early), len(late), code, exited))
        check(not early, "%d ends came before their slot (first: #%d at %.3f s)"
              % (len(early), early[0], times[early[0]]) if early else "")
        check(not late, "%d ends came over 250 ms after their slot (first: #%d at %.3f s, slot ends %.3f s)"
              % (len(late), late[0], times[late[0]], (late[0] + 1) * slot) if late else "")
        check(busiest <= bound, "%d ends in one 100 ms slice, over the bound %d" % (busiest, bound))
        check(times[-1] <= seconds + 0.25, "the last stream ended %.3f s after the signal" % times[-1])
        check(code == 0, "the service exited with %s" % code)
        check(exited <= seconds + 3 + 0.5, "the service took %.2f s to exit, over N + 3" % exited)
        # What the window still served.
        check(results["readyz"][0] == 503 and b'"draining"' in results["readyz"][1], "/readyz: %r" % (results["readyz"],))
        check(results["healthz"][0] == 503 and b'"draining"' in results["healthz"][1], "/healthz: %r" % (results["healthz"],))
        check(results["livez"] == (200, b'{"status":"ok"}'), "/livez: %r" % (results["livez"],))
        check(results["check_live"] == 0 and results["check_ready"] == 1,
              "--health-check=live exited %s, =ready %s while draining" % (results["check_live"], results["check_ready"]))
        check(results["write"] == 200, "a write during the window answered %s" % results["write"])
        check(results["read"][0] == 200 and token_hex(29, 2).encode() in results["read"][1],
              "a read during the window: %r" % (results["read"],))
        status, body, clean = results["new_stream"]
        check(status == 200 and "retry: " in body and body.index("retry: ") < body.index("id: ")
              and token_hex(29, 2) in body and clean,
              "a new stream during the window: %s %r (clean end: %s)" % (status, body[:200], clean))
        check(results["metrics"][0] == 200 and results["metrics"][1] == 1 and results["metrics"][2] >= 1,
              "/metrics during the window: %r" % (results["metrics"],))
        check("sighup_at" in results, "SIGHUP was not sent")
        check("received SIGHUP while stopping; ignored" in server.stderr(),
              "the service did not log the SIGHUP it ignored during the drain")
        log("during the window: /readyz %s, /healthz %s, /livez %s, write %s, read %s, new stream %s with retry:"
            " and its event, then its end; SIGHUP at %.1f s changed nothing"
            % (results["readyz"][0], results["healthz"][0], results["livez"][0], results["write"],
               results["read"][0], status, results["sighup_at"] - signalled))
    finally:
        server.kill()


def second_signal(binary):
    streams, seconds = 200, 60
    server = Server(binary, ["--port", "0", "--drain-seconds", str(seconds), "--access-log", "off"]).start()
    try:
        sockets = open_subscribers(server.port, streams)
        signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        first, broken = watch_ends(sockets, signalled + 1.0)
        check(not broken, "streams broke before the second signal")
        check(len(first) < streams // 10, "%d streams ended in the first second of a 60 s drain" % len(first))
        again = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        rest, broken = watch_ends([s for i, s in enumerate(sockets) if i not in first], again + 5)
        last = max(rest.values()) - again if rest else 0
        code = server.wait(timeout=5)
        for sock in sockets:
            sock.close()
        check(not broken and len(first) + len(rest) == streams,
              "after the second signal: %d ended cleanly, %d broken" % (len(rest), len(broken)))
        check(last < 1.0, "the last stream ended %.2f s after the second signal" % last)
        check(code == 0, "the service exited with %s" % code)
        log("second SIGTERM: %d of %d streams ended in the first second, the other %d within %.3f s of the"
            " second signal; exit %s" % (len(first), streams, len(rest), last, code))
    finally:
        server.kill()


def nothing_to_drain(binary):
    seconds = 3
    server = Server(binary, ["--port", "0", "--drain-seconds", str(seconds), "--access-log", "off"]).start()
    try:
        signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        # The SIGTERM handled (a real-clock gap: the drain has begun, well before its end).
        time.sleep(0.25)
        early = request(server.port, "POST", "/register", body=token_hex(6, 1).encode(),
                        headers={"Content-Type": "application/x-www-form-urlencoded"})[0]
        ready = request(server.port, "GET", "/readyz")[0]
        # Until 0.5 s before the window ends: writes are still served at its end (real-clock contract).
        time.sleep(max(0, signalled + seconds - 0.5 - time.monotonic()))
        late = request(server.port, "POST", "/register", body=token_hex(6, 2).encode(),
                       headers={"Content-Type": "application/x-www-form-urlencoded"})[0]
        code = server.wait(timeout=seconds + 5)
        took = time.monotonic() - signalled
        check(early == 200 and late == 200 and ready == 503,
              "with no streams, during the window: a write 0.25 s in got %s, /readyz %s, a write %.1f s in got %s"
              % (early, ready, seconds - 0.5, late))
        check(code == 0 and seconds <= took <= seconds + 3,
              "a drain with no streams exited %s after %.2f s (want 0 within [%d, %d] s)"
              % (code, took, seconds, seconds + 3))
        log("no streams: --drain-seconds %d served writes 0.25 s and %.1f s in (200, /readyz 503), exited %s"
            " after %.3f s" % (seconds, seconds - 0.5, code, took))
    finally:
        server.kill()
    server = Server(binary, ["--port", "0", "--drain-seconds", "600"]).start()
    try:
        os.kill(server.pid, signal.SIGTERM)
        wait_until(lambda: "draining 0 event streams" in server.stderr(), 5, what="the drain's start")
        again = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(timeout=5)
        took = time.monotonic() - again
        check(code == 0 and took < 4, "a second SIGTERM in a drain with no streams: exit %s after %.2f s" % (code, took))
        log("no streams, --drain-seconds 600: a second SIGTERM ended it; exit %s %.3f s later" % (code, took))
    finally:
        server.kill()


def hung_redis_stop(binary, seconds):
    writes = 6
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", HOST, "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        server = Server(binary, ["--port", "0", "--redis-url", "redis://%s:%d" % (HOST, redis_port),
                                 "--drain-seconds", str(seconds), "--access-log", "off"]).start()
        wait_until(lambda: request(server.port, "GET", "/healthz")[0] == 200, 10, what="the replica connected")
        stream = EventStream(server.port)
        stream.next_token_event()
        os.kill(redis.pid, signal.SIGSTOP)
        answers = [None] * writes

        def write(index):
            try:
                answers[index] = request(server.port, "POST", "/register", body=token_hex(0x42, index).encode(),
                                         headers={"Content-Type": "application/x-www-form-urlencoded"},
                                         timeout=20)[0]
            except Exception as error:  # a closed connection or a timeout: no answer
                answers[index] = repr(error)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writes)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # the writes reach the writer's queue; Redis answers none of them
        signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(timeout=seconds + 3 + 40)
        took = time.monotonic() - signalled
        for thread in threads:
            thread.join(5)
        stream.close()
        check(code == 0 and took <= seconds + 3,
              "with Redis hung the service exited %s after %.2f s (want 0 within %d s); log tail:\n%s"
              % (code, took, seconds + 3, server.stderr()[-1500:]))
        check(all(answer == 503 for answer in answers), "the writes in flight got %r (want a 503 each)" % answers)
        log("Redis hung (SIGSTOP), %d writes in flight: each answered 503, exit %s %.2f s after SIGTERM"
            " (--drain-seconds %d)" % (writes, code, took, seconds))
    finally:
        os.kill(redis.pid, signal.SIGCONT)
        redis.kill()
        redis.wait(5)
        if server:
            server.kill()


def image_backtrace_settings():
    """docker/Dockerfile's SWIFT_BACKTRACE, with swift-backtrace= pointing at this toolchain's
    static backtracer (the image copies the same file to its own path)."""
    dockerfile = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docker", "Dockerfile")
    with open(dockerfile) as f:
        found = re.search(r"SWIFT_BACKTRACE=(\S+)", f.read())
    check(found is not None, "docker/Dockerfile sets no SWIFT_BACKTRACE")
    swift = shutil.which("swift")
    check(swift is not None, "swift is not on PATH (the backtracer comes with the toolchain)")
    backtracer = os.path.join(os.path.dirname(os.path.realpath(swift)), "..", "libexec", "swift", "linux",
                              "swift-backtrace-static")
    check(os.access(backtracer, os.X_OK), "no swift-backtrace-static at %s" % backtracer)
    settings = re.sub(r"swift-backtrace=[^,]*", "swift-backtrace=" + os.path.realpath(backtracer), found.group(1))
    check("swift-backtrace=" in settings, "docker/Dockerfile's SWIFT_BACKTRACE names no swift-backtrace")
    return settings


# SIGUSR1, SIGUSR2 and SIGPROF as bits of /proc's SigBlk mask: a crash pauses a thread with the first
# of them the thread leaves open.
SUSPEND_SIGNALS = (1 << (signal.SIGUSR1 - 1)) | (1 << (signal.SIGUSR2 - 1)) | (1 << (signal.SIGPROF - 1))


def thread_masks(pid):
    """Each live thread of `pid` and its blocked-signal mask (/proc/PID/task/TID/status, SigBlk)."""
    masks = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                found = re.search(r"^SigBlk:\s*([0-9a-f]+)$", f.read(), re.M)
        except FileNotFoundError:
            continue
        if found:
            masks[int(tid)] = int(found.group(1), 16)
    return masks


def open_to_suspend(masks):
    """`masks` when every thread in it leaves one of SUSPEND_SIGNALS open, else None."""
    return masks if all(mask & SUSPEND_SIGNALS != SUSPEND_SIGNALS for mask in masks.values()) else None


def crash(binary):
    settings = image_backtrace_settings()
    for draining in (False, True):
        args = ["--port", "0", "--log-format", "text", "--access-log", "off"]
        if draining:
            args += ["--drain-seconds", "30"]
        server = Server(binary, args, env={"SWIFT_BACKTRACE": settings, "FPT_TEST_CRASH_ON_SIGUSR2": "1"}).start()
        stream = None
        try:
            stream = EventStream(server.port)
            stream.next_token_event()
            if draining:
                os.kill(server.pid, signal.SIGTERM)
                wait_until(lambda: "draining 1 event streams" in server.stderr(), 5, what="the drain's start")
            # A thread being created shows every signal blocked for an instant; one that stays so
            # could never be paused by a crash.
            before = wait_until(lambda: open_to_suspend(thread_masks(server.pid)), 2,
                                what="every thread to leave SIGUSR1, SIGUSR2 or SIGPROF open (a crash pauses "
                                "threads with them; %s)" % thread_masks(server.pid))
            crashed = time.monotonic()
            os.kill(server.pid, signal.SIGUSR2)
            code = server.wait(timeout=60)
            took = time.monotonic() - crashed
            text = server.stderr()
            what = "while draining" if draining else "while serving"
            check(code is not None and code < 0 and -code in (signal.SIGILL, signal.SIGTRAP),
                  "a fatal error %s ended the process with %s, not its signal; log tail:\n%s"
                  % (what, code, text[-1500:]))
            check(took < 5, "a fatal error %s: the process was gone only %.2f s later" % (what, took))
            check("deliberate crash on SIGUSR2" in text and "Program crashed" in text and "Backtrace took" in text,
                  "a fatal error %s printed no backtrace; log tail:\n%s" % (what, text[-1500:]))
            skipped = len(re.findall(r"failed to suspend thread \d+", text))
            log("a fatal error %s: backtrace printed (%s), process gone %.2f s later (signal %d); %d threads "
                "before it, all open to a pause signal; %d skipped by a pass of the crash handler"
                % (what, re.search(r"Backtrace took [0-9.]+s", text).group(0), took, -code, len(before), skipped))
        finally:
            if stream:
                stream.close()
            server.kill()


def out_of_range(binary):
    for args, env in [(["--drain-seconds", "601"], {}), (["--drain-seconds=-1"], {}),
                      (["--max-stream-age", "59"], {}), (["--max-stream-age", "86401"], {}),
                      (["--health-check=sometimes"], {}), ([], {"FORGE_PUSH_TOKEN_DRAIN_SECONDS": "1000"}),
                      ([], {"FORGE_PUSH_TOKEN_MAX_STREAM_AGE": "10"})]:
        done = subprocess.run([binary] + args, env=dict(env, PATH="/usr/bin:/bin"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=10)
        check(done.returncode == 64, "%s %s exited %s: %s" % (args, env, done.returncode, done.stderr[-300:]))
    log("out-of-range --drain-seconds, --max-stream-age, --health-check and their variables exit 64")


AGE_STREAMS = 200


def stream_age_start(binary):
    server = Server(binary, ["--port", "0", "--max-stream-age", "60", "--access-log", "off"]).start()
    sockets = open_subscribers(server.port, AGE_STREAMS)
    return server, sockets, time.monotonic()


def stream_age_finish(age):
    server, sockets, opened = age
    try:
        ended, broken = watch_ends(sockets, opened + 64)
        for sock in sockets:
            sock.close()
        ages = sorted(t - opened for t in ended.values())
        check(not broken and len(ended) == AGE_STREAMS, "--max-stream-age 60: %d of %d ended cleanly, %d broken"
              % (len(ended), AGE_STREAMS, len(broken)))
        bound = max(1, -(-2 * AGE_STREAMS // (10 * 30)))
        busiest = busiest_100ms(sorted(ended.values()))
        check(busiest <= bound, "--max-stream-age 60: %d of %d streams ended by age in one 100 ms (bound %d)"
              % (busiest, AGE_STREAMS, bound))
        # Each limit is drawn from [30, 60] s; the limits are checked every 100 ms, paced.
        check(ages[0] >= 30 - 0.2 and ages[-1] <= 60 + 1.5, "stream ages %.1f to %.1f s, outside [30, 61.5]"
              % (ages[0], ages[-1]))
        check(ages[-1] - ages[0] >= 5, "%d streams' limits all within %.1f s: not drawn"
              % (AGE_STREAMS, ages[-1] - ages[0]))
        streams_ended_settles(server.port, "age", AGE_STREAMS)
        log("--max-stream-age 60: %d streams ended cleanly %.1f to %.1f s after opening, counted as age; at most"
            " %d in any 100 ms (bound %d)" % (AGE_STREAMS, ages[0], ages[-1], busiest, bound))
        check(server.stop() == 0, "the stream-age server did not exit 0")
    finally:
        server.kill()


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    binary = os.path.abspath(parser.parse_args().server)
    out_of_range(binary)
    age = stream_age_start(binary)
    try:
        crash(binary)
        hung_redis_stop(binary, 0)
        hung_redis_stop(binary, 1)
        nothing_to_drain(binary)
        second_signal(binary)
        spread(binary)
        stream_age_finish(age)
    finally:
        age[0].kill()


if __name__ == "__main__":
    main(run)
