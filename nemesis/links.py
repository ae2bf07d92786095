"""Link faults short of a partition: flaky links (each packet dropped with probability p, iptables
`statistic`) and slow links (each packet held D ms each way, an NFQUEUE delay daemon: see
clusters/deploy/delay.py). Each undoes only the links it made (`unflaky` / `unslow`), so it
composes with partitions and with other link faults in force.

Which links, drawn with the run's rng:

- `node`: one random broker or bookie (or the node(s) of a TARGET selector: `flaky:owner`,
  `slow:zk-leader`, `flaky:broker-2`) with every other server (ZooKeeper, bookies, brokers);
- `pairs`: 1..3 random pairs of servers.

Client hosts and the harness host are never touched.
"""
from __future__ import annotations

import itertools
from typing import Any

from nemesis.base import Nemesis, NemesisContext, NemesisError
from nemesis.targets import draw, plan_nodes

SERVER_ROLES = ("zookeeper", "bookie", "broker")
NODE_ROLES = ("bookie", "broker")       # what the `node` shape draws from, as kill and pause
SHAPES = ("node", "pairs")
MAX_PAIRS = 3


class _LinkNemesis(Nemesis):
    """Applies `_apply(ctx, a, b)` to a set of links; stop undoes exactly the ones applied."""

    key = ""                               # the fault's parameter in the journal: "p" or "delay_ms"

    def __init__(self, selector: str | None = None, shape: str | None = None, max_pairs: int = MAX_PAIRS):
        super().__init__()
        if shape is not None and shape not in SHAPES:
            raise ValueError(f"unknown link shape {shape!r}; use one of {', '.join(SHAPES)}")
        self.selector, self.shape, self.max_pairs = selector, shape, max(1, int(max_pairs))
        self._done: list[list[str]] = []

    # -- what a subclass provides
    def _draw(self, ctx: NemesisContext) -> float:
        raise NotImplementedError

    def _apply(self, ctx: NemesisContext, a: str, b: str, value: float) -> None:
        raise NotImplementedError

    def _undo(self, ctx: NemesisContext, a: str, b: str, value: float) -> None:
        raise NotImplementedError

    # -- the fault
    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        rng = ctx.rng
        servers = ctx.names(*SERVER_ROLES)
        if len(servers) < 2:
            raise NemesisError(f"{self.name}: the cluster needs two servers to have a link, it has {len(servers)}")
        shape = rng.choice(SHAPES)
        param = self._draw(ctx)
        if self.selector is not None:
            plan: dict[str, Any] = {"shape": "node", **draw(ctx, self.selector)}
        elif (self.shape or shape) == "node":
            pool = ctx.names(*NODE_ROLES) or servers
            plan = {"shape": "node", "node": rng.choice(pool)}
        else:
            pairs = [list(p) for p in itertools.combinations(servers, 2)]
            k = rng.randint(1, min(self.max_pairs, len(pairs)))
            plan = {"shape": "pairs", "links": sorted(rng.sample(pairs, k))}
        plan[self.key] = param
        return plan

    def _links(self, ctx: NemesisContext, plan: dict[str, Any]) -> tuple[list[list[str]], dict[str, Any]]:
        if plan["shape"] == "pairs":
            return [list(x) for x in plan["links"]], {}
        centers, found = plan_nodes(ctx, plan)
        extra = {"target": found["target"]} if found else {}
        servers = ctx.names(*SERVER_ROLES)
        links, seen = [], set()
        for c in centers:
            for peer in servers:
                if peer != c and frozenset((c, peer)) not in seen:
                    seen.add(frozenset((c, peer)))
                    links.append([c, peer])
        if not links:
            raise NemesisError(f"{self.name}: {', '.join(centers)} has no other server to link to")
        if len(centers) > 1:
            extra["nodes"] = centers
        else:
            extra["node"] = centers[0]
        return links, extra

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        param = float(plan[self.key])
        links, extra = self._links(ctx, plan)
        value: dict[str, Any] = {**plan, **extra, "links": links, self.key: param}
        if "node" not in value and "nodes" not in value:
            value["nodes"] = sorted({n for link in links for n in link})
        self.applied = value                  # before the first side effect
        self._done = []
        try:
            for a, b in links:
                self._apply(ctx, a, b, param)
                self._done.append([a, b])
        except BaseException:
            if not self._done:
                self.applied = None           # nothing was done
            else:
                self.applied["applied_links"] = list(self._done)
            raise
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        param = float(self.applied[self.key])
        while self._done:                     # an error leaves the rest for a retry
            a, b = self._done[0]
            self._undo(ctx, a, b, param)
            self._done.pop(0)
        undone, self.applied = self.applied, None
        out = {"links": undone["links"], self.key: param}
        for k in ("node", "nodes"):
            if k in undone:
                out[k] = undone[k]
        return out

    def describe(self) -> str:
        if not self.applied:
            return self.name
        a = self.applied
        where = (a["node"] + " and every server") if "node" in a and a.get("shape") == "node" else \
            " ".join(f"{x}~{y}" for x, y in a["links"])
        return f"{self.name}: {where} ({self._param_text(a[self.key])})"

    def _param_text(self, value: float) -> str:
        return f"{self.key} {value:g}"


class FlakyNemesis(_LinkNemesis):
    """Links that drop each packet with probability p (0.2..0.5 by default), both ways."""

    name = "flaky"
    key = "p"

    def __init__(self, selector: str | None = None, shape: str | None = None,
                 p_range: tuple[float, float] = (0.2, 0.5), max_pairs: int = MAX_PAIRS):
        super().__init__(selector, shape, max_pairs)
        lo, hi = p_range
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"drop probability range {p_range} must be within (0, 1]")
        self.p_range = (float(lo), float(hi))

    def _draw(self, ctx: NemesisContext) -> float:
        return round(ctx.rng.uniform(*self.p_range), 3)

    def _apply(self, ctx: NemesisContext, a: str, b: str, value: float) -> None:
        ctx.cluster.flaky(a, b, value)

    def _undo(self, ctx: NemesisContext, a: str, b: str, value: float) -> None:
        ctx.cluster.unflaky(a, b, value)

    def _param_text(self, value: float) -> str:
        return f"p={value:g}"


class SlowNemesis(_LinkNemesis):
    """Links that hold each packet D ms each way (50..500 ms by default), established connections
    included."""

    name = "slow"
    key = "delay_ms"

    def __init__(self, selector: str | None = None, shape: str | None = None,
                 delay_range_ms: tuple[int, int] = (50, 500), max_pairs: int = MAX_PAIRS):
        super().__init__(selector, shape, max_pairs)
        lo, hi = delay_range_ms
        if not 0 < lo <= hi:
            raise ValueError(f"delay range {delay_range_ms} ms must be 0 < low <= high")
        self.delay_range_ms = (int(lo), int(hi))

    def _draw(self, ctx: NemesisContext) -> float:
        return float(ctx.rng.randint(*self.delay_range_ms))

    def _apply(self, ctx: NemesisContext, a: str, b: str, value: float) -> None:
        ctx.cluster.slow(a, b, value)

    def _undo(self, ctx: NemesisContext, a: str, b: str, value: float) -> None:
        ctx.cluster.unslow(a, b, value)

    def _param_text(self, value: float) -> str:
        return f"+{value:g} ms each way"
