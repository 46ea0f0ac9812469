#!/usr/bin/env python3
"""The image of docker/Dockerfile run by a real OCI engine (rootful podman with runc), and the
compose stacks of docker/ brought up with podman-compose (issue 45). docker/verify-engine.sh
builds the image and the base-image stand-ins, then runs this file:

    python3 docker/podman/engine_test.py --image IMAGE --compose PODMAN_COMPOSE [--conformance RUN_PY] [--only a,b]

Each check prints `ok N - ...` or `not ok N - ...` (TAP). Every container, volume and network it
makes carries a name or compose project starting with `fpt-engine-` and the label
`forge-push-token.test=engine`, and is removed at exit, whatever the result. Traffic goes to the
host's loopback (published ports) and to the containers' own bridge networks only.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "e2e"))
from e2e_support import (Failure, SENTINEL_FAILOVER_BOUND, check, distinct_free_ports,  # noqa: E402
                         run_selected_as_tap, sentinels_ready, token_hex, wait_until)

LABEL = "forge-push-token.test=engine"
PREFIX = "fpt-engine-%d" % os.getpid()
DATA_DIR = "/var/lib/forge-push-token"
# The hardening docs/operations.md ("Container") recommends, as `podman run` options.
HARDENED = ["--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
            "--tmpfs", "/tmp:size=16m,mode=1777"]

ARGS = None
VERBOSE = False


def podman(*args, timeout=120, ok=True, stdin=None):
    """`podman ARGS`: (exit status, standard output, standard error); fails unless it exits 0,
    when `ok`."""
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, stdin=stdin)
    if VERBOSE:
        print("# podman %s -> %d" % (" ".join(args), proc.returncode), flush=True)
    if ok:
        check(proc.returncode == 0, "podman %s: exit %d: %s" % (" ".join(args), proc.returncode,
                                                               (proc.stderr or proc.stdout).strip()[-800:]))
    return proc.returncode, proc.stdout, proc.stderr


def compose(project, files, *args, env=None, timeout=120, ok=True):
    """podman-compose -p PROJECT -f FILE... ARGS, from docker/ (the files' relative paths)."""
    command = [ARGS.compose, "-p", project]
    for name in files:
        command += ["-f", os.path.join(ROOT, "docker", name)]
    command += list(args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=os.path.join(ROOT, "docker"))
    if VERBOSE or (ok and proc.returncode != 0):
        print("# %s -> %d\n%s" % (" ".join(command), proc.returncode,
                                  "\n".join("#   " + line for line in (proc.stdout + proc.stderr).splitlines()[-40:])),
              flush=True)
    if ok:
        check(proc.returncode == 0, "podman-compose %s: exit %d" % (" ".join(args), proc.returncode))
    return proc.returncode, proc.stdout, proc.stderr


def request(host, port, method, path, body=None, headers=None, timeout=5):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def try_request(host, port, method, path, body=None, timeout=3):
    """request(), or (None, {}, b"") when the connection fails."""
    try:
        return request(host, port, method, path, body=body, timeout=timeout)
    except (OSError, http.client.HTTPException):
        return None, {}, b""


def register(host, port, token, timeout=5):
    status, _, body = request(host, port, "POST", "/register", body=token.encode(),
                              headers={"Content-Type": "text/plain"}, timeout=timeout)
    check(status == 200, "POST /register on %s:%d answered %s: %r" % (host, port, status, body[:200]))


def read_token(host, port):
    status, _, body = request(host, port, "GET", "/token")
    check(status == 200, "GET /token on %s:%d answered %s" % (host, port, status))
    return json.loads(body)["token"]


class Stream:
    """A `GET /token/stream` subscriber on HOST:PORT: `next()` returns (id as int, token)."""

    def __init__(self, host, port, last_event_id=None, timeout=10):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self.conn.request("GET", "/token/stream", headers=headers)
        self.sock = self.conn.sock
        self.response = self.conn.getresponse()
        check(self.response.status == 200, "GET /token/stream on %s:%d answered %s"
              % (host, port, self.response.status))

    def next(self, timeout=10):
        """The next event with data, or raises Failure (a timeout), or returns None at the end."""
        self.sock.settimeout(timeout)
        fields = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.response.isclosed():
                return None
            try:
                raw = self.response.readline()
            except (TimeoutError, OSError, http.client.HTTPException) as error:
                raise Failure("no event within %.1f s (%s)" % (timeout, error))
            if not raw:
                return None
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if "data" in fields:
                    return int(fields["id"]), json.loads(fields["data"])["token"]
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
        raise Failure("no complete event within %.1f s" % timeout)

    def end(self, timeout):
        """Reads until the stream ends; returns when it ended (time.monotonic()), or fails."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            check(left > 0, "the stream did not end within %.1f s" % timeout)
            try:
                if self.next(timeout=left) is None:
                    return time.monotonic()
            except Failure:
                check(False, "the stream did not end within %.1f s" % timeout)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
        self.conn.close()


def container_ip(name):
    """The container's address on its (first) network."""
    _, out, _ = podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", name)
    addresses = out.split()
    check(addresses, "%s has no address" % name)
    return addresses[0]


def health_check(name, timeout=30):
    """`podman healthcheck run NAME`: (exit status, output)."""
    status, out, err = podman("healthcheck", "run", name, ok=False, timeout=timeout)
    return status, (out + err).strip()


def inspect(name, template):
    return podman("inspect", "--format", template, name)[1].strip()


def run_service(name, volume, port, env=(), extra=()):
    """Starts the image as docs/operations.md recommends, published on 127.0.0.1:PORT, the data
    folder on VOLUME; waits for /healthz."""
    args = ["run", "-d", "--name", name, "--label", LABEL, *HARDENED,
            "-v", "%s:%s" % (volume, DATA_DIR), "-p", "127.0.0.1:%d:8080" % port]
    for pair in env:
        args += ["-e", pair]
    podman(*args, *extra, ARGS.image)
    wait_until(lambda: try_request("127.0.0.1", port, "GET", "/healthz")[0] == 200, 30,
               interval=0.2, what="GET /healthz of %s answering 200" % name)


# ------------------------------------------------------------------------------------------------
CHECKS = []


def test(description):
    def register_check(function):
        CHECKS.append((description, function))
        return function
    return register_check


@test("the image: its size, labels, user, entrypoint and health check (kept by --format docker)")
def image_metadata():
    _, out, _ = podman("image", "inspect", ARGS.image)
    image = json.loads(out)[0]
    config = image["Config"]
    labels = config.get("Labels") or {}
    with open(os.path.join(ROOT, "Sources", "forge-push-token-server", "Version.swift")) as f:
        version = re.search(r'serverVersion = "([^"]+)"', f.read()).group(1)
    check(labels.get("org.opencontainers.image.title") == "forge-push-token-server", "title label: %r" % labels)
    check(labels.get("org.opencontainers.image.version") == version,
          "version label %r, Version.swift says %s" % (labels.get("org.opencontainers.image.version"), version))
    check(labels.get("org.opencontainers.image.base.name") == "docker.io/library/debian:bookworm-slim",
          "base.name label: %r" % labels.get("org.opencontainers.image.base.name"))
    check(config.get("User") == "999:999", "user %r, not 999:999" % config.get("User"))
    check(config.get("Entrypoint") == ["/usr/local/bin/forge-push-token-server"], "entrypoint %r" % config.get("Entrypoint"))
    # podman's inspect shows the Docker format's health check beside Config, not in it.
    health = image.get("Healthcheck") or config.get("Healthcheck")
    check(health is not None, "the image has no health check (built in OCI format?)")
    check(health.get("Test") == ["CMD", "/usr/local/bin/forge-push-token-server", "--health-check"],
          "health check %r" % health)
    check(config.get("StopSignal") == "SIGTERM", "stop signal %r" % config.get("StopSignal"))
    check("8080/tcp" in (config.get("ExposedPorts") or {}), "exposed ports %r" % config.get("ExposedPorts"))
    print("#   %s: %.1f MB, user %s, version %s, health check %s every %.0f s"
          % (ARGS.image, image["Size"] / 1e6, config["User"], version, " ".join(health["Test"][1:]),
             health.get("Interval", 0) / 1e9))


class Single:
    """The one container of the single-service checks, shared by them in order."""
    name = PREFIX + "-single"
    volume = PREFIX + "-data"
    port = None
    token = token_hex(45, 1)


@test("hardened run (read-only root, no capabilities, no new privileges, a volume): user, root, capabilities")
def hardened_run():
    Single.port = distinct_free_ports(1)[0]
    podman("volume", "create", "--label", LABEL, Single.volume)
    run_service(Single.name, Single.volume, Single.port, env=["FORGE_PUSH_TOKEN_DRAIN_SECONDS=4"])
    _, out, _ = podman("exec", Single.name, "id", "-u")
    check(out.strip() == "999", "the service runs as uid %r" % out.strip())
    _, out, _ = podman("exec", Single.name, "grep", "-E", "^(CapEff|CapBnd|NoNewPrivs)", "/proc/1/status")
    fields = dict(re.findall(r"^(\w+):\s*(\S+)", out, re.M))
    check(int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0, "capabilities left: %s" % fields)
    check(fields["NoNewPrivs"] == "1", "no_new_privs is off: %s" % fields)
    status, _, err = podman("exec", Single.name, "touch", "/usr/local/bin/probe", ok=False)
    check(status != 0 and "Read-only file system" in err, "the root is writable: %d %s" % (status, err))
    podman("exec", Single.name, "sh", "-c", "touch %s/.probe && rm %s/.probe" % (DATA_DIR, DATA_DIR))
    print("#   uid 999, CapEff 0, CapBnd 0, NoNewPrivs 1, / read-only, %s writable" % DATA_DIR)


@test("smoke through the published port: probes, a write, a read, a stream")
def smoke():
    for path in ("/healthz", "/livez", "/readyz"):
        status, _, body = request("127.0.0.1", Single.port, "GET", path)
        check(status == 200, "GET %s answered %s %r" % (path, status, body))
    stream = Stream("127.0.0.1", Single.port)
    try:
        first_id, first = stream.next()
        check(first is None, "a new volume starts with a token: %r" % first)
        register("127.0.0.1", Single.port, Single.token)
        check(read_token("127.0.0.1", Single.port) == Single.token, "GET /token does not return the write")
        event_id, value = stream.next()
        check(value == Single.token and event_id == first_id + 1,
              "stream event %r %r after the write (first id %d)" % (event_id, value, first_id))
    finally:
        stream.close()
    status, _, body = request("127.0.0.1", Single.port, "GET", "/metrics")
    check(status == 200 and b"forge_push_token_" in body, "GET /metrics answered %s" % status)


@test("podman healthcheck run: healthy, unhealthy while frozen (kill -s STOP), healthy again (CONT)")
def health_frozen():
    status, out = health_check(Single.name)
    check(status == 0 and "unhealthy" not in out, "healthcheck of the running service: %d %r" % (status, out))
    podman("kill", "-s", "STOP", Single.name)
    try:
        t0 = time.monotonic()
        status, out = health_check(Single.name)
        check(status != 0 and "unhealthy" in out, "healthcheck of the frozen service: %d %r" % (status, out))
        print("#   frozen: %r after %.1f s" % (out, time.monotonic() - t0))
    finally:
        podman("kill", "-s", "CONT", Single.name)
    wait_until(lambda: health_check(Single.name)[0] == 0, 30, interval=0.5, what="healthy after SIGCONT")


@test("podman restart keeps the token and its version (the state file on the volume)")
def restart_keeps_state():
    stream = Stream("127.0.0.1", Single.port)
    before_id, before = stream.next()
    stream.close()
    check(before == Single.token, "before the restart the token is %r" % before)
    podman("restart", "-t", "10", Single.name, timeout=60)
    wait_until(lambda: try_request("127.0.0.1", Single.port, "GET", "/healthz")[0] == 200, 30,
               interval=0.2, what="GET /healthz after the restart")
    stream = Stream("127.0.0.1", Single.port)
    try:
        after_id, after = stream.next()
    finally:
        stream.close()
    check((after_id, after) == (before_id, before),
          "after podman restart: id %d %r, before: id %d %r" % (after_id, after, before_id, before))
    print("#   id %d and the token kept across podman restart" % after_id)


@test("podman healthcheck run: unhealthy while the service answers 503 (a drain after podman kill -s TERM), then exit 0")
def health_503():
    # A drain lasts while there are streams to end: open some.
    streams = [Stream("127.0.0.1", Single.port) for _ in range(4)]
    try:
        for stream in streams:
            stream.next()
        podman("kill", "-s", "TERM", Single.name)
        wait_until(lambda: try_request("127.0.0.1", Single.port, "GET", "/healthz")[0] == 503, 4,
                   interval=0.05, what="/healthz answering 503 during the drain")
        status, out = health_check(Single.name)
        check(status != 0 and "unhealthy" in out, "healthcheck while draining: %d %r" % (status, out))
    finally:
        for stream in streams:
            stream.close()
    wait_until(lambda: inspect(Single.name, "{{.State.Running}}") == "false", 10, interval=0.2,
               what="the container ending after its drain")
    exit_code = inspect(Single.name, "{{.State.ExitCode}}")
    check(exit_code == "0", "the container exited %s after SIGTERM" % exit_code)
    print("#   draining: /healthz 503 and %r; exit code 0" % out)
    podman("start", Single.name)
    wait_until(lambda: try_request("127.0.0.1", Single.port, "GET", "/healthz")[0] == 200, 30,
               interval=0.2, what="GET /healthz after podman start")


@test("podman stop -t 9 with open streams: /healthz 503, streams end spread over the 4 s drain, exit 0")
def stop_drains():
    drain = 4
    streams = [Stream("127.0.0.1", Single.port) for _ in range(4)]
    try:
        for stream in streams:
            stream.next()
        ends = []
        errors = []

        def read_end(stream):
            try:
                ends.append(stream.end(drain + 8))
            except Failure as error:
                errors.append(str(error))
        readers = [threading.Thread(target=read_end, args=(s,)) for s in streams]
        for reader in readers:
            reader.start()
        t0 = time.monotonic()
        stopper = subprocess.Popen(["podman", "stop", "-t", str(drain + 5), Single.name],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # While it drains, the service answers 503 (draining) and the health check says so.
        wait_until(lambda: try_request("127.0.0.1", Single.port, "GET", "/healthz")[0] == 503, drain,
                   interval=0.05, what="/healthz answering 503 during the drain")
        out, _ = stopper.communicate(timeout=drain + 20)
        stopped = time.monotonic() - t0
        for reader in readers:
            reader.join(drain + 10)
        check(not errors, "streams: %s" % errors)
        check(stopper.returncode == 0, "podman stop: exit %d %s" % (stopper.returncode, out))
        offsets = sorted(end - t0 for end in ends)
        check(len(offsets) == len(streams), "%d of %d streams ended" % (len(offsets), len(streams)))
        check(offsets[-1] <= drain + 1.5, "the last stream ended %.1f s after SIGTERM (drain %d s)" % (offsets[-1], drain))
        check(offsets[-1] - offsets[0] >= drain / 4,
              "the streams ended together (%s s), not spread over the %d s drain" % (offsets, drain))
        exit_code = inspect(Single.name, "{{.State.ExitCode}}")
        check(exit_code == "0", "the container exited %s" % exit_code)
        check(stopped <= drain + 5, "podman stop took %.1f s" % stopped)
        print("#   streams ended at %s s, podman stop returned after %.1f s, exit code 0"
              % (", ".join("%.1f" % o for o in offsets), stopped))
    finally:
        for stream in streams:
            stream.close()
        podman("rm", "-f", Single.name, ok=False)
        podman("volume", "rm", "-f", Single.volume, ok=False)


@test("the conformance runner through docker/podman/conformance-server.sh (the image, --network=host)")
def conformance():
    if not ARGS.conformance:
        print("#   no conformance runner given (not beside this checkout): left out")
        return
    wrapper = os.path.join(HERE, "conformance-server.sh")
    env = dict(os.environ, FORGE_PUSH_TOKEN_ENGINE_IMAGE=ARGS.image)
    try:
        proc = subprocess.run([sys.executable, ARGS.conformance, "--server", wrapper], env=env,
                              capture_output=True, text=True, timeout=900)
    finally:
        # A wrapper the runner ended with SIGKILL (which no signal proxy can pass on) leaves its
        # container behind: remove every one.
        left = podman("ps", "-a", "--filter", "label=forge-push-token.test=engine-conformance",
                      "--format", "{{.Names}}", ok=False)[1].split()
        for name in left:
            podman("rm", "-f", "-v", "-t", "0", name, ok=False)
        if left:
            print("#   removed %d container(s) that SIGKILLed wrappers left" % len(left))
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    for line in lines[-5:]:
        print("#   " + line)
    check(proc.returncode == 0, "the conformance runner failed:\n%s" % "\n".join(lines[-40:]))


# ------------------------------------------------------------------------------------------------
# Compose stacks.

LIMITS = {"compose.yaml": "podman/compose.limits.yaml",
          "compose.replicas.yaml": "podman/compose.limits-replicas.yaml",
          "compose.sentinel.yaml": "podman/compose.limits-replicas.yaml"}


class Stack:
    def __init__(self, file, suffix):
        self.file = file
        self.project = "%s-%s" % (PREFIX, suffix)
        self.files = [file, LIMITS[file]]
        self.port, self.prometheus_port = distinct_free_ports(2)
        self.env = {"FORGE_PUSH_TOKEN_PUBLISH": "127.0.0.1:%d" % self.port,
                    "FORGE_PUSH_TOKEN_PROMETHEUS_PUBLISH": "127.0.0.1:%d" % self.prometheus_port,
                    "FORGE_PUSH_TOKEN_IMAGE_TAG": ARGS.image.rsplit(":", 1)[1]}

    def up(self):
        self.volumes_before = set(podman("volume", "ls", "--format", "{{.Name}}")[1].split())
        compose(self.project, self.files, "up", "-d", "--no-build", env=self.env)

    def containers(self, service=None):
        filters = ["--filter", "label=io.podman.compose.project=%s" % self.project]
        if service:
            filters += ["--filter", "label=com.docker.compose.service=%s" % service]
        _, out, _ = podman("ps", "-a", *filters, "--format", "{{.Names}}")
        return sorted(out.split())

    def down(self):
        """`down -v`, then nothing of the project may be left: containers, networks, volumes."""
        compose(self.project, self.files, "down", "-v", "-t", "10", env=self.env, timeout=120)
        label = "label=io.podman.compose.project=%s" % self.project
        left = {
            "containers": podman("ps", "-a", "--filter", label, "--format", "{{.Names}}")[1].split(),
            "networks": [n for n in podman("network", "ls", "--format", "{{.Name}}")[1].split()
                         if n.startswith(self.project)],
            # Named volumes of the project, and anonymous ones (an image's VOLUME) it made.
            "volumes": [v for v in podman("volume", "ls", "--format", "{{.Name}}")[1].split()
                        if v.startswith(self.project) or v not in self.volumes_before],
        }
        check(not any(left.values()), "podman-compose down -v left %s" % left)

    def force_clean(self):
        """After a failure: whatever of the project is left, removed (a no-op after `down`)."""
        remove_by_prefix(self.project)


def remove_by_prefix(prefix):
    """Removes every container, network and volume whose name starts with PREFIX (the compose
    projects name theirs `PROJECT_...`); returns how many there were."""
    count = 0
    for _ in range(3):
        names = [n for n in podman("ps", "-a", "--format", "{{.Names}}", ok=False)[1].split() if n.startswith(prefix)]
        for name in names:
            podman("rm", "-f", "-v", "-t", "0", name, ok=False)
        networks = [n for n in podman("network", "ls", "--format", "{{.Name}}", ok=False)[1].split() if n.startswith(prefix)]
        for network in networks:
            podman("network", "rm", "-f", network, ok=False)
        volumes = [v for v in podman("volume", "ls", "--format", "{{.Name}}", ok=False)[1].split() if v.startswith(prefix)]
        for volume in volumes:
            podman("volume", "rm", "-f", volume, ok=False)
        if not names and not networks and not volumes:
            break
        count += len(names) + len(networks) + len(volumes)
    return count


def wait_replicas_ready(stack, count, timeout=60, redis_field=True):
    """Waits until COUNT replica containers answer /healthz 200 (Redis connected) on their own
    addresses; returns their (name, address) pairs."""
    def ready():
        pairs = []
        for name in stack.containers("replica"):
            if inspect(name, "{{.State.Running}}") != "true":
                continue
            address = container_ip(name)
            status, _, body = try_request(address, 8080, "GET", "/healthz")
            if status == 200 and (not redis_field or json.loads(body).get("redis") == "connected"):
                pairs.append((name, address))
        return pairs if len(pairs) >= count else None
    return wait_until(ready, timeout, interval=0.5, what="%d replicas of %s ready" % (count, stack.project))


def write_reaches_every_replica(stack, replicas, token):
    streams = [Stream(address, 8080) for _, address in replicas]
    via_nginx = Stream("127.0.0.1", stack.port)
    try:
        firsts = [s.next() for s in streams]
        nginx_first = via_nginx.next()
        register("127.0.0.1", stack.port, token)
        for (name, _), stream, (first_id, _) in zip(replicas, streams, firsts):
            event_id, value = stream.next(timeout=10)
            check(value == token and event_id > first_id,
                  "%s's stream: %r %r after the write through nginx (first id %d)" % (name, event_id, value, first_id))
        event_id, value = via_nginx.next(timeout=10)
        check(value == token and event_id > nginx_first[0], "the stream through nginx: %r %r" % (event_id, value))
        return event_id
    finally:
        for stream in streams + [via_nginx]:
            stream.close()


@test("compose.yaml up: the service on its published port, hardened, healthy; Prometheus loads its rules and scrapes it; down -v leaves nothing")
def compose_single():
    stack = Stack("compose.yaml", "single")
    try:
        stack.up()
        wait_until(lambda: try_request("127.0.0.1", stack.port, "GET", "/healthz")[0] == 200, 60,
                   interval=0.5, what="the compose service answering /healthz")
        token = token_hex(45, 2)
        register("127.0.0.1", stack.port, token)
        check(read_token("127.0.0.1", stack.port) == token, "GET /token after the write")
        service = stack.containers("forge-push-token")[0]
        check(inspect(service, "{{.HostConfig.ReadonlyRootfs}}") == "true", "the root is not read-only")
        status, out = health_check(service)
        check(status == 0, "healthcheck of the compose service: %d %r" % (status, out))

        def scraped():
            status, _, body = try_request("127.0.0.1", stack.prometheus_port, "GET",
                                          "/api/v1/query?query=up%7Bjob%3D%22forge-push-token%22%7D")
            if status != 200:
                return None
            result = json.loads(body)["data"]["result"]
            return result if result and result[0]["value"][1] == "1" else None
        wait_until(scraped, 40, interval=1, what="Prometheus's up{job=\"forge-push-token\"} == 1")
        status, _, body = request("127.0.0.1", stack.prometheus_port, "GET", "/api/v1/rules")
        groups = json.loads(body)["data"]["groups"]
        check(status == 200 and groups, "Prometheus has no rules loaded: %s" % body[:200])
        print("#   Prometheus scrapes the service (up == 1) with %d rule groups" % len(groups))
        stack.down()
    finally:
        stack.force_clean()


@test("compose.replicas.yaml up: a write through nginx reaches a stream on every replica; kill one replica and the stream through nginx goes on, no id going back; down -v leaves nothing")
def compose_replicas():
    stack = Stack("compose.replicas.yaml", "replicas")
    try:
        stack.up()
        replicas = wait_replicas_ready(stack, 3)
        wait_until(lambda: try_request("127.0.0.1", stack.port, "GET", "/healthz")[0] == 200, 30,
                   interval=0.5, what="nginx answering /healthz")
        last_id = write_reaches_every_replica(stack, replicas, token_hex(45, 3))
        print("#   %d replicas heard the write through nginx (id %d)" % (len(replicas), last_id))

        # A stream through nginx, then the replica that serves it is killed.
        stream = Stream("127.0.0.1", stack.port)
        seen_id, _ = stream.next()

        def serving():
            # The one replica with a subscriber (the streams of the write above are closed, and
            # each replica counts its own).
            busy = []
            for name, address in replicas:
                status, _, body = try_request(address, 8080, "GET", "/metrics")
                match = re.search(rb"^forge_push_token_subscribers (\d+)", body, re.M) if status == 200 else None
                if match and int(match.group(1)) > 0:
                    busy.append(name)
            return busy[0] if len(busy) == 1 else None
        victim = wait_until(serving, 10, interval=0.2, what="the replica that serves the stream")
        podman("kill", victim)
        check(stream.end(10), "the stream through nginx did not end when its replica was killed")
        stream.close()
        # An EventSource reconnects with Last-Event-ID; nginx sends it to a live replica.
        stream = wait_until(lambda: _reconnect(stack.port, seen_id), 15, interval=0.2,
                            what="a stream through nginx again")
        try:
            event_id, _ = stream.next()
            check(event_id >= seen_id, "after the kill the stream resumed at id %d, below %d" % (event_id, seen_id))
            token = token_hex(45, 4)
            register("127.0.0.1", stack.port, token)
            event_id, value = stream.next(timeout=10)
            while value != token:
                check(event_id >= seen_id, "id %d went back below %d" % (event_id, seen_id))
                event_id, value = stream.next(timeout=10)
            check(event_id > seen_id, "the next event has id %d, not above %d" % (event_id, seen_id))
        finally:
            stream.close()
        print("#   killed %s; the stream through nginx went on at id %d (was %d)" % (victim, event_id, seen_id))
        stack.down()
    finally:
        stack.force_clean()


def _reconnect(port, last_id):
    try:
        return Stream("127.0.0.1", port, last_event_id=last_id)
    except (OSError, http.client.HTTPException, Failure):
        return None


@test("compose.sentinel.yaml up: writes through nginx reach every replica; kill the master Redis and writes resume within the failover bound; down -v leaves nothing")
def compose_sentinel():
    stack = Stack("compose.sentinel.yaml", "sentinel")
    try:
        stack.up()
        replicas = wait_replicas_ready(stack, 3, timeout=90)
        wait_until(lambda: try_request("127.0.0.1", stack.port, "GET", "/healthz")[0] == 200, 30,
                   interval=0.5, what="nginx answering /healthz")
        write_reaches_every_replica(stack, replicas, token_hex(45, 5))
        master = stack.containers("redis-master")[0]
        replica_redis = stack.containers("redis-replica")[0]
        sentinels = stack.containers("sentinel-1") + stack.containers("sentinel-2") + stack.containers("sentinel-3")

        # A sentinel that has not seen the replica cannot promote it, and one that has not met the
        # other sentinels splits the vote (docs/replicas.md): wait for both, as the e2e tests do.
        def cli_of(name):
            return lambda *args: podman("exec", name, "redis-cli", "-p", "26379", *args, ok=False)[1]
        # The sentinels know the Redis nodes by their fixed addresses (docker/compose.sentinel.yaml).
        replica_address = container_ip(replica_redis)
        wait_until(lambda: sentinels_ready([cli_of(name) for name in sentinels], "mymaster", replica_address),
                   30, interval=0.5, what="every sentinel listing the replica and the other sentinels")
        podman("kill", master)
        t0 = time.monotonic()
        token = token_hex(45, 6)

        def written():
            status, _, _ = try_request("127.0.0.1", stack.port, "POST", "/register", body=token.encode(), timeout=3)
            return status == 200
        # With the Redis nodes known by host name, this missed the bound in 3 of 11 runs: the
        # sentinels logged "Failed to resolve hostname 'redis-master'" once the killed container's
        # name had left aardvark-dns, and aborted the failover every 10 s. The stack now gives
        # them fixed addresses; should it ever miss again, the logs below show why.
        try:
            wait_until(written, SENTINEL_FAILOVER_BOUND, interval=0.5,
                       what="a write through nginx after the master was killed")
        except Failure:
            # What the sentinels, the promoted Redis and a replica of ours say, for the report.
            for name in sentinels[:1] + [replica_redis, replicas[0][0]]:
                log = subprocess.run(["podman", "logs", "--tail", "25", name], capture_output=True, text=True)
                for line in (log.stdout + log.stderr).splitlines():
                    print("#   %s: %s" % (name, line))
            raise
        took = time.monotonic() - t0
        _, out, _ = podman("exec", replica_redis, "redis-cli", "ROLE")
        check(out.split()[0] == "master", "redis-replica did not become the master: %r" % out)
        for name in sentinels:
            wait_until(lambda: cli_of(name)("SENTINEL", "get-master-addr-by-name", "mymaster").split()[:1]
                       == [replica_address], 10, interval=0.2,
                       what="%s naming redis-replica (%s) the master" % (name, replica_address))
        for name, address in replicas:
            wait_until(lambda: read_token(address, 8080) == token, 10, interval=0.2,
                       what="%s reading the write after the failover" % name)
        print("#   writes resumed %.1f s after the master was killed (bound %d s, docs/replicas.md); "
              "redis-replica (%s) is the master; every replica reads them"
              % (took, SENTINEL_FAILOVER_BOUND, replica_address))
        stack.down()
    finally:
        stack.force_clean()


def clean_all():
    """Removes every container, network and volume of this run (by label and name), whatever
    happened."""
    for name in podman("ps", "-a", "--filter", "label=" + LABEL, "--format", "{{.Names}}", ok=False)[1].split():
        podman("rm", "-f", "-v", "-t", "0", name, ok=False)
    for volume in podman("volume", "ls", "--filter", "label=" + LABEL, "--format", "{{.Name}}", ok=False)[1].split():
        podman("volume", "rm", "-f", volume, ok=False)
    left = remove_by_prefix(PREFIX)
    if left:
        print("# removed %d container(s), network(s) and volume(s) a failed check left" % left, flush=True)


def main():
    global ARGS, VERBOSE
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--compose", required=True, help="the podman-compose command")
    parser.add_argument("--conformance", default="")
    parser.add_argument("--only", default="")
    parser.add_argument("--verbose", action="store_true")
    ARGS = parser.parse_args()
    VERBOSE = ARGS.verbose
    selected = [(d, f) for d, f in CHECKS
                if not ARGS.only or any(p in d or p in f.__name__ for p in ARGS.only.split(","))]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run_selected_as_tap(selected, clean_all)


if __name__ == "__main__":
    sys.exit(main())
