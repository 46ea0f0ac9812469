#!/usr/bin/env python3
"""End-to-end: --state-file / FORGE_PUSH_TOKEN_STATE_FILE.

  (a) restart: register A then B, stop (SIGTERM), start again with the same file (the second time
      through the environment variable): GET /token is B and the stream's first id is the old last
      id; the file is already up to date when each POST is answered.
  (b) unparsable file (garbage, truncated JSON, empty, an invalid token): the server exits 1 within
      a few seconds, never listens, and one line of standard error names the file.
  (c) unwritable: after start the state file's folder is replaced by a regular file (root ignores
      permission bits, so chmod cannot make it unwritable): a change gets 503 `state_not_saved`
      and /healthz answers 200 {"status":"degraded","reason":"state_not_saved"}; once the folder is back, the next change
      gets 200, lands in the file, and /healthz is {"status":"ok"} again.
  (d) crash: ITERATIONS (100) times start the server on the file left by the previous kill, check
      that GET /token and the stream agree with the file, let several threads POST distinct tokens
      while a subscriber reads the stream, SIGKILL at a random moment 50-400 ms in; the file must
      parse and hold a token that was in flight or one acknowledged after every acknowledged
      request was sent (never one older than the last acknowledged), with a version between the
      acknowledged and the sent counts; and no event id the subscriber saw is above the file's
      version (group commit, issue 32: no event is streamed before the write that holds it).

  (e) the last version: a file at version 2^64 - 1 loads and is served, but every change answers
      503 store_unavailable and /healthz answers 200 {"status":"degraded","reason":
      "version_exhausted"} (it said "ok" before: attack finding, issue 21); the file is unchanged.
  (f) a write answered 503 state_not_saved (issue 42, finding 4; a folder where the temporary file
      goes): no stream event carries it (the stream, ended by SIGTERM, holds every event the
      server sent), GET /token still answers the token before it, and after a restart and the next
      write no id names two tokens, in the events of both runs. Then again with the token served
      written once more before the restart (the file then records the version tried, "tried"):
      the next write after the restart takes a version above it.

    python3 e2e/state_file_test.py --server PATH [--iterations 100] [--seed N] [--only a,b,c,d,e,f]
"""
import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import http.client

from e2e_support import HOST, EventStream, Failure, Server, check, log, main, token_hex

BASE_ARGS = ["--host", "127.0.0.1", "--port", "0", "--access-log", "off"]


