#!/usr/bin/env python3
"""Checks of the two replica setups for docker/lint.sh (steps 6 and 7; docs/replicas.md):

    lint_replicas.py replicas docker/compose.replicas.yaml docker/nginx/replicas.conf
    lint_replicas.py sentinel docker/compose.sentinel.yaml

Each prints its problems to standard error, one a line, and exits 1 when there is any. Needs
PyYAML (lint.sh's virtual environment)."""
import ipaddress
import re
import sys

import yaml


def replica_service_problems(services, url_problem):
    """What both setups ask of the service's own replicas, nginx in front: no state file (Redis
    keeps the state), a Redis URL (`url_problem(url)` says what is wrong with it, or None), at
    least three replicas, no published port, and docker/nginx/replicas.conf mounted into nginx,
    which writes it as its default.conf with the container's own resolvers."""
    problems = []
    replica = services.get("replica", {})
    environment = replica.get("environment", {})
    if environment.get("FORGE_PUSH_TOKEN_STATE_FILE", None) != "":
        problems.append("replica: FORGE_PUSH_TOKEN_STATE_FILE must be cleared (\"\"): --redis-url excludes --state-file")
    url_wrong = url_problem(environment.get("FORGE_PUSH_TOKEN_REDIS_URL"))
    if url_wrong:
        problems.append("replica: " + url_wrong)
    if replica.get("deploy", {}).get("replicas", 1) < 3:
        problems.append("replica: fewer than 3 replicas")
    if "ports" in replica:
        problems.append("replica: publishes a port (nginx is the way in)")
    nginx = services.get("nginx", {})
    if not any("replicas.conf:/etc/nginx/replicas.conf" in str(v) for v in nginx.get("volumes", [])):
        problems.append("nginx: docker/nginx/replicas.conf is not mounted as /etc/nginx/replicas.conf")
    # The resolver of replicas.conf is Docker's; the command sets the container's own (podman's
    # aardvark-dns differs) and writes the result as default.conf (issue 45).
    script = " ".join(str(part) for part in nginx.get("command", []))
    if "/etc/resolv.conf" not in script or ">/etc/nginx/conf.d/default.conf" not in script \
            or "exec nginx -g 'daemon off;'" not in script:
        problems.append("nginx: the command does not write default.conf with the resolvers of /etc/resolv.conf "
                        "and exec nginx")
    return problems


def replicas(compose_path, nginx_path):
    """docker/compose.replicas.yaml and docker/nginx/replicas.conf: Redis with AOF on a volume and
    noeviction, the replicas, and nginx passing event streams through unbuffered."""
    services = yaml.safe_load(open(compose_path)).get("services", {})
    nginx = open(nginx_path).read()
    problems = []
    command = " ".join(services.get("redis", {}).get("command", []))
    if "--appendonly yes" not in command:
        problems.append("redis: the append-only file is off (--appendonly yes)")
    if "--maxmemory-policy noeviction" not in command:
        problems.append("redis: the eviction policy is not noeviction (the state key must never be evicted)")
    if not any(str(v).endswith(":/data") for v in services.get("redis", {}).get("volumes", [])):
        problems.append("redis: /data is not on a volume")
    problems += replica_service_problems(services, lambda url: None if url is not None else "no FORGE_PUSH_TOKEN_REDIS_URL")
    stream = re.search(r"location = /token/stream \{(.*?)\}", nginx, re.S)
    if not stream:
        problems.append("replicas.conf: no location for /token/stream")
    else:
        if "proxy_buffering off;" not in stream.group(1):
            problems.append("replicas.conf: the stream route buffers (proxy_buffering off)")
        timeout = re.search(r"proxy_read_timeout (\d+)([smh]);", stream.group(1))
        if not timeout or int(timeout.group(1)) * {"s": 1, "m": 60, "h": 3600}[timeout.group(2)] < 300:
            problems.append("replicas.conf: the stream route's proxy_read_timeout is under 5 minutes")
    if "resolver 127.0.0.11" not in nginx:
        problems.append("replicas.conf: not resolving through Docker's DNS (resolver 127.0.0.11): scaled replicas are not found")
    return "compose.replicas.yaml", problems


