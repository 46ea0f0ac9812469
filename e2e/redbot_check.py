#!/usr/bin/env python3
"""REDbot (https://redbot.org, `redbot` on PyPI) against every route of a live server (issue 14).

REDbot is Mark Nottingham's lint for HTTP: it sends each request, then its own follow-up requests
(a conditional one with the ETag it got, a range, gzip negotiation) and notes what RFC 9110/9111
and the browsers' security headers say about the answers, each note at a level GOOD, INFO, WARN
or BAD. This check fails on any WARN or BAD note, and prints them with the request they came from.

  1. Starts SERVER on a free loopback port with a state file and registers a token.
  2. Checks, each as REDbot's HAR output (`-o har`, made in-process with REDbot's own HAR
     formatter, so that HEAD and request header fields can be set):
     GET and HEAD of /token, /healthz, /livez, /readyz, /metrics and /; a conditional GET and HEAD of /token and a
     conditional GET of / (If-None-Match with the ETag just served: a 304); an error answer
     (GET and HEAD of an unknown path: 404; GET of /register: 405).
  3. Starts SERVER again with --auth-token and --auth-scope all and checks GET /token, the
     conditional GET /token and GET / with the bearer token (`private, no-cache`), and GET
     /token without it (401).
  4. Writes every HAR document to $E2E_ARTIFACTS/redbot (default e2e/artifacts/redbot).

Notes REDbot is wrong about for this service would be listed in IGNORED below, each with why;
it is empty: every route passes as it is.

    python3 e2e/redbot_check.py --server PATH     (run by e2e/redbot_check.sh, in REDbot's venv)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from configparser import ConfigParser

import thor
from redbot.formatter import find_formatter
from redbot.resource import HttpResource

from e2e_support import Failure, Server, check, log, main, token_hex

HERE = os.path.dirname(os.path.abspath(__file__))

# note_id -> why REDbot is wrong about it for this service. The one place to ignore a note.
IGNORED = {}

FAILING_LEVELS = ("WARN", "BAD")


def redbot_har_here(url, method, headers):
    """REDbot's HAR document for one request, as `redbot -o har URL` prints it (in this process:
    thor's loop is run once per process, so `redbot_har` calls this in a child process)."""
    parser = ConfigParser()
    parser.read_dict({"redbot": {"enable_local_access": "True"}})  # as the redbot CLI sets it
    config = parser["redbot"]
    resource = HttpResource(config)
    resource.set_request(url, method=method, headers=list(headers))
    output = []
    formatter = find_formatter("har", "text", False)(config, resource, output.append,
                                                     {"tty_out": False, "descend": False})
    formatter.bind_resource(resource)

    @thor.events.on(formatter)
    def formatter_done():
        thor.stop()

    resource.check()
    thor.run()
    return "".join(output)


def redbot_har(url, method="GET", headers=()):
    """REDbot's HAR document for one request (a child process runs `redbot_har_here`)."""
    command = [sys.executable, os.path.abspath(__file__), "--one", method, url]
    for name, value in headers:
        command += [name, value]
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        raise Failure("REDbot did not finish checking %s %s within 30 s" % (method, url))
    check(done.returncode == 0, "REDbot failed on %s %s: %s" % (method, url, done.stderr.decode(errors="replace")[-2000:]))
    document = json.loads(done.stdout)
    error = document["log"].get("_red_error")
    check(error is None, "REDbot could not check %s %s: %s" % (method, url, error))
    check(document["log"]["entries"], "REDbot returned no entry for %s %s" % (method, url))
    return document


