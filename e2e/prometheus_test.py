#!/usr/bin/env python3
"""End-to-end: a real Prometheus (Debian's `prometheus`) scrapes the service and loads its rules.

Starts the server (one subscriber allowed in four, a state file) and Prometheus on free loopback
ports, Prometheus with a one-second scrape and evaluation interval and docker/prometheus/rules.yml,
then through Prometheus's HTTP API:

  * waits for up{job="forge-push-token"} == 1;
  * registers a device token through the service's API and waits until Prometheus reads
    forge_push_token_token_changes_total == 1 (a counter it just changed), then 2 after a second;
  * reads the standard process series and the build info;
  * checks that every rule of rules.yml evaluates without error (health "ok"), that the
    recording rule instance:forge_push_token_subscribers:ratio is 0.25 with one subscriber of
    four connected, and that no alert fires on a healthy service.

    python3 e2e/prometheus_test.py --server PATH [--prometheus PATH]
"""
import argparse
import json
import os
import shutil
import secrets
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

from e2e_support import EventStream, Failure, Server, check, free_port, log, main, remember_secret, token_hex, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "..", "docker", "prometheus", "rules.yml")
JOB = "forge-push-token"
READ_JOB = "forge-push-token-read-token"
NO_TOKEN_JOB = "forge-push-token-no-token"


