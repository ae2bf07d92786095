"""An in-memory Cluster: records faults, so nemesis logic is tested without namespaces."""
from __future__ import annotations

import subprocess
from typing import Any

from clusters.deploy.backend import Cluster, ClusterError, Grudge, Node, grudge_edges


class FakeCluster(Cluster):
    def __init__(self, brokers: int = 2, bookies: int = 3, zookeepers: int = 1):
        self._nodes: dict[str, Node] = {}
        pid = 1000
        for role, prefix, n, base in (("zookeeper", "zk", zookeepers, 10), ("bookie", "bookie", bookies, 20),
                                      ("broker", "broker", brokers, 60)):
            for i in range(1, n + 1):
                pid += 1
                name = f"{prefix}-{i}"
                ports = {"broker": {"pulsar": 6650, "http": 8080}, "bookie": {"bookie": 3181},
                         "zookeeper": {"client": 2181}}[role]
                self._nodes[name] = Node(name=name, role=role, host=f"10.0.0.{base + i}", pid=pid,
                                         ports=dict(ports), alive=True)
        self.drops: set[tuple[str, str]] = set()
        self.counts: dict[tuple[str, str], int] = {}
        self.calls: list[tuple[str, Any]] = []
        self._next_pid = 5000

    def up(self) -> "FakeCluster":
        return self

    def down(self) -> None:
        pass

    def nodes(self, role: str | None = None) -> list[Node]:
        return [Node(**vars(n)) for n in self._nodes.values() if role is None or n.role == role]

    def node(self, name: str) -> Node:
        if name not in self._nodes:
            raise ClusterError(f"no node named {name!r}")
        return Node(**vars(self._nodes[name]))

    @property
    def service_url(self) -> str:
        return "pulsar://" + ",".join(f"{n.host}:6650" for n in self.nodes("broker"))

    @property
    def zk_connect(self) -> str:
        return ",".join(f"{n.host}:2181" for n in self.nodes("zookeeper"))

    def status(self) -> dict[str, Any]:
        return {"nodes": [n.to_json() for n in self.nodes()], "partitions": sorted(self.drops)}

    def _live(self, name: str) -> Node:
        n = self._nodes[name]
        if not n.alive:
            raise ClusterError(f"{name} is not running")
        return n

    def start(self, name: str) -> Node:
        n = self._nodes[name]
        if n.alive:
            raise ClusterError(f"{name} is already running")
        self._next_pid += 1
        n.pid, n.alive, n.paused = self._next_pid, True, False
        self.calls.append(("start", name))
        return self.node(name)

    def stop(self, name: str) -> None:
        self.kill(name)

    def kill(self, name: str) -> None:
        n = self._live(name)
        n.alive = n.paused = False
        self.calls.append(("kill", name))

    def pause(self, name: str) -> None:
        self._live(name).paused = True
        self.calls.append(("pause", name))

    def resume(self, name: str) -> None:
        self._live(name).paused = False
        self.calls.append(("resume", name))

    def partition(self, grudge: Grudge) -> None:
        edges = grudge_edges(grudge)
        for a, b in edges:
            if a not in self._nodes or b not in self._nodes:
                raise ClusterError(f"unknown node in {a}->{b}")
        for e in edges | {(b, a) for a, b in edges}:
            self.counts[e] = self.counts.get(e, 0) + 1
        self.drops = {e for e, n in self.counts.items() if n > 0}
        self.calls.append(("partition", sorted(edges)))

    def deafen(self, node: str, peers: Any, *, trigger: bytes | None = None) -> None:
        self._live(node)
        self.calls.append(("deafen", (node, sorted(peers), trigger)))

    def undeafen(self, node: str, peers: Any, *, trigger: bytes | None = None) -> None:
        self.calls.append(("undeafen", (node, sorted(peers), trigger)))

    def unpartition(self, grudge: Grudge) -> None:
        edges = grudge_edges(grudge)
        for e in edges | {(b, a) for a, b in edges}:
            if self.counts.get(e, 0) > 0:
                self.counts[e] -= 1
        self.drops = {e for e, n in self.counts.items() if n > 0}
        self.calls.append(("unpartition", sorted(edges)))

    def heal(self) -> None:
        self.drops.clear()
        self.counts.clear()
        self.calls.append(("heal", None))

    def run_client(self, argv: list[str], node: str | None = None, **popen_kw: Any) -> subprocess.Popen:
        raise NotImplementedError