class Run:
    def __init__(self, artifacts):
        self.artifacts = artifacts
        self.problems = []
        self.ignored = []
        self.count = 0

    def check(self, port, label, path, method="GET", headers=(), status=None):
        url = "http://127.0.0.1:%d%s" % (port, path)
        document = redbot_har(url, method, headers)
        self.count += 1
        name = "%02d-%s.har" % (self.count, "".join(c if c.isalnum() else "-" for c in label).strip("-"))
        with open(os.path.join(self.artifacts, name), "w") as f:
            json.dump(document, f, indent=2)
        entry = document["log"]["entries"][0]
        got = entry["response"]["status"]
        if status is not None:
            check(got == status, "%s: %s %s answered %s, expected %s" % (label, method, path, got, status))
        notes = entry["_red_messages"]
        levels = {}
        for note in notes:
            levels[note["level"]] = levels.get(note["level"], 0) + 1
            if note["level"] not in FAILING_LEVELS:
                continue
            if note["note_id"] in IGNORED:
                self.ignored.append((label, note))
                continue
            self.problems.append((label, method, path, note))
        log("  %-40s %s %-28s %s  %s" % (label, method, path, got,
                                          ", ".join("%s %d" % kv for kv in sorted(levels.items()))))
        return entry

    def etag(self, entry):
        for header in entry["response"]["headers"]:
            if header["name"].lower() == "etag":
                return header["value"].strip()
        raise Failure("no ETag in the answer to %s" % entry["request"]["url"])


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    args = parser.parse_args()

    artifacts = os.path.join(os.environ.get("E2E_ARTIFACTS") or os.path.join(HERE, "artifacts"), "redbot")
    os.makedirs(artifacts, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="e2e-redbot-")
    checks = Run(artifacts)

    # -- open service --------------------------------------------------------------------------
    server = Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off",
                                  "--state-file", os.path.join(workdir, "state.json")], workdir=workdir).start()
    try:
        status, _, body = server.register(token_hex(0x4ED, 1))
        check(status == 200, "POST /register answered %s: %r" % (status, body))
        port = server.port
        log("server pid %d on port %d" % (server.proc.pid, port))
        token = checks.check(port, "token", "/token", status=200)
        checks.check(port, "token head", "/token", "HEAD", status=200)
        etag = checks.etag(token)
        checks.check(port, "token conditional", "/token", headers=[("If-None-Match", etag)], status=304)
        checks.check(port, "token conditional head", "/token", "HEAD", headers=[("If-None-Match", etag)], status=304)
        checks.check(port, "token conditional weak", "/token", headers=[("If-None-Match", "W/" + etag)], status=304)
        checks.check(port, "healthz", "/healthz", status=200)
        checks.check(port, "healthz head", "/healthz", "HEAD", status=200)
        checks.check(port, "livez", "/livez", status=200)
        checks.check(port, "livez head", "/livez", "HEAD", status=200)
        checks.check(port, "readyz", "/readyz", status=200)
        checks.check(port, "readyz head", "/readyz", "HEAD", status=200)
        checks.check(port, "metrics", "/metrics", status=200)
        checks.check(port, "metrics head", "/metrics", "HEAD", status=200)
        page = checks.check(port, "page", "/", status=200)
        checks.check(port, "page head", "/", "HEAD", status=200)
        checks.check(port, "page conditional", "/", headers=[("If-None-Match", checks.etag(page))], status=304)
        checks.check(port, "error 404", "/nope", status=404)
        checks.check(port, "error 404 head", "/nope", "HEAD", status=404)
        checks.check(port, "error 405", "/register", status=405)
        check(server.stop() == 0, "the server did not exit 0 on SIGTERM")
    finally:
        server.kill()

    # -- --auth-scope all: the token and the page need the bearer token ------------------------
    secret = "redbot-" + token_hex(0x4ED, 2)[:24]
    server = Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off",
                                  "--auth-token", secret, "--auth-scope", "all"], workdir=workdir).start()
    try:
        port = server.port
        bearer = [("Authorization", "Bearer " + secret)]
        log("server pid %d on port %d with --auth-scope all" % (server.proc.pid, port))
        token = checks.check(port, "auth token", "/token", headers=bearer, status=200)
        check(any(h["name"].lower() == "cache-control" and h["value"].strip() == "private, no-cache"
                  for h in token["response"]["headers"]),
              "GET /token with --auth-scope all: Cache-Control is not 'private, no-cache': %r"
              % token["response"]["headers"])
        checks.check(port, "auth token conditional", "/token",
                     headers=bearer + [("If-None-Match", checks.etag(token))], status=304)
        checks.check(port, "auth page", "/", headers=bearer, status=200)
        checks.check(port, "auth error 401", "/token", status=401)
        check(server.stop() == 0, "the server did not exit 0 on SIGTERM")
    finally:
        server.kill()

    for label, note in checks.ignored:
        log("ignored %s %s on %s: %s" % (note["level"], note["note_id"], label, IGNORED[note["note_id"]]))
    if checks.problems:
        for label, method, path, note in checks.problems:
            log("REDbot %s %s on %s (%s %s): %s" % (note["level"], note["note_id"], label, method, path,
                                                    note["summary"]))
        raise Failure("REDbot reported %d WARN or BAD notes; HAR documents in %s" % (len(checks.problems), artifacts))
    log("REDbot: %d requests, no WARN or BAD note; HAR documents in %s" % (checks.count, artifacts))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--one":
        pairs = sys.argv[4:]
        sys.stdout.write(redbot_har_here(sys.argv[3], sys.argv[2], list(zip(pairs[0::2], pairs[1::2]))))
    else:
        main(run)
