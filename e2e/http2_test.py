#!/usr/bin/env python3
"""HTTP/2 at the edge (docs/replicas.md, "HTTP/2 and TLS at the edge"): three replicas on one
redis-server behind nginx configured exactly as that section writes it (its `nginx` block and its
`openssl` line for the certificate, with this run's ports and folder).

1. `curl --http2` shows the stream route is HTTP/2 at the edge (`HTTP/2 200`, `text/event-stream`).
2. One headless Chromium page opens 10 `EventSource` streams to `/token/stream` (over HTTP/1.1 a
   browser would hold 6 per origin and leave the rest waiting): all 10 open, over `h2`, and all
   receive the same write, made through the edge.

    python3 e2e/http2_test.py --server PATH [--chromedriver /usr/bin/chromedriver]
"""
import argparse
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import http.client

from e2e_support import HOST, Server, check, log, main, request, token_hex, wait_until
from replicas_test import Redis, free_port

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "replicas.md")
SECTION = "### HTTP/2 and TLS at the edge"

OPEN_STREAMS = """
    window.__streams = [];
    for (let i = 0; i < 10; i++) {
      const record = {open: false, tokens: [], errors: 0};
      const source = new EventSource("/token/stream");
      source.addEventListener("open", () => { record.open = true; });
      source.addEventListener("error", () => { record.errors += 1; });
      source.addEventListener("token", (event) => { record.tokens.push(JSON.parse(event.data).token); });
      window.__streams.push(record);
    }
    return window.__streams.length;
"""
STREAMS = "return window.__streams.map((s) => ({open: s.open, tokens: s.tokens, errors: s.errors}));"
# A stream still open has no resource-timing entry yet; the page's own navigation entry says
# which protocol its origin's connection speaks, and every EventSource of the page shares it.
PROTOCOLS = """
    return performance.getEntriesByType("navigation").map((e) => e.nextHopProtocol)
        .concat(performance.getEntriesByType("resource").map((e) => e.nextHopProtocol));
"""


