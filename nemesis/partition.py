"""Network faults: partitions of every shape as grudges (networkx graphs of cut links).

random halves, one node isolated (at random or a resolved target), a bridge, a majorities ring, the
primaries (every topic's owner) cut from everyone, a role cut from ZooKeeper only, the clients cut
from one broker, and an arbitrary grudge from the spec. Each fault undoes only its own cuts
(`cluster.unpartition`), so overlapping partitions compose: a link stays cut while any fault in force
cuts it.
"""
from __future__ import annotations

from typing import Any

from clusters.deploy.backend import Unsupported
from nemesis import grudge as shapes
from nemesis.base import Nemesis, NemesisContext, NemesisError, normalize_topic
from nemesis.targets import draw, resolve_plan as resolve

SHAPES = ("halves", "one", "bridge", "majorities-ring")
SERVER_ROLES = ("zookeeper", "bookie", "broker")


class _GrudgeNemesis(Nemesis):
    """A fault that is a grudge applied with `cluster.partition`; stopping undoes that grudge alone and
    journals it with the `healed_keys` of what was applied."""

    healed_keys: tuple[str, ...] = ("grudge",)

    def _apply(self, ctx: NemesisContext, value: dict[str, Any]) -> dict[str, Any]:
        if not value.get("grudge"):
            raise NemesisError(f"{self.name}: the grudge is empty: nothing to cut")
        self.applied = value                 # before the side effect, so a half-done start is undone
        ctx.cluster.partition(value["grudge"])
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        try:
            ctx.cluster.unpartition(self.applied["grudge"])
        except Unsupported:                  # a backend that can only heal everything at once
            ctx.cluster.heal()
        undone, self.applied = self.applied, None
        return {"healed": True, **{k: undone[k] for k in self.healed_keys if k in undone}}


class PartitionNemesis(_GrudgeNemesis):
    """Cut the cluster's network along a random shape.

    - halves (`partition`): brokers and bookies shuffled and cut in two non-empty halves, ZooKeeper
      on the bigger side; every node of one side drops every node of the other.
    - one (`isolate`): a random broker or bookie cut from every other node (ZooKeeper included).
    - bridge / majorities-ring: over every server node (ZooKeeper, bookies, brokers).
    Client hosts and the harness host are never cut."""

    def __init__(self, shape: str = "halves", name: str | None = None):
        super().__init__()
        if shape not in SHAPES:
            raise ValueError(f"unknown partition shape {shape!r}; use one of {', '.join(SHAPES)}")
        self.shape = shape
        self.name = name or ("partition" if shape == "halves"
                             else f"partition-{'ring' if shape == 'majorities-ring' else shape}")

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
                        "sides": [[node], sorted(set(ctx.names(*SERVER_ROLES)) - {node})]}
            servers = ctx.names(*SERVER_ROLES)
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
        return self._apply(ctx, {**plan, "grudge": self._grudge(ctx, plan)})

    def describe(self) -> str:
        if not self.applied:
            return self.name
        if "sides" in self.applied:
            sides = " | ".join(",".join(s) for s in self.applied["sides"])
            extra = f" (bridge {self.applied['bridge']})" if "bridge" in self.applied else ""
            return f"{self.name}: {sides}{extra}"
        return f"{self.name}: ring {','.join(self.applied['ring'])}"


class IsolateNemesis(PartitionNemesis):
    """`isolate[:TARGET]`: a node (a random broker or bookie, or the target resolved when the fault
    starts: owner, ledger-bookies, zk-leader, lb-leader, a role or a node name) cut from every other
    server node. Several resolved nodes (ledger-bookies) are each cut from everyone."""

    def __init__(self, selector: str | None = None, name: str = "isolate"):
        super().__init__("one", name=name)
        self.selector = selector

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.selector is None:
            return super().choose(ctx)
        return {"shape": "one", **draw(ctx, self.selector)}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        if self.selector is None:
            return super().start(ctx, plan)
        found = resolve(ctx, plan)
        nodes = found["nodes"]
        rest = sorted(set(ctx.names(*SERVER_ROLES)) - set(nodes))
        if not rest:
            raise NemesisError(f"{self.name}: nothing left to cut {', '.join(nodes)} from")
        sides = [[n] for n in nodes] + [rest]
        value = {**plan, "target": found, "nodes": nodes, "node": nodes[0], "sides": sides,
                 "grudge": shapes.grudge_json(shapes.complete_grudge(sides))}
        return self._apply(ctx, value)


class PrimariesNemesis(_GrudgeNemesis):
    """`primaries`: the owner of every topic of the test, found through the brokers' lookup when the
    fault starts, each cut from every other server node (from the other owners too)."""

    name = "primaries"
    healed_keys = ("owners", "grudge")

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        if not ctx.topics:
            raise NemesisError("primaries: this workload has no topics, so it has no primaries")
        owners = {normalize_topic(t): ctx.owner_of(t) for t in sorted(ctx.topics)}
        primaries = sorted(set(owners.values()))
        rest = sorted(set(ctx.names(*SERVER_ROLES)) - set(primaries))
        sides = [[p] for p in primaries] + ([rest] if rest else [])
        if len(sides) < 2:
            raise NemesisError(f"primaries: only {primaries[0]} is a server node; nothing to cut it from")
        return self._apply(ctx, {"owners": owners, "primaries": primaries, "sides": sides,
                                 "grudge": shapes.grudge_json(shapes.complete_grudge(sides))})

    def describe(self) -> str:
        return f"primaries: {','.join(self.applied['primaries'])} cut off" if self.applied else self.name


