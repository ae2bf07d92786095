"""Fixtures for the deployment backend: throwaway netns clusters with unique names, always cleaned up."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import uuid

import pytest

from clusters.deploy.backend import Node
from clusters.deploy.netns import NetnsCluster
from clusters.deploy.spec import ClusterSpec


def placeholder(port_name: str):
    """A node command that just listens on the node's port (stands in for a bookie or broker)."""
    def command(node: Node) -> list[str]:
        return [sys.executable, "-m", "clusters.deploy.placeholder", f"{node.host}:{node.ports[port_name]}"]
    return command


PLACEHOLDERS = {"bookie": placeholder("bookie"), "broker": placeholder("pulsar")}


def unique_name(prefix: str = "t") -> str:
    return prefix + uuid.uuid4().hex[:5]        # <= 6 chars: used as the short id itself


def connect_from(namespace: str | None, host: str, port: int, timeout: float = 1.0) -> str:
    """Try a TCP connect from inside a namespace (None: the host): 'ok', 'timeout' or the error."""
    code = ("import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(({host!r}, {port}), timeout={timeout}).close(); print('ok')\n"
            "except socket.timeout:\n"
            "    print('timeout')\n"
            "except OSError as e:\n"
            "    print(type(e).__name__)\n")
    argv = [sys.executable, "-c", code]
    if namespace:
        argv = ["ip", "netns", "exec", namespace, *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 10).stdout.strip()


def host_connect(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


@pytest.fixture
def make_cluster():
    """Factory: make_cluster(**spec_overrides) -> an up NetnsCluster with placeholder bookies/brokers.

    Everything created is removed at teardown, even when the test fails."""
    created: list[NetnsCluster] = []

    def make(**kw) -> NetnsCluster:
        commands = kw.pop("commands", PLACEHOLDERS)
        spec = dict(name=unique_name(), zookeepers=1, bookies=1, brokers=1, ensemble=1, write_quorum=1,
                    ack_quorum=1)
        spec.update(kw)
        cluster = NetnsCluster(ClusterSpec(**spec), commands=commands)
        created.append(cluster)
        return cluster.up()

    try:
        yield make
    finally:
        for cluster in created:
            try:
                cluster.down()
            finally:
                NetnsCluster.cleanup_all(force=True, names=[cluster.name])
                shutil.rmtree(cluster.base_dir, ignore_errors=True)
