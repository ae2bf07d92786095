"""The deployment backend interface: what the harness may do to a cluster's hosts and network.

A backend (network namespaces, containers) implements `Cluster`; nemeses and the runner see only this.
"""
from __future__ import annotations

import abc
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Union

import networkx as nx

ROLES = ("zookeeper", "bookie", "broker", "client")
# A pseudo-node naming the machine that runs the harness (its address on the cluster network).
# It may appear in a grudge so that clients running on the host can be cut off from nodes.
HOST = "host"


class ClusterError(RuntimeError):
    """A user-facing failure (bad spec, missing prerequisite, cluster not up...) with how to fix it."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message


class SpecError(ClusterError):
    """A cluster spec that cannot be deployed."""


class Unsupported(ClusterError):
    """A fault this backend (or this deployment of it) cannot apply; the nemesis records it as failed."""


@dataclass
class Node:
    """A snapshot of one host of the cluster and the process it runs (if any)."""
    name: str                       # zk-1, bookie-2, broker-1, client-1
    role: str                       # one of ROLES
    host: str                       # its address, reachable from the harness host
    pid: int | None = None          # the node's process (its process group leader); None: never started
    ports: dict[str, int] = field(default_factory=dict)
    log: Path | None = None
    data_dir: Path | None = None
    config: Path | None = None
    namespace: str | None = None    # backend-specific location (netns name, container id)
    alive: bool = False             # process exists and has not exited (a paused process is alive)
    paused: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("log", "data_dir", "config"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d


Grudge = Union[Mapping[str, Iterable[str]], nx.DiGraph]


def grudge_edges(grudge: Grudge) -> set[tuple[str, str]]:
    """Normalise a grudge into drop edges (a, b): node a drops packets from (and to) node b."""
    if isinstance(grudge, nx.Graph):
        g = grudge if grudge.is_directed() else grudge.to_directed()
        edges = {(str(a), str(b)) for a, b in g.edges()}
    else:
        edges = set()
        for a, bs in grudge.items():
            if isinstance(bs, str):
                bs = [bs]
            edges.update((str(a), str(b)) for b in bs)
    return {(a, b) for a, b in edges if a != b}


def partition_groups(groups: Iterable[Iterable[str]]) -> nx.DiGraph:
    """The grudge in which nodes of different groups drop each other (nodes in no group are untouched)."""
    groups = [list(g) for g in groups]
    seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        for n in g:
            if n in seen and seen[n] != i:
                raise ClusterError(f"node {n!r} appears in two partition groups",
                                   "list each node in one group only")
            seen[n] = i
    grudge = nx.DiGraph()
    grudge.add_nodes_from(seen)
    for i, g in enumerate(groups):
        for j, h in enumerate(groups):
            if i != j:
                grudge.add_edges_from((a, b) for a in g for b in h)
    return grudge


class Cluster(abc.ABC):
    """A running (or about to run) deployment of ZooKeeper, bookies and brokers on isolated hosts."""

    # -- lifecycle ---------------------------------------------------------------------------
    @abc.abstractmethod
    def up(self) -> "Cluster":
        """Create the hosts and start ZooKeeper, then bookies, then brokers; return once all are healthy."""

    @abc.abstractmethod
    def down(self) -> None:
        """Stop every process and remove every host and network object; idempotent. Logs and data stay."""

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- inventory ---------------------------------------------------------------------------
    @abc.abstractmethod
    def nodes(self, role: str | None = None) -> list[Node]:
        """Every node (or those of one role), with liveness as of now."""

    def node(self, name: str) -> Node:
        for n in self.nodes():
            if n.name == name:
                return n
        known = ", ".join(n.name for n in self.nodes())
        raise ClusterError(f"no node named {name!r}", f"use one of: {known}")

    def is_alive(self, name: str) -> bool:
        return self.node(name).alive

    @property
    @abc.abstractmethod
    def service_url(self) -> str:
        """pulsar://broker-1:6650,broker-2:6650 (addresses reachable from the harness host)."""

    @property
    @abc.abstractmethod
    def zk_connect(self) -> str:
        """ZooKeeper connect string, host:port,... reachable from the harness host."""

    @abc.abstractmethod
    def status(self) -> dict[str, Any]:
        """A JSON-able description: cluster status, nodes (roles, addresses, pids, liveness, logs), URLs."""

    # -- process faults ----------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, name: str) -> Node:
        """(Re)start a node's process with the same config, data and identity; waits until it is healthy."""

    @abc.abstractmethod
    def stop(self, name: str) -> None:
        """Graceful stop: SIGTERM, then SIGKILL if it does not exit in time."""

    @abc.abstractmethod
    def kill(self, name: str) -> None:
        """SIGKILL the node's processes."""

    @abc.abstractmethod
    def pause(self, name: str) -> None:
        """SIGSTOP the node's processes."""

    @abc.abstractmethod
    def resume(self, name: str) -> None:
        """SIGCONT the node's processes."""

    # -- network faults ----------------------------------------------------------------------
    @abc.abstractmethod
    def partition(self, grudge: Grudge) -> None:
        """Apply a grudge (node -> nodes it drops packets from, or a DiGraph a->b: a drops b).

        Drops are symmetric per edge (a neither receives from nor sends to b). Successive calls
        compose: the drops in force are the union of all grudges since the last heal()."""

    @abc.abstractmethod
    def heal(self) -> None:
        """Remove every partition, flaky link and slow link."""

    def unpartition(self, grudge: Grudge) -> None:
        """Undo one earlier `partition(grudge)` call only: drops stay in force while another
        partition still in force holds them (each drop edge is counted per call)."""
        raise Unsupported(f"{type(self).__name__} cannot undo one partition alone", "heal() undoes all")

    def deafen(self, node: str, peers: Iterable[str], *, trigger: bytes | None = None) -> None:
        """Make `node` drop every packet the `peers` send it, one way: what it sends them still arrives
        (its requests are carried out, their answers never reach it). Counted per call like partitions.

        With `trigger`, only one connection goes deaf: the one on which `node` sends a peer a packet
        that contains those bytes (a request of one kind on one path, say) hears nothing more from that
        peer from then on, that packet's answer included; a new connection is not affected. Armed
        until undone."""
        raise Unsupported(f"{type(self).__name__} has no one-way cuts")

    def undeafen(self, node: str, peers: Iterable[str], *, trigger: bytes | None = None) -> None:
        """Undo one earlier `deafen(node, peers, ...)` call (the same arguments)."""
        raise Unsupported(f"{type(self).__name__} cannot undo one one-way cut alone", "heal() undoes all")

    def flaky(self, src: str, dst: str, p: float) -> None:
        """Make src drop a fraction p of the packets it exchanges with dst (both directions)."""
        raise Unsupported(f"{type(self).__name__} has no flaky links")

    def unflaky(self, src: str, dst: str, p: float) -> None:
        """Undo one earlier `flaky(src, dst, p)` call only (a no-op if heal() undid it already)."""
        raise Unsupported(f"{type(self).__name__} cannot undo one flaky link alone", "heal() undoes all")

    def slow(self, src: str, dst: str, delay_ms: float) -> None:
        """Hold every packet src exchanges with dst for delay_ms, each way (a round trip gains twice
        that), established connections included."""
        raise Unsupported(f"{type(self).__name__} has no slow links")

    def unslow(self, src: str, dst: str, delay_ms: float) -> None:
        """Undo one earlier `slow(src, dst, delay_ms)` call only (a no-op if heal() undid it already)."""
        raise Unsupported(f"{type(self).__name__} cannot undo one slow link alone", "heal() undoes all")

    # -- disk, power and clock faults ---------------------------------------------------------
    def wipe(self, name: str) -> dict[str, Any]:
        """Delete a dead node's data (its identity and config stay): the next start() begins empty."""
        raise Unsupported(f"{type(self).__name__} cannot wipe a node's disk")

    def corrupt(self, name: str, mode: str, draws: list[float], flips: int = 16) -> dict[str, Any]:
        """Damage a stopped bookie's newest entry log (`mode` "bitflip" or "truncate", at points drawn
        from `draws` in [0, 1); clusters/bookie/corrupt.py); its index is left as it is."""
        raise Unsupported(f"{type(self).__name__} cannot corrupt a bookie's files")

    def format(self, name: str) -> dict[str, Any]:
        """The operator's answer to a bookie that refuses its disks: format the stopped bookie as a
        new bookie (its cookie in the metadata store and its local data deleted, BookKeeper's
        `bookieformat -deleteCookie`); the next start() writes new cookies under the same id."""
        raise Unsupported(f"{type(self).__name__} cannot format a bookie")

    def power_loss(self, names: Iterable[str]) -> dict[str, Any]:
        """Kill these nodes at once and lose every write of theirs that was not fsync'ed (the nodes
        stay down; start() brings them back). Needs the cluster deployed with lazy disks."""
        raise Unsupported(f"{type(self).__name__} cannot cut power")

    def set_clock(self, name: str, offset_s: float) -> None:
        """Set a node's wall-clock offset from true time in seconds (0 = true time); takes effect at
        once in the running process. Needs the cluster deployed with fake clocks."""
        raise Unsupported(f"{type(self).__name__} cannot skew clocks")

    def exec(self, name: str, argv: list[str], timeout: float = 30.0,
             **run_kw: Any) -> subprocess.CompletedProcess:
        """Run a short command on a node's host and wait for it (text output captured): for probes."""
        raise Unsupported(f"{type(self).__name__} cannot run commands on its hosts")

    # -- clients -----------------------------------------------------------------------------
    @abc.abstractmethod
    def run_client(self, argv: list[str], node: str | None = None, **popen_kw: Any) -> subprocess.Popen:
        """Run a process on a client host (so its links to the cluster can be cut) and return it."""