class ZkIsolateNemesis(_GrudgeNemesis):
    """`zk-isolate[:TARGET]`: cut a node from every ZooKeeper node, and only from them.

    The default target is a topic's current owner (asked of the brokers when the fault starts, so it
    follows ownership changes): Vanlightly's `isolate-broker-from-zk`. Other targets: ledger-bookies
    (the bookies of the topic's open ledger's last fragment), lb-leader, a role (one random node
    of it), all-<role>, or a node name. Without topics (the ledger and register workloads) the
    default is a random broker or bookie (topic "")."""

    name = "zk-isolate"
    healed_keys = ("topic", "owner", "grudge")

    def __init__(self, selector: str | None = None):
        super().__init__()
        self.selector = selector

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.selector is not None:
            return {"topic": "", **draw(ctx, self.selector)}
        if not ctx.topics:      # a workload without topics (ledger, register): a random broker or bookie
            pool = ctx.names("broker", "bookie")
            if not pool:
                raise NemesisError("zk-isolate: no topics and no broker or bookie to cut from ZooKeeper")
            return {"topic": "", "owner": ctx.rng.choice(pool)}
        return {"topic": normalize_topic(ctx.rng.choice(list(ctx.topics)))}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        topic = plan.get("topic", "")
        zks = ctx.names("zookeeper")
        if not zks:
            raise NemesisError("zk-isolate: the cluster has no ZooKeeper nodes")
        extra: dict[str, Any] = {}
        if self.selector is not None:
            found = resolve(ctx, plan)
            nodes, extra = found["nodes"], {"selector": self.selector, "target": found, "nodes": found["nodes"]}
            topic = found.get("topic", topic) or ""
        else:
            nodes = [plan.get("owner") or ctx.owner_of(topic)]
        bad = sorted(set(nodes) & set(zks))
        if bad:
            raise NemesisError(f"zk-isolate: {', '.join(bad)} is a ZooKeeper node; pick a broker or bookie")
        grudge: dict[str, set[str]] = {}
        for node in nodes:
            for a, bs in shapes.grudge_json(shapes.isolate(node, zks)).items():
                grudge.setdefault(a, set()).update(bs)
        value = {"topic": topic, "owner": nodes[0], **extra,
                 "grudge": {a: sorted(bs) for a, bs in sorted(grudge.items())}}
        return self._apply(ctx, value)

    def describe(self) -> str:
        if not self.applied:
            return self.name
        topic = self.applied["topic"]
        who = ",".join(self.applied.get("nodes") or [self.applied["owner"]])
        return f"zk-isolate: {who} cut from ZooKeeper" + (f" (for {topic})" if topic else "")


class ClientLinkNemesis(_GrudgeNemesis):
    """`client-link[:TARGET]`: every client host cut from one broker (by default the owner of a random
    topic) while the brokers, bookies and ZooKeeper still reach each other: the broker keeps its
    ownership and its ZooKeeper session, only the clients lose it."""

    name = "client-link"
    healed_keys = ("broker", "grudge")

    def __init__(self, selector: str | None = None):
        super().__init__()
        self.selector = selector or "owner"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.selector == "owner" and not ctx.topics:
            return draw(ctx, "broker")
        return draw(ctx, self.selector)

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        clients = ctx.names("client")
        if not clients:
            raise NemesisError("client-link: the cluster has no client hosts (deploy with clients >= 1)")
        found = resolve(ctx, plan)
        brokers = set(ctx.names("broker"))
        not_brokers = [n for n in found["nodes"] if n not in brokers]
        if not_brokers:
            raise NemesisError(f"client-link: {', '.join(not_brokers)} is not a broker")
        sides = [clients, found["nodes"]]
        return self._apply(ctx, {**plan, "target": found, "broker": found["nodes"][0], "clients": clients,
                                 "grudge": shapes.grudge_json(shapes.complete_grudge(sides))})

    def describe(self) -> str:
        return f"client-link: clients cut from {self.applied['broker']}" if self.applied else self.name


class GrudgeNemesis(_GrudgeNemesis):
    """`grudge`: an explicit grudge ({node: [nodes it drops]}, e.g. {"broker-1": ["zk-1"]}) from the
    spec's `grudge` table (or a schedule entry's); drops are symmetric."""

    name = "grudge"

    def __init__(self, grudge: dict[str, list[str]] | None = None):
        super().__init__()
        self.grudge = grudge

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        grudge = self.grudge if self.grudge is not None else ctx.grudge
        if not grudge:
            raise NemesisError("grudge: no grudge given (set `grudge` in the spec, e.g. "
                               "--grudge '{\"broker-1\": [\"zk-1\"]}')")
        known = {n.name for n in ctx.cluster.nodes()}
        unknown = sorted({a for a in grudge} | {b for bs in grudge.values() for b in bs})
        unknown = [n for n in unknown if n not in known and n != "host"]
        if unknown:
            raise NemesisError(f"grudge: unknown node(s) {', '.join(unknown)}; "
                               f"this cluster has {', '.join(sorted(known))}")
        sym: dict[str, set[str]] = {}
        for a, bs in grudge.items():
            for b in bs:
                if a != b:
                    sym.setdefault(a, set()).add(b)
                    sym.setdefault(b, set()).add(a)
        return self._apply(ctx, {"grudge": {a: sorted(bs) for a, bs in sorted(sym.items())}})
