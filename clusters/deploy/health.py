"""Health checks a backend waits on: `srvr` for ZooKeeper, "the TCP port accepts" for bookies and brokers.

A check is any callable Node -> bool; backends take a role -> check map so tests can swap them.
"""
from __future__ import annotations

import socket
from collections.abc import Callable

from clusters import zookeeper
from clusters.deploy.backend import Node

HealthCheck = Callable[[Node], bool]


def tcp_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def zookeeper_serving(node: Node) -> bool:
    return zookeeper.is_serving(node.host, node.ports["client"])


def bookie_listening(node: Node) -> bool:
    return tcp_accepts(node.host, node.ports["bookie"])


def broker_listening(node: Node) -> bool:
    return tcp_accepts(node.host, node.ports["pulsar"])


DEFAULT: dict[str, HealthCheck] = {
    "zookeeper": zookeeper_serving,
    "bookie": bookie_listening,
    "broker": broker_listening,
}
