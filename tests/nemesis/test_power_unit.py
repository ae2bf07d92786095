"""PowerLossNemesis (nemesis/power.py) on an in-memory cluster: which nodes it cuts, what it records,
how it undoes the fault, and what it refuses."""
from __future__ import annotations

import random
from typing import Any

import pytest

from clusters.deploy.backend import ClusterError, Unsupported
from nemesis.base import NemesisContext, NemesisError
from nemesis.base import FaultNameError
from nemesis.registry import make
from nemesis.power import PowerLossNemesis
from tests.nemesis.fakes import FakeCluster


class LazyFakeCluster(FakeCluster):
    """FakeCluster whose nodes of `lazy` roles have lazy disks: power_loss kills them at once."""

    def __init__(self, lazy=("bookie",), fail_start: set[str] | None = None, **kw):
        super().__init__(**kw)
        self.lazy = set(lazy)
        self.fail_start = set(fail_start or ())

    def power_loss(self, names) -> dict[str, Any]:
        names = list(names)
        bare = [n for n in names if self._nodes[n].role not in self.lazy]
        if bare:
            raise Unsupported(f"{', '.join(bare)}: no lazy disk", "deploy with lazy_disks")
        self.calls.append(("power_loss", names))
        out = {}
        for n in names:
            node = self._nodes[n]
            out[n] = {"dropped_bytes": 100, "dropped_files": 1, "removed_files": 0,
                      "pid": node.pid if node.alive else None}
            node.alive = False
        return out

    def start(self, name: str):
        if name in self.fail_start:
            self.fail_start.discard(name)
            raise ClusterError(f"{name} exited while starting")
        return super().start(name)


def ctx_of(cluster) -> NemesisContext:
    return NemesisContext(cluster=cluster, rng=random.Random(3), topics=["t"])


def test_default_cuts_every_bookie_at_once_and_stop_restarts_them():
    c = LazyFakeCluster()
    ctx = ctx_of(c)
    nem = PowerLossNemesis()
    plan = nem.choose(ctx)
    value = nem.start(ctx, plan)
    assert c.calls == [("power_loss", ["bookie-1", "bookie-2", "bookie-3"])]
    assert value["nodes"] == ["bookie-1", "bookie-2", "bookie-3"] and value["selector"] == "all-bookie"
    assert value["dropped_bytes"] == 300 and value["killed"] == {"bookie-1": 1002, "bookie-2": 1003, "bookie-3": 1004}
    assert nem.applied == value and nem.describe() == "power-loss: bookie-1, bookie-2, bookie-3"
    assert all(not c.node(n).alive for n in value["nodes"]) and c.node("broker-1").alive
    out = nem.stop(ctx)
    assert out["nodes"] == value["nodes"] and sorted(out["restarted"]) == value["nodes"]
    assert all(c.node(n).alive for n in value["nodes"]) and nem.applied is None
    assert nem.stop(ctx) == {}


def test_targets_joined_by_plus_and_lists():
    c = LazyFakeCluster(lazy=("bookie", "broker"))
    ctx = ctx_of(c)
    v = PowerLossNemesis("all-bookie+all-broker").start(ctx)
    assert v["nodes"] == ["bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"]
    assert v["selector"] == "all-bookie+all-broker" and len(v["resolved"]) == 2
    c2 = LazyFakeCluster()
    v = PowerLossNemesis("bookie-2+all-bookie").start(ctx_of(c2))
    assert v["nodes"] == ["bookie-2", "bookie-1", "bookie-3"]            # each node once
    c3 = LazyFakeCluster()
    v = PowerLossNemesis(["bookie-3", "bookie-1"]).start(ctx_of(c3))
    assert c3.calls == [("power_loss", ["bookie-3", "bookie-1"])] and v["nodes"] == ["bookie-3", "bookie-1"]
    with pytest.raises(NemesisError, match="no server node named bookie-9"):
        PowerLossNemesis(["bookie-9"]).choose(ctx_of(LazyFakeCluster()))


def test_unsupported_leaves_nothing_applied():
    c = LazyFakeCluster()                          # brokers on plain disks
    nem = PowerLossNemesis("all-broker")
    with pytest.raises(Unsupported):
        nem.start(ctx_of(c))
    assert nem.applied is None and c.node("broker-1").alive and nem.stop(ctx_of(c)) == {}


def test_a_failed_restart_keeps_the_fault_for_a_retry():
    c = LazyFakeCluster(fail_start={"bookie-2"})
    ctx = ctx_of(c)
    nem = PowerLossNemesis()
    nem.start(ctx)
    with pytest.raises(NemesisError, match="bookie-2: ClusterError: bookie-2 exited while starting"):
        nem.stop(ctx)
    assert nem.is_active() and c.node("bookie-1").alive and not c.node("bookie-2").alive
    out = nem.stop(ctx)                            # the retry starts only what is still down
    assert out["restarted"] == {"bookie-2": c.node("bookie-2").pid} and nem.applied is None


def test_registry_names():
    assert isinstance(make("power-loss"), PowerLossNemesis)
    assert make("power-loss:all-bookie+all-broker").selectors == ["all-bookie", "all-broker"]
    for bad in ("power-loss:nobody", "power-loss:all-bookie+", "power-loss:+all-broker"):
        with pytest.raises(FaultNameError):
            make(bad)
