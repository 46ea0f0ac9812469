#!/usr/bin/env python3
"""What schemas cannot see in the deployment files (docs/operations.md, "Deploying and upgrading";
../shared/spec/deploy.md, "Kubernetes"). Run by docker/lint.sh with PyPI's PyYAML.

    lint_deploy.py kubernetes RENDERED.yaml   the output of `kubectl kustomize docker/kubernetes`
    lint_deploy.py drain                      compose files, systemd unit and Dockerfile agree with
                                              the drain

kubernetes: a Deployment of 3 replicas, RollingUpdate with maxUnavailable 0 and maxSurge 1; the
probe paths are routes of openapi.yaml, readiness on /readyz (fails fast), liveness on /livez
(slow to fail), the startup probe on /livez; every probe's port and the Service's target port are
the container port, which is the service's --port; a preStop sleep and a grace period of at least
pause + --drain-seconds + 5; a drain of 5 s or more; no secret mounted with subPath (nor any
volume from a secret), both token files (--write-token-file, --read-token-file) inside one mounted
secret and none of the one-token settings; the state file off; every
FORGE_PUSH_TOKEN_* variable a setting of the service; the security context the image supports
(its USER, non-root, read-only root filesystem, no capabilities, no privilege escalation,
RuntimeDefault seccomp); requests and limits; a PodDisruptionBudget of one and a Service whose
selectors match the pods; the Prometheus scrape job on /metrics with a read token's credentials
file.

drain: each compose file's service stop_grace_period, and the systemd unit's TimeoutStopSec, are at
least its --drain-seconds (FORGE_PUSH_TOKEN_DRAIN_SECONDS) + 5; the fleet files (replicas,
Sentinel, systemd) set a drain of 5 or more; the Dockerfile's HEALTHCHECK asks /healthz or
/readyz through --health-check and is not faster to give up than the drain (interval x retries
above it), so Docker never marks a draining container unhealthy before it is gone.
"""
import json
import os
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
problems = []


def check(condition, message):
    if not condition:
        problems.append(message)
    return condition


def settings():
    """Every flag of the service that takes a value, from the command line's one list of flags
    (the `CommandLineFlag` enum: its cases, and those whose `argument` is nil take none), as its
    variable name."""
    text = (ROOT / "Sources/forge-push-token-server/CommandLineFlag.swift").read_text()
    cases = {match.group(1): match.group(2) or match.group(1)
             for match in re.finditer(r'^\s*case (\w+)(?: = "([a-z0-9-]+)")?\s*$', text, re.M)}
    argument = re.search(r"var argument: String\? \{(.*?)\n    \}", text, re.S).group(1)
    none = set(re.findall(r"\.(\w+)", re.search(r"case ([^:]*): nil", argument).group(1)))
    flags = [raw for name, raw in cases.items() if name not in none]
    if not check(len(flags) >= 20 and none, "CommandLineFlag.swift: found only %d value flags" % len(flags)):
        return {}
    return {"FORGE_PUSH_TOKEN_" + flag.upper().replace("-", "_"): flag for flag in flags}


def routes():
    return set(yaml.safe_load((ROOT / "openapi.yaml").read_text())["paths"])


def dockerfile():
    """The runtime stage's instructions (logical lines, comments out): USER, HEALTHCHECK, ENV, ..."""
    text = re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", (ROOT / "docker/Dockerfile").read_text()))
    runtime = re.split(r"(?mi)^FROM ", text)[-1]

    def instruction(name):
        found = re.findall(rf"(?mi)^{name} (.*)$", runtime)
        return found[-1].strip() if found else None
    env = dict(re.findall(r"(FORGE_PUSH_TOKEN_[A-Z_]+)=(\S*)", instruction("ENV") or ""))
    return instruction, env


def seconds(duration):
    if isinstance(duration, (int, float)):
        return float(duration)
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration)):
        total += float(amount) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def default(value):
    """"${NAME:-default}" -> default; other values as they are."""
    match = re.fullmatch(r"\$\{[A-Z0-9_]+:-([^}]*)\}", str(value))
    return match.group(1) if match else str(value)