class Prometheus:
    """One Prometheus process on loopback, killed by PID at the end."""

    def __init__(self, binary, target_port, workdir, read_target=None):
        """`read_target`: (port, credentials file) of a service whose reads need a token (issue 28),
        scraped as job READ_JOB with `authorization.credentials_file`, and as job NO_TOKEN_JOB
        without it."""
        self.port = free_port()
        self.workdir = workdir
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "rule_files:\n  - %s\n"
                    "scrape_configs:\n  - job_name: %s\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n" % (json.dumps(os.path.abspath(RULES)), JOB, target_port))
            if read_target:
                port, credentials = read_target
                f.write("  - job_name: %s\n    authorization:\n      type: Bearer\n      credentials_file: %s\n"
                        "    static_configs:\n      - targets: ['127.0.0.1:%d']\n"
                        "  - job_name: %s\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n"
                        % (READ_JOB, json.dumps(credentials), port, NO_TOKEN_JOB, port))
        check(subprocess.run([shutil.which("promtool") or "promtool", "check", "config", config],
                             capture_output=True, timeout=30).returncode == 0, "promtool check config failed")
        self.log_path = os.path.join(workdir, "prometheus.log")
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [binary, "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(workdir, "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log_tail(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-2000:]

    def api(self, path, **params):
        # urlencode percent-encodes the {} and quotes of a PromQL selector.
        url = "http://127.0.0.1:%d%s" % (self.port, path)
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = json.load(response)
        except OSError:
            if self.proc.poll() is not None:
                raise Failure("prometheus exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            return None
        check(body.get("status") == "success", "%s answered %r" % (path, body))
        return body["data"]

    def query(self, expression):
        """The instant vector of `expression` as {labels-tuple: value}; None before Prometheus answers."""
        data = self.api("/api/v1/query", query=expression)
        if data is None:
            return None
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}

    def scalar(self, expression):
        result = self.query(expression)
        if not result:
            return None
        check(len(result) == 1, "%s has %d series: %r" % (expression, len(result), result))
        return next(iter(result.values()))


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    args = parser.parse_args()
    check(os.path.exists(args.prometheus), "no prometheus at %s (apt-get install prometheus)" % args.prometheus)
    workdir = tempfile.mkdtemp(prefix="e2e-prometheus-")
    server = Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--max-subscribers", "4",
                                  "--state-file", os.path.join(workdir, "state.json")], workdir=workdir).start()
    # A service whose reads need a token (--read-token-file): Prometheus presents its own read
    # token from a file of its own (credentials_file takes the whole file as the token).
    read_token, write_token = "prometheus-" + secrets.token_hex(16), "writer-" + secrets.token_hex(16)
    for value in (read_token, write_token):
        remember_secret(value)
    paths = {name: os.path.join(workdir, name) for name in ("read-tokens", "write-tokens", "prometheus-token")}
    for name, text in (("read-tokens", "# Prometheus\n%s\n" % read_token), ("write-tokens", write_token + "\n"),
                       ("prometheus-token", read_token + "\n")):
        with open(paths[name], "w") as f:
            f.write(text)
    guarded = Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--write-token-file", paths["write-tokens"],
                                   "--read-token-file", paths["read-tokens"]], workdir=workdir).start()
    prometheus = Prometheus(args.prometheus, server.port, workdir, read_target=(guarded.port, paths["prometheus-token"]))
    log("server on port %d, prometheus (pid %d) on port %d" % (server.port, prometheus.proc.pid, prometheus.port))
    try:
        check_scrapes(server, prometheus)
        wait_until(lambda: prometheus.scalar('up{job="%s"}' % READ_JOB) == 1, 30, interval=0.25,
                   what='up{job="%s"} == 1 (a read token from credentials_file)' % READ_JOB)
        tokens = prometheus.scalar('forge_push_token_credentials_tokens{job="%s",role="read"}' % READ_JOB)
        check(tokens == 1, "credentials_tokens{role=read} scraped with the read token: %r" % tokens)
        wait_until(lambda: prometheus.scalar('up{job="%s"}' % NO_TOKEN_JOB) == 0, 30, interval=0.25,
                   what='up{job="%s"} == 0 (no token: 401)' % NO_TOKEN_JOB)
        log("Prometheus scrapes /metrics with a read token from authorization.credentials_file (up 1); "
            "without it the scrape is refused (up 0)")
    finally:
        prometheus.stop()
        server.kill()
        guarded.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def check_scrapes(server, prometheus):
    started = time.monotonic()
    wait_until(lambda: prometheus.scalar('up{job="%s"}' % JOB) == 1, 30, interval=0.25,
               what='up{job="%s"} == 1' % JOB)
    log("up == 1 after %.1f s" % (time.monotonic() - started))

    selector = 'forge_push_token_token_changes_total{job="%s"}' % JOB
    check(prometheus.scalar(selector) == 0, "token_changes_total is not 0 before any registration")
    stream = EventStream(server.port)
    check(stream.status == 200, "GET /token/stream answered %s" % stream.status)
    status, _, body = server.register(token_hex(13, 1))
    check(status == 200, "register answered %s: %r" % (status, body))
    changed = time.monotonic()
    wait_until(lambda: prometheus.scalar(selector) == 1, 10, interval=0.2, what="%s == 1" % selector)
    log("Prometheus read token_changes_total 1 %.1f s after the change" % (time.monotonic() - changed))
    check(server.register(token_hex(13, 2))[0] == 200, "second register failed")
    wait_until(lambda: prometheus.scalar(selector) == 2, 10, interval=0.2, what="%s == 2" % selector)

    # The standard process series and the build info, as Prometheus stored them.
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                 "process_start_time_seconds", "process_open_fds", "process_max_fds",
                 "forge_push_token_subscribers_limit", "forge_push_token_state_saved"):
        value = prometheus.scalar('%s{job="%s"}' % (name, JOB))
        check(value is not None and value >= 0, "%s missing in Prometheus: %r" % (name, value))
    start = prometheus.scalar('process_start_time_seconds{job="%s"}' % JOB)
    check(abs(start - server.started_at) < 3, "process_start_time_seconds %r, the test started the process at %r"
          % (start, server.started_at))
    info = prometheus.query('forge_push_token_build_info{job="%s"}' % JOB)
    check(len(info) == 1 and list(info.values()) == [1.0] and dict(next(iter(info))).get("version"),
          "forge_push_token_build_info: %r" % info)

    # The rules: loaded, evaluated without error, the recording rule right, no alert firing.
    def rules_evaluated():
        data = prometheus.api("/api/v1/rules")
        rules = [rule for group in (data or {}).get("groups", []) for rule in group["rules"]]
        return rules if rules and all(rule.get("lastEvaluation", "").startswith("2") and
                                      not rule["lastEvaluation"].startswith("0001") for rule in rules) else None
    rules = wait_until(rules_evaluated, 10, interval=0.3, what="every rule evaluated once")
    check(len(rules) >= 10, "only %d rules loaded from rules.yml" % len(rules))
    unhealthy = [(r["name"], r.get("health"), r.get("lastError")) for r in rules if r.get("health") != "ok"]
    check(not unhealthy, "rules that do not evaluate: %r" % unhealthy)
    wait_until(lambda: prometheus.scalar('instance:forge_push_token_subscribers:ratio{job="%s"}' % JOB) == 0.25, 10,
               interval=0.3, what="instance:forge_push_token_subscribers:ratio == 0.25 (1 of 4)")
    firing = [a for a in prometheus.api("/api/v1/alerts")["alerts"] if a["state"] != "inactive"]
    check(not firing, "alerts pending or firing on a healthy service: %r" % firing)
    log("%d rules healthy, recording rule 0.25, no alert" % len(rules))
    stream.close()


if __name__ == "__main__":
    main(run)
