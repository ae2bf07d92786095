"""The modular leader without I/O (clusters/loadbalancer/modular_leader.py): the decisions the broker's
ModularLoadManager carries out, from registrations and a time handed in."""
from __future__ import annotations

import random

from clusters.loadbalancer.data import NamespaceBundleStats
from clusters.loadbalancer.modular_leader import ModularLeader
from clusters.loadbalancer.settings import LoadBalancerSettings
from tests.loadbalancer.helpers import broker


def _reg(cpu: float, bundles: dict[str, NamespaceBundleStats] | None = None, name: str = "x") -> dict:
    doc = broker(cpu_percent=cpu, bundles=bundles).to_json()
    doc["pulsarServiceUrl"] = f"pulsar://{name}:6650"
    return doc


def _stats(rate: float, topics: int = 1) -> NamespaceBundleStats:
    s = NamespaceBundleStats()
    s.msgRateIn, s.msgThroughputIn, s.topics = rate, rate * 1024, topics
    return s


def _leader(seed: int = 1, **kw) -> ModularLeader:
    settings = LoadBalancerSettings.from_mapping({"loadBalancerLoadPlacementStrategy": "LeastResourceUsageWithWeight",
                                                  "loadBalancerBundleUnloadMinThroughputThreshold": 0})
    return ModularLeader(settings, random.Random(seed), **kw)


def test_assignment_prefers_affinity_then_the_least_loaded_broker():
    lead = _leader()
    assert lead.select("t/n/0x00000000_0x40000000").reason == "no-brokers"
    found = lead.refresh({"a:8080": _reg(90, name="a"), "b:8080": _reg(5, name="b"), "c:8080": {"cpu": "x"}})
    assert found.brokers == ["a:8080", "b:8080"] and found.malformed == ["c:8080"]
    assert lead.urls == {"a:8080": "pulsar://a:6650", "b:8080": "pulsar://b:6650"}
    lead.affinity["t/n/0x00000000_0x40000000"] = "a:8080"
    first = lead.select("t/n/0x00000000_0x40000000")
    assert (first.broker, first.reason) == ("a:8080", "affinity")
    again = lead.select("t/n/0x00000000_0x40000000")       # an affinity is used once
    assert (again.broker, again.reason) == ("b:8080", "lookup")


def test_the_same_inputs_and_seed_give_the_same_decisions():
    def run(seed: int) -> list:
        lead = _leader(seed)
        lead.refresh({f"b{i}:8080": _reg(10.0, name=f"b{i}") for i in range(5)})
        return [lead.select(f"t/n/0x{i:08x}_0x{i + 1:08x}").broker for i in range(40)]
    assert run(3) == run(3)
    assert len(set(run(3))) > 1                 # equal brokers: the choice is random, and spread


def test_a_dead_brokers_preallocations_are_released_unless_the_knob_keeps_them():
    for keep in (False, True):
        lead = _leader(keep_preallocations=keep)
        lead.refresh({"a:8080": _reg(5, name="a")})
        bundle = "t/n/0x00000000_0x40000000"
        assert lead.select(bundle).broker == "a:8080"
        assert lead.load_data.preallocated_bundle_to_broker.get(bundle) == "a:8080"
        found = lead.refresh({"b:8080": _reg(5, name="b")})
        assert found.gone == ["a:8080"]
        held = lead.load_data.preallocated_bundle_to_broker.get(bundle)
        assert held == ("a:8080" if keep else None)


def test_shedding_moves_load_off_the_overloaded_broker_never_to_its_owner_unless_the_knob():
    hot = {f"t/n/0x{i:08x}_0x{i + 1:08x}": _stats(100.0 * (i + 1)) for i in range(4)}
    regs = {"a:8080": _reg(95, hot, name="a"), "b:8080": _reg(5, name="b")}
    for knob in (False, True):
        lead = _leader(shed_to_owner=knob)
        for _ in range(3):
            lead.refresh(regs)
        plan = lead.shed(now_ms=1_000_000)
        assert plan.unloads and all(u.src == "a:8080" for u in plan.unloads)
        assert all(u.dst != u.src for u in plan.unloads) or knob
        # the grace period: the bundles just shed are not chosen again at once
        again = lead.shed(now_ms=1_000_001)
        assert not {u.bundle for u in again.unloads} & {u.bundle for u in plan.unloads}
        lead.unload_failed(plan.unloads[0].bundle)
        assert plan.unloads[0].bundle not in lead.recently_unloaded


def test_hot_bundles_split_on_their_owner():
    settings = LoadBalancerSettings.from_mapping({"loadBalancerNamespaceBundleMaxTopics": 2})
    lead = ModularLeader(settings, random.Random(1))
    crowded = {"t/n/0x00000000_0x80000000": _stats(10.0, topics=5)}
    lead.refresh({"a:8080": _reg(10, crowded, name="a"), "b:8080": _reg(10, name="b")})
    splits = lead.splits()
    assert [(s.bundle, s.owner, s.reason) for s in splits] == [("t/n/0x00000000_0x80000000", "a:8080", "Topics")]
    lead.refresh({"a:8080": _reg(10, crowded, name="a")})          # one broker: no split (Pulsar)
    assert lead.splits() == []