def kubernetes(rendered_path):
    documents = [d for d in yaml.safe_load_all(open(rendered_path)) if d]
    by_kind = {}
    for document in documents:
        by_kind.setdefault(document["kind"], []).append(document)
    check(set(by_kind) >= {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"},
          f"expected a Deployment, Service, PodDisruptionBudget and ConfigMap; rendered {sorted(by_kind)}")
    deployment = by_kind.get("Deployment", [{}])[0]
    spec = deployment.get("spec", {})
    check(spec.get("replicas") == 3, f"replicas {spec.get('replicas')}, not 3")
    strategy = spec.get("strategy", {})
    rolling = strategy.get("rollingUpdate", {})
    check(strategy.get("type") == "RollingUpdate" and rolling.get("maxUnavailable") == 0 and rolling.get("maxSurge") == 1,
          f"strategy {strategy}: RollingUpdate with maxUnavailable 0 and maxSurge 1 expected")
    pod = spec.get("template", {}).get("spec", {})
    pod_labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
    selector = spec.get("selector", {}).get("matchLabels", {})
    check(selector and all(pod_labels.get(k) == v for k, v in selector.items()), "the selector does not match the pods")
    containers = pod.get("containers", [])
    check(len(containers) == 1, f"{len(containers)} containers, expected 1")
    container = containers[0] if containers else {}
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    known = settings()
    for name in env:
        check(name in known, f"{name} is not a setting of the service")
    check(all(isinstance(v, str) for v in env.values()), "every variable needs a literal string value")
    instruction, image_env = dockerfile()
    # The port: the service's --port (the variable, else the image's), the container's port.
    port = int(env.get("FORGE_PUSH_TOKEN_PORT") or image_env.get("FORGE_PUSH_TOKEN_PORT", "8080"))
    check(int(instruction("EXPOSE").split()[0].split("/")[0]) == port, "the container port differs from the image's EXPOSE")
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}
    check(port in named.values(), f"no container port is the service's --port {port}: {named}")

    def resolves(target):
        return (named.get(target) if isinstance(target, str) else target) == port
    paths = routes()
    probes = {}
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = container.get(kind)
        if not check(probe and "httpGet" in probe, f"no {kind} with httpGet"):
            continue
        path = probe["httpGet"].get("path")
        check(path in paths, f"{kind} path {path} is not a route of openapi.yaml")
        check(resolves(probe["httpGet"].get("port")), f"{kind} port {probe['httpGet'].get('port')} is not {port}")
        probes[kind] = (path, probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))
    check(probes.get("readinessProbe", ("",))[0] == "/readyz", "the readiness probe is not /readyz")
    check(probes.get("livenessProbe", ("",))[0] == "/livez", "the liveness probe is not /livez")
    check(probes.get("startupProbe", ("",))[0] == "/livez",
          "the startup probe is not /livez (on /readyz a Redis down at start means a restart loop)")
    if "readinessProbe" in probes:
        check(probes["readinessProbe"][1] <= 5, f"readiness takes {probes['readinessProbe'][1]} s to fail: it should be fast")
    if "livenessProbe" in probes:
        check(probes["livenessProbe"][1] >= 30, f"liveness fails after {probes['livenessProbe'][1]} s: it should be slow")
    # The grace period covers the pause, the drain and the shutdown.
    drain = int(env.get("FORGE_PUSH_TOKEN_DRAIN_SECONDS") or 0)
    check(drain >= 5, f"--drain-seconds {drain}: a fleet drains for 5 s or more")
    pause = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
    check(isinstance(pause, int) and pause >= 1, "no preStop sleep action (endpoints must drop the pod before SIGTERM)")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(grace >= (pause or 0) + drain + 5,
          f"terminationGracePeriodSeconds {grace} < preStop {pause} + drain {drain} + 5")
    # Secrets whole, never with subPath; the token file inside one.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    secret_mounts = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if "secret" in volume or "projected" in volume:
            check("subPath" not in mount and "subPathExpr" not in mount,
                  f"secret volume {mount['name']} is mounted with subPath: a rotated Secret would never reach the pod")
            secret_mounts.append(mount["mountPath"].rstrip("/") + "/")
    for name, value in env.items():
        if name.endswith("_FILE") and value:
            check(any(value.startswith(m) for m in secret_mounts), f"{name}={value} is not inside a mounted secret")
    # Read and write tokens that rotate without a restart (docs/operations.md, "Read and write
    # tokens"): both token files, from one whole-mounted secret; none of the one-token settings.
    token_files = [env.get("FORGE_PUSH_TOKEN_WRITE_TOKEN_FILE"), env.get("FORGE_PUSH_TOKEN_READ_TOKEN_FILE")]
    check(all(token_files), "FORGE_PUSH_TOKEN_WRITE_TOKEN_FILE and FORGE_PUSH_TOKEN_READ_TOKEN_FILE must both be set")
    check(len({os.path.dirname(path) for path in token_files}) == 1, f"the token files are not in one secret: {token_files}")
    for name in ("FORGE_PUSH_TOKEN_AUTH_TOKEN", "FORGE_PUSH_TOKEN_AUTH_TOKEN_FILE", "FORGE_PUSH_TOKEN_AUTH_SCOPE"):
        check(not env.get(name), f"{name} with the token files would stop the service (exit 64)")
    check(env.get("FORGE_PUSH_TOKEN_STATE_FILE") == "", "FORGE_PUSH_TOKEN_STATE_FILE must be set empty (replicas exclude it)")
    check(env.get("FORGE_PUSH_TOKEN_REDIS_URL"), "no FORGE_PUSH_TOKEN_REDIS_URL")
    age = int(env.get("FORGE_PUSH_TOKEN_MAX_STREAM_AGE") or 0)
    check(age == 0 or 60 <= age <= 86400, f"--max-stream-age {age} is out of range")
    # The security context the image supports.
    user, _, group = instruction("USER").partition(":")
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    check(str(security.get("runAsUser")) == user and str(security.get("runAsGroup")) == (group or user),
          f"runAsUser/runAsGroup {security.get('runAsUser')}/{security.get('runAsGroup')} differ from the image's USER {user}:{group}")
    check(security.get("runAsNonRoot") is True, "runAsNonRoot must be true")
    container_security = container.get("securityContext", {})
    check(container_security.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    check(container_security.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check(container_security.get("capabilities", {}).get("drop") == ["ALL"], "capabilities must drop ALL")
    check(security.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccompProfile must be RuntimeDefault")
    resources = container.get("resources", {})
    check(resources.get("requests", {}).get("cpu") and resources.get("requests", {}).get("memory")
          and resources.get("limits", {}).get("memory"), f"requests (cpu, memory) and a memory limit expected: {resources}")
    # The Service and the budget select the pods; the Service targets the port.
    service = by_kind.get("Service", [{}])[0].get("spec", {})
    check(service.get("selector") and all(pod_labels.get(k) == v for k, v in service["selector"].items()),
          "the Service's selector does not match the pods")
    check(all(resolves(p.get("targetPort")) for p in service.get("ports", [])) and service.get("ports"),
          "the Service's target port is not the container port")
    budget = by_kind.get("PodDisruptionBudget", [{}])[0].get("spec", {})
    check(budget.get("maxUnavailable") == 1, f"the PodDisruptionBudget allows {budget.get('maxUnavailable')} down, not 1")
    budget_selector = budget.get("selector", {}).get("matchLabels", {})
    check(budget_selector and all(pod_labels.get(k) == v for k, v in budget_selector.items()),
          "the PodDisruptionBudget's selector does not match the pods")
    # The scrape job.
    jobs = []
    for config in by_kind.get("ConfigMap", []):
        for text in config.get("data", {}).values():
            jobs += (yaml.safe_load(text) or {}).get("scrape_configs", [])
    check(len(jobs) == 1, f"{len(jobs)} Prometheus scrape jobs in the ConfigMaps, expected 1")
    for job in jobs:
        check(job.get("metrics_path", "/metrics") == "/metrics" and "/metrics" in paths, "the scrape job's path is not /metrics")
        check(job.get("authorization", {}).get("credentials_file"), "the scrape job has no authorization.credentials_file")
        check("read" in job["authorization"]["credentials_file"],
              "the scrape job's credentials_file should be a read token of Prometheus's own, not a write token")
        kept = " ".join(str(r.get("regex")) for r in job.get("relabel_configs", []) if r.get("action") == "keep")
        check(pod_labels.get("app.kubernetes.io/name", "?") in kept, "the scrape job does not keep the pods by their label")
    print(f"kubernetes: 3 replicas, probes /readyz {probes.get('readinessProbe', ('', 0))[1]} s to fail, /livez "
          f"{probes.get('livenessProbe', ('', 0))[1]} s, startup /livez; port {port}; preStop {pause} s + drain {drain} s "
          f"+ 5 <= grace {grace} s; secrets whole at {', '.join(secret_mounts)}; state file off; user {user}:{group}")


def drain():
    instruction, image_env = dockerfile()
    fleet = {"docker/compose.replicas.yaml": "replica", "docker/compose.sentinel.yaml": "replica",
             "docker/compose.yaml": "forge-push-token"}
    summary = []
    for path, name in fleet.items():
        service = yaml.safe_load((ROOT / path).read_text()).get("services", {}).get(name, {})
        env = service.get("environment", {})
        value = default(env.get("FORGE_PUSH_TOKEN_DRAIN_SECONDS", "0")) or "0"
        drain_seconds = int(value)
        grace = seconds(service.get("stop_grace_period", "10s"))
        check(grace >= drain_seconds + 5, f"{path}: stop_grace_period {grace:g} s < drain {drain_seconds} + 5")
        if name == "replica":
            check(drain_seconds >= 5, f"{path}: the replicas drain for {drain_seconds} s; a fleet drains for 5 s or more")
        summary.append(f"{Path(path).name} drain {drain_seconds} s, stop grace {grace:g} s")
    unit = (ROOT / "docker/systemd/forge-push-token-server.service").read_text()
    found = re.search(r"(?m)^Environment=FORGE_PUSH_TOKEN_DRAIN_SECONDS=(\d+)$", unit)
    unit_drain = int(found.group(1)) if found else 0
    stop = re.search(r"(?m)^TimeoutStopSec=(\S+)$", unit)
    stop_seconds = seconds(stop.group(1) if stop and not stop.group(1).isdigit() else f"{stop.group(1) if stop else 90}s")
    check(unit_drain >= 5, f"systemd: FORGE_PUSH_TOKEN_DRAIN_SECONDS {unit_drain}; behind a load balancer drain 5 s or more")
    check(stop_seconds >= unit_drain + 5, f"systemd: TimeoutStopSec {stop_seconds:g} < drain {unit_drain} + 5")
    summary.append(f"systemd drain {unit_drain} s, stop timeout {stop_seconds:g} s")
    health = instruction("HEALTHCHECK") or ""
    command = json.loads(health.split(" CMD ", 1)[1]) if " CMD " in health else []
    check(command[1:] in (["--health-check"], ["--health-check=ready"]),
          f"the HEALTHCHECK asks {command[1:]}: --health-check (/healthz) or --health-check=ready expected")
    interval = seconds(re.search(r"--interval=(\S+)", health).group(1)) if "--interval=" in health else 30
    retries = int(re.search(r"--retries=(\d+)", health).group(1)) if "--retries=" in health else 3
    longest = max([0] + [int(default(yaml.safe_load((ROOT / p).read_text())["services"][n]["environment"].get(
        "FORGE_PUSH_TOKEN_DRAIN_SECONDS", "0")) or 0) for p, n in fleet.items()])
    check(interval * retries > longest + 3,
          f"the HEALTHCHECK gives up after {interval * retries:g} s, within a drain of {longest} s + 3")
    check(instruction("STOPSIGNAL") == "SIGTERM", "STOPSIGNAL must be SIGTERM (the drain's signal)")
    summary.append(f"HEALTHCHECK {' '.join(command[1:])} unhealthy after {interval * retries:g} s > drain {longest} + 3 s")
    print("drain: " + "; ".join(summary))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "kubernetes":
        kubernetes(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "drain":
        drain()
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    for problem in problems:
        print(f"{sys.argv[1]}: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)
