"""`pulsar-chaos doctor`: is this machine able to deploy clusters and run tests, and how to fix what is missing.

Each check is a function returning a Check; required ones decide the exit code, the others only warn.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def label(self) -> str:
        return "ok" if self.ok else ("missing" if self.required else "warning")


def _run(argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _first_line(cp: subprocess.CompletedProcess | None) -> str:
    if cp is None:
        return ""
    text = (cp.stdout or "") + (cp.stderr or "")
    return text.strip().splitlines()[0] if text.strip() else ""


def check_root() -> Check:
    uid = os.geteuid()
    return Check("root", uid == 0, f"running as uid {uid}",
                 "run as root (e.g. `sudo pulsar-chaos ...`): namespaces and iptables need it")


def check_iproute2() -> Check:
    cp = _run(["ip", "-V"]) if shutil.which("ip") else None
    ok = cp is not None and cp.returncode == 0
    return Check("iproute2 (ip)", ok, _first_line(cp) if ok else "`ip` not found", "apt-get install iproute2")


def check_iptables() -> Check:
    if not shutil.which("iptables") or not shutil.which("iptables-restore"):
        return Check("iptables", False, "iptables / iptables-restore not found", "apt-get install iptables")
    cp = _run(["iptables", "--version"])
    detail = _first_line(cp)
    if os.geteuid() == 0:
        probe = _run(["iptables", "-w", "5", "-S", "INPUT"])
        if probe is None or probe.returncode != 0:
            return Check("iptables", False, f"{detail}; `iptables -S` failed: {_first_line(probe)}",
                         "load the kernel's netfilter modules (nf_tables or ip_tables), or run --privileged")
    return Check("iptables", cp is not None and cp.returncode == 0, detail, "apt-get install iptables")


def check_java() -> Check:
    java = shutil.which("java")
    if not java:
        return Check("java", False, "java not found", "apt-get install default-jre-headless")
    cp = _run([java, "-version"])
    ok = cp is not None and cp.returncode == 0
    return Check("java", ok, _first_line(cp) or java, "apt-get install default-jre-headless")


def check_zookeeper() -> Check:
    from clusters import zookeeper
    try:
        zookeeper.classpath()
        return Check("zookeeper", True, f"Debian package jars in {zookeeper.JAVA_DIR}")
    except zookeeper.ZooKeeperMissing as ex:
        return Check("zookeeper", False, str(ex).split(";")[0], "apt-get install zookeeper (or `make setup`)")


def check_pulsar_client() -> Check:
    try:
        mod = importlib.import_module("pulsar")
    except Exception as ex:  # ImportError, or a broken native library
        return Check("pulsar-client", False, f"import pulsar failed: {ex}",
                     "pip install 'pulsar-client>=3.5,<4' in this virtualenv (or `make setup`)")
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version
            version = dist_version("pulsar-client")
        except Exception:
            version = "?"
    return Check("pulsar-client", True, f"version {version}")


def check_docker() -> Check:
    if not shutil.which("docker"):
        return Check("docker engine", False, "docker CLI not found",
                     "install Docker Engine (only the docker backend needs it)", required=False)
    cp = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=15)
    if cp is not None and cp.returncode == 0:
        return Check("docker engine", True, f"server {cp.stdout.strip()}", required=False)
    return Check("docker engine", False, "`docker info` failed: no engine reachable",
                 "start the Docker daemon (`systemctl start docker` or `dockerd &`); only the docker backend needs it",
                 required=False)


def check_netns() -> Check:
    fix = "needs root and a kernel with network namespaces; inside a container, run it --privileged"
    if os.geteuid() != 0 or not shutil.which("ip"):
        return Check("network namespaces", False, "not tried (needs root and `ip`)", fix)
    # our prefix, so a killed doctor's namespace is swept by `cluster down --force`
    name = f"pc-doctor{os.getpid() % 100000}"
    add = _run(["ip", "netns", "add", name])
    if add is None or add.returncode != 0:
        return Check("network namespaces", False, f"`ip netns add` failed: {_first_line(add)}", fix)
    try:
        lo = _run(["ip", "-n", name, "link", "set", "lo", "up"])
        ok = lo is not None and lo.returncode == 0
        return Check("network namespaces", ok, "created and deleted a throwaway namespace" if ok
                     else f"`ip -n {name} link set lo up` failed: {_first_line(lo)}", fix)
    finally:
        _run(["ip", "netns", "del", name])


CHECKS: list[Callable[[], Check]] = [
    check_root, check_iproute2, check_iptables, check_java, check_zookeeper, check_pulsar_client,
    check_docker, check_netns,
]


def run_checks() -> list[Check]:
    out = []
    for fn in CHECKS:
        try:
            out.append(fn())
        except Exception as ex:  # a check must never crash the doctor
            out.append(Check(fn.__name__.removeprefix("check_"), False, f"check failed: {ex}"))
    return out


def report(checks: list[Check], out: TextIO, rich: bool = False) -> int:
    """Print the checks; 0 if every required one passed, else 1."""
    failed = [c for c in checks if not c.ok and c.required]
    if rich:
        from rich.console import Console
        from rich.table import Table
        table = Table(title="pulsar-chaos doctor")
        for col in ("check", "status", "detail", "how to get it"):
            table.add_column(col)
        style = {"ok": "green", "missing": "bold red", "warning": "yellow"}
        for c in checks:
            table.add_row(c.name, f"[{style[c.label]}]{c.label}[/]", c.detail, "" if c.ok else c.fix)
        Console(file=out).print(table)
    else:
        for c in checks:
            line = f"{c.label:<8} {c.name:<20} {c.detail}"
            if not c.ok and c.fix:
                line += f"  (fix: {c.fix})"
            print(line, file=out)
    print("all required prerequisites present" if not failed else
          f"missing required: {', '.join(c.name for c in failed)}", file=out)
    return 1 if failed else 0