def read_state(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        state = json.loads(raw)
    except ValueError as error:
        raise Failure("state file %s does not parse (%s): %r" % (path, error, raw[:200]))
    check(isinstance(state, dict) and set(state) in ({"token", "version"}, {"token", "version", "tried"}),
          "state file %s is not {\"token\":…,\"version\":N} (with \"tried\":M): %r" % (path, state))
    check("tried" not in state or (isinstance(state["tried"], int) and state["tried"] > state["version"]),
          "state file %s: tried is not above version: %r" % (path, state))
    check(state["token"] is None or isinstance(state["token"], str), "state token %r" % state["token"])
    check(isinstance(state["version"], int) and state["version"] >= 0, "state version %r" % state["version"])
    return state


def first_stream_event(server):
    stream = EventStream(server.port)
    try:
        check(stream.status == 200, "GET /token/stream answered %s" % stream.status)
        return stream.next_token_event()
    finally:
        stream.close()


def health(server):
    status, _, body = server.request("GET", "/healthz")
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


# -- (a) ----------------------------------------------------------------------------------------
def restart_keeps_token(binary, workdir):
    log("(a) restart keeps token and version")
    path = os.path.join(workdir, "a", "state.json")
    os.makedirs(os.path.dirname(path))
    server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
    try:
        check(server.token() is None, "a fresh state file should start with no token")
        check(first_stream_event(server) == (0, None), "a fresh start's first event is not (0, null)")
        a, b = token_hex(0xA, 1), token_hex(0xB, 2)
        for version, token in ((1, a), (2, b)):
            status, _, body = server.register(token)
            check(status == 200, "register answered %s: %r" % (status, body))
            # Written before the answer: the file holds it the moment the 200 arrives.
            state = read_state(path)
            check(state == {"token": token, "version": version},
                  "right after the 200 the file holds %r, expected token %s version %d" % (state, token, version))
        last_id, _ = first_stream_event(server)
        check(last_id == 2, "stream id before restart is %d, expected 2" % last_id)
        code = server.stop()
        check(code == 0, "SIGTERM exit code %s, expected 0" % code)
    finally:
        server.kill()

    # Restart with the same file through the environment variable.
    again = Server(binary, BASE_ARGS, env={"FORGE_PUSH_TOKEN_STATE_FILE": path}, workdir=workdir).start()
    try:
        check(again.token() == b, "after restart GET /token is %r, expected B %s" % (again.token(), b))
        event = first_stream_event(again)
        check(event == (last_id, b), "after restart the first event is %r, expected (%d, B)" % (event, last_id))
        c = token_hex(0xC, 3)
        status, _, _ = again.register(c)
        check(status == 200, "register C after restart answered %s" % status)
        check(first_stream_event(again) == (3, c), "the version does not go on from 2 to 3 after restart")
        check(read_state(path) == {"token": c, "version": 3}, "file after C: %r" % read_state(path))
        check(again.stop() == 0, "second server did not exit 0 on SIGTERM")
    finally:
        again.kill()

    # A flag wins over the variable (the documented rule for every flag).
    other = os.path.join(workdir, "a", "other.json")
    flag = Server(binary, BASE_ARGS + ["--state-file", other],
                  env={"FORGE_PUSH_TOKEN_STATE_FILE": path}, workdir=workdir).start()
    try:
        check(flag.token() is None, "--state-file did not win over FORGE_PUSH_TOKEN_STATE_FILE")
    finally:
        flag.stop()
        flag.kill()

    # A bare name is a file in the working directory, saved there and read back from there (the
    # save once wrote it under its name less the first letter, and a restart lost the token).
    here = os.path.join(workdir, "a", "bare")
    os.makedirs(here)
    d = token_hex(0xD, 4)
    bare = Server(binary, BASE_ARGS + ["--state-file", "state.json"], workdir=workdir, cwd=here).start()
    try:
        status, _, body = bare.register(d)
        check(status == 200, "register with --state-file state.json answered %s: %r" % (status, body))
        check(sorted(os.listdir(here)) == ["state.json"], "the folder holds %r, not state.json alone"
              % sorted(os.listdir(here)))
        check(read_state(os.path.join(here, "state.json")) == {"token": d, "version": 1},
              "state.json holds %r" % read_state(os.path.join(here, "state.json")))
        check(bare.stop() == 0, "the bare-name server did not exit 0 on SIGTERM")
    finally:
        bare.kill()
    bare = Server(binary, BASE_ARGS + ["--state-file", "state.json"], workdir=workdir, cwd=here).start()
    try:
        check(bare.token() == d, "after a restart with a bare name GET /token is %r, not %s" % (bare.token(), d))
    finally:
        bare.stop()
        bare.kill()
    log("(a) ok: token B and id %d survived a restart; version continued to 3; a bare name too" % last_id)


# -- (e) ----------------------------------------------------------------------------------------
def last_version_degrades(binary, workdir):
    log("(e) a state file at version 2^64 - 1")
    path = os.path.join(workdir, "e", "state.json")
    os.makedirs(os.path.dirname(path))
    last = (1 << 64) - 1
    a = token_hex(0xA, 5)
    with open(path, "w") as f:
        json.dump({"token": a, "version": last}, f)
    server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
    try:
        check(server.token() == a, "GET /token at the last version is %r, expected A" % server.token())
        check(first_stream_event(server) == (last, a), "the first event is not (2^64 - 1, A)")
        check(health(server) == (200, {"status": "degraded", "reason": "version_exhausted"}),
              "healthz at the last version: %r, expected 200 degraded version_exhausted" % (health(server),))
        status, _, body = server.register(token_hex(0xB, 6))
        check(status == 503 and json.loads(body).get("error") == "store_unavailable",
              "a change at the last version answered %s %r, expected 503 store_unavailable" % (status, body))
        check(server.token() == a, "a refused change changed GET /token")
        check(read_state(path) == {"token": a, "version": last}, "a refused change changed the file")
    finally:
        server.stop()
        server.kill()
    log("(e) ok: served, every change refused, healthz degraded with the reason")


# -- (b) ----------------------------------------------------------------------------------------
def unparsable_exits_1(binary, workdir):
    log("(b) unparsable state file")
    cases = {
        "garbage": b"this is not json\n",
        "truncated": b'{"token":"a1b2","vers',
        "empty": b"",
        "invalid-token": b'{"token":"not hex","version":1}\n',
        "wrong-shape": b'[1,2,3]\n',
    }
    for name, content in cases.items():
        path = os.path.join(workdir, "b", "bad-%s.json" % name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content)
        server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).spawn()
        started = time.monotonic()
        code = server.wait(5)
        elapsed = time.monotonic() - started
        try:
            check(code is not None, "%s: the server still runs 5 s after starting with %s" % (name, path))
            err = server.stderr()
            check(code == 1, "%s: exit code %s, expected 1; stderr: %r" % (name, code, err))
            check("listening on" not in err, "%s: the server listened before failing" % name)
            naming = [line for line in err.splitlines() if path in line]
            check(len(naming) == 1, "%s: expected one stderr line naming %s, got %r" % (name, path, err))
            with open(path, "rb") as f:
                check(f.read() == content, "%s: the server changed the unparsable file" % name)
            log("  %s: exit 1 in %.2f s: %s" % (name, elapsed, naming[0].strip()))
        finally:
            server.kill()
    log("(b) ok")


