#!/usr/bin/env python3
"""End-to-end: the commands of docs/replicas.md, "TLS on one machine", run as written.

The shell block of that section is read from docs/replicas.md and run by bash in a temporary
folder, with three substitutions only: free loopback ports for 6380 (Redis' TLS port), 8081 and
8082 (the two replicas), and a random password for PASSWORD; `forge-push-token-server` is the
binary under test (first on PATH). A local `redis-server --tls-port` with a password stands in
for a managed service (`rediss://default:PASSWORD@HOST:PORT`). Then:

  - both replicas report /healthz {"redis":"connected","status":"ok"} over TLS;
  - a token registered through one replica is served by the other with the same version;
  - no line either replica logged holds the password or key material.

Every process the block started is stopped at the end (its process group).

    python3 e2e/tls_docs_test.py --server PATH
"""
import argparse
import os
import secrets
import signal
import subprocess

from e2e_support import EventStream, check, distinct_free_ports, docs_block_folder, docs_sh_blocks, health_of as health, log, main, request, token_hex, wait_until

def docs_block():
    """The first ```sh block after the heading "### TLS on one machine"."""
    blocks = docs_sh_blocks("replicas.md", "### TLS on one machine")
    check(len(blocks) > 0, "docs/replicas.md: no sh block under 'TLS on one machine'")
    return blocks[0]


def run(binary):
    block = docs_block()
    for needle in ("6380", "8081 8082", "PASSWORD", "rediss://default:PASSWORD@127.0.0.1:6380", "--redis-tls-ca-file"):
        check(needle in block, "the docs block lacks %r" % needle)
    redis_port, a, b = distinct_free_ports(3)
    password = secrets.token_hex(12)
    script = (block.replace("6380", str(redis_port)).replace("8081", str(a)).replace("8082", str(b))
              .replace("PASSWORD", password))
    folder, env = docs_block_folder(binary, "e2e-tls-docs-")
    output_path = os.path.join(folder, "output.log")
    output = open(output_path, "w")
    proc = subprocess.Popen(["bash", "-c", script], cwd=folder, env=env, stdout=output, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_until(lambda: all(health(port) == (200, {"redis": "connected", "status": "ok"}) for port in (a, b)), 20,
                   interval=0.1, what="both replicas connected over TLS")
        log("both replicas of the docs block report redis connected over rediss://")
        token = token_hex(0x7175)
        status, _, body = request(a, "POST", "/register", body=token.encode(),
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
        check(status == 200, "POST /register through the first replica: %s %r" % (status, body))

        def first_event(port):
            stream = EventStream(port)
            try:
                return stream.next_token_event()
            finally:
                stream.close()

        on_a = first_event(a)
        check(on_a[1] == token, "the first replica's stream: %r" % (on_a,))
        wait_until(lambda: first_event(b) == on_a, 5, interval=0.05,
                   what="the second replica's stream at %r" % (on_a,))
        log("a token registered through one replica is served by the other with the same id %d" % on_a[0])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        output.close()
    text = open(output_path, encoding="utf-8", errors="replace").read()
    check(password not in text, "the password is in the output: %s" % text[-800:])
    check("PRIVATE KEY" not in text, "key material is in the output")
    check("Redis connected at rediss://default@127.0.0.1:%d/0" % redis_port in text,
          "no 'Redis connected at rediss://...' line: %s" % text[-800:])
    log("no log line holds the password or key material")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    arguments = parser.parse_args()
    main(lambda: run(os.path.abspath(arguments.server)))
