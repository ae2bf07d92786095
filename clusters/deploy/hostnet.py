"""Thin wrappers over iproute2 and iptables on the host: run a command, list namespaces and links,
find a free private /24, and add or remove host iptables rules tagged with a comment.
"""
from __future__ import annotations

import ipaddress
import json
import shlex
import shutil
import subprocess
from collections.abc import Iterable

from clusters.deploy.backend import ClusterError

PREFIX = "pc-"                        # every namespace and link we create starts with this
RULE_TAG = "pulsar-chaos:"            # comment on every host iptables rule we add: pulsar-chaos:<id>
SUBNET_POOL = [f"10.213.{x}.0/24" for x in range(256)]


def run(argv: list[str], *, check: bool = True, input: str | None = None,
        timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ClusterError(f"{argv[0]} not found", "install iproute2 and iptables "
                           "(`apt-get install iproute2 iptables`)") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{shlex.join(argv)}` did not finish within {timeout}s") from None
    if check and cp.returncode != 0:
        raise ClusterError(f"`{shlex.join(argv)}` failed: {cp.stderr.strip() or cp.stdout.strip()}")
    return cp


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def netns_list() -> list[str]:
    cp = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]


def link_names() -> list[str]:
    cp = run(["ip", "-o", "link", "show"], check=False)
    out = []
    for line in cp.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@")[0])
    return out


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def routed_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host routes or has an address in (default routes excluded)."""
    nets: list[ipaddress.IPv4Network] = []
    cp = run(["ip", "-4", "-j", "route", "show", "table", "all"], check=False)
    try:
        routes = json.loads(cp.stdout or "[]")
    except ValueError:
        routes = []
    for r in routes:
        dst = r.get("dst", "")
        if dst in ("", "default", "0.0.0.0/0"):
            continue
        try:
            nets.append(ipaddress.IPv4Network(dst, strict=False))
        except ValueError:
            pass
    cp = run(["ip", "-4", "-j", "addr", "show"], check=False)
    try:
        for link in json.loads(cp.stdout or "[]"):
            for a in link.get("addr_info", []):
                nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    except (ValueError, KeyError):
        pass
    return nets


def subnet_free(subnet: str, reserved: Iterable[str] = ()) -> bool:
    net = ipaddress.IPv4Network(subnet)
    taken = routed_networks() + [ipaddress.IPv4Network(s) for s in reserved]
    return not any(net.overlaps(t) for t in taken)


def pick_subnet(reserved: Iterable[str] = ()) -> str:
    reserved = list(reserved)
    taken = routed_networks() + [ipaddress.IPv4Network(s) for s in reserved]
    for cand in SUBNET_POOL:
        net = ipaddress.IPv4Network(cand)
        if not any(net.overlaps(t) for t in taken):
            return cand
    raise ClusterError("no free subnet in 10.213.0.0/16", "take some clusters down, or pass --subnet")


# -- host iptables rules, each tagged with a comment so a killed run's rules can be found --------

def host_rule(chain: str, args: list[str], cluster_id: str) -> list[str]:
    """The rule spec (without -A/-D) tagged with our comment."""
    return [chain, *args, "-m", "comment", "--comment", RULE_TAG + cluster_id]


def add_host_rule(rule: list[str]) -> None:
    chain, rest = rule[0], rule[1:]
    run(["iptables", "-w", "5", "-I", chain, "1", *rest])


def delete_host_rule(rule: list[str]) -> None:
    chain, rest = rule[0], rule[1:]
    # a rule may have been added twice by a retried run: delete until gone
    for _ in range(8):
        if run(["iptables", "-w", "5", "-D", chain, *rest], check=False).returncode != 0:
            return


def tagged_host_rules(cluster_id: str | None = None) -> list[list[str]]:
    """Our rules present in the host's filter table (of one cluster id, or of all)."""
    if not have("iptables"):
        return []
    cp = run(["iptables", "-w", "5", "-S"], check=False)
    out = []
    for line in cp.stdout.splitlines():
        if not line.startswith("-A ") or RULE_TAG not in line:
            continue
        words = shlex.split(line)
        tag = words[words.index("--comment") + 1] if "--comment" in words else ""
        if not tag.startswith(RULE_TAG):
            continue
        if cluster_id is not None and tag != RULE_TAG + cluster_id:
            continue
        out.append(words[1:])
    return out
