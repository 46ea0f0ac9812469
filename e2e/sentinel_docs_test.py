#!/usr/bin/env python3
"""End-to-end: the commands of docs/replicas.md, "Sentinel without Docker", run as written.

The two shell blocks of that section are read from docs/replicas.md and run by bash in a
temporary folder, with free loopback ports in place of 6379 and 6380 (the master and its
replica), 26379 to 26381 (the sentinels) and 8081 to 8083 (the replicas of the service);
`forge-push-token-server` is the binary under test (first on PATH). Then:

  - the three replicas report /healthz connected, found through the sentinels, and a token
    registered through one is served by the others with the same id;
  - once the sentinels list the replica, the second block (the master shut down) makes every
    replica follow the promoted replica: /metrics names it, and a write through each answers 200.

Every process the blocks started is stopped at the end (their process group).

    python3 e2e/sentinel_docs_test.py --server PATH
"""
import argparse
import os
import re
import signal
import subprocess

from e2e_support import (SENTINEL_FAILOVER_BOUND, check, sentinels_ready, distinct_free_ports, docs_block_folder, docs_sh_blocks,
                         health_of as health, log, main, request, token_hex, wait_until)
from replicas_test import version_of, write

def docs_blocks():
    blocks = docs_sh_blocks("replicas.md", "### Sentinel without Docker",
                            until="With Docker Compose, `docker/compose.sentinel.yaml`")
    check(len(blocks) == 2, "docs/replicas.md: expected two sh blocks under 'Sentinel without Docker'")
    return blocks


def metrics(port):
    _, _, body = request(port, "GET", "/metrics")
    return body.decode()


def run(binary):
    start_block, failover_block = docs_blocks()
    names = ["6379", "6380", "26379", "26380", "26381", "8081", "8082", "8083"]
    for name in names:
        check(name in start_block, "the docs block lacks port %s" % name)
    ports = dict(zip(names, distinct_free_ports(len(names))))

    def substitute(block):
        # Longest first, so that 26379 is replaced before 6379 could match inside it.
        for name in sorted(names, key=len, reverse=True):
            block = re.sub(r"(?<![0-9])%s(?![0-9])" % name, str(ports[name]), block)
        return block

    folder, env = docs_block_folder(binary, "e2e-sentinel-docs-")
    output = open(os.path.join(folder, "output.log"), "w")
    proc = subprocess.Popen(["bash", "-c", substitute(start_block)], cwd=folder, env=env, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)
    service = [ports["8081"], ports["8082"], ports["8083"]]
    try:
        wait_until(lambda: all(health(p) == (200, {"redis": "connected", "status": "ok"}) for p in service), 20,
                   interval=0.1, what="the three replicas connected through the sentinels")
        token = token_hex(0x5D0C, 1)
        status, _, body = write(service[0], token)
        check(status == 200, "POST /register: %s %r" % (status, body))
        first = version_of(service[0])
        wait_until(lambda: all(version_of(p) == first for p in service[1:]), 5, what="the others at %r" % (first,))
        log("the docs block's three replicas found the master through three sentinels and share %r" % (first,))

        def redis_cli(port):
            return lambda *args: subprocess.run(["redis-cli", "-p", str(ports[port])] + list(args),
                                                capture_output=True, text=True, timeout=5).stdout

        # Every sentinel, not one (e2e_support.sentinels_ready): 1 run in 8 never failed over
        # within 45 s while only the first sentinel was asked.
        clis = [redis_cli(port) for port in ("26379", "26380", "26381")]

        try:
            wait_until(lambda: sentinels_ready(clis, "mymaster", ports["6380"]), 30, interval=0.2,
                       what="every sentinel to list the replica and the two other sentinels")
        except Exception:
            for args in (["-p", str(ports["26379"]), "SENTINEL", "replicas", "mymaster"],
                         ["-p", str(ports["6380"]), "INFO", "replication"]):
                log("redis-cli %s: %s" % (" ".join(args), subprocess.run(
                    ["redis-cli"] + args, capture_output=True, text=True, timeout=5).stdout[-600:]))
            raise
        subprocess.run(["bash", "-c", substitute(failover_block)], cwd=folder, env=env, stdout=output,
                       stderr=subprocess.STDOUT, timeout=10)
        promoted = 'forge_push_token_redis_master_info{address="127.0.0.1:%d"} 1' % ports["6380"]
        # Bounded by the sentinels' election, which may split and be retried (e2e_support).
        try:
            wait_until(lambda: all(promoted in metrics(p) for p in service), SENTINEL_FAILOVER_BOUND, interval=0.1,
                       what="every replica on the promoted master")
        except Exception:
            for sentinel in ("26379", "26380", "26381"):
                log("sentinel %s names %s" % (sentinel, subprocess.run(
                    ["redis-cli", "-p", str(ports[sentinel]), "SENTINEL", "get-master-addr-by-name", "mymaster"],
                    capture_output=True, text=True, timeout=5).stdout.split()))
            log("redis %s: %s" % (ports["6380"], subprocess.run(
                ["redis-cli", "-p", str(ports["6380"]), "ROLE"], capture_output=True, text=True, timeout=5).stdout.split()[:1]))
            for port in service:
                log("replica %d: %s" % (port, [line for line in metrics(port).splitlines()
                                               if "master_info" in line or "redis_connected" in line or "store_health" in line]))
            raise
        for index, port in enumerate(service):
            wait_until(lambda: write(port, token_hex(0x5D0C, 2 + index))[0] == 200, 5, interval=0.1,
                       what="a write through replica %d after the failover" % index)
        log("after the docs block's failover every replica follows 127.0.0.1:%d and writes" % ports["6380"])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        output.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    arguments = parser.parse_args()
    main(lambda: run(os.path.abspath(arguments.server)))
