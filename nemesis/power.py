"""Power loss: every target node dies at once and loses what it had not fsync'ed.

The cluster must be deployed with lazy disks for the targets' roles (`ClusterSpec.lazy_disks`; the
runner deploys bookies on lazyfs when `power-loss` is in the run): their data dirs are lazyfs
mounts (clusters/deploy/lazyfs.py) that keep un-fsync'ed writes in memory and drop them on a crash.
Nothing in the system under test cooperates: a bookie that acknowledges before fsync
(`bookie.ack_before_fsync`) loses acknowledged entries, one that fsyncs first loses none.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

from clusters.deploy.backend import Unsupported
from nemesis.base import Nemesis, NemesisContext, NemesisError

DEFAULT_TARGET = "all-bookie"          # a whole rack: every bookie, so no copy survives in memory


class PowerLossNemesis(Nemesis):
    """start: cut the power of the targets at once (`Cluster.power_loss`); stop: start every target
    again and wait until each serves.

    `target`: None (every bookie), a selector of nemesis/targets.py (`all-bookie`, `all-broker`,
    `bookie` for one random bookie, `ledger-bookies`, a node name...), several joined by `+` (the
    union: `all-bookie+all-broker` is the whole cluster but ZooKeeper), or a list of node names."""

    name = "power-loss"

    def __init__(self, target: str | Sequence[str] | None = None):
        super().__init__()
        if target is None:
            target = DEFAULT_TARGET
        if isinstance(target, str):
            self.selectors: list[str] = [t.strip() for t in target.split("+")]
            if not all(self.selectors):
                raise ValueError(f"power-loss: empty target in {target!r}; join targets with '+', "
                                 "e.g. all-bookie+all-broker")
            from nemesis.targets import check_name as check_selector
            for sel in self.selectors:
                check_selector(sel)             # a name that cannot be a target on any cluster
            self.nodes: list[str] | None = None
        else:
            self.selectors, self.nodes = [], list(dict.fromkeys(target))
            if not self.nodes:
                raise NemesisError("power-loss: an empty list of nodes")

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.nodes is not None:
            known = set(ctx.names("zookeeper", "bookie", "broker"))
            unknown = [n for n in self.nodes if n not in known]
            if unknown:
                raise NemesisError(f"power-loss: no server node named {', '.join(unknown)}; "
                                   f"use some of {', '.join(sorted(known))}")
            return {"nodes": list(self.nodes)}
        from nemesis import targets
        plans = [targets.draw(ctx, sel) for sel in self.selectors]
        return plans[0] if len(plans) == 1 else {"selectors": plans}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        if self.nodes is not None:
            resolved: dict[str, Any] = {"nodes": list(plan["nodes"])}
        else:
            from nemesis import targets
            plans = plan["selectors"] if "selectors" in plan else [plan]
            parts = [targets.resolve(ctx, p["selector"], plan=p) for p in plans]
            resolved = parts[0] if len(parts) == 1 else {
                "selector": "+".join(p["selector"] for p in parts), "resolved": parts,
                "nodes": [n for p in parts for n in p["nodes"]]}
        nodes = list(dict.fromkeys(resolved["nodes"]))
        value: dict[str, Any] = {**resolved, "nodes": nodes}
        self.applied = value                # before the side effect: a half-done start is undone
        try:
            dropped = ctx.cluster.power_loss(nodes)
        except Unsupported:
            self.applied = None             # nothing was done
            raise
        value = {**value, "dropped": dropped,
                 "dropped_bytes": sum(d.get("dropped_bytes", 0) for d in dropped.values()),
                 "killed": {n: d.get("pid") for n, d in dropped.items()}}
        self.applied = value
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        nodes = list(self.applied["nodes"])
        down = [n for n in nodes if not ctx.cluster.node(n).alive]

        def start(name: str) -> Any:
            return ctx.cluster.start(name)          # waits until it serves (the backend's timeout)
        started: dict[str, Any] = {}
        errors = []
        with concurrent.futures.ThreadPoolExecutor(max(1, len(down))) as pool:
            futs = {pool.submit(start, n): n for n in down}
            for fut, name in futs.items():
                try:
                    started[name] = fut.result().pid
                except Exception as e:  # noqa: BLE001 - every target is tried; the fault stays applied
                    errors.append(f"{name}: {type(e).__name__}: {e}")
        if errors:
            raise NemesisError("power-loss: could not restart " + "; ".join(errors))
        self.applied = None
        return {"nodes": nodes, "restarted": started}

    def describe(self) -> str:
        if not self.applied:
            return self.name
        return f"{self.name}: {', '.join(self.applied['nodes'])}"