class EdgeNginx:
    """The section's nginx block with this run's replica ports, listening port and folder."""

    def __init__(self, replica_ports):
        text = open(DOCS, encoding="utf-8").read()
        section = text[text.index(SECTION):]
        block = re.search(r"```nginx\n(.*?)```", section, re.S).group(1)
        commands = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
        self.dir = tempfile.mkdtemp(prefix="e2e-edge-")
        self.port = free_port()
        check("http2" in block and "ssl" in block, "the documented edge does not listen with ssl and http2")
        block = block.replace("/tmp/fpt-replicas", self.dir)
        block = re.sub(r"listen 127\.0\.0\.1:\d+ ssl http2;", "listen %s:%d ssl http2;" % (HOST, self.port), block)
        documented = re.findall(r"server 127\.0\.0\.1:(\d+)", block)
        check(len(documented) == len(replica_ports), "the documented edge has %d upstream servers" % len(documented))
        for old, new in zip(documented, replica_ports):
            block = block.replace("server 127.0.0.1:%s " % old, "server 127.0.0.1:@%d " % new)
        self.conf = os.path.join(self.dir, "edge-nginx.conf")
        with open(self.conf, "w") as f:
            f.write(block.replace("127.0.0.1:@", "127.0.0.1:"))
        # The documented certificate command, run as written in this folder.
        openssl = re.search(r"(openssl req .*?-out edge\.crt)", commands.replace("\\\n", " "), re.S).group(1)
        done = subprocess.run(openssl, shell=True, cwd=self.dir, capture_output=True, text=True, timeout=60)
        check(done.returncode == 0, "the documented openssl command failed: %s" % done.stderr[-500:])
        self.proc = None

    def start(self):
        out = subprocess.run(["nginx", "-t", "-p", self.dir, "-c", self.conf], capture_output=True, text=True,
                             timeout=10)
        check(out.returncode == 0, "nginx -t on the documented edge: %s" % out.stderr)
        self.proc = subprocess.Popen(["nginx", "-p", self.dir, "-c", self.conf, "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        context = ssl.create_default_context(cafile=os.path.join(self.dir, "edge.crt"))

        def up():
            try:
                conn = http.client.HTTPSConnection(HOST, self.port, timeout=1, context=context)
                conn.request("GET", "/livez")
                return conn.getresponse().status == 200
            except OSError:
                return False
        wait_until(up, 10, what="the edge nginx on port %d" % self.port)
        self.context = context
        return self

    def write(self, token):
        conn = http.client.HTTPSConnection(HOST, self.port, timeout=5, context=self.context)
        try:
            conn.request("POST", "/register", body=token.encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def curl_http2(edge):
    """`curl --http2` of the stream route: its response head (the stream is cut after 2 s)."""
    done = subprocess.run(["curl", "-sS", "--http2", "--cacert", os.path.join(edge.dir, "edge.crt"), "-D", "-",
                           "-o", "/dev/null", "--max-time", "2", "https://%s:%d/token/stream" % (HOST, edge.port)],
                          capture_output=True, text=True, timeout=10)
    return done.stdout


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    binary = os.path.abspath(args.server)
    for tool in ("redis-server", "nginx", "curl", "openssl"):
        check(shutil.which(tool), "%s is not installed" % tool)
    from browser_test import make_driver
    redis = Redis().start()
    replicas, edge, driver = [], None, None
    workdir = tempfile.mkdtemp(prefix="e2e-http2-")
    try:
        for _ in range(3):
            port = free_port()
            replicas.append(Server(binary, ["--host", HOST, "--port", str(port), "--access-log", "off",
                                            "--redis-url", "redis://%s:%d/0" % (HOST, redis.port),
                                            "--redis-key-prefix", "http2"]).start())
        for server in replicas:
            wait_until(lambda: request(server.port, "GET", "/readyz", timeout=2)[0] == 200, 10,
                       what="replica %d ready" % server.port)
        edge = EdgeNginx([s.port for s in replicas]).start()
        check(edge.write(token_hex(29, 5, 0)) == 200, "the first write through the edge failed")
        head = curl_http2(edge)
        check(head.startswith("HTTP/2 200"), "curl --http2 of /token/stream: %r" % head[:200])
        check("content-type: text/event-stream" in head.lower(), "curl --http2: no event-stream type in %r" % head)
        log("curl --http2 https://127.0.0.1:%d/token/stream: %s" % (edge.port, head.splitlines()[0]))
        driver = make_driver(args.chromedriver, args.chromium, workdir)
        driver.execute_cdp_cmd("Security.setIgnoreCertificateErrors", {"ignore": True})
        driver.get("https://%s:%d/" % (HOST, edge.port))
        check(driver.execute_script(OPEN_STREAMS) == 10, "the page did not open 10 EventSource streams")
        wait_until(lambda: all(s["open"] and s["tokens"] for s in driver.execute_script(STREAMS)), 10,
                   what="10 EventSource streams open, each with its first event")
        token = token_hex(29, 5, 1)
        check(edge.write(token) == 200, "the write through the edge failed")
        wait_until(lambda: all(token in s["tokens"] for s in driver.execute_script(STREAMS)), 5,
                   what="every EventSource receiving the write")
        streams = driver.execute_script(STREAMS)
        protocols = driver.execute_script(PROTOCOLS)
        check(all(s["errors"] == 0 for s in streams), "EventSource errors: %r" % streams)
        check(protocols and set(protocols) == {"h2"}, "the streams' protocols: %r" % protocols)
        # Over HTTP/1.1 Chromium holds at most 6 connections to an origin: 10 streams open at once
        # beside the live page's own (11) can only share one HTTP/2 connection.
        log("10 EventSource streams (and the live page's own) open at once in one Chromium page over %s,"
            " all received the write %s..." % ("/".join(sorted(set(protocols))), token[:12]))
    finally:
        if driver:
            driver.quit()
        if edge:
            edge.stop()
        for server in replicas:
            server.kill()
        redis.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(run)
