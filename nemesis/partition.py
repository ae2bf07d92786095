"""Network faults: partitions of the cluster (halves, one node, bridge, majorities ring) and cutting a
topic's owner from ZooKeeper. All of them are undone by `cluster.heal()`."""
from __future__ import annotations

from typing import Any

from nemesis import grudge as shapes
from nemesis.base import Nemesis, NemesisContext, NemesisError, normalize_topic

SHAPES = ("halves", "one", "bridge", "majorities-ring")


class _GrudgeNemesis(Nemesis):
    """A fault that is a grudge applied with `cluster.partition`; stopping heals every partition and
    journals the healed grudge with the `healed_keys` of what was applied."""

    healed_keys: tuple[str, ...] = ("grudge",)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        ctx.cluster.heal()
        undone, self.applied = self.applied, None
        return {"healed": True, **{k: undone[k] for k in self.healed_keys}}


class PartitionNemesis(_GrudgeNemesis):
    """Cut the cluster's network along a random shape.

    - halves (`partition`): brokers and bookies shuffled and cut in two non-empty halves, ZooKeeper
      on the bigger side; every node of one side drops every node of the other.
    - one: a random broker or bookie cut from every other node (ZooKeeper included).
    - bridge / majorities-ring: over every server node (ZooKeeper, bookies, brokers).
    Client hosts and the harness host are never cut."""

    def __init__(self, shape: str = "halves"):
        super().__init__()
        if shape not in SHAPES:
            raise ValueError(f"unknown partition shape {shape!r}; use one of {', '.join(SHAPES)}")
        self.shape = shape
        self.name = "partition" if shape == "halves" else f"partition-{'ring' if shape == 'majorities-ring' else shape}"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        data_nodes = ctx.names("bookie", "broker")
        zks = ctx.names("zookeeper")
        try:
            if self.shape == "halves":
                sides, _ = shapes.halves(data_nodes, ctx.rng, majority_extra=zks)
                return {"shape": self.shape, "sides": sides}
            if self.shape == "one":
                node, _ = shapes.one(data_nodes, ctx.rng)
                return {"shape": self.shape, "node": node,
                        "sides": [[node], sorted(set(ctx.names("zookeeper", "bookie", "broker")) - {node})]}
            servers = ctx.names("zookeeper", "bookie", "broker")
            if self.shape == "bridge":
                sides, node, _ = shapes.bridge(servers, ctx.rng)
                return {"shape": self.shape, "sides": sides, "bridge": node}
            ring, _ = shapes.majorities_ring(servers, ctx.rng)
            return {"shape": self.shape, "ring": ring}
        except shapes.GrudgeError as e:
            raise NemesisError(f"{self.name}: {e}") from None

    def _grudge(self, ctx: NemesisContext, plan: dict[str, Any]) -> dict[str, list[str]]:
        if self.shape == "majorities-ring":
            return shapes.grudge_json(shapes.ring_grudge(plan["ring"]))
        return shapes.grudge_json(shapes.complete_grudge(plan["sides"]))

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        grudge = self._grudge(ctx, plan)
        value = {**plan, "grudge": grudge}
        self.applied = value
        ctx.cluster.partition(grudge)
        return value

    def describe(self) -> str:
        if not self.applied:
            return self.name
        if "sides" in self.applied:
            sides = " | ".join(",".join(s) for s in self.applied["sides"])
            extra = f" (bridge {self.applied['bridge']})" if "bridge" in self.applied else ""
            return f"{self.name}: {sides}{extra}"
        return f"{self.name}: ring {','.join(self.applied['ring'])}"


class ZkIsolateNemesis(_GrudgeNemesis):
    """Cut a topic's current owner from every ZooKeeper node (and only from them).

    The topic is drawn from the context's topics; its owner is asked of the brokers when the fault
    starts (HTTP lookup), so the fault follows ownership changes. Without topics (the ledger and
    register workloads) a random broker or bookie is cut instead (topic ""). The owner keeps its links to
    bookies, other brokers and clients: Vanlightly's `isolate-broker-from-zk`."""

    name = "zk-isolate"
    healed_keys = ("topic", "owner", "grudge")

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if not ctx.topics:      # a workload without topics (ledger, register): a random broker or bookie
            pool = ctx.names("broker", "bookie")
            if not pool:
                raise NemesisError("zk-isolate: no topics and no broker or bookie to cut from ZooKeeper")
            return {"topic": "", "owner": ctx.rng.choice(pool)}
        return {"topic": normalize_topic(ctx.rng.choice(list(ctx.topics)))}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        topic = plan["topic"]
        owner = plan.get("owner") or ctx.owner_of(topic)
        zks = ctx.names("zookeeper")
        if not zks:
            raise NemesisError("the cluster has no ZooKeeper nodes")
        grudge = shapes.grudge_json(shapes.isolate(owner, zks))
        value = {"topic": topic, "owner": owner, "grudge": grudge}
        self.applied = value
        ctx.cluster.partition(grudge)
        return value

    def describe(self) -> str:
        if not self.applied:
            return self.name
        topic = self.applied["topic"]
        return f"zk-isolate: {self.applied['owner']} cut from ZooKeeper" + (f" (owner of {topic})" if topic else "")