def compose_defaults(text):
    """TEXT with every `${NAME:-default}` and `${NAME-default}` replaced by its default: the file
    as Compose reads it when the environment sets none of them."""
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", text)


def fixed_address(service, network):
    """The fixed IPv4 address SERVICE asks for on NETWORK (`networks: {NETWORK: {ipv4_address}}`),
    or None."""
    networks = service.get("networks") or {}
    if not isinstance(networks, dict):
        return None
    address = (networks.get(network) or {}).get("ipv4_address")
    try:
        return ipaddress.ip_address(address) if address else None
    except ValueError:
        return None


def sentinel(compose_path):
    """docker/compose.sentinel.yaml: a master and a replica with noeviction, three sentinels with
    writable configuration files of their own and a quorum of 2, and the replicas on a
    redis+sentinel:// URL naming every sentinel. The Redis nodes and the sentinels have fixed
    addresses on the default network, outside the range the engine hands out, and every sentinel
    monitors the master by its address: a killed container's name leaves the engine's DNS, and a
    sentinel that must resolve it cannot fail the master over (redis/redis#12753)."""
    compose = yaml.safe_load(compose_defaults(open(compose_path).read()))
    services = compose.get("services", {})
    problems = []
    for name in ("redis-master", "redis-replica"):
        command = " ".join(services.get(name, {}).get("command", []))
        if "--maxmemory-policy noeviction" not in command:
            problems.append(f"{name}: the eviction policy is not noeviction (the state key must never be evicted)")
    sentinels = [name for name in services if name.startswith("sentinel-")]
    if len(sentinels) < 3:
        problems.append(f"only {len(sentinels)} sentinels (a quorum of 2 needs 3)")

    ipam = ((compose.get("networks") or {}).get("default") or {}).get("ipam", {}).get("config") or [{}]
    try:
        subnet = ipaddress.ip_network(ipam[0].get("subnet", ""))
        dynamic = ipaddress.ip_network(ipam[0].get("ip_range", ""))
    except ValueError:
        subnet = dynamic = None
        problems.append("networks.default: no ipam subnet and ip_range (the Redis nodes and sentinels need "
                        "fixed addresses outside the range handed out)")
    addresses = {}
    for name in ["redis-master", "redis-replica"] + sentinels:
        address = fixed_address(services.get(name, {}), "default")
        if address is None:
            problems.append(f"{name}: no fixed ipv4_address on the default network")
        elif subnet and (address not in subnet or address in dynamic):
            problems.append(f"{name}: {address} is not in {subnet} outside the range handed out ({dynamic})")
        elif address in addresses.values():
            problems.append(f"{name}: {address} is taken by another service")
        else:
            addresses[name] = address
    master = addresses.get("redis-master")
    if f"--replicaof {master} 6379" not in " ".join(services.get("redis-replica", {}).get("command", [])):
        problems.append(f"redis-replica: not a replica of redis-master at its address ({master})")
    for name in sentinels:
        command = " ".join(services[name].get("command", []))
        if "--sentinel" not in command or "> /data/sentinel.conf" not in command:
            problems.append(f"{name}: not a sentinel with a writable configuration file of its own")
        if f"sentinel monitor mymaster {master} 6379 2" not in command:
            problems.append(f"{name}: does not monitor mymaster at redis-master's address ({master}) with quorum 2")
        if "resolve-hostnames yes" in command:
            problems.append(f"{name}: resolves host names (a killed master's name leaves the DNS)")

    def url_problem(url):
        url = str(url or "")
        if "redis+sentinel://" not in url or not all(name in url for name in sentinels) or "/mymaster" not in url:
            return "FORGE_PUSH_TOKEN_REDIS_URL is not a redis+sentinel:// URL naming every sentinel and mymaster"
        return None
    problems += replica_service_problems(services, url_problem)
    return "compose.sentinel.yaml", problems


if __name__ == "__main__":
    setups = {"replicas": replicas, "sentinel": sentinel}
    if len(sys.argv) < 2 or sys.argv[1] not in setups:
        sys.exit("usage: lint_replicas.py replicas COMPOSE NGINX_CONF | sentinel COMPOSE")
    label, found = setups[sys.argv[1]](*sys.argv[2:])
    for problem in found:
        print(f"{label}: {problem}", file=sys.stderr)
    sys.exit(1 if found else 0)