# -- (c) ----------------------------------------------------------------------------------------
def unwritable_degrades(binary, workdir):
    log("(c) unwritable state file")
    folder = os.path.join(workdir, "c", "state-folder")
    os.makedirs(folder)
    path = os.path.join(folder, "state.json")
    server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
    try:
        a, b, c = token_hex(0xCA, 1), token_hex(0xCB, 2), token_hex(0xCC, 3)
        check(server.register(a)[0] == 200, "register A failed")
        check(read_state(path)["token"] == a, "file does not hold A")
        check(health(server) == (200, {"status": "ok"}), "healthz before the break: %r" % (health(server),))

        # Break it: the folder becomes a regular file, so neither a temporary file beside the
        # target nor a rename into it can succeed, whatever the process's privileges.
        shutil.rmtree(folder)
        with open(folder, "w") as f:
            f.write("not a folder\n")

        status, _, body = server.register(b)
        check(status == 503, "register B with the folder gone answered %s, expected 503: %r" % (status, body))
        error = json.loads(body)
        check(error.get("error") == "state_not_saved", "503 body %r, expected error state_not_saved" % error)
        check(isinstance(error.get("message"), str) and error["message"], "503 without a message: %r" % error)
        check(health(server) == (200, {"status": "degraded", "reason": "state_not_saved"}),
              "healthz after a failed write: %r, expected 200 degraded" % (health(server),))
        after_b = server.token()
        log("  register B: 503 state_not_saved; GET /token is now %s (the interface leaves open whether "
            "an unsaved change is kept in memory)" % ("B" if after_b == b else "A" if after_b == a else repr(after_b)))
        status, _, body = server.fail("while broken")
        check(status == 503 and json.loads(body).get("error") == "state_not_saved",
              "POST /fail with the folder gone answered %s %r, expected 503 state_not_saved" % (status, body))
        check(health(server)[1] == {"status": "degraded", "reason": "state_not_saved"}, "healthz not degraded after the second failure")
        log("  POST /fail: 503 state_not_saved, healthz still degraded; GET /token is now %r" % server.token())

        # Fix it: the next change is written and health is ok again.
        os.unlink(folder)
        os.makedirs(folder)
        status, _, body = server.register(c)
        check(status == 200, "register C after the fix answered %s: %r" % (status, body))
        state = read_state(path)
        check(state["token"] == c, "after the fix the file holds %r, expected C" % state)
        check(health(server) == (200, {"status": "ok"}),
              "healthz after a successful write: %r, expected 200 ok" % (health(server),))
        check(server.token() == c, "GET /token after the fix is not C")
        version = state["version"]
        check(server.stop() == 0, "server did not exit 0 on SIGTERM")
    finally:
        server.kill()
    again = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
    try:
        check(again.token() == c, "restart after the fix: GET /token is not C")
        check(first_stream_event(again)[0] == version, "restart after the fix: stream id != file version")
    finally:
        again.stop()
        again.kill()
    log("(c) ok")


