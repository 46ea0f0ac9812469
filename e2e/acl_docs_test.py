#!/usr/bin/env python3
"""End-to-end: the ACL user of docs/replicas.md ("Redis Sentinel", the ACLs item) is enough for a
replica, as written.

The `ACL SETUSER forge ...` command is read from docs/replicas.md and sent to a local
redis-server with redis-cli, with a random password for PASSWORD; the default user is then turned
off, so that nothing but that user's rules lets the replicas in. Two replicas log in as `forge`
(`redis://forge:PASSWORD@HOST:PORT/0`, the default key prefix `forge-push-token`, and
`--redis-probe-interval 1`). Then:

  - both report /healthz {"redis":"connected","status":"ok"}, and stay connected while several
    probes are heard (the user may publish and subscribe on `PREFIX:probe`);
  - a token registered through one replica is served by the other at the same version
    (the scripts, the hash and `PREFIX:changes`);
  - `ROLE`, which the Sentinel client sends, is allowed (`+role`);
  - a user without `+role` gets NOPERM for it, which is why the docs name it.

    python3 e2e/acl_docs_test.py --server PATH
"""
import argparse
import os
import re
import secrets
import shlex

from e2e_support import HOST, Server, check, log, main, request, token_hex, wait_until
from probe_test import probe_count
from replicas_test import Redis, health, write


def docs_acl_command():
    """The backquoted `ACL SETUSER ...` of docs/replicas.md, as a list of arguments."""
    page = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "replicas.md"),
                encoding="utf-8").read()
    found = re.findall(r"`(ACL SETUSER [^`]+)`", page)
    check(len(found) == 1, "docs/replicas.md: expected one `ACL SETUSER ...` command, found %d" % len(found))
    return shlex.split(found[0])


def run(binary):
    command = docs_acl_command()
    check(command[:3] == ["ACL", "SETUSER", "forge"] and ">PASSWORD" in command, "the docs command: %r" % command)
    password = secrets.token_hex(12)
    redis = Redis().start()
    replicas = []
    try:
        def with_password(parts):
            return [">" + password if part == ">PASSWORD" else part for part in parts]
        check(redis.cli(*with_password(command)) == "OK", "ACL SETUSER from the docs")
        # The same user without +role, to show why the docs name it.
        without = [part for part in command if part != "+role"]
        without[2] = "forge-norole"
        check(redis.cli(*with_password(without)) == "OK", "a user like the docs' one but without +role")
        check(redis.cli("ACL", "SETUSER", "default", "off") == "OK", "turning the default user off")
        url = "redis://forge:%s@%s:%d/0" % (password, HOST, redis.port)
        for _ in range(2):
            replicas.append(Server(binary, ["--host", HOST, "--port", "0", "--access-log", "off", "--redis-url", url,
                                            "--redis-probe-interval", "1"]).start())
        a, b = (server.port for server in replicas)
        wait_until(lambda: all(health(port) == (200, {"status": "ok", "redis": "connected"}) for port in (a, b)), 10,
                   what="both replicas connected as the docs' ACL user")
        wait_until(lambda: all((probe_count(port) or 0) >= 3 for port in (a, b)), 10, what="three probes heard on each")
        check(all(health(port) == (200, {"status": "ok", "redis": "connected"}) for port in (a, b)),
              "a replica left `connected` while its probes were heard")
        log("both replicas connected as `forge`, each heard %d+ probes" % 3)
        token = token_hex(0xAC1)
        status, _, body = write(a, token)
        check(status == 200 and body["token"] == token, "POST /register through the first replica: %s %r" % (status, body))
        wait_until(lambda: request(b, "GET", "/token")[2] == request(a, "GET", "/token")[2], 5, interval=0.05,
                   what="the second replica serving the first one's token")
        log("a token registered through one replica is served by the other")
        role = redis.cli("--user", "forge", "--pass", password, "--no-auth-warning", "ROLE")
        check(role.splitlines()[:1] == ["master"], "ROLE as the docs' user: %r" % role)
        check(redis.cli("--user", "forge", "--pass", password, "--no-auth-warning",
                        "ACL", "SETUSER", "forge-norole", "on", ">" + password).find("NOPERM") >= 0,
              "the docs' user may change ACLs, which it must not need")
        denied = redis.cli("--user", "forge-norole", "--pass", password, "--no-auth-warning", "ROLE")
        check("NOPERM" in denied, "ROLE without +role: %r" % denied)
        log("ROLE is allowed with +role and refused (NOPERM) without it")
    finally:
        for server in replicas:
            server.stop()
        redis.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    arguments = parser.parse_args()
    main(lambda: run(os.path.abspath(arguments.server)))