# -- (d) ----------------------------------------------------------------------------------------
class Poster(threading.Thread):
    """POSTs distinct tokens on one keep-alive connection until the server dies or `stop` is set."""

    def __init__(self, port, iteration, index, stop, records, lock):
        super().__init__(daemon=True)
        self.port, self.iteration, self.index = port, iteration, index
        self.stop, self.records, self.lock = stop, records, lock
        self.unexpected = None

    def run(self):
        conn = http.client.HTTPConnection(HOST, self.port, timeout=3)
        n = 0
        try:
            while not self.stop.is_set() and n < 100000:
                n += 1
                token = token_hex(0xD0000000 | self.iteration, self.index, n)
                record = {"token": token, "sent": time.monotonic(), "acked": None}
                with self.lock:
                    self.records.append(record)
                try:
                    conn.request("POST", "/register", body=token.encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
                    response = conn.getresponse()
                    body = response.read()
                except (OSError, http.client.HTTPException):
                    return  # the server was killed: this request stays "in flight"
                if response.status != 200:
                    self.unexpected = "POST answered %s: %r" % (response.status, body[:200])
                    return
                record["acked"] = time.monotonic()
        finally:
            conn.close()


class StreamWatcher(threading.Thread):
    """Reads a /token/stream until it ends (the SIGKILL), keeping the highest event id seen."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.stream = EventStream(port, timeout=5)
        self.highest = None
        self.events = 0

    def run(self):
        try:
            while True:
                event_id, _ = self.stream.next_token_event(timeout=15)
                self.events += 1
                self.highest = event_id if self.highest is None else max(self.highest, event_id)
        except (Failure, OSError, ValueError):
            return


def crash_iterations(binary, workdir, iterations, rng, threads):
    log("(d) SIGKILL crash test: %d iterations, %d posting threads" % (iterations, threads))
    path = os.path.join(workdir, "d", "state.json")
    os.makedirs(os.path.dirname(path))
    expected = None  # the file's contents after the previous kill
    totals = {"acked": 0, "sent": 0, "in_flight_kept": 0}
    for iteration in range(1, iterations + 1):
        server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
        records, lock, stop = [], threading.Lock(), threading.Event()
        posters = []
        try:
            # Restart must succeed and agree with the file.
            current = server.token()
            if expected is not None:
                check(current == expected["token"], "iteration %d: after restart GET /token is %r, the file "
                      "held %r" % (iteration, current, expected["token"]))
                event = first_stream_event(server)
                check(event == (expected["version"], expected["token"]),
                      "iteration %d: first stream event %r, the file held %r" % (iteration, event, expected))
            before = read_state(path) if os.path.exists(path) else {"token": None, "version": 0}
            watcher = StreamWatcher(server.port)
            watcher.start()
            posters = [Poster(server.port, iteration, i, stop, records, lock) for i in range(threads)]
            for poster in posters:
                poster.start()
            delay = rng.uniform(0.050, 0.400)
            # The kill's moment, random among the writes (the crash test's point; its rng is seeded).
            time.sleep(delay)
            server.kill()
            killed = time.monotonic()
        finally:
            stop.set()
            server.kill()
            for poster in posters:
                poster.join(10)
                check(not poster.is_alive(), "a posting thread did not end within 10 s")
        for poster in posters:
            check(poster.unexpected is None, "iteration %d: %s" % (iteration, poster.unexpected))

        state = read_state(path)
        watcher.join(10)
        check(watcher.highest is not None, "iteration %d: the subscriber saw no event" % iteration)
        check(watcher.highest <= state["version"],
              "iteration %d: the stream carried id %d, above the file's version %d after SIGKILL (an event "
              "streamed before its write)" % (iteration, watcher.highest, state["version"]))
        totals["streamed"] = totals.get("streamed", 0) + watcher.events
        with lock:
            done = list(records)
        acked = [r for r in done if r["acked"] is not None]
        unacked = [r for r in done if r["acked"] is None]
        by_token = {r["token"]: r for r in done}
        if acked:
            latest_send = max(r["sent"] for r in acked)
            last_acked = max(acked, key=lambda r: r["acked"])
            # An acknowledged token is still allowed only if no other acknowledged request was
            # sent after its answer came (that one was then certainly applied after it).
            allowed_acked = {r["token"] for r in acked if r["acked"] > latest_send}
            check(last_acked["token"] in allowed_acked, "internal: the last acknowledged token is not allowed")
        else:
            last_acked, allowed_acked = None, set()
        allowed = allowed_acked | {r["token"] for r in unacked}
        if not acked:
            allowed.add(before["token"])  # nothing acknowledged: the old state may remain
        check(state["token"] in allowed,
              "iteration %d: after SIGKILL at %.0f ms the file holds %r (%s); the last acknowledged was %r, "
              "%d were in flight" % (iteration, delay * 1000, state["token"],
                                     "acknowledged at %.1f ms" % ((by_token[state["token"]]["acked"] - killed) * 1000)
                                     if state["token"] in by_token and by_token[state["token"]]["acked"]
                                     else "never sent" if state["token"] not in by_token else "in flight",
                                     last_acked and last_acked["token"], len(unacked)))
        low, high = before["version"] + len(acked), before["version"] + len(done)
        check(low <= state["version"] <= high,
              "iteration %d: file version %d outside [%d acknowledged, %d sent]" % (iteration, state["version"], low, high))
        kept_in_flight = state["token"] in {r["token"] for r in unacked}
        totals["acked"] += len(acked)
        totals["sent"] += len(done)
        totals["in_flight_kept"] += kept_in_flight
        log("  %2d: kill at %3.0f ms, %3d acknowledged, %d in flight, file v%d holds %s" % (
            iteration, delay * 1000, len(acked), len(unacked), state["version"],
            "an in-flight token" if kept_in_flight else
            "the last acknowledged" if last_acked and state["token"] == last_acked["token"] else
            "an acknowledged token" if acked else "the previous token"))
        expected = state

    final = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
    try:
        check(final.token() == expected["token"], "final restart: GET /token differs from the file")
        check(first_stream_event(final) == (expected["version"], expected["token"]),
              "final restart: the first event differs from the file")
        check(final.stop() == 0, "final server did not exit 0 on SIGTERM")
    finally:
        final.kill()
    check(totals["acked"] > 0, "no POST was ever acknowledged: the crash test tested nothing")
    log("(d) ok: %d POSTs acknowledged of %d sent; the file held an in-flight token %d times; %d events "
        "streamed, none above the file's version after its kill"
        % (totals["acked"], totals["sent"], totals["in_flight_kept"], totals.get("streamed", 0)))


# -- (f) ----------------------------------------------------------------------------------------
def stream_until_end(stream, events):
    """Appends every (id, token) event until the stream ends (SIGTERM ends it after every event
    the server sent); fails when it does not end within 10 s."""
    while True:
        try:
            events.append(stream.next_token_event(timeout=10))
        except Failure as error:
            check("ended" in str(error), "the stream did not end: %s" % error)
            return


def not_saved_is_not_streamed(binary, workdir):
    log("(f) a write answered 503 state_not_saved is neither streamed nor served (issue 42, finding 4)")
    for variant in ("restart at once", "the served token written again first"):
        folder = os.path.join(workdir, "f", variant.replace(" ", "-"))
        os.makedirs(folder)
        path = os.path.join(folder, "state.json")
        events = []
        server = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
        a, b, d = token_hex(0xFA, 1), token_hex(0xFB, 2), token_hex(0xFD, 4)
        try:
            stream = EventStream(server.port)
            events.append(stream.next_token_event())
            check(server.register(a)[0] == 200, "register A failed")
            events.append(stream.next_token_event())
            check(events[-1] == (1, a), "the stream's event after A is %r" % (events[-1],))
            os.mkdir(path + ".tmp")
            status, _, body = server.register(b)
            check(status == 503 and json.loads(body).get("error") == "state_not_saved",
                  "register B with a folder at the temporary name answered %s %r" % (status, body))
            check(server.token() == a, "GET /token after the 503 is %r, expected A (the token before it)"
                  % server.token())
            check(health(server) == (200, {"status": "degraded", "reason": "state_not_saved"}),
                  "healthz after the 503: %r" % (health(server),))
            log("  %s: register B answered 503 state_not_saved; GET /token still A" % variant)
            os.rmdir(path + ".tmp")
            tried = None
            if variant != "restart at once":
                status, _, body = server.register(a)
                check(status == 200 and json.loads(body) == {"changed": False, "token": a},
                      "register A again answered %s %r" % (status, body))
                state = read_state(path)
                check(state == {"token": a, "version": 1, "tried": 2},
                      "the file after A again is %r, expected A at 1 with tried 2" % state)
                tried = state["tried"]
                log("  A again: 200, the file holds %r" % state)
            server_stop_at = time.monotonic()
            os.kill(server.pid, signal.SIGTERM)
            stream_until_end(stream, events)
            code = server.wait(10)
            check(code == 0, "SIGTERM exit code %s" % code)
            log("  SIGTERM: exit 0 in %.2f s; the stream carried %r" % (
                time.monotonic() - server_stop_at, [(i, "A" if t == a else "B" if t == b else t) for i, t in events]))
            check(all(token != b for _, token in events), "the refused token B was streamed: %r" % events)
        finally:
            server.kill()
        again = Server(binary, BASE_ARGS + ["--state-file", path], workdir=workdir).start()
        try:
            check(again.token() == a, "after the restart GET /token is %r, expected A" % again.token())
            stream = EventStream(again.port)
            events.append(stream.next_token_event())
            check(events[-1] == (1, a), "after the restart the first event is %r, expected (1, A)" % (events[-1],))
            check(again.register(d)[0] == 200, "register D after the restart failed")
            events.append(stream.next_token_event())
            check(events[-1][1] == d, "the event after D is %r" % (events[-1],))
            if tried is not None:
                check(events[-1][0] > tried, "D took id %d, not above the version tried (%d)" % (events[-1][0], tried))
            stream.close()
            check(again.stop() == 0, "the restarted server did not exit 0 on SIGTERM")
        finally:
            again.kill()
        named = {}
        for event_id, token in events:
            check(named.setdefault(event_id, token) == token,
                  "id %d names two tokens: %r and %r (events %r)" % (event_id, named[event_id], token, events))
        log("  %s: after the restart D has id %d; no id names two tokens" % (variant, events[-1][0]))
    log("(f) ok")


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("E2E_SEED", "0")) or None)
    parser.add_argument("--only", default="a,b,c,d,e,f")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1, 1 << 30)
    log("seed %d (rerun with --seed %d)" % (seed, seed))
    rng = random.Random(seed)
    parts = set(args.only.split(","))
    workdir = tempfile.mkdtemp(prefix="e2e-state-")
    try:
        if "a" in parts:
            restart_keeps_token(args.server, workdir)
        if "b" in parts:
            unparsable_exits_1(args.server, workdir)
        if "c" in parts:
            unwritable_degrades(args.server, workdir)
        if "d" in parts:
            crash_iterations(args.server, workdir, args.iterations, rng, args.threads)
        if "e" in parts:
            last_version_degrades(args.server, workdir)
        if "f" in parts:
            not_saved_is_not_streamed(args.server, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(run)
